"""GridMapping and BlockMapping: the canonical form of a grid specification.

Backends read only the kernel jaxpr and a GridMapping. Calling conventions:

* the ``pallas_call`` primitive is invoked with ``*index, *inputs`` (no dynamic grid
  bounds yet, so ``num_dynamic_grid_bounds == 0``);
* the kernel jaxpr is invoked with ``*grid_indices, *index, *inputs, *outputs,
  *scratch``: one int32 scalar per grid axis first (what ``pl.program_id`` reads),
  then Refs -- the scalar-prefetch operands whole, each input and output as its
  block, then scratch;
* each index map jaxpr is invoked with ``*grid_indices, *index`` and returns one
  int32 per array dimension: a block index (element offset for ``pl.Element``).
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Hashable
from typing import Any

import jax
import numpy as np

from pallax._src import core as pc
from pallax._src import jax_internals as ji


@dataclasses.dataclass(frozen=True, eq=False)
class BlockMapping:
  """How one operand (``origin``: 'args[1]', 'out[0]') is cut into blocks."""
  block_shape: tuple[pc.BlockDim, ...]
  transformed_block_aval: Any          # AbstractRef the kernel sees (squeezed dims dropped)
  index_map_jaxpr: ji.Jaxpr            # closed: consts attached
  index_map_out_tree: Any
  array_aval: ji.ShapedArray
  origin: str
  transforms: tuple = ()
  pipeline_mode: Any = None
  debug: bool = False

  @property
  def block_aval(self):
    return self.transformed_block_aval

  @property
  def ref_aval(self):
    return self.transformed_block_aval

  @property
  def full_block_shape(self) -> tuple[int, ...]:
    """Block size per array dimension, squeezed dimensions counting 1."""
    return tuple(d.block_size for d in self.block_shape)

  @property
  def squeezed_dims(self) -> tuple[int, ...]:
    return tuple(i for i, d in enumerate(self.block_shape) if isinstance(d, pc.Squeezed))

  @property
  def has_element_dims(self) -> bool:
    return any(isinstance(d, pc.Element) for d in self.block_shape)

  @property
  def blocks_per_dim(self) -> tuple[int, ...]:
    return tuple(-(-a // b) for a, b in zip(self.array_aval.shape, self.full_block_shape))

  def check_invariants(self) -> None:
    kept = tuple(d.block_size for d in self.block_shape if not isinstance(d, pc.Squeezed))
    assert kept == tuple(self.ref_aval.shape), (self.block_shape, self.ref_aval)
    assert len(self.block_shape) == len(self.array_aval.shape), (self.block_shape, self.array_aval)
    assert all(b > 0 for b in self.full_block_shape), self.block_shape
    assert len(self.index_map_jaxpr.out_avals) == len(self.block_shape)
    assert all(a.shape == () and a.dtype == np.int32 for a in self.index_map_jaxpr.out_avals)

  def replace(self, **kw) -> BlockMapping:
    new = dataclasses.replace(self, **kw)
    new.check_invariants()
    return new


@dataclasses.dataclass(frozen=True, eq=False)
class GridMapping:
  """The canonical grid specification of one ``pallas_call`` (see module docstring)."""
  grid: tuple[int, ...]
  grid_names: tuple[Hashable, ...] | None
  block_mappings: tuple[BlockMapping, ...]
  index_map_tree: Any
  index_map_avals: tuple[Any, ...]
  vmapped_dims: tuple[int, ...]
  scratch_avals: tuple[Any, ...]
  num_index_operands: int
  num_inputs: int
  num_outputs: int
  get_grid_indices: Any = None
  local_grid_env: Any = None
  debug: bool = False
  scratch_zeroed: tuple[bool, ...] = ()   # pallax: scratch that starts at zero (semaphores)

  def check_invariants(self) -> None:
    assert len(self.block_mappings) == self.num_inputs + self.num_outputs
    assert len(self.index_map_avals) == len(self.grid) + self.num_index_operands
    args, kwargs = self.index_map_tree.unflatten(self.index_map_avals)
    assert not kwargs and len(args) >= len(self.grid)
    for a in self.index_map_avals[:len(self.grid)]:
      assert a.shape == () and a.dtype == np.int32, a
    assert all(isinstance(g, int) and g > 0 for g in self.grid), self.grid
    assert all(0 <= d < len(self.grid) for d in self.vmapped_dims)
    if self.grid_names is not None:
      assert len(self.grid_names) == len(self.grid)
    for bm in self.block_mappings:
      bm.check_invariants()
      assert tuple(self.index_map_avals) == tuple(bm.index_map_jaxpr.in_avals), bm.origin

  def replace(self, **kw) -> GridMapping:
    new = dataclasses.replace(self, **kw)
    new.check_invariants()
    return new

  def to_lojax(self) -> GridMapping:
    return self  # pallax has no high-level types to lower

  @contextlib.contextmanager
  def trace_env(self, ids=None, kernel_name="kernel"):
    """The tracing context in which ``pl.program_id``/``num_programs`` answer for this grid."""
    ids = tuple(ids) if ids is not None else tuple(np.int32(0) for _ in self.grid)
    with pc.grid_env(pc.GridEnv(kernel_name, ids, self.grid, self.grid_names or ())):
      yield

  @property
  def static_grid(self) -> tuple[int, ...]:
    return self.grid

  @property
  def num_dynamic_grid_bounds(self) -> int:
    return 0

  @property
  def num_scratch_operands(self) -> int:
    return len(self.scratch_avals)

  @property
  def block_mappings_output(self) -> tuple[BlockMapping, ...]:
    return self.block_mappings[self.num_inputs:]

  @property
  def in_shapes(self) -> tuple[jax.ShapeDtypeStruct, ...]:
    """The shapes of ``*index, *inputs``."""
    index = [jax.ShapeDtypeStruct(a.shape, a.dtype)
             for a in self.index_map_avals[len(self.grid):]]
    ins = [jax.ShapeDtypeStruct(bm.array_aval.shape, bm.array_aval.dtype)
           for bm in self.block_mappings[:self.num_inputs]]
    return tuple(index + ins)

  @property
  def out_shapes(self) -> tuple[jax.ShapeDtypeStruct, ...]:
    return tuple(jax.ShapeDtypeStruct(bm.array_aval.shape, bm.array_aval.dtype)
                 for bm in self.block_mappings_output)

  @property
  def slice_index_ops(self) -> slice:
    """Selects the index (scalar-prefetch) operands among the kernel's Ref operands."""
    return slice(0, self.num_index_operands)

  @property
  def slice_block_ops(self) -> slice:
    """Selects the block operands (inputs and outputs) among the kernel's Ref operands."""
    return slice(self.num_index_operands,
                 self.num_index_operands + self.num_inputs + self.num_outputs)

  @property
  def slice_scratch_ops(self) -> slice:
    """Selects the scratch operands among the kernel's Ref operands."""
    start = self.num_index_operands + self.num_inputs + self.num_outputs
    return slice(start, start + len(self.scratch_avals))

  def __repr__(self):
    lines = [f"GridMapping(grid={self.grid}, index operands={self.num_index_operands}, "
             f"inputs={self.num_inputs}, outputs={self.num_outputs}, "
             f"scratch={[str(a) for a in self.scratch_avals]}, vmapped_dims={self.vmapped_dims})"]
    for bm in self.block_mappings:
      lines.append(f"  {bm.origin}: array {bm.array_aval.str_short()} block "
                   f"{tuple(getattr(d, 'block_size', d) if not isinstance(d, pc.Squeezed) else None for d in bm.block_shape)}"
                   f" index_map {{ {str(bm.index_map_jaxpr).strip()} }}")
    return "\n".join(lines)

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
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pallax._src import core as pc
from pallax._src import hi_types
from pallax._src import jax_internals as ji
from pallax._src import kernel_errors


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
  memory_space: Any = None             # the spec's (None: the backend's default)

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
    assert all(ji.is_symbolic_dim(g) or isinstance(g, int) and g > 0 for g in self.grid), self.grid
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


# --- building the GridMapping ------------------------------------------------------------

def _as_tuple_grid(grid, name) -> tuple[int, ...]:
  if grid is None:
    grid = ()
  if isinstance(grid, (int, np.integer)):
    grid = (grid,)
  try:
    grid = tuple(grid)
  except TypeError:
    raise TypeError(f"pallas_call {name}: grid must be an int or a tuple of ints, got {grid!r}") from None
  for g in grid:
    if isinstance(g, tuple):
      raise TypeError(f"pallas_call {name}: grid {grid!r} mixes named and unnamed axes; name "
                      "every axis, grid=((\"i\", 2), (\"j\", 4)), or none")
    if not isinstance(g, (int, np.integer)) and not ji.is_symbolic_dim(g):
      raise TypeError(f"pallas_call {name}: grid sizes must be static Python ints, got {grid!r}; "
                      "dynamic grids are not supported")
  if any(ji.is_symbolic_dim(g) for g in grid):   # jax.export's shape polymorphism
    return tuple(g if ji.is_symbolic_dim(g) else int(g) for g in grid)   # (interpret/symbolic.py)
  if any(g < 0 for g in grid):
    raise ValueError(f"pallas_call {name}: grid sizes must be positive, got grid={tuple(grid)}")
  if any(g == 0 for g in grid):
    raise ValueError(
        f"pallas_call {name}: grid={tuple(grid)} runs no program, so no output is written. A size "
        "of 0 usually comes from `n // block` with n < block: `pl.cdiv(n, block)` rounds up and "
        "covers the last, partial block (Pallas masks its out-of-bounds part)")
  return tuple(int(g) for g in grid)


def _flatten_specs(specs, tree, what: str, count: int, name: str):
  """One BlockSpec (or None) per operand. in_specs is a list or tuple (as in JAX Pallas) whose
  entries may be prefixes of the inputs' pytrees; out_specs may be a single spec."""
  if specs is pc.no_block_spec:
    return [None] * count
  if what == "in_specs" and not isinstance(specs, (list, tuple)):
    # As JAX Pallas: a lone BlockSpec is not spread over the inputs.
    got = "a single BlockSpec" if isinstance(specs, pc.BlockSpec) else repr(specs)
    raise ValueError(f"pallas_call {name}: `in_specs` must be a tuple or a list with one entry "
                     f"per input, got {got}; wrap it: in_specs=[spec] (or [spec] * {count})")
  is_leaf = lambda s: s is None or isinstance(s, (pc.BlockSpec, pc.NoBlockSpec))
  if isinstance(specs, (list, tuple)) and tree.num_leaves == count and tree.num_nodes == count + 1 \
      and len(specs) != count and all(is_leaf(s) for s in specs):
    other = "inputs" if what == "in_specs" else "out_shape"   # JAX's words: users match them
    raise ValueError(f"pallas_call {name}: Pytree for `{what}` and `{other}` do not match. There "
                     f"are 1 mismatches, including: `{what}` is a tuple of length "
                     f"{len(specs)} but `{other}` is a tuple of length {count}; pass one BlockSpec "
                     "(or None for the whole array) per operand")
  full = jax.tree.unflatten(tree, [0] * count)
  # Pallas accepts lists and tuples interchangeably at the top level.
  full = tuple(full) if isinstance(full, list) else full
  specs = tuple(specs) if isinstance(specs, list) else specs
  if what == "in_specs":
    _check_same_structure(specs, full, is_leaf, name)
  try:
    flat = ji.tree_util.broadcast_prefix(specs, full, is_leaf=is_leaf)
  except (ValueError, TypeError) as e:
    operands = "inputs" if what == "in_specs" else "out_shape"
    raise ValueError(f"pallas_call {name}: Pytree for `{what}` and `{operands}` do not match: "
                     f"{what} is not a prefix of the operands' structure {tree}; pass one BlockSpec "
                     "(or None) per operand. "
                     f"{_prefix_error(specs, full, is_leaf, what, operands) or e}") from None
  return [None if isinstance(s, pc.NoBlockSpec) else s for s in flat]


def _check_same_structure(specs, full, is_leaf, name: str):
  """As JAX Pallas: in_specs has the inputs' structure exactly (one spec for a dict input is
  refused, not spread over its leaves). pallax also takes None, for the whole array, where the
  inputs have an array; an input that is None has one entry too (its spec is not used)."""
  spec_tree = jax.tree.structure(specs, is_leaf=is_leaf)
  # the specs' structure with each spec (or None) as a leaf, comparable with the inputs'
  got = jax.tree.structure(jax.tree.unflatten(spec_tree, [0] * spec_tree.num_leaves))
  # an input that is None (JAX's mha passes segment_ids=None) takes a spec (None) of its own
  want = jax.tree.structure(full, is_leaf=lambda x: x is None)
  if got == want:
    return
  errs = list(ji.tree_util.equality_errors_pytreedef(got, want))
  lines = [f"pallas_call {name}: Pytree for `in_specs` and `inputs` do not match. There are "
           f"{len(errs)} mismatches, including:"]
  for path, thing1, thing2, explanation in errs[:3]:
    where = f"at {ji.tree_util.keystr(path)}, " if path else ""
    lines.append(f"    * {where}`in_specs` is a {thing1} but `inputs` is a {thing2}, so {explanation}")
  lines.append("Pass one BlockSpec (or None, for the whole array) per array of the inputs.")
  raise ValueError("\n".join(lines))


def _prefix_error(specs, full, is_leaf, what: str, operands: str) -> str | None:
  """Where ``specs`` stops being a prefix of ``full``, with the key path named after ``what``
  (one line)."""
  errors = ji.tree_util.prefix_errors(specs, full, is_leaf=is_leaf)
  if not errors:
    return None
  return " ".join(str(errors[0](what)).split()).replace("the full pytree has",
                                                        f"the {operands} have")


def _block_shape(spec: pc.BlockSpec | None, shape: tuple, origin: str, name: str) -> tuple:
  """The spec's block shape in canonical form (the whole array without a spec)."""
  if spec is None or spec.block_shape is None:
    if any(ji.is_symbolic_dim(d) for d in shape):
      raise ValueError(   # JAX's words first: users match them
          f"pallas_call {name}: shape polymorphism for Pallas does not support dynamically-shaped "
          f"blocks. Block spec for {origin} has block_shape: {shape} (the whole array, whose shape "
          "is symbolic); give it a BlockSpec with static block sizes")
    return tuple(pc.Blocked(d) if d > 0 else pc.Blocked(1) for d in shape)
  if isinstance(spec.block_shape, (int, np.integer)) or not isinstance(spec.block_shape, Sequence):
    raise TypeError(f"pallas_call {name}: block_shape of {origin} must be a tuple, got {spec.block_shape!r}")
  if len(spec.block_shape) != len(shape):
    raise ValueError(   # JAX's words first: users match them
        f"pallas_call {name}: Block shape for {origin.replace('out[', 'outputs[')} "
        f"{tuple(spec.block_shape)} must have the same "
        f"number of dimensions as the array shape {shape}: it has {len(spec.block_shape)}, the "
        f"array {len(shape)}; give one block size per dimension (None to squeeze a dimension)")
  if any(ji.is_symbolic_dim(getattr(d, "block_size", d)) for d in spec.block_shape):
    raise ValueError(   # JAX's words first: users match them
        f"pallas_call {name}: shape polymorphism for Pallas does not support dynamically-shaped "
        f"blocks. Block spec for {origin} has block_shape: {tuple(spec.block_shape)}; give "
        "static block sizes")
  try:
    block_shape = tuple(pc.canonical_block_dim(d) for d in spec.block_shape)
  except TypeError as e:
    raise TypeError(f"pallas_call {name}: {origin}: {e}") from None
  for d in block_shape:
    if d.block_size <= 0:
      raise ValueError(f"pallas_call {name}: block sizes must be positive; {origin} has block_shape "
                       f"{tuple(spec.block_shape)}")
  return block_shape


def _block_mapping(spec: pc.BlockSpec | None, aval, origin: str, grid, index_avals,
                   name: str, debug: bool) -> BlockMapping:
  shape = tuple(aval.shape)
  block_shape = _block_shape(spec, shape, origin, name)
  index_map = None if spec is None else spec.index_map
  nd = len(shape)
  if index_map is None:
    index_map = lambda *_: (0,) * nd
  else:
    why = kernel_errors.bind_error(index_map, len(index_avals))
    if why is not None:
      extra = len(index_avals) - len(grid)
      raise TypeError(
          f"pallas_call {name}: {why}: the index_map of {origin} cannot take {len(index_avals)} positional "
          f"arguments (one per grid axis of grid {grid}"
          + (f" plus {extra} scalar-prefetch operands" if extra else "")
          + f"); its signature is {kernel_errors.signature_text(index_map)}")

  the_map = f"the index_map of {origin}" + (f" (at {kernel_errors.defined_at(index_map)})"
                                             if kernel_errors.defined_at(index_map) else "")
  where = kernel_errors.defined_at(index_map)
  map_name = getattr(index_map, "__name__", "index_map") + (f" at {where}" if where else "")

  def flat_index_map(*args):
    out = index_map(*args)
    out = tuple(out) if isinstance(out, list) else out
    if not isinstance(out, tuple):
      out = (out,) if nd == 1 else out
    if not isinstance(out, tuple) or len(out) != nd:
      n = len(out) if isinstance(out, (tuple, list)) else 1
      raise ValueError(   # JAX's words: users match them
          f"Index map function {map_name} for {origin} must return {nd} values to match the rank "
          f"of its block shape. Currently returning {n} values: one block index per dimension")
    for k, i in enumerate(out):
      _check_block_index(i, k, f"Index map function {map_name} for {origin}")
    return [jnp.asarray(i, jnp.int32) for i in out]

  try:
    jaxpr, _, consts = ji.trace_to_jaxpr(flat_index_map, index_avals, name=f"index_map of {origin}")
  except (ValueError, TypeError) as e:
    kernel_errors.reraise(e, f"pallas_call {name}")
  if any(isinstance(c, jax.core.Tracer) for c in consts):
    raise ValueError(f"pallas_call {name}: {the_map} closes over a traced value; "
                     "pass it as a scalar-prefetch operand instead")
  if consts:
    # As JAX Pallas: an index map computes block indices from the grid indices alone.
    raise ValueError(
        f"pallas_call {name}: Index map function {map_name} for {origin} must not capture "
        f"constants: "
        f"[{', '.join(jax.typeof(c).str_short() for c in consts)}]; compute the block index from "
        "the grid indices, or pass the table as a scalar-prefetch operand (PrefetchScalarGridSpec)")
  kernel_shape = tuple(d.block_size for d in block_shape if not isinstance(d, pc.Squeezed))
  ref = ji.ref_aval(kernel_shape, aval.dtype, getattr(spec, "memory_space", None))
  return BlockMapping(block_shape, ref, ji.closed(jaxpr, consts), None, ji.ShapedArray(shape, aval.dtype),
                      origin, pipeline_mode=getattr(spec, "pipeline_mode", None), debug=debug,
                      memory_space=getattr(spec, "memory_space", None))


def _check_block_index(i, k: int, the_map: str):
  """An index map's output ``k`` must be an integer scalar (as in JAX Pallas)."""
  if isinstance(i, (int, np.integer)) and not isinstance(i, bool):
    return
  dtype = getattr(i, "dtype", None)
  if getattr(i, "shape", None) == () and dtype is not None and jnp.issubdtype(dtype, jnp.integer):
    return
  what = jax.typeof(i).str_short() if dtype is not None else f"a {type(i).__name__}"
  raise ValueError(f"{the_map} must return integer scalars. Output[{k}] has type {what}: "
                   "return one integer block index per dimension")


def scratch_aval(s, name):
  if hasattr(s, "get_ref_aval"):
    return s.get_ref_aval()
  if isinstance(s, jax.ShapeDtypeStruct):
    return ji.ref_aval(s.shape, s.dtype)
  raise TypeError(f"pallas_call {name}: scratch_shapes entries must be scratch types such as "
                  f"pl.ANY((8, 128), jnp.float32), got {s!r}")


def _input_origins(in_tree, nidx: int, count: int) -> list[str]:
  """Each input's name in errors, as in JAX Pallas: its path in the arguments (``args[0]['one']``
  for a dict argument), or its position after the scalar-prefetch operands."""
  if nidx or in_tree.num_leaves != count:
    return [f"args[{nidx + i}]" for i in range(count)]
  leaves = jax.tree_util.tree_flatten_with_path(jax.tree.unflatten(in_tree, [0] * count))[0]
  return ["args" + ji.tree_util.keystr(path) for path, _ in leaves]


def operand_specs(grid_spec: pc.GridSpec, in_tree, n_in: int, out_tree, n_out: int, label: str):
  """One BlockSpec (or None: the whole operand) per flat input (after the scalar-prefetch
  operands) and per flat output."""
  if grid_spec.num_scalar_prefetch:   # the inputs' tree counts the scalar-prefetch operands
    in_tree = jax.tree.structure([0] * n_in)
  return (_flatten_specs(grid_spec.in_specs, in_tree, "in_specs", n_in, label),
          _flatten_specs(grid_spec.out_specs, out_tree, "out_specs", n_out, label))


def make_grid_mapping(name, grid_spec: pc.GridSpec, in_avals, in_tree, out_avals, out_tree,
                      debug=False, kernel=None) -> GridMapping:
  grid = _as_tuple_grid(grid_spec.grid, name)
  label = kernel_errors.label(name, kernel)
  nidx = grid_spec.num_scalar_prefetch
  index_avals = [ji.ref_aval(a.shape, a.dtype, pc.MemorySpace.INDEX) for a in in_avals[:nidx]]
  grid_avals = [ji.ShapedArray((), jnp.int32)] * len(grid)
  map_avals = grid_avals + index_avals
  ins = in_avals[nidx:]
  in_specs, out_specs = operand_specs(grid_spec, in_tree, len(ins), out_tree, len(out_avals), label)
  # a hi operand (JAX's hijax types) is cut into its component arrays, each with its own spec
  lo_ins = [lo for origin, s, a in zip(_input_origins(in_tree, nidx, len(ins)), in_specs, ins)
            for lo in hi_types.lower_spec(s, a, origin, name)]
  lo_outs = [lo for i, (s, a) in enumerate(zip(out_specs, out_avals))
             for lo in hi_types.lower_spec(s, a, f"out[{i}]", name)]
  bms = [_block_mapping(s, a, origin, grid, map_avals, name, debug)
         for s, a, origin in lo_ins + lo_outs]
  scratch = jax.tree.leaves(grid_spec.scratch_shapes, is_leaf=lambda s: hasattr(s, "get_ref_aval"))
  gm = GridMapping(
      grid=grid, grid_names=None, block_mappings=tuple(bms),
      index_map_tree=jax.tree.structure((tuple(map_avals), {})),
      index_map_avals=tuple(map_avals), vmapped_dims=(),
      scratch_avals=tuple(scratch_aval(s, name) for s in scratch),
      scratch_zeroed=tuple(getattr(s, "memory_space", None) is pc.MemorySpace.SEMAPHORE for s in scratch),
      num_index_operands=nidx, num_inputs=len(lo_ins), num_outputs=len(lo_outs), debug=debug)
  gm.check_invariants()
  return gm


# --- a leading grid axis (vmap, tiling) ---------------------------------------------------

def _batch_block_mapping(bm: BlockMapping, batched: bool, size: int) -> BlockMapping:
  old = bm.index_map_jaxpr
  def new_map(b, *args):
    idx = ji.eval_jaxpr(old, old.consts, *args)
    return ([b] if batched else []) + list(idx)
  jaxpr, _, consts = ji.trace_to_jaxpr(new_map, [ji.ShapedArray((), jnp.int32)] + list(old.in_avals))
  if not batched:
    return dataclasses.replace(bm, index_map_jaxpr=ji.closed(jaxpr, consts))
  return dataclasses.replace(
      bm, block_shape=(pc.squeezed,) + bm.block_shape, index_map_jaxpr=ji.closed(jaxpr, consts),
      array_aval=ji.ShapedArray((size,) + bm.array_aval.shape, bm.array_aval.dtype))


def with_leading_grid_axis(gm: GridMapping, size: int, batched, vmapped=True) -> GridMapping:
  """``gm`` with a new first grid axis of ``size``; each block operand k with ``batched[k]`` gets
  a new leading array dimension of that size, indexed by the new axis (the others ignore it).
  ``vmapped``: the axis is a batch axis that vmap added (GPU launches run it slowest)."""
  bms = tuple(_batch_block_mapping(bm, b, size) for bm, b in zip(gm.block_mappings, batched))
  map_avals = (ji.ShapedArray((), jnp.int32),) + tuple(gm.index_map_avals)
  return gm.replace(
      grid=(size,) + gm.grid, block_mappings=bms,
      index_map_tree=jax.tree.structure((map_avals, {})), index_map_avals=map_avals,
      vmapped_dims=(0,) * vmapped + tuple(d + 1 for d in gm.vmapped_dims),
      grid_names=None if gm.grid_names is None else ("vmap",) + tuple(gm.grid_names))

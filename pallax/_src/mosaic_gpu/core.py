"""Spec 003's types: memory spaces, barriers, the WGMMA accumulator, SMEM transforms, layouts,
``BlockSpec``, ``CompilerParams`` and ``Mesh``.

Transforms (tiling, swizzle) and layouts say how data sits in SMEM and registers, never what it
is: kernels see logical shapes, the interpreter checks the transforms' rules and otherwise ignores
them, and a GPU backend turns them into its own layouts.
"""
from __future__ import annotations

import dataclasses
import enum
from collections.abc import Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pallax._src import core as pc
from pallax._src import jax_internals as ji


class LoweringSemantics(enum.Enum):
  """How Mosaic lowers a kernel; pallax's semantics are the same for both."""
  Lane = enum.auto()
  Warpgroup = enum.auto()


class TraceScope(enum.Enum):
  WARP = "warp"
  WARPGROUP = "warpgroup"


class OOBFillMode(enum.IntEnum):
  """What a GMEM->SMEM copy reads past the array's end (pallax fills zeros for all three)."""
  UNDEFINED = 0
  PROMISE_IN_BOUNDS = 1
  ZEROS = 2


class CopyPartition:
  """Leader-tracked cluster copies that split or replicate a transfer over a pair of blocks
  (``copy_gmem_to_smem(..., leader_tracked=...)``; the interpreter runs them: clusters.py)."""

  @staticmethod
  def PARTITIONED(axis: int):   # noqa: N802 (JAX's spelling)
    return ("partitioned", axis)

  REPLICATED = ("replicated",)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CompilerParams(pc.CompilerParams):
  """Mosaic GPU compiler parameters (``plgpu.CompilerParams``); the same fields as JAX's."""
  BACKEND = "mosaic_gpu"
  # True: float32 exp, exp2, log, log2, sin, cos, tanh and logistic use the GPU's fast approximate
  # instructions, as in JAX; False: XLA's functions, bit for bit (docs/triton.md, "Float math").
  # The interpreter computes lax's functions either way.
  approx_math: bool = False
  dimension_semantics: Sequence[str] | None = None
  max_concurrent_steps: int = 1
  unsafe_no_auto_barriers: bool = False
  reduction_scratch_bytes: int = 128 * 4 * 4
  profile_space: int = 0
  profile_dir: str = ""
  profile_trace_scope: TraceScope = TraceScope.WARPGROUP
  profile_bounds_check: bool = False
  lowering_semantics: LoweringSemantics = LoweringSemantics.Warpgroup
  skip_device_barrier: bool = False

  def __post_init__(self):
    if self.dimension_semantics is not None:
      object.__setattr__(self, "dimension_semantics", tuple(self.dimension_semantics))
    if bool(self.profile_space) != bool(self.profile_dir):
      raise ValueError("plgpu.CompilerParams: set both profile_space and profile_dir, or neither")

  replace = dataclasses.replace


# --- SMEM transforms: physical layout, checked -----------------------------------------------

@dataclasses.dataclass(frozen=True)
class TilingTransform:
  """SMEM tiled by ``tiling`` over the trailing dimensions (a layout, not a change of shape)."""
  tiling: tuple[int, ...]

  def __post_init__(self):
    object.__setattr__(self, "tiling", tuple(int(t) for t in self.tiling))

  def check(self, shape, dtype, what: str):
    tail = shape[-len(self.tiling):]
    if len(shape) < len(self.tiling) or any(d % t for d, t in zip(tail, self.tiling)):
      raise ValueError(f"{what}: TilingTransform({self.tiling}) needs trailing dimensions that "
                       f"are multiples of the tiling, but the shape is {tuple(shape)}")


@dataclasses.dataclass(frozen=True)
class SwizzleTransform:
  """128-, 64- or 32-byte swizzled SMEM rows: the trailing dimension spans ``swizzle`` bytes."""
  swizzle: int

  def __post_init__(self):
    if self.swizzle not in (32, 64, 128):
      raise ValueError(f"Swizzle {self.swizzle} is not supported. Only 32, 64 and 128 are accepted.")

  def check(self, shape, dtype, what: str):
    elems = self.swizzle * 8 // (jnp.dtype(dtype).itemsize * 8)
    if shape and shape[-1] % elems:
      raise ValueError(f"{what}: SwizzleTransform({self.swizzle}) needs a trailing dimension that "
                       f"is a multiple of {elems} {jnp.dtype(dtype).name} elements, but the shape "
                       f"is {tuple(shape)}")


@dataclasses.dataclass(frozen=True)
class TransposeTransform:
  """A transposed SMEM layout (``ref.transpose(perm)`` transposes a Ref's view instead)."""
  permutation: tuple[int, ...]

  def check(self, shape, dtype, what: str):
    if sorted(self.permutation) != list(range(len(shape))):
      raise ValueError(f"{what}: TransposeTransform{self.permutation} is not a permutation of "
                       f"the {len(shape)} dimensions of {tuple(shape)}")


def check_transforms(transforms, shape, dtype, what: str):
  for t in transforms:
    if hasattr(t, "check"):
      t.check(tuple(shape), dtype, what)


# --- memory spaces and scratch types ---------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GPUMemoryRef(pc.MemoryRef):
  """A scratch buffer in GMEM, SMEM, TMEM or registers, with its SMEM transforms. ``alias``:
  set on the members of a ``RefUnion``: (their group's index, whether it is the union's first
  member), which is how the interpreter finds the buffers that share memory."""
  transforms: tuple = ()
  alias: tuple[int, bool] | None = None

  def get_ref_aval(self):
    check_transforms(self.transforms, self.shape, self.dtype, f"plgpu.{self.memory_space}")
    return ji.ref_aval(self.shape, self.dtype)


class MemorySpace(enum.Enum):
  GMEM = "gmem"
  SMEM = "smem"
  TMEM = "tmem"
  REGS = "regs"

  def __str__(self) -> str:
    return self.name

  def __call__(self, shape, dtype, *, transforms=(), packed=None, collective=None,
               layout=None) -> GPUMemoryRef:
    shape = tuple(int(d) for d in shape)
    if self is MemorySpace.TMEM:
      return tmem_type(shape, dtype, transforms, packed, collective, layout)
    if packed is not None or collective is not None or layout is not None:
      raise ValueError("packed, collective and layout arguments are only supported for TMEM.")
    return GPUMemoryRef(shape, jnp.dtype(dtype), self, tuple(transforms))

  def like(self, shape_dtype):
    return self(shape_dtype.shape, shape_dtype.dtype)


# --- tensor memory (Blackwell) ----------------------------------------------------------------

TMEM_ROWS = 128          # lanes of tensor memory
TMEM_MAX_COLS = 512      # 32-bit columns of a block's tensor memory
TMEM_COL_ALIGNMENT = 4   # each allocation starts at a multiple of 4 columns


@dataclasses.dataclass(frozen=True)
class TMEMType(GPUMemoryRef):
  """``plgpu.TMEM(shape, dtype)``: 128 (or 64) rows of tensor memory; ``packing`` elements of
  a narrow dtype share one 32-bit column (``packed=True``), ``collective`` allocations span
  the two blocks of a cluster pair, ``layout`` is a ``plgpu.TMEMLayout`` (scales, metadata)."""
  packing: int = 1
  collective: bool = False
  layout: Any = None

  @property
  def columns(self) -> int:
    """The 32-bit columns it takes (leading dimensions laid out side by side, as in JAX)."""
    rows, cols = self.shape[-2], int(np.prod(self.shape[:-2], dtype=int)) * self.shape[-1]
    if self.layout is not None:     # scales and sparsity metadata: a quarter of the rows a column
      return max(1, rows * cols // TMEM_ROWS)
    return rows * cols // TMEM_ROWS // self.packing


def tmem_type(shape, dtype, transforms, packed, collective, layout) -> TMEMType:
  """A TMEM scratch type, checked as JAX checks it."""
  dtype = jnp.dtype(dtype)
  if transforms:
    raise ValueError("transforms are not supported for TMEM")
  if len(shape) < 2:
    raise ValueError(f"TMEM can only represent 2D shapes, got {shape}")
  bits = dtype.itemsize * 8
  if layout is None and packed is None:
    if bits != 32:
      raise ValueError("dtypes narrower than 32-bit require either the packed argument or an "
                       f"explicit TMEM layout (plgpu.TMEM({shape}, {dtype.name}, packed=True))")
    packed = False
  if layout is not None and packed is not None:
    raise ValueError("packed cannot be specified if layout is specified.")
  packing = 32 // bits if packed else 1
  if layout is None and shape[-2] not in (TMEM_ROWS, TMEM_ROWS // 2):
    raise ValueError(f"Unsupported shape: {shape}. TMEM references must have either "
                     f"{TMEM_ROWS} or {TMEM_ROWS // 2} rows, but got {shape[-2]}.")
  if shape[-1] % packing:
    raise ValueError(f"Minor dimension of shape must be divisible by packing, got: {shape}")
  return TMEMType(shape, dtype, MemorySpace.TMEM, (), packing=packing,
                  collective=bool(collective), layout=layout)


GMEM = MemorySpace.GMEM
SMEM = MemorySpace.SMEM
TMEM = MemorySpace.TMEM
REGS = MemorySpace.REGS


class SemaphoreType(enum.Enum):
  """``plgpu.SemaphoreType.REGULAR`` (one semaphore) or ``.REGULAR((n,))``: int32 counters,
  starting at 0, for ``pl.semaphore_signal``/``pl.semaphore_wait``; as kernel scratch each
  block has its own, ``pl.get_global(...)`` makes one that all blocks share."""
  REGULAR = "regular"
  BARRIER = "barrier"

  def __call__(self, shape=()):
    return pc.SemaphoreType.REGULAR(tuple(shape))

  @property
  def shape(self) -> tuple[int, ...]:
    return ()

  @property
  def dtype(self):
    return self(()).dtype

  def get_ref_aval(self):
    return self(()).get_ref_aval()


BARRIER_DTYPE = jnp.dtype(jnp.int32)   # a barrier Ref's element type (never read as data)


def _barrier_shape(num_barriers) -> tuple[int, ...]:
  return (int(num_barriers),) if isinstance(num_barriers, (int, np.integer)) else tuple(num_barriers)


@dataclasses.dataclass(frozen=True)
class Barrier:
  """``num_barriers`` mbarriers, each completing a phase after ``num_arrivals`` arrivals (an
  arrival is a ``barrier_arrive`` or a ``copy_gmem_to_smem`` landing)."""
  num_arrivals: int = 1
  num_barriers: Any = ()
  orders_tensor_core: bool = False

  def __post_init__(self):
    if self.num_arrivals < 1:
      raise ValueError(f"Num arrivals must be at least 1, but got {self.num_arrivals}")
    object.__setattr__(self, "num_barriers", _barrier_shape(self.num_barriers))

  def get_array_aval(self):
    raise ValueError("Barriers are not arrays")

  def get_ref_aval(self):
    return ji.ref_aval(self.num_barriers, BARRIER_DTYPE)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClusterBarrier(Barrier):
  """A barrier of each block of a cluster: an arrival reaches the barrier of every block that
  differs from the arriving one along at most one of ``collective_axes`` (each completes a
  phase after ``num_arrivals`` arrivals from every such block: clusters.py)."""
  collective_axes: tuple = ()
  leader_tracked: bool = False


@dataclasses.dataclass(frozen=True)
class WGMMAAccumulatorRef:
  """``plgpu.ACC((m, n))``: a WGMMA accumulator in registers, zero-initialized by ``run_scoped``;
  ``ACC.init(x)`` starts it at ``x`` inside ``pl.run_state``."""
  shape: tuple[int, int]
  dtype: Any = jnp.float32
  _init: Any = dataclasses.field(default=ji.uninitialized, compare=False)

  def get_ref_aval(self):
    if self._init is not ji.uninitialized:
      raise ValueError("ACC.init(...) makes an initialized accumulator for pl.run_state only; "
                       "in run_scoped use plgpu.ACC(shape) (it starts at zero)")
    return ji.ref_aval(tuple(self.shape), jnp.dtype(self.dtype))

  @staticmethod
  def init(array):
    return WGMMAAccumulatorRef(tuple(array.shape), array.dtype, _init=array)


ACC = WGMMAAccumulatorRef
ji.register_ref_type(WGMMAAccumulatorRef, lambda r: (ji.ref_aval(r.shape, jnp.dtype(r.dtype)), r._init))


# --- unions of SMEM scratch ------------------------------------------------------------------

def _is_memory_ref(x) -> bool:
  return isinstance(x, GPUMemoryRef)


class RefUnion:
  """``plgpu.RefUnion(group0, group1, ...)``: SMEM scratch whose groups (each a pytree of
  ``plgpu.SMEM`` types) may share memory, for groups used at different times. The kernel gets
  a ``RefUnionRefs``: unpack it (``a, [b, c] = union`` or ``union[1]``) into the groups' Refs.

  As in JAX, how the groups overlap is not defined: a write through one group leaves the
  others' contents undefined (the interpreter checks that no Ref is read after a write
  through another group of its union, until it is written again)."""

  def __init__(self, *groups):
    leaves = jax.tree.leaves(groups, is_leaf=_is_memory_ref)
    if not leaves:
      raise ValueError("plgpu.RefUnion needs at least one plgpu.SMEM(...) member")
    for leaf in leaves:
      if not _is_memory_ref(leaf):
        raise TypeError(f"plgpu.RefUnion takes pytrees of plgpu.SMEM(...) types, got {leaf!r}")
      if leaf.memory_space not in (MemorySpace.SMEM, MemorySpace.TMEM):
        raise NotImplementedError(
            f"plgpu.RefUnion of {leaf.memory_space} Refs: pallax supports unions of SMEM "
            "or of TMEM Refs only")
    if len({leaf.memory_space for leaf in leaves}) > 1:
      raise ValueError("plgpu.RefUnion: all Refs of a union must be in one memory space (SMEM "
                       "or TMEM)")
    first = [True]

    def mark(g):
      def one(leaf):
        marked = dataclasses.replace(leaf, alias=(g, first[0]))
        first[0] = False
        return marked
      return one

    self.groups = tuple(jax.tree.map(mark(g), grp, is_leaf=_is_memory_ref)
                        for g, grp in enumerate(groups))

  def __repr__(self):
    return f"RefUnion{self.groups!r}"

  def __eq__(self, other):
    return isinstance(other, RefUnion) and self.groups == other.groups

  def __hash__(self):
    return hash(tuple(jax.tree.leaves(self.groups, is_leaf=_is_memory_ref)))


class RefUnionRefs:
  """The kernel's side of a ``plgpu.RefUnion``: a sequence of its groups' Refs."""

  def __init__(self, groups):
    self.groups = tuple(groups)

  def __iter__(self):
    return iter(self.groups)

  def __len__(self):
    return len(self.groups)

  def __getitem__(self, i):
    if not isinstance(i, int):
      raise TypeError(f"a plgpu.RefUnion is indexed by a group number, got {i!r}; unpack it "
                      "into its groups' Refs (a, [b] = union) and index those")
    return self.groups[i]

  def __setitem__(self, i, value):
    raise ValueError("Ref unions can't be assigned to: unpack the union into its groups' Refs "
                     "(a, [b] = union) and write to one of those")


def _union_unflatten(_, groups):
  leaves = jax.tree.leaves(groups, is_leaf=_is_memory_ref)
  if leaves and all(_is_memory_ref(x) for x in leaves):   # types: the RefUnion itself
    union = RefUnion.__new__(RefUnion)
    union.groups = tuple(groups)
    return union
  return RefUnionRefs(groups)


jax.tree_util.register_pytree_node(RefUnion, lambda u: (u.groups, None), _union_unflatten)


@dataclasses.dataclass(frozen=True)
class RefType:
  """A Ref argument type of ``plgpu.inline_mgpu`` (which pallax does not run)."""
  transforms: tuple = ()


# --- layouts: hints in pallax's semantics ----------------------------------------------------

class SomeLayout:
  def reduce(self, axes) -> "SomeLayout":
    return ReducedLayout(self, (axes,) if isinstance(axes, int) else tuple(axes))


@dataclasses.dataclass(frozen=True)
class ParameterizedLayout(SomeLayout):
  layout_cls: Any
  args: tuple
  kwargs: tuple


@dataclasses.dataclass(frozen=True)
class ReducedLayout(SomeLayout):
  layout: SomeLayout
  axes: tuple


class Layout(SomeLayout, enum.Enum):
  WGMMA = enum.auto()
  WGMMA_8BIT = enum.auto()
  WGMMA_UPCAST_2X = enum.auto()
  WGMMA_UPCAST_4X = enum.auto()
  WGMMA_TRANSPOSED = enum.auto()
  WG_SPLAT = enum.auto()
  WG_STRIDED = enum.auto()
  TILED = enum.auto()
  TCGEN05 = enum.auto()
  TCGEN05_TRANSPOSED = enum.auto()
  TCGEN05_M64_COLLECTIVE = enum.auto()
  TCGEN05_TMEM_NATIVE = enum.auto()
  TCGEN05_M64_COLLECTIVE_NATIVE = enum.auto()
  SMEM_GMEM_COPY = enum.auto()
  TMA_INDICES = enum.auto()
  TMA_INDICES_4 = enum.auto()
  MMA_LHS = enum.auto()
  MMA_RHS = enum.auto()
  MMA_ACC = enum.auto()
  _WGMMA_ACC_32BIT = enum.auto()       # JAX's spelling (a workaround it exposes)
  WGMMA_ACC_32BIT = _WGMMA_ACC_32BIT   # the same layout

  def __call__(self, *args, **kwargs) -> ParameterizedLayout:
    return ParameterizedLayout(self, tuple(args), tuple(sorted(kwargs.items())))


class TMEMLayout(enum.Enum):
  """Layouts of TMEM scratch (``plgpu.TMEM(..., layout=...)``): MMA scales, sparsity metadata,
  the two-block layouts (whose MMAs pallax does not run yet)."""
  SCALES_LAYOUT = enum.auto()
  SPARSE_METADATA_LAYOUT = enum.auto()
  M64_COLLECTIVE_LAYOUT = enum.auto()
  SCALES_M64_COLLECTIVE_LAYOUT = enum.auto()

  def __call__(self, *args, **kwargs) -> ParameterizedLayout:
    return ParameterizedLayout(self, tuple(args), tuple(sorted(kwargs.items())))


@dataclasses.dataclass(frozen=True)
class Tiling:
  tiles: tuple


@dataclasses.dataclass(frozen=True)
class Replicated:
  times: int


# --- specs and meshes ------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class BlockSpec(pc.BlockSpec):
  """A ``BlockSpec`` with SMEM transforms and pipelining options (``emit_pipeline``'s specs; in
  ``pallas_call`` the extras are layout hints)."""
  transforms: Sequence[Any] = ()
  delay_release: int = 0
  collective_axes: tuple[Hashable, ...] | None = None
  oob_fill_mode: OOBFillMode = OOBFillMode.ZEROS


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mesh:
  """``plgpu.Mesh``: a grid of blocks, each with ``num_threads`` warpgroup threads."""
  grid: tuple[int, ...] = ()
  grid_names: tuple[str, ...] = ()
  cluster: tuple[int, ...] = ()
  cluster_names: tuple[str, ...] = ()
  num_threads: int | None = None
  thread_name: str | None = None
  kernel_name: str | None = None

  def __post_init__(self):
    for f in ("grid", "grid_names", "cluster", "cluster_names"):
      object.__setattr__(self, f, tuple(getattr(self, f)))
    if len(self.cluster) > 3:
      raise ValueError(f"cluster= must be at most 3D, got {self}.")
    if len(self.grid_names) != len(self.grid):
      raise ValueError(f"grid_names must have the same length as grid, got {self}.")
    if len(self.cluster_names) != len(self.cluster):
      raise ValueError(f"cluster_names must have the same length as cluster, got {self}.")
    if (self.thread_name is None) != (self.num_threads is None):
      raise ValueError(f"num_threads and thread_name must be either both set or both None, got {self}")
    if self.num_threads is not None and not 1 <= self.num_threads <= 16:
      raise ValueError(f"num_threads must be in [1, 16] (each thread is a warpgroup of 128 CUDA "
                       f"threads), got {self}")

  def as_pallas_mesh(self):
    """(the grid as a pl.Mesh, the cluster and thread axes) for pl.kernel."""
    threads = ThreadInfo(tuple(zip(self.cluster_names, self.cluster)), self.num_threads or 1,
                         self.thread_name)
    return pc.Mesh(self.grid, self.grid_names), threads

  @property
  def shape(self) -> dict:
    names = (*self.grid_names, *self.cluster_names)
    sizes = (*self.grid, *self.cluster)
    if self.num_threads is not None:
      names, sizes = (*names, self.thread_name), (*sizes, self.num_threads)
    return dict(zip(names, sizes))


@dataclasses.dataclass(frozen=True)
class ThreadInfo:
  """What a Mosaic GPU kernel adds to a pallas_call: cluster and thread axes (names, sizes), and
  which of its outputs are ``pl.get_global`` buffers (zeros, in GMEM, every block's)."""
  cluster: tuple[tuple[str, int], ...] = ()
  num_threads: int = 1
  thread_name: str | None = None
  global_outputs: tuple[int, ...] = ()

  def with_global_outputs(self, outputs: tuple[int, ...]) -> "ThreadInfo":
    return dataclasses.replace(self, global_outputs=tuple(outputs))

  def axis_env(self) -> tuple[tuple[Hashable, int], ...]:
    thread = ((self.thread_name, self.num_threads),) if self.thread_name is not None else ()
    return self.cluster + thread


def shape_dtype_struct(shape, dtype, layout=None):
  """``plgpu.ShapeDtypeStruct``: a type with a register layout hint."""
  del layout
  return jax.ShapeDtypeStruct(tuple(shape), dtype)


def TryClusterCancelResult(num_buffers: int | None = None) -> GPUMemoryRef:  # noqa: N802 (JAX's name)
  """SMEM for the opaque 16-byte results of ``try_cluster_cancel`` (Blackwell cluster launch
  control): one of them, or ``num_buffers``."""
  shape = (16,) if num_buffers is None else (num_buffers, 16)
  return SMEM(shape, jnp.int8)

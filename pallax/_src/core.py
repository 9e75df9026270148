"""The user-facing specification types: BlockSpec, GridSpec, memory spaces, params.

These are plain frozen dataclasses; `grid_mapping.py` turns them into the
canonical form that backends read.
"""
from __future__ import annotations

import contextlib
import dataclasses
import enum
import threading
import traceback
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import numpy as np

from pallax._src import jax_internals as ji


# --- block dimensions ---------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Squeezed:
  """A block dimension of size 1 that is dropped inside the kernel."""
  block_size: int = dataclasses.field(default=1, init=False)


squeezed = Squeezed()


@dataclasses.dataclass(frozen=True)
class Blocked:
  """A block dimension indexed in units of blocks (the default)."""
  block_size: int


@dataclasses.dataclass(frozen=True)
class Element:
  """A block dimension whose index map returns an element offset, not a block index.

  ``padding=(low, high)`` pads the array along this dimension before slicing.
  """
  block_size: int
  padding: tuple[int, int] = (0, 0)


BlockDim = Squeezed | Blocked | Element


def canonical_block_dim(d) -> BlockDim:
  if d is None or d is squeezed or isinstance(d, Squeezed):
    return squeezed
  if isinstance(d, (Blocked, Element)):
    return d
  if isinstance(d, (int, np.integer)):
    return Blocked(int(d))
  raise TypeError(f"block_shape entries must be ints, None, pl.squeezed, "
                  f"pl.Blocked or pl.Element, got {d!r}")


# --- memory spaces and scratch types ------------------------------------------

@dataclasses.dataclass(frozen=True)
class MemoryRef:
  """The type of a scratch buffer: a shape, a dtype and a memory space."""
  shape: tuple[int, ...]
  dtype: Any
  memory_space: Any = None

  def get_ref_aval(self):
    return ji.ref_aval(self.shape, self.dtype, self.memory_space)


class MemorySpace(enum.Enum):
  """Logical, device-agnostic memory spaces; ``pl.ANY(shape, dtype)`` is a scratch type."""
  ANY = "any"
  DEFAULT = "default"
  ERROR = "error"
  INDEX = "index"
  KEY = "key"
  SEMAPHORE = "semaphore"

  def __call__(self, shape, dtype=None) -> MemoryRef:
    if self is MemorySpace.SEMAPHORE:
      dtype = np.int32 if dtype is None else dtype
    return MemoryRef(tuple(shape), jax.numpy.dtype(dtype), self)

  def __str__(self):
    return self.value


ANY = MemorySpace.ANY


class SemaphoreType(enum.Enum):
  """Semaphore scratch types; ``pl.SemaphoreType.REGULAR((2,))`` makes two counters."""
  REGULAR = "regular"
  BARRIER = "barrier"

  def __call__(self, shape=()) -> MemoryRef:
    return MemorySpace.SEMAPHORE(tuple(shape))


# --- specs -----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class BlockSpec:
  """How an operand is sliced into blocks for each program of the grid.

  ``index_map`` takes the grid indices (and scalar-prefetch refs) and returns
  one block index per dimension. ``None`` for ``block_shape`` means the whole
  array; ``None``/``pl.squeezed`` inside it drops that dimension in the kernel.
  """
  block_shape: Sequence[Any] | None = None
  index_map: Callable[..., Any] | None = None
  memory_space: Any = None
  pipeline_mode: Any = None

  def replace(self, **changes) -> "BlockSpec":
    """This spec with the fields in ``changes`` replaced (as JAX Pallas's ``BlockSpec.replace``)."""
    return dataclasses.replace(self, **changes)


class NoBlockSpec:
  def __repr__(self):
    return "no_block_spec"


no_block_spec = NoBlockSpec()


@dataclasses.dataclass(frozen=True)
class GridSpec:
  """The grid, the operands' block specs and the scratch buffers of a ``pallas_call``.

  A named grid, ``grid=(("i", 2), ("j", 4))`` as in JAX Pallas, is kept as its sizes in
  ``grid`` and its names in ``grid_names``; kernels see the names through
  ``lax.axis_index``/``lax.axis_size`` and ``pl.program_id(name)``.
  """
  grid: Any = ()
  in_specs: Any = no_block_spec
  out_specs: Any = no_block_spec
  scratch_shapes: Any = ()
  num_scalar_prefetch: int = 0
  grid_names: tuple[Hashable, ...] | None = None

  def __post_init__(self):
    if self.grid_names is None and _is_named_grid(self.grid):
      names, sizes = zip(*self.grid)
      object.__setattr__(self, "grid", tuple(sizes))
      object.__setattr__(self, "grid_names", tuple(names))


def _is_named_grid(grid) -> bool:
  """Whether every entry of ``grid`` is a (name, size) pair (a mix is left for the grid's
  check to refuse, with the kernel's name)."""
  return (isinstance(grid, (tuple, list)) and len(grid) > 0
          and all(isinstance(g, tuple) and len(g) == 2 for g in grid))


def PrefetchScalarGridSpec(num_scalar_prefetch, grid=(), in_specs=no_block_spec,
                           out_specs=no_block_spec, scratch_shapes=()):
  """A GridSpec whose first ``num_scalar_prefetch`` operands are passed whole to
  the index maps and the kernel (as in Pallas TPU)."""
  return GridSpec(grid, in_specs, out_specs, scratch_shapes, num_scalar_prefetch)


@dataclasses.dataclass(frozen=True)
class CompilerParams:
  """Backend compiler parameters; each backend subclasses this (``pallax.triton.CompilerParams``)."""
  BACKEND = "any"


@dataclasses.dataclass(frozen=True)
class CostEstimate:
  flops: int
  transcendentals: int
  bytes_accessed: int
  remote_bytes_transferred: int = 0


@dataclasses.dataclass(frozen=True)
class InterpretParams:
  """Options of the interpreter (``interpret=pl.InterpretParams(...)``).

  detect_races: report two concurrently running programs writing one element.
  check_bounds: check every Ref access against its block at run time.
  parallel: evaluate independent programs together (never changes a result).
  check_uninitialized: report values computed from output or scratch elements that no program
    wrote, and output elements that no program writes (doubles the interpreter's work). None:
    on where ``pl.enable_debug_checks()`` is on.
  """
  detect_races: bool = False
  check_bounds: bool = True
  parallel: bool = True
  check_uninitialized: bool | None = None


@dataclasses.dataclass(frozen=True)
class Mesh:
  """A mesh of programs for ``pl.kernel``/``pl.core_map``: one body run per point."""
  grid: tuple[int, ...]
  grid_names: tuple[Hashable, ...] = ()

  def __post_init__(self):
    object.__setattr__(self, "grid", tuple(int(g) for g in self.grid))
    names = tuple(self.grid_names) or tuple(f"axis{i}" for i in range(len(self.grid)))
    if len(names) != len(self.grid):
      raise ValueError(f"Mesh: {len(self.grid)} sizes but {len(names)} names")
    object.__setattr__(self, "grid_names", names)

  @property
  def shape(self):
    return dict(zip(self.grid_names, self.grid))


# --- debug checks -------------------------------------------------------------------

_debug_checks = threading.local()


def debug_checks_enabled() -> bool:
  return getattr(_debug_checks, "value", False)


class enable_debug_checks(contextlib.ContextDecorator):
  """Turns ``pl.debug_check`` on: ``pl.enable_debug_checks(True)`` or ``with pl.enable_debug_checks():``."""

  def __init__(self, value: bool = True):
    self._old = debug_checks_enabled()
    _debug_checks.value = bool(value)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    _debug_checks.value = self._old
    return False


# --- the kernel tracing context ------------------------------------------------------

@dataclasses.dataclass
class GridEnv:
  """What ``program_id``/``num_programs`` answer while a kernel body is traced."""
  kernel_name: str
  ids: tuple[Any, ...]        # tracers of the kernel jaxpr's grid-index inputs
  sizes: tuple[int, ...]
  names: tuple[Hashable, ...] = ()
  globals: Callable[[Any], Any] | None = None  # serves pl.get_global


_grid_envs = threading.local()


@contextlib.contextmanager
def grid_env(env: GridEnv):
  """In scope while a kernel body is traced. A JAX Pallas function called in the body (its
  ``program_id`` asserts that JAX Pallas's own grid is in scope) is reported as the mix it is."""
  stack = _grid_envs.__dict__.setdefault("stack", [])
  stack.append(env)
  try:
    yield
  except jax.errors.TracerBoolConversionError as e:
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not ji.is_library_file(f.filename)]
    at = f" at {frames[-1].filename}:{frames[-1].lineno} ({frames[-1].name})" if frames else ""
    raise TypeError(
        f"a Python if, while, and, or or bool() on a traced value{at}: values computed from "
        "pl.program_id, Refs or operands are known only when the kernel runs. Use "
        "@pl.when(condition) for a block that runs conditionally, jax.lax.cond or "
        "jax.lax.fori_loop for control flow, jnp.where for values") from None
  except Exception as e:
    found = ji.jax_pallas_call_in(traceback.extract_tb(e.__traceback__))
    if found is None:
      raise
    raise ValueError(
        f"the kernel calls {found[0]} of jax.experimental.pallas "
        f"at {found[1]}, inside a pallax "
        f"kernel ({type(e).__name__} from JAX Pallas: {str(e) or 'no message'}). JAX Pallas and "
        "pallax primitives do not mix in one kernel: import pallax in its place (import pallax "
        "as pl instead of from jax.experimental import pallas as pl; import pallax.triton as "
        "plgpu, import pallax.mosaic_gpu as plgpu)") from None
  finally:
    stack.pop()


def innermost_grid_env() -> GridEnv | None:
  """The grid of the kernel being traced (None outside kernels)."""
  stack = getattr(_grid_envs, "stack", [])
  return stack[-1] if stack else None


def current_grid_env(what: str) -> GridEnv:
  stack = getattr(_grid_envs, "stack", [])
  if not stack:
    caller = ji.jax_pallas_is_tracing(traceback.extract_stack())
    if caller is not None:
      raise ValueError(
          f"pallax's pl.{what} is called inside a kernel that jax.experimental.pallas traces "
          f"(its pallas_call is at {caller}). JAX Pallas and pallax primitives do not mix in "
          "one kernel: run the kernel with pallax (import pallax as pl where pallas_call is "
          "called), or use jax.experimental.pallas's own functions in it")
    raise RuntimeError(f"pl.{what} can only be called inside a kernel body "
                       "(a function run by pl.pallas_call or pl.kernel).")
  return stack[-1]


def axis_position(env: GridEnv, axis, what: str) -> int:
  if not isinstance(axis, (int, np.integer)):
    if axis in env.names:
      return env.names.index(axis)
    raise ValueError(f"pl.{what}({axis!r}): no such grid axis; "
                     f"the axes are {env.names or tuple(range(len(env.sizes)))}")
  axis = int(axis)
  if not 0 <= axis < len(env.sizes):
    raise ValueError(
        f"pl.{what}({axis}): the grid "
        f"{tuple(env.sizes)} has {len(env.sizes)} axes; use an axis in "
        f"[0, {len(env.sizes)}).")
  return axis

"""The Gluon layouts pallax chooses for a one-warpgroup kernel (4 warps), as data.

Layouts say where data sits, never what it is. A layout is a frozen dataclass that knows its
Gluon source (``text``); the writer declares each one once as a named constexpr. The choices
are local: a coalesced blocked layout for register tiles read from memory, the wgmma layout for
accumulators, an NVMMA-swizzled layout for every SMEM buffer (the widest swizzle its rows allow).
Which value gets which layout, and where they meet, is decided by ``assign.py`` before any
code is written.

Gluon tensors have powers of two in every dimension: a value or buffer of another shape is the
tensor of its shape rounded up (``padded``), and every layout here is that tensor's. The rules
keep the lanes past the logical shape from leaking (see ``values.py``).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from pallax._src.gpu.expr import pow2

WARPS = 4


def padded(shape) -> tuple:
  return tuple(pow2(d) for d in shape)


def is_pow2(n: int) -> bool:
  return n >= 1 and n & (n - 1) == 0


class Layout:
  """A Gluon layout. ``text(name)`` is its source, ``name`` giving the constexpr name of a
  layout it refers to (a slice's parent)."""
  kind = "other"      # "blocked", "wgmma", "other": what halving and rebuilding may assume
  registers = True    # a layout of register tensors (not of shared memory)

  def text(self, name: Callable[["Layout"], str]) -> str:
    raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Blocked(Layout):
  size_per_thread: tuple
  threads_per_warp: tuple
  warps_per_cta: tuple
  order: tuple
  kind = "blocked"

  def text(self, name) -> str:
    fields = (self.size_per_thread, self.threads_per_warp, self.warps_per_cta, self.order)
    return f"gl.BlockedLayout({', '.join(str(list(f)) for f in fields)})"


@dataclasses.dataclass(frozen=True)
class Wgmma(Layout):
  """The accumulator layout of a wgmma of instruction shape (16, n, k)."""
  n: int
  k: int
  kind = "wgmma"

  def text(self, name) -> str:
    return (f"gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[{WARPS}, 1], "
            f"instr_shape=[16, {self.n}, {self.k}])")


@dataclasses.dataclass(frozen=True)
class Slice(Layout):
  """The layout of a tensor with dimension ``dim`` of a ``parent`` tensor taken away."""
  dim: int
  parent: Layout

  def text(self, name) -> str:
    return f"gl.SliceLayout({self.dim}, {name(self.parent)})"


@dataclasses.dataclass(frozen=True)
class DotOperand(Layout):
  """The layout wgmma reads its register operand a in."""
  parent: Layout
  k_width: int

  def text(self, name) -> str:
    return f"gl.DotOperandLayout(operand_index=0, parent={name(self.parent)}, k_width={self.k_width})"


@dataclasses.dataclass(frozen=True)
class RowMajorShared(Layout):
  """An unswizzled row-major SMEM layout of ``rank`` dimensions (slices start anywhere)."""
  rank: int
  registers = False

  def text(self, name=None) -> str:
    return f"gl.SwizzledSharedLayout(1, 1, 1, order={list(reversed(range(self.rank)))})"


@dataclasses.dataclass(frozen=True)
class Shared(Layout):
  """The NVMMA (swizzled) layout of an SMEM matrix, written for ``rank`` dimensions."""
  swizzle: int
  bits: int
  rank: int
  registers = False

  def text(self, name=None, module: str = "gl.") -> str:
    return (f"{module}NVMMASharedLayout(swizzle_byte_width={self.swizzle}, "
            f"element_bitwidth={self.bits}, rank={self.rank})")


def _blocked_params(shape, dtype):
  vec = max(1, min(shape[-1] if shape else 1, 16 // np.dtype(dtype).itemsize))
  lanes_c = max(1, min(32, shape[-1] // vec)) if len(shape) > 1 else 32
  return vec, lanes_c, 32 // lanes_c


def blocked(shape, dtype) -> Blocked:
  """A coalesced layout: 16-byte vectors along the last dimension, warps along the first."""
  shape = padded(shape)
  vec, lanes_c, lanes_r = _blocked_params(shape, dtype)
  if len(shape) <= 1:
    return Blocked((vec,), (32,), (WARPS,), (0,))
  lead = (1,) * (len(shape) - 2)
  return Blocked(lead + (1, vec), lead + (lanes_r, lanes_c), lead + (WARPS, 1),
                 tuple(range(len(shape) - 1, -1, -1)))


def permuted(layout: Blocked, permutation) -> Blocked:
  """The layout of a ``layout`` tensor with its dimensions permuted (``tensor.permute``: dimension
  ``k`` of the result is ``permutation[k]`` of the operand): each thread holds the same elements,
  as Gluon infers it, no data moves."""
  new_dim = {old: new for new, old in enumerate(permutation)}
  pick = lambda fields: tuple(fields[old] for old in permutation)  # noqa: E731
  return Blocked(pick(layout.size_per_thread), pick(layout.threads_per_warp),
                 pick(layout.warps_per_cta), tuple(new_dim[d] for d in layout.order))


def coverage(layout: Layout, shape, dtype) -> tuple:
  """The extent of a layout's one repetition along each dimension of a 2-D tile: a dimension
  larger than that repeats in each thread's registers, so its halves are in the same thread."""
  if layout.kind == "wgmma":
    return (16 * WARPS, 8)       # 16 rows a warp; 2 of each 8 columns a thread
  vec, lanes_c, lanes_r = _blocked_params(padded(shape), dtype)
  return (lanes_r * WARPS, vec * lanes_c)


def wgmma(n: int, in_bits: int) -> Wgmma:
  """The accumulator layout of a wgmma with N = ``n`` (one instruction up to 256 wide)."""
  return Wgmma(pow2(n), 256 // in_bits)


def in_bits(layout: Wgmma) -> int:
  """The operand width of the wgmmas an accumulator layout is for."""
  return 256 // layout.k


def swizzle(shape, dtype) -> int:
  """The widest swizzle an SMEM matrix's rows allow (Gluon's default choice)."""
  shape = padded(shape)
  row_bytes = shape[-1] * np.dtype(dtype).itemsize
  if len(shape) < 2 or int(np.prod(shape[:-1])) < 8:
    return 0
  return next((s for s in (128, 64, 32) if row_bytes >= s and row_bytes % s == 0), 0)


def shared(shape, dtype, rank: int | None = None) -> Shared:
  """The NVMMA (swizzled) layout of an SMEM matrix (its last two dimensions), written for
  ``rank`` dimensions: a TMA box with unit dimensions sees the same bytes through a reshape."""
  block = padded(shape[-2:])
  return Shared(swizzle(block, dtype), np.dtype(dtype).itemsize * 8, rank or len(block))


BARRIER = "mbarrier.MBarrierLayout()"

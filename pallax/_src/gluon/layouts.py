"""The Gluon layouts pallax chooses for a one-warpgroup kernel (4 warps), as source text.

Layouts say where data sits, never what it is. This first version picks them locally: a
coalesced blocked layout for register tiles read from memory, the wgmma layout for accumulators,
an NVMMA-swizzled layout for every SMEM buffer (the widest swizzle its rows allow); a binary
operation between two layouts converts its second operand to the first's.

Gluon tensors have powers of two in every dimension: a value or buffer of another shape is the
tensor of its shape rounded up (``padded``), and every layout here is that tensor's. The rules
keep the lanes past the logical shape from leaking (see ``values.py``).
"""
from __future__ import annotations

import numpy as np

from pallax._src.gpu.expr import pow2

WARPS = 4


def padded(shape) -> tuple:
  return tuple(pow2(d) for d in shape)


def is_pow2(n: int) -> bool:
  return n >= 1 and n & (n - 1) == 0


def _blocked_params(shape, dtype):
  vec = max(1, min(shape[-1] if shape else 1, 16 // np.dtype(dtype).itemsize))
  lanes_c = max(1, min(32, shape[-1] // vec)) if len(shape) > 1 else 32
  return vec, lanes_c, 32 // lanes_c


def blocked(shape, dtype) -> str:
  """A coalesced layout: 16-byte vectors along the last dimension, warps along the first."""
  shape = padded(shape)
  vec, lanes_c, lanes_r = _blocked_params(shape, dtype)
  if len(shape) <= 1:
    return f"gl.BlockedLayout([{vec}], [32], [{WARPS}], [0])"
  lead = len(shape) - 2
  spt = [1] * lead + [1, vec]
  tpw = [1] * lead + [lanes_r, lanes_c]
  wpc = [1] * lead + [WARPS, 1]
  order = list(range(len(shape) - 1, -1, -1))
  return f"gl.BlockedLayout({spt}, {tpw}, {wpc}, {order})"


def coverage(kind: str, shape, dtype) -> tuple:
  """The extent of a layout's one repetition along each dimension of a 2-D tile: a dimension
  larger than that repeats in each thread's registers, so its halves are in the same thread."""
  if kind == "wgmma":
    return (16 * WARPS, 8)       # 16 rows a warp; 2 of each 8 columns a thread
  vec, lanes_c, lanes_r = _blocked_params(padded(shape), dtype)
  return (lanes_r * WARPS, vec * lanes_c)


def wgmma(n: int, in_bits: int) -> str:
  """The accumulator layout of a wgmma with N = ``n`` (one instruction up to 256 wide)."""
  k = 256 // in_bits
  return f"gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[{WARPS}, 1], instr_shape=[16, {pow2(n)}, {k}])"


def swizzle(shape, dtype) -> int:
  """The widest swizzle an SMEM matrix's rows allow (Gluon's default choice)."""
  shape = padded(shape)
  row_bytes = shape[-1] * np.dtype(dtype).itemsize
  if len(shape) < 2 or int(np.prod(shape[:-1])) < 8:
    return 0
  return next((s for s in (128, 64, 32) if row_bytes >= s and row_bytes % s == 0), 0)


def shared(shape, dtype, rank: int | None = None) -> str:
  """The NVMMA (swizzled) layout of an SMEM matrix (its last two dimensions), written for
  ``rank`` dimensions: a TMA box with unit dimensions sees the same bytes through a reshape."""
  block = padded(shape[-2:])
  bits = np.dtype(dtype).itemsize * 8
  return (f"gl.NVMMASharedLayout(swizzle_byte_width={swizzle(block, dtype)}, element_bitwidth={bits}, "
          f"rank={rank or len(block)})")


BARRIER = "mbarrier.MBarrierLayout()"

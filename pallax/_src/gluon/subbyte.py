"""Sub-byte types (int4, uint4, int2, uint2, float4_e2m1fn) in generated Gluon.

In GMEM, XLA packs them: element i of an int4 array is bits 4*(i%2) .. 4*(i%2)+3 of byte i//2
(the even element in the low nibble). In registers a sub-byte integer takes a byte
(``gpu/subbyte.py``): int8 for the signed types, uint8 for the unsigned ones. A register load of
GMEM reads the byte of each element and shifts its bits down; a conversion to a sub-byte type
keeps the type's low bits, sign-extended for the signed types, as lax's conversion wraps.

SMEM holds them packed as in GMEM: a buffer is allocated as the bytes of its rows (uint8, the
last dimension divided by the values a byte), TMA copies move those bytes, and Blackwell's
block-scaled MMA reads float4 operands so (``blackwell.tcgen05_mma_scaled``, ``"e2m1"``).
Views of such a buffer index bytes (``byte_view``). What the backend does not read or write
packed (register stores into GMEM, register loads and stores of SMEM, float4 in registers) is
refused by name.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from pallax._src import jax_internals as ji
from pallax._src.gluon.values import I32, dtype_token, i32
from pallax._src.gpu import expr as ex
from pallax._src.gpu import subbyte
from pallax._src.gpu.expr import binary, call, method


# The refusal of what the backend does not read or write packed: (what, its type).
UNWRITTEN = ("{0} of {1}, packed two or four values a byte: pallax's Gluon backend moves "
             "packed SMEM by TMA and MMAs only, and reads sub-byte integers into registers from "
             "GMEM only; use int8 where registers need the values (x.astype(jnp.int8)), or run "
             "the kernel in the interpreter")


FLOAT4 = np.dtype(ml_dtypes.float4_e2m1fn)
BYTES = np.dtype(np.uint8)   # what SMEM buffers and TMA descriptors of packed types hold


def is_packed(dtype) -> bool:
  """A sub-byte integer (registers hold it in a byte)."""
  return subbyte.is_subbyte(dtype)


def in_bytes(dtype) -> bool:
  """Held packed in GMEM and SMEM: the sub-byte integers and float4."""
  return is_packed(dtype) or (dtype is not None and np.dtype(dtype) == FLOAT4)


def values_per_byte(dtype) -> int:
  return 2 if np.dtype(dtype) == FLOAT4 else per_byte(dtype)


def byte_shape(shape, dtype) -> tuple | None:
  """The bytes of an array of ``shape`` packed (the last dimension divided), or None where
  its rows do not end on a byte."""
  k = values_per_byte(dtype)
  if not shape or shape[-1] % k:
    return None
  return (*shape[:-1], shape[-1] // k)


def as_bytes(shape, dtype) -> tuple[tuple, np.dtype, np.dtype | None]:
  """(shape, dtype, the packed type or None) an SMEM buffer of ``shape`` and ``dtype`` is
  allocated with: a packed type's bytes, where its rows end on a byte; else as it is."""
  stored = byte_shape(shape, dtype) if in_bytes(dtype) else None
  return (stored, BYTES, np.dtype(dtype)) if stored else (shape, dtype, None)


def byte_view(transforms, shape: tuple, per: int) -> list | None:
  """``transforms`` of a view of packed bytes of ``shape`` (bytes), ``per`` values a byte along
  the last dimension, made to index the bytes: slices of that dimension (wherever transposes
  moved it) in bytes. None where one does not start and end on a byte, or indexes one value."""
  shape, dim, out = list(shape), len(shape) - 1, []
  for t in transforms:
    if isinstance(t, ji.TransposeRef):
      dim, shape = list(t.permutation).index(dim), [shape[p] for p in t.permutation]
      out.append(t)
      continue
    if not isinstance(t, ji.NDIndexer):
      out.append(t)
      continue
    indices, new_shape, new_dim = list(t.indices), [], None
    for k, idx in enumerate(indices):
      if k == dim:
        start = getattr(idx, "start", None)
        start = getattr(start, "value", start)
        if not isinstance(idx, ji.Slice) or not isinstance(start, (int, np.integer)) or \
            start % per or idx.size % per or idx.stride != 1:
          return None
        indices[k], new_dim = ji.Slice(int(start) // per, idx.size // per, 1), len(new_shape)
      if isinstance(indices[k], ji.Slice):
        new_shape.append(indices[k].size)
    out.append(ji.NDIndexer(tuple(indices), tuple(shape), t.int_indexer_shape))
    shape, dim = new_shape, new_dim
  return out


def holds(dtype, new) -> bool:
  """Whether a register value of sub-byte ``dtype`` is already ``new`` (int4 in its int8)."""
  return is_packed(dtype) and subbyte.storage(dtype) == np.dtype(new)


def per_byte(dtype) -> int:
  return 8 // subbyte.bits(dtype)


def signature_type(dtype) -> str:
  """The kernel parameter's type: a packed array is passed as a pointer to its bytes."""
  return ex.SIGNATURE[(subbyte.storage(dtype) if is_packed(dtype) else BYTES).name]


def _as_i32(x: ex.Expr) -> ex.Expr:
  return x if np.dtype(x.dtype) == I32 else method(x, "to", dtype_token(I32), dtype=I32)


def wrap(x: ex.Expr, new) -> ex.Expr:
  """``x`` (an integer or bool, or a float already in range) as sub-byte ``new``: its low bits,
  sign-extended for the signed types, in the byte that holds the value in registers."""
  b = subbyte.bits(new)
  v = _as_i32(x)
  if subbyte.storage(new) == np.int8:
    v = binary(">>", binary("<<", v, i32(32 - b)), i32(32 - b))
  else:
    v = binary("&", v, i32((1 << b) - 1))
  return method(v, "to", dtype_token(subbyte.storage(new)), dtype=np.dtype(new))


def load_gmem(gen, ptr: str, offsets: ex.Expr, dtype, mask) -> ex.Expr:
  """The values of packed array ``ptr`` at element ``offsets`` (a tensor, or a scalar), read
  through the bytes that hold them; ``mask``: the lanes to read (None: all)."""
  k, b = per_byte(dtype), subbyte.bits(dtype)
  byte_offsets = ex.binary("//", offsets, i32(k)) if not ex.is_zero(offsets) else offsets
  ptrs = gen.bind(ex.add(ex.Name(ptr, dtype=subbyte.storage(dtype)), byte_offsets), "byte_ptrs")
  masks = {} if mask is None else {"mask": mask, "other": i32(0)}
  byte = gen.bind(_as_i32(call("gl.load", ptrs, dtype=subbyte.storage(dtype), shape=offsets.shape,
                               **masks)), "byte")
  if not ex.is_zero(offsets):   # the element's bits at the bottom
    byte = gen.bind(binary(">>", byte, ex.binary("*", ex.binary("%", offsets, i32(k)), i32(b))), "bits")
  return wrap(byte, dtype)

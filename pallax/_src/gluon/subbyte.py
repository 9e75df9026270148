"""Sub-byte integers (int4, uint4, int2, uint2) in generated Gluon.

In GMEM, XLA packs them: element i of an int4 array is bits 4*(i%2) .. 4*(i%2)+3 of byte i//2
(the even element in the low nibble). In registers a value takes a byte (``gpu/subbyte.py``):
int8 for the signed types, uint8 for the unsigned ones. A register load of GMEM reads the byte
of each element and shifts its bits down; a conversion to a sub-byte type keeps the type's low
bits, sign-extended for the signed types, as lax's conversion wraps. What the backend does not
read or write packed (register stores into GMEM, SMEM buffers, TMA copies) is refused by name.
"""
from __future__ import annotations

import numpy as np

from pallax._src.gluon.values import I32, dtype_token, i32
from pallax._src.gpu import expr as ex
from pallax._src.gpu import subbyte
from pallax._src.gpu.expr import binary, call, method


# The refusal of what the backend does not read or write packed: (what, its type).
UNWRITTEN = ("{0} of {1}, packed two or four values a byte: pallax's Gluon backend reads "
             "sub-byte values from GMEM into registers only; use int8 there "
             "(x.astype(jnp.int8)) and convert in registers, or run the kernel in the interpreter")


def is_packed(dtype) -> bool:
  return subbyte.is_subbyte(dtype)


def holds(dtype, new) -> bool:
  """Whether a register value of sub-byte ``dtype`` is already ``new`` (int4 in its int8)."""
  return is_packed(dtype) and subbyte.storage(dtype) == np.dtype(new)


def per_byte(dtype) -> int:
  return 8 // subbyte.bits(dtype)


def signature_type(dtype) -> str:
  """The kernel parameter's type: a packed array is passed as a pointer to its bytes."""
  return ex.SIGNATURE[subbyte.storage(dtype).name]


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

"""Sub-byte integers (int4, uint4, int2, uint2) in generated Triton.

In global memory XLA packs them: element i of an int4 array is bits 4*(i%2) .. 4*(i%2)+3 of
byte i//2 (the even element in the low nibble), as JAX's Triton lowering reads them. In registers
a value takes a byte (gpu/subbyte.py): loads unpack, stores pack pairs of neighbours, and a
conversion to the type wraps to its bits, as lax's conversion does.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from pallax._src.gpu import expr as ex
from pallax._src.gpu import subbyte
from pallax._src.gpu.source import Unsupported
from pallax._src.triton import lang as tl

U8 = np.dtype(np.uint8)


def per_byte(dtype) -> int:
  return 8 // subbyte.bits(dtype)


def wrap(x: ex.Expr, new) -> ex.Expr:
  """``x`` (an integer, bool, or a float already in range) converted to sub-byte ``new``: its low
  bits, sign-extended for the signed types."""
  b = subbyte.bits(new)
  v = x if np.dtype(x.dtype) == tl.I32 else tl.to(x, tl.I32)
  if subbyte.storage(new) == np.int8:
    v = ex.binary(">>", ex.binary("<<", v, tl.i32(32 - b)), tl.i32(32 - b))
  else:
    v = ex.binary("&", v, tl.i32((1 << b) - 1))
  return tl.to(v, new)


def load(ptr: ex.Expr, offs: ex.Expr, dtype, shape, mask, hints: dict) -> ex.Expr:
  """The values at element offsets ``offs`` of a packed array at ``ptr``, unpacked."""
  k = per_byte(dtype)
  b = subbyte.bits(dtype)
  kwargs = {"mask": mask, "other": tl.i32(0)} if mask is not None else {}
  byte_offs = ex.binary("//", offs, tl.i32(k)) if not ex.is_zero(offs) else offs
  addr = ptr if ex.is_zero(byte_offs) else ex.binary("+", ptr, byte_offs)
  byte = tl.to(ex.call("tl.load", addr, dtype=U8, shape=shape, **kwargs, **hints), tl.I32)
  if not ex.is_zero(offs):
    o32 = offs if np.dtype(offs.dtype) == tl.I32 else tl.to(offs, tl.I32)
    shift = ex.binary("*", ex.binary("%", o32, tl.i32(k)), tl.i32(b))
    byte = ex.binary(">>", byte, shift)
  return wrap(byte, dtype)


def byte_view(ref, what: str):
  """The bytes that a store to Ref view ``ref`` of a packed array writes whole: the view with its
  last axis counted in bytes. Unsupported unless the view covers whole bytes of that axis."""
  k = per_byte(ref.dtype)
  last = ref.dims[-1] if ref.dims else None
  whole_bytes = (last is not None and not ref.gather and last.kept and last.stride == 1
                 and last.step == 1 and last.index is None and last.size % k == 0
                 and last.array_size % k == 0 and _multiple(last.start, k))
  if not whole_bytes:
    raise Unsupported(
        f"a store to {what} ({np.dtype(ref.dtype).name}, {k} values per byte in memory) that does not "
        f"write whole bytes: the last axis must be stored contiguously, starting at a multiple of "
        f"{k} and {k} values at a time (store a wider block, or use int8)")
  dims = [dataclasses.replace(d, stride=d.stride // k) for d in ref.dims[:-1]]
  dims.append(dataclasses.replace(last, start=_divide(last.start, k), size=last.size // k,
                                  array_size=last.array_size // k))
  return dataclasses.replace(ref, dtype=U8, dims=tuple(dims))


def pack(val: ex.Expr, dtype) -> ex.Expr:
  """``val`` (..., n) as (..., n/k) bytes, k neighbours per byte, the first in the low bits."""
  k, b = per_byte(dtype), subbyte.bits(dtype)
  *lead, n = val.shape
  v = ex.binary("&", tl.to(val, tl.I32), tl.i32((1 << b) - 1))
  grouped = (*lead, n // k, k)
  v = ex.call("tl.reshape", v, tl.shape_token([ex.pow2(s) for s in grouped]), dtype=tl.I32, shape=grouped)
  shifts = ex.binary("*", tl.expand(tl.arange(k), len(grouped) - 1, len(grouped)), tl.i32(b))
  v = ex.binary("<<", v, shifts)
  total = ex.call("tl.sum", v, axis=tl.i32(len(grouped) - 1), dtype=tl.I32, shape=(*lead, n // k))
  return tl.to(total, U8)


def _multiple(e: ex.Expr, k: int) -> bool:
  """Whether index expression ``e`` is a multiple of ``k`` for every value of its names."""
  lit = ex.literal(e)
  if lit is not None:
    return int(lit) % k == 0
  if isinstance(e, ex.Op) and e.op == "*":
    return any(_multiple(a, k) for a in e.args)
  if isinstance(e, ex.Op) and e.op in ("+", "-"):
    return all(_multiple(a, k) for a in e.args)
  return False


def _divide(e: ex.Expr, k: int) -> ex.Expr:
  """``e // k`` for an ``e`` that ``_multiple`` found a multiple of ``k``."""
  lit = ex.literal(e)
  if lit is not None:
    return ex.index_literal(int(lit) // k, e)
  return ex.binary("//", e, tl.i32(k))

"""Constructors of ``triton.language`` expressions (typed nodes of ``gpu/expr.py``)."""
from __future__ import annotations

import numpy as np

from pallax._src.gpu import expr as ex
from pallax._src.gpu.expr import Lit, Token, binary, call, method

I32 = np.dtype(np.int32)
BOOL = np.dtype(np.bool_)
F32 = np.dtype(np.float32)
render = ex.Renderer("tl")


def dtype(d) -> Token:
  return Token(ex.dtype_name(d, "tl"))


def i32(n: int) -> Lit:
  return Lit(int(n), dtype=I32)


def tensor(e: ex.Expr) -> ex.Expr:
  """``e`` as a Triton tensor: a literal becomes a typed scalar (Python numbers have no methods)."""
  if isinstance(e, Lit):
    ex.check_fits(e)   # written out here, not by the renderer: the same check
    return call("tl.full", Token("[]"), Token(ex.literal_text(e.value)), dtype(e.dtype), dtype=e.dtype)
  return e


def to(e: ex.Expr, d, bitcast: bool = False) -> ex.Expr:
  kw = {"bitcast": True} if bitcast else {}
  return method(tensor(e), "to", dtype(d), dtype=np.dtype(d), **kw)


def arange(n: int) -> ex.Expr:
  return call("tl.arange", i32(0), i32(n), dtype=I32, shape=(n,))


def expand(e: ex.Expr, kept, rank: int) -> ex.Expr:
  """``e`` with its dimensions placed at positions ``kept`` of a ``rank``-d tensor (new axes of
  size 1 elsewhere)."""
  kept = {kept} if isinstance(kept, int) else set(kept)
  if len(kept) == rank:
    return e
  index = tuple(slice(None) if i in kept else None for i in range(rank))
  sizes = iter(e.shape)
  shape = tuple(next(sizes) if i in kept else 1 for i in range(rank))
  return ex.Subscript(e, index, dtype=e.dtype, shape=shape)


def shape_token(shape) -> Token:
  return Token(str([int(s) for s in shape]))


def full(shape, value: ex.Expr, d) -> ex.Expr:
  """A tensor of the padded ``shape`` filled with the scalar ``value``."""
  padded = [ex.pow2(s) for s in shape]
  return call("tl.full", shape_token(padded), value, dtype(d), dtype=np.dtype(d), shape=shape)


def where(c: ex.Expr, a: ex.Expr, b: ex.Expr, d=None) -> ex.Expr:
  shape = ex.broadcast_shapes(ex.broadcast_shapes(c.shape, a.shape), b.shape)
  return call("tl.where", c, a, b, dtype=np.dtype(d) if d is not None else a.dtype, shape=shape)


def compare(op: str, a: ex.Expr, b: ex.Expr) -> ex.Expr:
  return binary(op, a, b, dtype=BOOL)


def all_of(conds: list) -> ex.Expr | None:
  """``c0 & c1 & ...`` (None for none)."""
  out = None
  for c in conds:
    out = c if out is None else binary("&", out, c, dtype=BOOL)
  return out

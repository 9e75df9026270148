"""Gluon rules of ``lax.reshape`` on register values: a scalar made a tile of ones (a splat), a
tile of one element made a scalar, and reshapes between shapes whose dimensions are all powers
of two (Gluon's reshape; pallax pads other shapes, and padding does not reshape); and of
``lax.transpose`` (Gluon's permute: padding lies at the end of each dimension, so a padded
tile's permute is the padded tile of its transpose)."""
from __future__ import annotations

import numpy as np
from jax import lax

from pallax._src.gluon import layouts as L
from pallax._src.gluon.assign import Val, layout_rule
from pallax._src.gluon.writer import rule
from pallax._src.gpu import expr as ex
from pallax._src.gpu.expr import call


def _unpadded(shape) -> bool:
  return tuple(L.padded(shape)) == tuple(shape)


def _unit_dims_only(a, b) -> bool:
  """Whether shapes ``a`` and ``b`` differ by dimensions of one only (a squeeze or an
  expand_dims, which padding to powers of two does not disturb)."""
  return [d for d in a if d != 1] == [d for d in b if d != 1]


@rule(lax.reshape_p)
def _reshape(ctx, x, *, new_sizes, dimensions, **_):
  gen, shape = ctx.gen, tuple(new_sizes)
  if dimensions is not None:
    gen.unsupported("reshapes that transpose (lax.reshape(..., dimensions=...))")
  if not x.shape:   # a scalar as a tile of ones: a splat, as broadcast_in_dim writes it
    return gen.unwritten(ctx.eqn, lambda new: gen.splat(x, shape, new)) or \
        gen.splat(x, shape, gen.declared(gen.assigned(ctx.eqn.outvars[0])))
  if not shape:   # the one element of a tile as a scalar
    if x.dtype == np.bool_:
      x = gen.value(ex.method(x, "to", ex.Token("gl.int32"), dtype=np.dtype(np.int32), shape=x.shape),
                    gen.layout_of(x))
    flat = ex.method(x, "reshape", ex.Token("[1]"), dtype=x.dtype, shape=(1,))
    one = gen.bind(call("gl.sum", flat, ex.Lit(0, dtype=np.dtype(np.int32)), dtype=x.dtype, shape=()), "one")
    if ctx.out.dtype == np.bool_:
      one = gen.bind(ex.binary("!=", one, ex.Lit(0, dtype=np.dtype(np.int32)), dtype=np.dtype(np.bool_)), "one")
    return one
  if not (_unpadded(x.shape) and _unpadded(shape)) and not _unit_dims_only(x.shape, shape):
    gen.unsupported(f"reshaping a register value of shape {x.shape} to {shape} (shapes whose "
                    "dimensions are all powers of two, or dimensions of one added or dropped, only)")
  layout = gen.declared(gen.assigned(ctx.eqn.outvars[0]))
  padded = str(list(L.padded(shape)))   # (padding lanes stay padding where only ones move)
  reshaped = gen.bind(ex.method(x, "reshape", ex.Token(padded), dtype=x.dtype, shape=shape),
                      "reshaped")
  return gen.value(call("gl.convert_layout", reshaped, ex.Token(gen.layout(layout)), dtype=x.dtype,
                        shape=shape), layout)


@layout_rule(lax.reshape_p)
def _reshape_layouts(ctx, x, *, new_sizes, dimensions, **_):
  shape, dtype = tuple(new_sizes), np.dtype(ctx.out.dtype)
  if not getattr(x, "shape", ()):
    return Val(shape, dtype, L.blocked(shape, dtype), ("splat",))
  if not shape:
    return Val((), dtype, None)
  return Val(shape, dtype, L.blocked(shape, dtype))


@rule(lax.transpose_p)
def _transpose(ctx, x, *, permutation):
  """``x`` with its dimensions permuted: in a blocked layout, whose permute is the permuted
  blocked layout (each thread keeps its elements); another layout is converted first."""
  gen, permutation = ctx.gen, tuple(permutation)
  if permutation == tuple(range(len(permutation))):
    return x
  if gen.layout_of(x) is None:
    gen.unsupported("transposes of register values without a layout")
  before, after = gen.facts(ctx.eqn)
  if before is not None:
    x = gen.convert(x, gen.declared(before))
  shape = tuple(x.shape[d] for d in permutation)
  return gen.value(ex.method(x, "permute", ex.Token(str(permutation)), shape=shape), after)


@layout_rule(lax.transpose_p)
def _transpose_layouts(ctx, x, *, permutation):
  """(the layout ``x`` is converted to first or None, the result's layout): a blocked tile is
  permuted as it is; a tile in another layout (a wgmma accumulator's, a slice) is converted to
  the blocked layout whose permute is the coalesced layout of the result."""
  permutation = tuple(permutation)
  if permutation == tuple(range(len(permutation))):
    return x
  if not isinstance(x, Val) or x.layout is None:
    return None   # the writer refuses it
  before = None
  if not isinstance(x.layout, L.Blocked):
    inverse = tuple(int(d) for d in np.argsort(permutation))
    before = L.permuted(L.blocked(ctx.out.shape, x.dtype), inverse)
    x = ctx.a.convert(x, before)
  after = L.permuted(x.layout, permutation)
  ctx.facts((before, after))
  return Val(tuple(ctx.out.shape), x.dtype, after)

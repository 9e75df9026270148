"""Triton rules for shapes: iota, broadcasts, reshapes, transposes (on padded tensors)."""
from __future__ import annotations

import numpy as np
from jax import lax

from pallax._src import jax_internals as ji
from pallax._src.gpu import expr as ex
from pallax._src.gpu.expr import call
from pallax._src.triton import lang as tl
from pallax._src.triton.writer import rule


@rule(lax.iota_p, hint="iota")
def _iota(ctx, dtype, shape, dimension, sharding):
  padded = [ex.pow2(s) for s in shape]
  e = tl.arange(padded[dimension])
  if len(padded) > 1:
    e = call("tl.broadcast_to", tl.expand(e, dimension, len(padded)), tl.shape_token(padded),
             dtype=tl.I32, shape=shape)
  return e if np.dtype(dtype) == np.int32 else tl.to(e, dtype)


def _full(ctx, x):
  return tl.full(ctx.out.shape, x, x.dtype)


@rule(lax.broadcast_in_dim_p, hint="bcast")
def _broadcast_in_dim(ctx, x, *dyn, shape, broadcast_dimensions, sharding):
  if x.shape == ():
    return _full(ctx, x)
  target = [ex.pow2(s) for s in shape]
  e = tl.expand(x, broadcast_dimensions, len(target))
  if tuple(x.padded) != tuple(target[d] for d in broadcast_dimensions) or \
      len(broadcast_dimensions) != len(target):
    e = call("tl.broadcast_to", e, tl.shape_token(target), dtype=x.dtype, shape=shape)
  return e


@rule(ji.broadcast_to_p, hint="bcast")
def _broadcast_to(ctx, x, **_):
  if x.shape == ():
    return _full(ctx, x)
  shape = ctx.out.shape
  target = [ex.pow2(s) for s in shape]
  if len(x.shape) != len(target):
    x = tl.expand(x, range(len(target) - len(x.shape), len(target)), len(target))
  return call("tl.broadcast_to", x, tl.shape_token(target), dtype=x.dtype, shape=shape)


def _reshape(ctx, x):
  shape = ctx.out.shape
  new = ex.Name("", dtype=x.dtype, shape=shape)
  if [d for d in x.shape if d != 1] != [d for d in shape if d != 1] and (x.is_padded or new.is_padded):
    raise NotImplementedError(
        f"reshape {x.shape} -> {shape}: the Triton backend reshapes blocks whose sizes are "
        "powers of two, or only adds/removes dimensions of size 1")
  if shape == ():
    return call("tl.reshape", x, tl.shape_token([]), dtype=x.dtype) if x.shape else x
  if x.shape == ():
    return _full(ctx, x)
  return call("tl.reshape", x, tl.shape_token(new.padded), dtype=x.dtype, shape=shape)


rule(lax.reshape_p)(lambda ctx, x, *dyn, **_: _reshape(ctx, x))
rule(lax.squeeze_p)(lambda ctx, x, **_: _reshape(ctx, x))


@rule(lax.transpose_p)
def _transpose(ctx, x, permutation):
  perm = tuple(permutation)
  if perm == tuple(range(len(perm))):
    return x
  shape = tuple(x.shape[p] for p in perm)
  if len(perm) == 2:
    return call("tl.trans", x, dtype=x.dtype, shape=shape)
  return call("tl.permute", x, tl.shape_token(perm), dtype=x.dtype, shape=shape)

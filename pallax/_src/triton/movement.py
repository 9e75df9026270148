"""Data movement Triton cannot do on register tensors: slicing, splitting, unstacking, reversing,
concatenating and dynamically slicing or updating array values.

Each rule writes the value to a scratch buffer in global memory private to the program (it stays
in L1/L2), then reads back the view it needs, the way the kernel would through a Ref. A barrier
after the writes makes them visible to every thread of the program; one after the reads keeps a
loop's next iteration from overwriting data still being read.
"""
from __future__ import annotations

import dataclasses

import numpy as np
from jax import lax

from pallax._src.gpu import expr as ex
from pallax._src.triton import lang as tl
from pallax._src.triton import memory
from pallax._src.triton.memory import RefVal
from pallax._src.triton.writer import rule


def _view(buf: RefVal, dims: dict, drop=()) -> RefVal:
  """``buf`` with its value dimensions (after the program-lane dimension) replaced by ``dims``:
  {axis: (start expression, size, step)}; the axes in ``drop`` are indexed away."""
  new = list(buf.dims)
  for axis, (start, size, step) in dims.items():
    new[1 + axis] = dataclasses.replace(new[1 + axis], start=start, size=size, step=step,
                                        kept=axis not in drop)
  return dataclasses.replace(buf, dims=tuple(new))


def row(buf: RefVal, index: ex.Expr) -> RefVal:
  """The view of element ``index`` along the first axis of a spilled value (a scan's step)."""
  return _view(buf, {0: (index, 1, 1)}, drop=(0,))


def _read(ctx, buf: RefVal, hint: str, shape=None):
  out = memory.load(ctx.gen, buf, hint=hint)
  ctx.gen.emit("tl.debug_barrier()")
  if tuple(out.shape) != tuple(ctx.out.shape if shape is None else shape):
    raise AssertionError((out.shape, ctx.out.shape))
  return out


def _clamped(gen, start, size: int, dim: int) -> ex.Expr:
  """lax's rule for dynamic slice starts: clamped so the slice lies inside the array."""
  if isinstance(start, ex.Lit) or not isinstance(start, ex.Expr):
    return tl.i32(min(max(int(ex.literal(start) if isinstance(start, ex.Lit) else start), 0), dim - size))
  lo = ex.call("tl.maximum", start, tl.i32(0), dtype=start.dtype)
  return gen.bind(ex.call("tl.minimum", lo, tl.i32(dim - size), dtype=start.dtype), "start")


@rule(lax.slice_p)
def _slice(ctx, x, start_indices, limit_indices, strides):
  strides = strides or (1,) * len(x.shape)
  buf = memory.spill(ctx.gen, x)
  dims = {a: (tl.i32(lo), -(-(hi - lo) // st), st)
          for a, (lo, hi, st) in enumerate(zip(start_indices, limit_indices, strides))}
  return _read(ctx, _view(buf, dims), "part")


@rule(lax.split_p)
def _split(ctx, x, sizes, axis):
  """``jnp.split``: slices of one spilled buffer along ``axis``."""
  buf = memory.spill(ctx.gen, x)
  starts = np.cumsum((0,) + tuple(sizes))[:-1]
  return [_read(ctx, _view(buf, {axis: (tl.i32(int(lo)), n, 1)}), "part", shape)
          for lo, n, shape in zip(starts, sizes, [v.aval.shape for v in ctx.eqn.outvars])]


@rule(lax.rev_p)
def _rev(ctx, x, dimensions):
  buf = memory.spill(ctx.gen, x)
  dims = {a: (tl.i32(x.shape[a] - 1), x.shape[a], -1) for a in dimensions}
  return _read(ctx, _view(buf, dims), "rev")


@rule(lax.dynamic_slice_p)
def _dynamic_slice(ctx, x, *starts, slice_sizes):
  buf = memory.spill(ctx.gen, x)
  dims = {a: (_clamped(ctx.gen, s, n, x.shape[a]), n, 1)
          for a, (s, n) in enumerate(zip(starts, slice_sizes))}
  return _read(ctx, _view(buf, dims), "part")


@rule(lax.dynamic_update_slice_p)
def _dynamic_update_slice(ctx, x, update, *starts):
  buf = memory.spill(ctx.gen, x)
  dims = {a: (_clamped(ctx.gen, s, n, x.shape[a]), n, 1)
          for a, (s, n) in enumerate(zip(starts, update.shape))}
  memory.store(ctx.gen, _view(buf, dims), update)
  return _read(ctx, buf, "updated")


@rule(lax.concatenate_p)
def _concatenate(ctx, *xs, dimension):
  buf = memory.spill(ctx.gen, None, ctx.out)
  offset = 0
  for x in xs:
    memory.store(ctx.gen, _view(buf, {dimension: (tl.i32(offset), x.shape[dimension], 1)}), x)
    offset += x.shape[dimension]
  return _read(ctx, buf, "cat")


@rule(lax.stack_p)
def _stack(ctx, *xs, axis):
  buf = memory.spill(ctx.gen, None, ctx.out)
  for k, x in enumerate(xs):
    memory.store(ctx.gen, _view(buf, {axis: (tl.i32(k), 1, 1)}, drop=(axis,)), x)
  return _read(ctx, buf, "stacked")


@rule(lax.unstack_p)
def _unstack(ctx, x, axis):
  """``jnp.unstack``: each index along ``axis`` of one spilled buffer, that axis dropped."""
  buf = memory.spill(ctx.gen, x)
  return [_read(ctx, _view(buf, {axis: (tl.i32(k), 1, 1)}, drop=(axis,)), "part", v.aval.shape)
          for k, v in enumerate(ctx.eqn.outvars)]


def _element(gen, vec: ex.Expr, j: int) -> ex.Expr:
  """Element ``j`` of a small 1-D tensor, as a scalar."""
  if vec.shape == (1,) and j == 0:
    return gen.bind(ex.call("tl.sum", vec, axis=tl.i32(0), dtype=vec.dtype), "start")
  picked = tl.where(tl.compare("==", tl.arange(vec.padded[0]), tl.i32(j)), vec, tl.i32(0), vec.dtype)
  return gen.bind(ex.call("tl.sum", picked, axis=tl.i32(0), dtype=vec.dtype), "start")


def _window(gen, x, indices, update, dn, mode):
  """The view of ``x`` the scatter writes, and a mask (None: always) of whether it fits."""
  starts = {d: _element(gen, indices, j) for j, d in enumerate(dn.scatter_dims_to_operand_dims)}
  window = iter(update.shape[a] for a in dn.update_window_dims)
  dims, fits = {}, []
  for d in range(len(x.shape)):
    size = 1 if d in dn.inserted_window_dims else next(window)
    start = starts.get(d, tl.i32(0))
    if not ex.is_zero(start) and "CLIP" in mode:
      start = _clamped(gen, start, size, x.shape[d])
    elif not ex.is_zero(start) and "FILL_OR_DROP" in mode:
      fits += [tl.compare(">=", start, tl.i32(0)), tl.compare("<=", start, tl.i32(x.shape[d] - size))]
    dims[d] = (start, size, 1)
  mask = None
  if fits:
    cond = gen.bind(tl.all_of(fits), "fits")
    mask = gen.bind(tl.full(update.shape, cond, np.bool_), "fits")
  return dims, mask


@rule(lax.scatter_p, lax.scatter_add_p)
def _scatter(ctx, x, indices, update, dimension_numbers, mode, **_):
  """One window written (``x.at[i, :4].set(v)``) or added: a store into a view of ``x``.
  Like lax's FILL_OR_DROP, a window that does not fit inside ``x`` is dropped whole."""
  dn, gen = dimension_numbers, ctx.gen
  if len(indices.shape) != 1 or dn.operand_batching_dims:
    raise NotImplementedError("scatter of several windows (index arrays); the Triton backend "
                              "writes one window, as x.at[i, j:k].set(v) does")
  buf = memory.spill(gen, x)
  dims, mask = _window(gen, x, indices, update, dn, str(mode))
  view = _view(buf, dims, drop=dn.inserted_window_dims)
  if ctx.eqn.primitive is lax.scatter_add_p:
    cur = memory.load(gen, view, mask, hint="cur")
    update = gen.bind(ex.binary("+", cur, update), "upd")
  memory.store(gen, view, update, mask)
  return _read(ctx, buf, "scattered")

"""Data movement Triton cannot do on register tensors: slicing, reversing, concatenating and
dynamically slicing or updating array values.

Each rule writes the value to a scratch buffer in global memory private to the program (it stays
in L1/L2), then reads back the view it needs, the way the kernel would through a Ref. A barrier
after the writes makes them visible to every thread of the program; one after the reads keeps a
loop's next iteration from overwriting data still being read.
"""
from __future__ import annotations

import dataclasses

from jax import lax

from pallax._src.triton.rules import rule
from pallax._src.triton.values import RefVal, Val


def _view(buf: RefVal, dims: dict, drop=()) -> RefVal:
  """``buf`` with its value dimensions (after the program-lane dimension) replaced by ``dims``:
  {axis: (start expression, size, step)}; the axes in ``drop`` are indexed away."""
  new = list(buf.dims)
  for axis, (start, size, step) in dims.items():
    new[1 + axis] = dataclasses.replace(new[1 + axis], start=start, size=size, step=step,
                                        kept=axis not in drop)
  return dataclasses.replace(buf, dims=new)


def row(buf: RefVal, index: str) -> RefVal:
  """The view of element ``index`` along the first axis of a spilled value (a scan's step)."""
  return _view(buf, {0: (index, 1, 1)}, drop=(0,))


def _read(cg, buf: RefVal, eqn, hint: str):
  out = cg.load(buf, hint=hint)
  cg.emit("tl.debug_barrier()")
  aval = eqn.outvars[0].aval
  if tuple(out.shape) != tuple(aval.shape):
    raise AssertionError((out.shape, aval.shape))
  return out


def _clamped(cg, start, size: int, dim: int) -> str:
  """lax's rule for dynamic slice starts: clamped so the slice lies inside the array."""
  if hasattr(start, "expr"):
    return cg.bind(f"tl.minimum(tl.maximum({start.expr}, 0), {dim - size})", (), start.dtype,
                   "start").expr
  return str(min(max(int(start), 0), dim - size))


@rule(lax.slice_p)
def _slice(cg, eqn, x):
  p = eqn.params
  strides = p["strides"] or (1,) * len(x.shape)
  buf = cg.spill(x)
  dims = {a: (str(lo), -(-(hi - lo) // st), st)
          for a, (lo, hi, st) in enumerate(zip(p["start_indices"], p["limit_indices"], strides))}
  return _read(cg, _view(buf, dims), eqn, "part")


@rule(lax.rev_p)
def _rev(cg, eqn, x):
  buf = cg.spill(x)
  dims = {a: (str(x.shape[a] - 1), x.shape[a], -1) for a in eqn.params["dimensions"]}
  return _read(cg, _view(buf, dims), eqn, "rev")


@rule(lax.dynamic_slice_p)
def _dynamic_slice(cg, eqn, x, *starts):
  buf = cg.spill(x)
  sizes = eqn.params["slice_sizes"]
  dims = {a: (_clamped(cg, s, n, x.shape[a]), n, 1) for a, (s, n) in enumerate(zip(starts, sizes))}
  return _read(cg, _view(buf, dims), eqn, "part")


@rule(lax.dynamic_update_slice_p)
def _dynamic_update_slice(cg, eqn, x, update, *starts):
  buf = cg.spill(x)
  dims = {a: (_clamped(cg, s, n, x.shape[a]), n, 1)
          for a, (s, n) in enumerate(zip(starts, update.shape))}
  cg.store(_view(buf, dims), update)
  return _read(cg, buf, eqn, "updated")


@rule(lax.concatenate_p)
def _concatenate(cg, eqn, *xs):
  axis = eqn.params["dimension"]
  buf = cg.spill(None, eqn.outvars[0].aval)
  offset = 0
  for x in xs:
    cg.store(_view(buf, {axis: (str(offset), x.shape[axis], 1)}), x)
    offset += x.shape[axis]
  return _read(cg, buf, eqn, "cat")


@rule(lax.stack_p)
def _stack(cg, eqn, *xs):
  axis = eqn.params["axis"]
  buf = cg.spill(None, eqn.outvars[0].aval)
  for k, x in enumerate(xs):
    cg.store(_view(buf, {axis: (str(k), 1, 1)}, drop=(axis,)), x)
  return _read(cg, buf, eqn, "stacked")


def _element(cg, vec, j: int) -> str:
  """Element ``j`` of a small 1-D tensor, as a scalar expression."""
  if vec.shape == (1,) and j == 0:
    return cg.bind(f"tl.sum({vec.expr}, axis=0)", (), vec.dtype, "start").expr
  n = 1 << max(0, (vec.shape[0] - 1).bit_length())
  return cg.bind(f"tl.sum(tl.where(tl.arange(0, {n}) == {j}, {vec.expr}, 0), axis=0)", (),
                 vec.dtype, "start").expr


@rule(lax.scatter_p, lax.scatter_add_p)
def _scatter(cg, eqn, x, indices, update):
  """One window written (``x.at[i, :4].set(v)``) or added: a store into a view of ``x``.
  Like lax's FILL_OR_DROP, a window that does not fit inside ``x`` is dropped whole."""
  dn = eqn.params["dimension_numbers"]
  if len(indices.shape) != 1 or dn.operand_batching_dims:
    raise NotImplementedError("scatter of several windows (index arrays); the Triton backend "
                              "writes one window, as x.at[i, j:k].set(v) does")
  mode = str(eqn.params.get("mode"))
  buf = cg.spill(x)
  starts = {d: _element(cg, indices, j) for j, d in enumerate(dn.scatter_dims_to_operand_dims)}
  window = iter(update.shape[a] for a in dn.update_window_dims)
  dims, fits = {}, []
  for d in range(len(x.shape)):
    size = 1 if d in dn.inserted_window_dims else next(window)
    start = starts.get(d, "0")
    if start != "0" and "CLIP" in mode:
      start = _clamped(cg, Val(start, (), indices.dtype), size, x.shape[d])
    elif start != "0" and "FILL_OR_DROP" in mode:
      fits.append(f"({start} >= 0) & ({start} <= {x.shape[d] - size})")
    dims[d] = (start, size, 1)
  view = _view(buf, dims, drop=dn.inserted_window_dims)
  mask = None
  if fits:
    cond = cg.bind(" & ".join(fits), (), "bool", "fits")
    mask = cg.bind(f"tl.full({[1 << max(0, (n - 1).bit_length()) for n in update.shape]}, "
                   f"{cond.expr}, tl.int1)", update.shape, "bool", "fits")
  if eqn.primitive is lax.scatter_add_p:
    update = cg.bind(f"{cg.load(view, mask, hint='cur').expr} + {update.expr}", update.shape,
                     update.dtype, "upd")
  cg.store(view, update, mask)
  return _read(cg, buf, eqn, "scattered")

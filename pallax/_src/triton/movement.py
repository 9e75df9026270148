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
from pallax._src.triton.values import RefVal


def _view(buf: RefVal, dims: dict) -> RefVal:
  """``buf`` with its value dimensions (after the program-lane dimension) replaced by ``dims``:
  {axis: (start expression, size, step)}."""
  new = list(buf.dims)
  for axis, (start, size, step) in dims.items():
    d = new[1 + axis]
    new[1 + axis] = dataclasses.replace(d, start=start, size=size, step=step)
  return dataclasses.replace(buf, dims=new)


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
    view = _view(buf, {axis: (str(k), 1, 1)})
    view.dims[1 + axis] = dataclasses.replace(view.dims[1 + axis], kept=False)
    cg.store(view, x)
  return _read(cg, buf, eqn, "stacked")

"""Triton rules for control flow (loops, branches, calls), checks, prints and compiler hints; the
loops shared with the Gluon backend are written by ``gpu/control.py``."""
from __future__ import annotations

import jax
import numpy as np
from jax import lax

from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src import primitives as prims
from pallax._src.gpu import control as gpu_control
from pallax._src.gpu import expr as ex
from pallax._src.gpu.source import Unsupported
from pallax._src.triton import lang as tl
from pallax._src.triton import memory, movement
from pallax._src.triton.writer import rule


def _loop(gen, header: str, body, args) -> list:
  gen.emit(header)
  gen.depth += 1
  new = gen.lower_jaxpr(body, args)
  return new


def _end_loop(gen):
  gen.depth -= 1


def _carries(gen, init) -> list:
  """The loop's carried variables; a carried Ref stays the view it is (checked below)."""
  return [v if isinstance(v, memory.RefVal) else gen.materialize(v, "carry") for v in init]


def _assign(gen, carry, new):
  """``carry = new`` for the carries that are values; a carried Ref must come back as itself."""
  _check_ref_carries(carry, new)
  pairs = [(c, n) for c, n in zip(carry, new) if not isinstance(c, memory.RefVal)]
  gen.assign([c for c, _ in pairs], [n for _, n in pairs])


def _check_ref_carries(carry, new):
  """A Ref that a loop carries (JAX Pallas lets a body return the Ref it closes over or was
  given) must come back as itself: a Ref is a fixed place in memory here, not a value."""
  for c, n in zip(carry, new):
    if isinstance(c, memory.RefVal) != isinstance(n, memory.RefVal) or \
        (isinstance(c, memory.RefVal) and c != n):
      raise Unsupported("a loop body that returns another Ref than the one it carries (return the "
                        "Ref it was given, or copy the data with ref[...] = other[...])")


@rule(ji.scan_p)
def _scan(ctx, *invals, jaxpr, length, reverse, ft_in, **_):
  gen, body = ctx.gen, jaxpr
  consts_spec, carry_spec, xs_spec = ft_in.unpack()   # a flat tree: len() counts leaves
  nc, ncarry = len(consts_spec), len(carry_spec)
  if len(xs_spec) or len(body.outvars) != ncarry:
    return _scan_arrays(gen, invals, body, length, reverse, nc, ncarry, ctx.avals_out)
  consts, init = invals[:nc], invals[nc:]
  if ncarry and jaxpr_util.fori_index(body, nc) and not reverse:
    # A fori_loop: a Triton for loop (static bounds when the start is a constant, which lets
    # Triton pipeline it fully).
    carry = _carries(gen, init[1:])
    start = init[0]
    first, last = ex.interval(start), ex.interval(ex.add(start, tl.i32(length)))
    i = gen.fresh_name("i", start.dtype, (), bounds=first and last and (first[0], last[1] - 1))
    return gpu_control.fori_loop(gen, body, consts, i, start, length, carry,
                                 assign=lambda c, n: _assign(gen, c, n))
  carry = _carries(gen, init)
  return gpu_control.repeat(gen, body, consts, length, carry, assign=lambda c, n: _assign(gen, c, n))


def _scan_arrays(gen, invals, body, length, reverse, nc, ncarry, avals_out):
  """lax.scan over arrays: the xs and ys live in scratch buffers private to the program; step k
  reads row k of each x and writes row k of each y."""
  consts, init, xs = invals[:nc], invals[nc:nc + ncarry], invals[nc + ncarry:]
  if any(ji.is_ref_aval(a) for a in avals_out[ncarry:]):
    raise Unsupported("lax.scan whose body outputs a Ref at each step (the stacked outputs must "
                      "be arrays: output ref[...] instead)")
  x_bufs = [memory.spill(gen, x) for x in xs]
  y_bufs = [memory.spill(gen, None, a) for a in avals_out[ncarry:]]
  carry = _carries(gen, init)
  k = gen.fresh_name("k", np.int32, ())
  gen.emit(f"for {k.name} in range({length}):")
  gen.depth += 1
  step = gen.bind(ex.binary("-", tl.i32(length - 1), k), "step") if reverse else k
  x_k = [memory.load(gen, movement.row(b, step), hint="x_k") for b in x_bufs]
  new = gen.lower_jaxpr(body, [*consts, *carry, *x_k])
  _check_ref_carries(carry, new[:ncarry])
  for b, y in zip(y_bufs, new[ncarry:]):   # before the carries change: a y may be one of them
    memory.store(gen, movement.row(b, step), y)
  _assign(gen, carry, new[:ncarry])
  gen.depth -= 1
  ys = [memory.load(gen, b, hint="ys") for b in y_bufs]
  if y_bufs:
    gen.emit("tl.debug_barrier()")
  return [*carry, *ys]


def _is_dynamic_fori(cond, body, cn: int, bn: int, ncarry: int) -> bool:
  """lax.fori_loop with dynamic bounds: carry (i, upper, ...), cond i < upper, i += 1."""
  return (ncarry >= 2 and jaxpr_util.fori_index(body, bn) and len(cond.eqns) == 1 and
          cond.eqns[0].primitive is lax.lt_p and cond.eqns[0].invars[0] is cond.invars[cn] and
          cond.eqns[0].invars[1] is cond.invars[cn + 1] and body.outvars[1] is body.invars[bn + 1])


@rule(ji.while_p)
def _while(ctx, *invals, cond_jaxpr, body_jaxpr, cond_nconsts, body_nconsts):
  gen, cn, bn = ctx.gen, cond_nconsts, body_nconsts
  cconsts, bconsts, init = invals[:cn], invals[cn:cn + bn], invals[cn + bn:]
  carry = _carries(gen, init)
  if _is_dynamic_fori(cond_jaxpr, body_jaxpr, cn, bn, len(carry)):
    i = gen.fresh_name("i", carry[0].dtype, ())
    header = f"for {i.name} in range({carry[0].name}, {carry[1].name}):"
    new = _loop(gen, header, body_jaxpr, [*bconsts, i, *carry[1:]])
    _check_ref_carries(carry[2:], new[2:])
    _assign(gen, carry[2:], new[2:])
    _end_loop(gen)
    gen.emit(f"{carry[0].name} = tl.maximum({carry[0].name}, {carry[1].name})")
    return carry
  return gpu_control.while_loop(gen, cond_jaxpr, body_jaxpr, cconsts, bconsts, carry,
                                assign=lambda c, n: _assign(gen, c, n))


@rule(ji.cond_p)
def _cond(ctx, index, *ops, branches, **_):
  return gpu_control.cond(ctx.gen, index, branches, ops, ctx.avals_out)


def _inline(param):
  def lower(ctx, *invals, **params):
    return ctx.gen.lower_jaxpr(params[param], list(invals))
  return lower


for _p, _param in ((ji.jit_p, "jaxpr"), (ji.closed_call_p, "call_jaxpr"),
                   (ji.custom_jvp_call_p, "call_jaxpr"), (ji.custom_vjp_call_p, "call_jaxpr"),
                   (ji.remat_p, "jaxpr")):
  rule(_p)(_inline(_param))


@rule(prims.hint_p)
def _hint(ctx, x, kind, values):
  fn = "tl.multiple_of" if kind == "multiple_of" else "tl.max_contiguous"
  vals = list(values)
  out = ex.call(fn, x, ex.Token(str(vals if x.shape else vals[0])), dtype=x.dtype, shape=x.shape)
  return ctx.gen.bind(out, x.name if isinstance(x, ex.Name) else "v")


@rule(prims.debug_print_p)
def _debug_print(ctx, *args, fmt, **_):
  prefix = fmt.split("{")[0].rstrip()
  ctx.gen.emit_expr(ex.call("tl.device_print", prefix, *args))
  return []


def _check_message(err_tree) -> str:
  """The message of a checkify check (kept in the error's pytree metadata)."""
  try:
    err = jax.tree_util.tree_unflatten(err_tree, [False] * err_tree.num_leaves)
    for meta in err._metadata.values():
      node = meta.node_data()[1] if hasattr(meta, "node_data") else None
      if node and isinstance(node[-1], str):
        return node[-1]
  except Exception:  # noqa: BLE001  (the message is a courtesy; the check still runs)
    pass
  return "pl.debug_check failed"


@rule(ji.check_p)
def _check(ctx, failed, *args, err_tree, **_):
  """checkify's check: its first operand is True when the check FAILED."""
  ctx.gen.has_checks = True
  ok = tl.compare("==", failed, tl.i32(0))
  ctx.gen.emit_expr(ex.call("tl.device_assert", ok, _check_message(err_tree)))
  return []

"""Gluon rules of structured control flow (scan and fori loops, while loops, conds, calls
inlined) and of the axis indices; the loops and conditionals themselves are written by
``gpu/control.py``, as for Triton. Loop carries keep the layout they enter with; a loop carry
that starts as a splat or an iota starts in the layout the loop body computes it in (found by
the layout assignment, which analyses the body with that carry undecided first). A cond's
results take the layout its branches' values meet in, each branch converting its own to it.
"""
from __future__ import annotations

from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src.gluon.assign import Val, layout_rule
from pallax._src.gluon.mma import BranchesInFlight, loop_in_flight
from pallax._src.gluon.values import I32, i32
from pallax._src.gluon.writer import rule
from pallax._src.gpu import control as gpu_control
from pallax._src.gpu import expr as ex
from pallax._src.gpu.expr import Lit


@rule(ji.axis_index_p)
def _axis_index(ctx, *, axis_name):
  if axis_name not in ctx.gen.axes:
    raise NotImplementedError(f"lax.axis_index({axis_name!r}): no such axis")
  return ctx.gen.axes[axis_name]


@rule(ji.optimization_barrier_p, *ji.sharding_marks)
def _identity(ctx, *xs, **_):
  """(sharding marks values traced under a mesh: ``jax.shard_map(check_vma=True)``'s vma casts,
  explicit sharding's ``reshard``; in a kernel's program they change nothing)"""
  return list(xs)



def _settled(gen, eqn, init: list) -> list:
  """The loop's initial values in the layouts the assignment gave its carries (a carry that
  starts as a splat or an iota takes the layout the loop body computes it in)."""
  return [gen.in_layout(v, layout) for v, layout in zip(init, gen.facts(eqn))]


@rule(ji.scan_p)
def _scan(ctx, *invals, jaxpr, length, reverse, ft_in, **_):
  gen, body = ctx.gen, jaxpr
  nc, ncarry, nxs = (len(s) for s in ft_in.unpack())
  if nxs or len(body.outvars) != ncarry:   # (other scans over arrays are loops by now: gpu/scans.py)
    gen.unsupported("lax.scan whose body gives a Ref at each step")
  consts, init = list(invals[:nc]), list(invals[nc:])
  if ncarry and jaxpr_util.fori_index(body, nc):
    i = gen.fresh_name("i", I32, ())
    init[1:] = _settled(gen, ctx.eqn, init[1:])
    carry = [gen.materialize(v) for v in init[1:]]
    with loop_in_flight(gen, body):
      return gpu_control.fori_loop(gen, body, consts, i, init[0], length, carry)
  init = _settled(gen, ctx.eqn, init)
  carry = [gen.materialize(v) for v in init]
  with loop_in_flight(gen, body):
    return gpu_control.repeat(gen, body, consts, length, carry)


@rule(ji.while_p)
def _while(ctx, *invals, cond_jaxpr, body_jaxpr, cond_nconsts, body_nconsts):
  """``while go: carry = body(carry); go = cond(carry)``: the flag is a carry like the others."""
  gen, cn, bn = ctx.gen, cond_nconsts, body_nconsts
  cconsts, bconsts, init = invals[:cn], invals[cn:cn + bn], invals[cn + bn:]
  init = _settled(gen, ctx.eqn, list(init))
  carry = [gen.materialize(v) for v in init]
  with loop_in_flight(gen, cond_jaxpr, body_jaxpr):
    return gpu_control.while_loop(gen, cond_jaxpr, body_jaxpr, cconsts, bconsts, carry)


@rule(ji.cond_p)
def _cond(ctx, index, *ops, branches, **_):
  """The results are new variables in the layouts the assignment gave them, which each branch
  converts its values to (``Writer.assign``)."""
  gen = ctx.gen
  if gpu_control.static_branch(index, len(branches)) is not None:
    return gpu_control.cond(gen, index, branches, ops, ctx.avals_out)
  results = [gen.fresh_name("r", a.dtype, a.shape) for a in ctx.avals_out]
  for r, var in zip(results, ctx.eqn.outvars):
    if gen.assigned(var) is not None:
      gen.layouts[r.name] = gen.assigned(var)
  in_flight = BranchesInFlight(gen)
  gpu_control.cond(gen, index, branches, ops, ctx.avals_out, in_flight.branch, results)
  in_flight.done()
  return results


def _inline(param):
  return lambda ctx, *invals, **params: ctx.gen.lower_jaxpr(params[param], list(invals))


for _p, _param in ((ji.jit_p, "jaxpr"), (ji.closed_call_p, "call_jaxpr"),
                   (ji.custom_jvp_call_p, "call_jaxpr"), (ji.custom_vjp_call_p, "call_jaxpr"),
                   (ji.remat_p, "jaxpr")):
  rule(_p)(_inline(_param))


# --- layout assignment (assign.py) ------------------------------------------------------------

@layout_rule(ji.axis_index_p)
def _axis_index_layouts(ctx, *, axis_name):
  return ctx.a.axes.get(axis_name)


@layout_rule(ji.optimization_barrier_p, *ji.sharding_marks)
def _identity_layouts(ctx, *xs, **_):
  return list(xs)


def _new_carry(v, tentative: bool = False) -> Val:
  """A loop carry's variable: the layout of the value it starts from."""
  layout = v.layout if isinstance(v, Val) else None
  return Val(tuple(v.shape), v.dtype, layout, tentative=tentative)


def _settled_layouts(a, init: list, body) -> list:
  """``_settled``: carries that start as splats or iotas take the layouts the body computes
  them in, found by analysing the body once with them undecided."""
  rebuilt = [isinstance(v, Val) and v.rebuild is not None for v in init]
  if not any(r and v.shape for r, v in zip(rebuilt, init)):
    return init
  outs = a.probe(lambda: body([_new_carry(v, r) for v, r in zip(init, rebuilt)]))
  return [a.in_layout(v, o.layout if isinstance(o, Val) else None) if r else v
          for v, o, r in zip(init, outs, rebuilt)]


def _assigned(a, carry: list, values: list):
  """Values assigned to carries: in the carries' layouts."""
  for c, v in zip(carry, values):
    a.in_layout(v, c.layout)


@layout_rule(ji.scan_p)
def _scan_layouts(ctx, *invals, jaxpr, length, reverse, ft_in, **_):
  a, body = ctx.a, jaxpr
  nc, ncarry, nxs = (len(s) for s in ft_in.unpack())
  if nxs or len(body.outvars) != ncarry:
    return None   # the writer refuses it
  consts, init = list(invals[:nc]), list(invals[nc:])
  if ncarry and jaxpr_util.fori_index(body, nc):
    i = Val((), I32)
    init[1:] = _settled_layouts(a, init[1:], lambda c: ctx.lower(body, [*consts, i, *c])[1:])
    ctx.facts([getattr(v, "layout", None) for v in init[1:]])
    carry = [_new_carry(v) for v in init[1:]]
    _assigned(a, carry, ctx.lower(body, [*consts, i, *carry])[1:])
    stop = ex.add(init[0], i32(length)) if isinstance(init[0], Lit) else Val((), I32)
    return [stop, *carry]
  init = _settled_layouts(a, init, lambda c: ctx.lower(body, [*consts, *c]))
  ctx.facts([getattr(v, "layout", None) for v in init])
  carry = [_new_carry(v) for v in init]
  _assigned(a, carry, ctx.lower(body, [*consts, *carry]))
  return carry


@layout_rule(ji.while_p)
def _while_layouts(ctx, *invals, cond_jaxpr, body_jaxpr, cond_nconsts, body_nconsts):
  a, cn, bn = ctx.a, cond_nconsts, body_nconsts
  cconsts, bconsts, init = invals[:cn], invals[cn:cn + bn], invals[cn + bn:]
  init = _settled_layouts(a, list(init), lambda c: ctx.lower(body_jaxpr, [*bconsts, *c]))
  ctx.facts([getattr(v, "layout", None) for v in init])
  carry = [_new_carry(v) for v in init]
  ctx.lower(cond_jaxpr, [*cconsts, *carry])
  _assigned(a, carry, ctx.lower(body_jaxpr, [*bconsts, *carry]))
  ctx.lower(cond_jaxpr, [*cconsts, *carry])
  return carry


@layout_rule(ji.cond_p)
def _cond_layouts(ctx, index, *ops, branches, **_):
  """The results are new variables that every branch assigns (Gluon requires one layout for
  each): each takes the layout its branches' values meet in, as an operation's operands do (in
  the order the branches are written), and each branch converts its value to it where it ends
  (or rebuilds it in it: a splat, an iota)."""
  a = ctx.a
  k = gpu_control.static_branch(index, len(branches))
  if k is not None:   # the writer lowers the one branch taken
    return ctx.lower(branches[k], list(ops))
  outs, ends = [], []
  for k in gpu_control.branch_order(len(branches)):   # in the writer's order
    outs.append(ctx.lower(branches[k], list(ops)))
    ends.append(len(a.conversions))
  leads = [a.leading(*values) for values in zip(*outs)]
  layouts = [lead.layout if lead is not None else None for lead in leads]
  for values, end in reversed(list(zip(outs, ends))):   # (later branches first: ``end`` holds)
    a.converting_at(end, lambda values=values: [a.in_layout(v, l) for v, l in zip(values, layouts)])
  return [Val(tuple(var.aval.shape), var.aval.dtype, layout,
              tentative=lead is not None and lead.tentative)
          for var, layout, lead in zip(ctx.eqn.outvars, layouts, leads)]


def _inline_layouts(param):
  return lambda ctx, *invals, **params: ctx.lower(params[param], list(invals))


for _p, _param in ((ji.jit_p, "jaxpr"), (ji.closed_call_p, "call_jaxpr"),
                   (ji.custom_jvp_call_p, "call_jaxpr"), (ji.custom_vjp_call_p, "call_jaxpr"),
                   (ji.remat_p, "jaxpr")):
  layout_rule(_p)(_inline_layouts(_param))

"""Walking jaxprs: the one place that knows where sub-jaxprs hide in an equation's params.

Cond branches, loop bodies, ``run_scoped`` bodies and call primitives keep their jaxprs in
params, alone or in tuples; JAX 0.11 has one ``Jaxpr`` type (closed: it carries its consts).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from pallax._src import jax_internals as ji


def _is_jaxpr(v) -> bool:
  return isinstance(v, ji.Jaxpr)


def sub_jaxpr_params(params) -> Iterator[tuple[str, object]]:
  """(param name, a jaxpr or a tuple of jaxprs) for each param that holds jaxprs."""
  for k, v in params.items():
    if _is_jaxpr(v):
      yield k, v
    elif isinstance(v, (tuple, list)) and v and all(_is_jaxpr(x) for x in v):
      yield k, tuple(v)


def sub_jaxprs(params) -> Iterator[ji.Jaxpr]:
  """Every jaxpr in an equation's params, tuples flattened."""
  for _, v in sub_jaxpr_params(params):
    yield from (v if isinstance(v, tuple) else (v,))


def map_sub_jaxprs(params, fn: Callable[[ji.Jaxpr], ji.Jaxpr]) -> dict:
  """``params`` with ``fn`` applied to each sub-jaxpr (tuples stay tuples)."""
  new = dict(params)
  for k, v in sub_jaxpr_params(params):
    new[k] = tuple(fn(j) for j in v) if isinstance(v, tuple) else fn(v)
  return new


def equations(jaxpr) -> Iterator:
  """Every equation of ``jaxpr`` and of its sub-jaxprs, outer ones first."""
  for eqn in jaxpr.eqns:
    yield eqn
    for sub in sub_jaxprs(eqn.params):
      yield from equations(sub)


def uses(jaxpr, prims) -> bool:
  """Whether ``jaxpr`` (or a sub-jaxpr) has an equation of one of ``prims``."""
  return any(e.primitive in prims for e in equations(jaxpr))


def rebind(eqn, invals, params=None):
  """Binds ``eqn``'s primitive again on ``invals`` (inside a trace), keeping its source line;
  returns the list of outputs."""
  params = eqn.params if params is None else params
  with ji.source_info_util.user_context(eqn.source_info.traceback):
    ans = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(params))
  return list(ans) if eqn.primitive.multiple_results else [ans]


def fori_index(body, num_consts: int) -> bool:
  """Whether a loop body's first carry is an index that the body increments by one."""
  if len(body.outvars) == 0 or len(body.invars) <= num_consts:
    return False
  i_in, i_out = body.invars[num_consts], body.outvars[0]
  if i_in.aval.dtype != np.int32:   # Triton's range() counts in int32: others loop on a carry
    return False
  for eqn in body.eqns:
    if eqn.outvars and eqn.outvars[0] is i_out and eqn.primitive is ji.add_p:
      a, b = eqn.invars
      return (a is i_in and isinstance(b, ji.Literal) and b.val == 1) or \
             (b is i_in and isinstance(a, ji.Literal) and a.val == 1)
  return False


def _literal(a):
  # Typed NumPy scalars: rules tell literals (concrete) from traced values by them.
  if hasattr(a.aval, "dtype") and np.ndim(a.val) == 0:
    return np.array(a.val, a.aval.dtype)[()]
  return a.val


def retrace(jaxpr, rule: Callable, applies: Callable) -> ji.Jaxpr:
  """``jaxpr`` traced again with each equation that ``rule(eqn, invals, params)`` answers (its
  outputs; None keeps the equation) replaced by the equations the rule traced; sub-jaxprs are
  retraced too. The same object where ``applies(eqn)`` is False for every equation, or no rule
  answered. Rules run at the equation's source line."""
  if not any(applies(e) for e in equations(jaxpr)):
    return jaxpr
  changed: list = []

  def fn(*args):
    env = dict(zip(jaxpr.all_invars, [*jaxpr.consts, *args]))
    read = lambda a: _literal(a) if isinstance(a, ji.Literal) else env[a]
    for eqn in jaxpr.eqns:
      invals = [read(a) for a in eqn.invars]
      params = map_sub_jaxprs(eqn.params, lambda j: retrace(j, rule, applies))
      if any(a is not b for a, b in zip(sub_jaxprs(params), sub_jaxprs(eqn.params))):
        changed.append(eqn)
      with ji.source_info_util.user_context(eqn.source_info.traceback):
        outs = rule(eqn, invals, params) if applies(eqn) else None
      if outs is None:
        outs = rebind(eqn, invals, params)
      else:
        changed.append(eqn)
      env.update(zip(eqn.outvars, outs))
    return [read(a) for a in jaxpr.outvars]

  dbg = jaxpr.debug_info
  names = dbg.arg_names
  names = names if names is not None and len(names) == len(jaxpr.in_avals) else None
  new, _, consts = ji.trace_to_jaxpr(fn, jaxpr.in_avals, name=dbg.func_name, arg_names=names)
  return ji.closed(new, consts) if changed else jaxpr

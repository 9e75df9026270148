"""Bounds checks on Ref accesses: static ones at trace time, dynamic ones inserted
into the kernel jaxpr (as checkify checks) for the interpreter."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from pallax._src import jax_internals as ji
from pallax._src import primitives as prims

# primitive -> (index of the first index operand, reads?, writes?)
ACCESS = {
    ji.get_p: (1, "read from"),
    ji.swap_p: (2, "write to"),
    ji.addupdate_p: (2, "update of"),
    prims.masked_load_p: (1, "read from"),
    prims.masked_swap_p: (2, "write to"),
}


def _split_access(eqn, vals):
  """(transforms, mask) of a Ref access equation, given values for its operands."""
  first, _ = ACCESS[eqn.primitive]
  tree = eqn.params["tree"]
  n = tree.num_leaves
  transforms = ji.tree_util.tree_unflatten(tree, vals[first:first + n])
  mask = None
  if eqn.params.get("has_mask"):
    mask = vals[first + n]
  return transforms, mask


def violations(transforms, shape, mask):
  """Yields (in_bounds, dim, size, offending index) for each indexed dimension.

  A masked access (Triton style) is checked on the base Ref's coordinates of its unmasked
  lanes only: its view may run past the Ref where the mask is False.
  """
  if mask is not None:
    if not all(isinstance(t, ji.NDIndexer) for t in transforms):
      return
    for d, (c, size) in enumerate(zip(prims.base_coords(transforms), shape)):
      ok_lane = (c >= 0) & (c < size)
      bad = jnp.where(ok_lane | ~mask, 0, c)
      yield jnp.all(ok_lane | ~mask), d, size, jnp.min(bad) if bad.ndim else bad
    return
  for t in transforms:
    if not isinstance(t, ji.NDIndexer):
      return  # reshapes/bitcasts: shapes past here are not tracked
    for d, (i, size) in enumerate(zip(t.indices, shape)):
      if isinstance(i, ji.Slice):
        if isinstance(i.size, int) and i.size == 0:
          continue
        start = jnp.asarray(i.start)
        end = start + (i.size - 1) * i.stride
        yield (start >= 0) & (end < size), d, size, jnp.where(start < 0, start, end)
      else:
        i = jnp.asarray(i)
        ok = jnp.all((i >= 0) & (i < size))
        yield ok, d, size, (jnp.where((i >= 0) & (i < size), 0, i).min() if i.ndim else i)
    shape = tuple(t.get_indexer_shape())


def _describe(kernel, eqn, name, d, size, shape):
  _, verb = ACCESS[eqn.primitive]
  frame = ji.user_frame(eqn.source_info) or "unknown location"
  return (f"pallas_call {kernel}: out-of-bounds {verb} {name} (block shape {tuple(shape)}) at "
          f"{frame}: index {{index}} along dimension {d}, which has size {size}")


def _is_literal(a):
  return isinstance(a, ji.Literal)


def _sub_jaxprs(params):
  for k, v in params.items():
    if isinstance(v, ji.Jaxpr):
      yield k, v
    elif isinstance(v, tuple) and v and all(isinstance(x, ji.Jaxpr) for x in v):
      yield k, v


def _sub_names(eqn, sub, names):
  """Names of a sub-jaxpr's Ref invars: the equation's Ref operands, aligned at the end."""
  outer = [names.get(v, "a Ref") if isinstance(v, ji.Var) else "a Ref"
           for v in eqn.invars if ji.is_ref_aval(v.aval)]
  inner = [v for v in sub.invars if ji.is_ref_aval(v.aval)]
  if eqn.primitive is prims.run_scoped_p:
    k = eqn.params["num_consts"]
    return {**{v: names.get(o, "a Ref") for v, o in zip(sub.invars[:k], eqn.invars) if ji.is_ref_aval(v.aval)},
            **{v: f"scoped scratch {i}" for i, v in enumerate(sub.invars[k:])}}
  m = min(len(outer), len(inner))
  return {v: n for v, n in zip(inner[len(inner) - m:], outer[len(outer) - m:])}


def has_access(jaxpr) -> bool:
  for eqn in jaxpr.eqns:
    if eqn.primitive in ACCESS:
      return True
    for _, v in _sub_jaxprs(eqn.params):
      if any(has_access(j) for j in (v if isinstance(v, tuple) else (v,))):
        return True
  return False


# --- static checks (trace time) -------------------------------------------------------

def _static_ok(ok, bad, size) -> bool:
  """A static index passes if in range or a negative index from the end (as in NumPy)."""
  return bool(ok) or (-size <= int(bad) < 0)


def check_static_indices(jaxpr, kernel: str, names) -> None:
  """Raises IndexError for a Ref access whose indices are all constants and out of range."""
  names = dict(zip([v for v in jaxpr.invars if ji.is_ref_aval(v.aval)], names)) \
      if not isinstance(names, dict) else names
  for eqn in jaxpr.eqns:
    if eqn.primitive in ACCESS:
      first, _ = ACCESS[eqn.primitive]
      ops = eqn.invars[first:]
      if all(_is_literal(a) for a in ops):
        ref = eqn.invars[0]
        vals = [a.val if _is_literal(a) else None for a in eqn.invars]
        with jax.ensure_compile_time_eval():
          transforms, mask = _split_access(eqn, vals)
          for ok, d, size, bad in violations(transforms, ref.aval.shape, mask):
            if not _static_ok(ok, bad, size):
              raise IndexError(_describe(kernel, eqn, names.get(ref, "a Ref"), d, size,
                                         ref.aval.shape).format(index=int(bad)))
    for _, v in _sub_jaxprs(eqn.params):
      for sub in (v if isinstance(v, tuple) else (v,)):
        check_static_indices(sub, kernel, _sub_names(eqn, sub, names))


# --- dynamic checks (the interpreter) ---------------------------------------------------

def _literal(a):
  # Weakly typed int literals (TypedInt) trip JAX's gather-based discharge of Ref reads;
  # typed NumPy scalars do not.
  v = a.val
  return np.asarray(v, a.aval.dtype) if isinstance(v, (int, float, bool)) and hasattr(a.aval, "dtype") else v


class _Leaf:
  def __init__(self, k):
    self.k = k


def _from_end(eqn, invals):
  """Static negative indices count from the end, as in NumPy: make them non-negative."""
  first, _ = ACCESS[eqn.primitive]
  n = eqn.params["tree"].num_leaves
  shape = eqn.invars[0].aval.shape
  atoms = eqn.invars[first:first + n]
  leaves = list(invals[first:first + n])
  transforms = ji.tree_util.tree_unflatten(eqn.params["tree"], [_Leaf(k) for k in range(n)])
  for t in transforms:
    if not isinstance(t, ji.NDIndexer):
      break
    for i, d in zip(t.indices, shape):
      k = (i.start if isinstance(i, ji.Slice) else i)
      k = k.k if isinstance(k, _Leaf) else None
      if k is not None and isinstance(atoms[k], ji.Literal) and np.ndim(leaves[k]) == 0 \
          and int(leaves[k]) < 0:
        leaves[k] = np.asarray(int(leaves[k]) + d, np.asarray(leaves[k]).dtype)
    shape = tuple(t.get_indexer_shape()) if all(isinstance(x, ji.Slice) for x in t.indices) else ()
  return [*invals[:first], *leaves, *invals[first + n:]]


def _eval_checked(jaxpr, names, kernel, consts, args, check: bool):
  env = {}
  read = lambda a: _literal(a) if isinstance(a, ji.Literal) else env[a]
  for v, x in zip(jaxpr.all_invars, [*consts, *args]):
    env[v] = x
  for eqn in jaxpr.eqns:
    invals = [read(a) for a in eqn.invars]
    if eqn.primitive in ACCESS:
      invals = _from_end(eqn, invals)
    if check and eqn.primitive in ACCESS:
      ref = eqn.invars[0]
      transforms, mask = _split_access(eqn, invals)
      for ok, d, size, bad in violations(transforms, ref.aval.shape, mask):
        checkify.check(ok, _describe(kernel, eqn, names.get(ref, "a Ref"), d, size, ref.aval.shape),
                       index=bad)
    params = dict(eqn.params)
    for k, v in _sub_jaxprs(eqn.params):
      subs = v if isinstance(v, tuple) else (v,)
      new = tuple(instrument(s, _sub_names(eqn, s, names), kernel, check) for s in subs)
      params[k] = new if isinstance(v, tuple) else new[0]
    bind_params = eqn.primitive.get_bind_params(params)
    with ji.source_info_util.user_context(eqn.source_info.traceback):
      ans = eqn.primitive.bind(*invals, **bind_params)
    outs = ans if eqn.primitive.multiple_results else [ans]
    for v, x in zip(eqn.outvars, outs):
      env[v] = x
  return [read(a) for a in jaxpr.outvars]


def instrument(jaxpr, names: dict, kernel: str, check: bool = True):
  """``jaxpr`` retraced with typed literals and, if ``check``, a checkify check before every
  Ref access (same signature)."""
  if not has_access(jaxpr):
    return jaxpr
  fn = lambda *args: _eval_checked(jaxpr, names, kernel, jaxpr.consts, args, check)
  new, _, consts = ji.trace_to_jaxpr(fn, jaxpr.in_avals, name=kernel)
  return ji.closed(new, consts)

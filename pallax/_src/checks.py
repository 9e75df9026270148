"""Bounds checks on Ref accesses: static ones at trace time, dynamic ones inserted
into the kernel jaxpr (as checkify checks) for the interpreter."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src import primitives as prims
from pallax._src import ref_access


# --- the kind of a failed check -------------------------------------------------------------
# Carried as data: an extra int32 format argument that the message does not use (checkify keeps
# format arguments with the error), so that the error class never depends on a message's words.

KIND = "pallax_kind"
KERNEL_CHECK = 0   # pl.debug_check, races, semaphores (checks without a kind)
INDEX = 1          # an out-of-bounds Ref index, or an index map outside the array


def check(ok, msg: str, kind: int = KERNEL_CHECK, **fmt) -> None:
  """``checkify.check`` tagged with ``kind``."""
  checkify.check(ok, msg, **fmt, **{KIND: np.asarray(kind, np.int32)})


def kind_of(exc) -> int:
  """The kind of a checkify exception (``KERNEL_CHECK`` for checks made without one)."""
  mapping = getattr(exc, "error_mapping", None)   # a BatchedError: one error per batch index
  if mapping:
    exc = next(iter(mapping.values()))
  kwargs = getattr(exc, "kwargs", None) or {}
  return int(np.asarray(kwargs[KIND])) if KIND in kwargs else KERNEL_CHECK


def violations(transforms, shape, mask):
  """Yields (in_bounds, dim, size, offending index, integer index?) for each indexed dimension.

  A masked access (Triton style) is checked on the base Ref's coordinates of its unmasked
  lanes only: its view may run past the Ref where the mask is False.
  """
  if mask is not None:
    if not all(isinstance(t, ji.NDIndexer) for t in transforms):
      return
    for d, (c, size) in enumerate(zip(prims.base_coords(transforms), shape)):
      ok = ((c >= 0) & (c < size)) | ~mask
      yield jnp.all(ok), d, size, _first_bad(c, ok), False
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
        yield (start >= 0) & (end < size), d, size, jnp.where(start < 0, start, end), False
      else:
        i = jnp.asarray(i)
        ok = (i >= 0) & (i < size)
        yield jnp.all(ok), d, size, _first_bad(i, ok), i.ndim == 0
    shape = tuple(t.get_indexer_shape())


def _first_bad(i, ok):
  """The first entry of ``i`` (row-major) where ``ok`` is False: the index an error reports."""
  if not np.ndim(i):
    return i
  ok = jnp.broadcast_to(ok, jnp.shape(i))
  return jnp.ravel(i)[jnp.argmin(jnp.ravel(ok))]


def _describe(kernel, eqn, name, d, size, shape):
  frame = ji.user_frame(eqn.source_info) or "unknown location"
  return (f"pallas_call {kernel}: out-of-bounds {ref_access.verb(eqn)} {name} (block shape "
          f"{tuple(shape)}) at {frame}: index {{index}} along dimension {d}, which has size {size}")


def sub_names(eqn, sub, names):
  """Names of a sub-jaxpr's Ref invars: the equation's Ref operands, aligned at the end."""
  outer = [names.get(v, "a Ref") if isinstance(v, ji.Var) else "a Ref"
           for v in eqn.invars if ji.is_ref_aval(v.aval)]
  inner = [v for v in sub.invars if ji.is_ref_aval(v.aval)]
  if eqn.primitive is prims.run_scoped_p:
    k = eqn.params["num_consts"]
    return {**{v: names.get(o, "a Ref") for v, o in zip(sub.invars[:k], eqn.invars) if ji.is_ref_aval(v.aval)},
            **{v: _scoped_name(sub, k, i) for i, v in enumerate(sub.invars[k:])}}
  m = min(len(outer), len(inner))
  return {v: n for v, n in zip(inner[len(inner) - m:], outer[len(outer) - m:])}


def _scoped_name(sub, num_consts: int, i: int) -> str:
  """The ``i``-th pl.run_scoped buffer, by the parameter that receives it where known."""
  names = sub.debug_info.arg_names if sub.debug_info is not None else None
  name = names[num_consts + i] if names and len(names) == len(sub.invars) else ""
  return f"scoped scratch {name or i}"


def has_access(jaxpr) -> bool:
  return jaxpr_util.uses(jaxpr, ref_access.primitives())


# --- static checks (trace time) -------------------------------------------------------

def _static_ok(ok, bad, size, integer: bool) -> bool:
  """A static index passes if in range, or if it is an integer index counting from the end (as
  in NumPy; a slice's start does not: ``pl.ds(-4, 4)`` starts before the Ref)."""
  return bool(ok) or (integer and -size <= int(bad) < 0)


def _check_static_access(eqn, kernel: str, names) -> None:
  ops = eqn.invars[ref_access.leaf_span(eqn).start:]
  if not all(isinstance(a, ji.Literal) for a in ops):
    return
  ref = eqn.invars[0]
  vals = [a.val if isinstance(a, ji.Literal) else None for a in eqn.invars]
  with jax.ensure_compile_time_eval():
    # entries of index arrays counting from the end are in bounds, as at run time (an array
    # literal: JAX's jax_use_simplified_jaxpr_constants)
    acc = ref_access.split(eqn, _from_end(eqn, vals))
    for ok, d, size, bad, integer in violations(acc.transforms, ref.aval.shape, acc.mask):
      if not _static_ok(ok, bad, size, integer):
        raise IndexError(_describe(kernel, eqn, names.get(ref, "a Ref"), d, size,
                                   ref.aval.shape).format(index=int(bad)))


def check_static_indices(jaxpr, kernel: str, names) -> None:
  """Raises IndexError for a Ref access whose indices are all constants and out of range, and
  ValueError for a primitive of JAX Pallas (a kernel that mixes it with pallax)."""
  names = dict(zip([v for v in jaxpr.invars if ji.is_ref_aval(v.aval)], names)) \
      if not isinstance(names, dict) else names
  for eqn in jaxpr.eqns:
    if ji.is_jax_pallas_primitive(eqn.primitive):
      frame = ji.user_frame(eqn.source_info) or "unknown location"
      raise ValueError(
          f"pallas_call {kernel}: the kernel uses {eqn.primitive.name} of jax.experimental.pallas "
          f"at {frame}, inside a pallax kernel. JAX Pallas and pallax primitives do not mix in "
          "one kernel: import pallax in its place (import pallax as pl instead of from "
          "jax.experimental import pallas as pl; import pallax.triton as plgpu, import "
          "pallax.mosaic_gpu as plgpu)")
    if ref_access.is_access(eqn):
      _check_static_access(eqn, kernel, names)
    for sub in jaxpr_util.sub_jaxprs(eqn.params):
      check_static_indices(sub, kernel, sub_names(eqn, sub, names))


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
  """NumPy's rule: negative integer indices count from the end. Literal ones are made
  non-negative here; so are the entries of index arrays in [-size, 0), with ``jnp.where``.
  Entries below -size stay as written, for the bounds check to report. A computed scalar index
  is not an array: a negative one stays out of bounds (a GPU cannot tell it from a bug)."""
  span = ref_access.leaf_span(eqn)
  shape = eqn.invars[0].aval.shape
  atoms = eqn.invars[span]
  leaves = list(invals[span])
  transforms = ref_access.split(eqn, ref_access.with_leaves(
      eqn, invals, [_Leaf(k) for k in range(len(leaves))])).transforms
  for t in transforms:
    if not isinstance(t, ji.NDIndexer):
      break
    for i, d in zip(t.indices, shape):
      k = (i.start if isinstance(i, ji.Slice) else i)
      k = k.k if isinstance(k, _Leaf) else None
      if k is None:
        continue
      if np.ndim(leaves[k]) > 0 and not isinstance(i, ji.Slice):
        leaves[k] = _wrap_negative(leaves[k], d)
      elif isinstance(atoms[k], ji.Literal) and np.ndim(leaves[k]) == 0 and int(leaves[k]) < 0:
        leaves[k] = np.asarray(int(leaves[k]) + d, np.asarray(leaves[k]).dtype)
    shape = tuple(t.get_indexer_shape())
  return ref_access.with_leaves(eqn, invals, leaves)


def _wrap_negative(i, size: int):
  """An index array's entries in [-size, 0) moved to the end: ``i + size``, in int32 at least
  (an int8 -1 indexing 200 elements becomes 199)."""
  if jnp.issubdtype(i.dtype, jnp.unsignedinteger):
    return i
  i = jnp.asarray(i, jnp.promote_types(i.dtype, jnp.int32))
  return jnp.where((i < 0) & (i >= -size), i + size, i)


def _check_access(eqn, invals, names, kernel) -> None:
  ref = eqn.invars[0]
  acc = ref_access.split(eqn, invals)
  for ok, d, size, bad, _ in violations(acc.transforms, ref.aval.shape, acc.mask):
    check(ok, _describe(kernel, eqn, names.get(ref, "a Ref"), d, size, ref.aval.shape), INDEX,
          index=bad)


def _eval_checked(jaxpr, names, kernel, consts, args, check_bounds: bool):
  env = {}
  read = lambda a: _literal(a) if isinstance(a, ji.Literal) else env[a]
  for v, x in zip(jaxpr.all_invars, [*consts, *args]):
    env[v] = x
  for eqn in jaxpr.eqns:
    invals = [read(a) for a in eqn.invars]
    if ref_access.is_access(eqn):
      invals = _from_end(eqn, invals)
      if check_bounds:
        _check_access(eqn, invals, names, kernel)
    params = jaxpr_util.map_sub_jaxprs(
        eqn.params, lambda s: instrument(s, sub_names(eqn, s, names), kernel, check_bounds))
    for v, x in zip(eqn.outvars, jaxpr_util.rebind(eqn, invals, params)):
      env[v] = x
  return [read(a) for a in jaxpr.outvars]


def instrument(jaxpr, names: dict, kernel: str, check_bounds: bool = True):
  """``jaxpr`` retraced with typed literals and, if ``check_bounds``, a checkify check before
  every Ref access (same signature)."""
  if not has_access(jaxpr):
    return jaxpr
  fn = lambda *args: _eval_checked(jaxpr, names, kernel, jaxpr.consts, args, check_bounds)
  new, _, consts = ji.trace_to_jaxpr(fn, jaxpr.in_avals, name=kernel)
  return ji.closed(new, consts)

"""The functions kernels call: program ids, Ref access with masks, dot, control flow, scratch."""
from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import checkify

from pallax._src import core as pc
from pallax._src import jax_internals as ji


# --- grid position ----------------------------------------------------------------

def program_id(axis) -> jax.Array:
  """The index of the running program along ``axis`` of the grid (or mesh)."""
  env = pc.current_grid_env("program_id")
  return env.ids[pc.axis_position(env, axis, "program_id")]


def num_programs(axis) -> int:
  """The size of the grid (or mesh) along ``axis``."""
  env = pc.current_grid_env("num_programs")
  return env.sizes[pc.axis_position(env, axis, "num_programs")]


def cdiv(a, b):
  """Ceiling division, for Python ints and arrays."""
  if isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer)):
    return -(-int(a) // int(b))
  return (a + b - 1) // b


def next_power_of_2(x: int) -> int:
  """The smallest power of two >= x (1 for 0)."""
  if x < 0:
    raise ValueError(f"next_power_of_2 takes a non-negative int, got {x}")
  return 1 if x == 0 else 1 << (int(x) - 1).bit_length()


dslice = ji.ds
ds = ji.ds
Slice = ji.Slice


# --- indexing helpers --------------------------------------------------------------

def split_ref(ref):
  """(base ref, transforms so far) of a Ref or a ``ref.at[...]`` view."""
  if isinstance(ref, ji.TransformedRef):
    return ref.ref, tuple(ref.transforms)
  return ref, ()


def _normalize_index(idx, shape) -> tuple:
  """Expands ``...``/missing trailing dims and turns Python slices into Slices."""
  if not isinstance(idx, tuple):
    idx = (idx,)
  if any(i is Ellipsis for i in idx):
    k = idx.index(Ellipsis)
    idx = idx[:k] + (slice(None),) * (len(shape) - len(idx) + 1) + idx[k + 1:]
  idx = idx + (slice(None),) * (len(shape) - len(idx))
  if len(idx) != len(shape):
    raise IndexError(f"too many indices ({len(idx)}) for a Ref of shape {shape}")
  out = []
  for i, d in zip(idx, shape):
    if isinstance(i, slice):
      start, stop, step = i.indices(d) if all(
          isinstance(v, (int, type(None))) for v in (i.start, i.stop, i.step)) else (None,) * 3
      if start is None:
        raise TypeError("use pl.ds(start, size) for dynamic slices")
      out.append(ji.Slice(start, max(0, -(-(stop - start) // step)), step))
    else:
      out.append(i)
  return tuple(out)


def _indexer(idx, shape):
  idx = _normalize_index(idx, shape)
  int_shapes = [jnp.shape(i) for i in idx if not isinstance(i, ji.Slice)]
  int_shape = np.broadcast_shapes(*int_shapes) if int_shapes else ()
  idx = tuple(i if isinstance(i, ji.Slice) else jnp.broadcast_to(jnp.asarray(i, jnp.int32), int_shape)
              for i in idx)
  return ji.NDIndexer(idx, tuple(shape), tuple(int_shape), validate=False)


def _broadcast_to_batched(args, dims, *, shape):
  """JAX's ``broadcast_to`` (how Ref indexing broadcasts an integer beside an index array) under
  vmap, which the interpreter runs programs with: the batch axis first, then the broadcast."""
  (x,), (d,) = args, dims
  x = jnp.moveaxis(x, d, 0)
  x = x.reshape(x.shape[:1] + (1,) * (len(shape) - x.ndim + 1) + x.shape[1:])
  return jnp.broadcast_to(x, x.shape[:1] + tuple(shape)), 0


if ji.broadcast_to_p not in ji.batching.fancy_primitive_batchers:   # JAX 0.11 has no rule for it
  ji.batching.primitive_batchers[ji.broadcast_to_p] = _broadcast_to_batched


def view_shape(ref_aval, transforms):
  shape = ref_aval.shape
  for t in transforms:
    shape = t.get_indexer_shape() if isinstance(t, ji.NDIndexer) else t.transform_shape(shape)
  return tuple(shape)


def indexer_dims(indexer) -> tuple[list[int], list[int]]:
  """Result dimensions of an NDIndexer: those of its slices (in order) and of its integer
  indices (NumPy's rule: together where the integer indices are adjacent, else first)."""
  is_int = [not isinstance(i, ji.Slice) for i in indexer.indices]
  nslice = sum(not b for b in is_int)
  int_rank = len(indexer.int_indexer_shape)
  contiguous = bool(np.all(np.diff(np.where(is_int)[0]) == 1))
  int_pos = (is_int.index(True) if (contiguous and any(is_int)) else 0)
  slice_dims = list(range(nslice + int_rank))
  int_dims = slice_dims[int_pos:int_pos + int_rank]
  del slice_dims[int_pos:int_pos + int_rank]
  return slice_dims, int_dims


def _parent_coords(indexer, coords) -> list[jax.Array]:
  """Coordinates in the indexed array of the elements at ``coords`` of the result."""
  slice_dims, int_dims = indexer_dims(indexer)
  shape = coords[0].shape if coords else ()
  out, k = [], 0
  for i in indexer.indices:
    if isinstance(i, ji.Slice):
      out.append(jnp.asarray(i.start, jnp.int32) + i.stride * coords[slice_dims[k]])
      k += 1
    elif jnp.ndim(i) == 0:
      out.append(jnp.broadcast_to(jnp.asarray(i, jnp.int32), shape))
    else:   # an array of indices: gather it at the result's integer-indexed coordinates
      out.append(jnp.asarray(i, jnp.int32)[tuple(coords[d] for d in int_dims)])
  return out


def indexer_coords(indexer) -> list[jax.Array]:
  """Per-dimension element coordinates of an NDIndexer, broadcast to its result shape."""
  out_shape = tuple(indexer.get_indexer_shape())
  iotas = [lax.broadcasted_iota(jnp.int32, out_shape, d) for d in range(len(out_shape))]
  return _parent_coords(indexer, iotas)


def poison(shape, dtype):
  """Values that stand out when read before written: NaN, the smallest int (JAX Pallas's
  interpreter pads with it too), True."""
  dtype = jnp.dtype(dtype)
  if jnp.issubdtype(dtype, jnp.inexact):
    v = jnp.nan
  elif dtype == jnp.bool_:
    v = True
  else:
    v = jnp.iinfo(dtype).min
  return jnp.full(shape, v, dtype)


def other_poison(shape, dtype):
  """A fill that differs from the poison in every element and in what arithmetic makes of it:
  -1.5 for floats (the poison is NaN; -1.5 is exact in every float format, and adding to it or
  comparing with it changes the result, where the largest float would absorb additions), the
  largest integer (the poison is the smallest), False for bools."""
  dtype = jnp.dtype(dtype)
  if jnp.issubdtype(dtype, jnp.inexact):
    v = -1.5
  elif dtype == jnp.bool_:
    v = False
  else:
    v = jnp.iinfo(dtype).max
  return jnp.full(shape, v, dtype)


# --- masked load / swap --------------------------------------------------------------

masked_load_p = ji.Primitive("masked_load")
masked_swap_p = ji.Primitive("masked_swap")


def _check_broadcasts(what: str, named, shape, verb: str):
  """A mask or fill value broadcasts to the accessed view (NumPy's rule), as in Triton."""
  for name, aval in named:
    try:
      ok = np.broadcast_shapes(tuple(aval.shape), shape) == shape
    except ValueError:
      ok = False
    if not ok:
      raise ValueError(f"{what} a Ref view of shape {shape}: its {name} has shape "
                       f"{tuple(aval.shape)}, which does not broadcast to it; {verb}")


def _masked_load_abstract_eval(ref_aval, *args, tree, has_mask, has_other, cache=None, evict=None):
  transforms = ji.tree_util.tree_unflatten(tree, args[:tree.num_leaves])
  shape = view_shape(ref_aval, transforms)
  names = (["mask"] if has_mask else []) + (["other"] if has_other else [])
  _check_broadcasts("load from", zip(names, args[tree.num_leaves:]), shape,
                    "give it the shape of the loaded block")
  return ji.ShapedArray(shape, ref_aval.dtype), {ji.ReadEffect(0)}


def _masked_swap_abstract_eval(ref_aval, val_aval, *args, tree, has_mask, evict=None):
  transforms = ji.tree_util.tree_unflatten(tree, args[:tree.num_leaves])
  shape = view_shape(ref_aval, transforms)
  if has_mask:
    _check_broadcasts("store into", [("mask", args[tree.num_leaves])], shape,
                      "give it the shape of the stored block")
  if tuple(val_aval.shape) != shape:
    raise ValueError(f"store of shape {val_aval.shape} into a Ref view of shape {shape}")
  if val_aval.dtype != ref_aval.dtype:
    raise ValueError(f"store of dtype {val_aval.dtype} into a Ref of dtype {ref_aval.dtype}")
  return ji.ShapedArray(shape, ref_aval.dtype), {ji.WriteEffect(0)}


masked_load_p.def_effectful_abstract_eval(_masked_load_abstract_eval)
masked_swap_p.def_effectful_abstract_eval(_masked_swap_abstract_eval)


def base_coords(transforms) -> list[jax.Array]:
  """Coordinates in the base Ref of every element a chain of indexers selects (``ref.at[...]``
  views, then the access), one array per base dimension, broadcast to the result shape."""
  *views, last = transforms
  coords = indexer_coords(last)
  for t in reversed(views):
    coords = _parent_coords(t, coords)
  return coords


def _in_range(coords, shape):
  ok = jnp.ones(coords[0].shape if coords else (), bool)
  for c, d in zip(coords, shape):
    ok = ok & (c >= 0) & (c < d)
  return ok


def _masked_load_discharge(ctx, x, *args, tree, has_mask, has_other, cache=None, evict=None):
  n = tree.num_leaves
  transforms = ji.tree_util.tree_unflatten(tree, args[:n])
  rest = list(args[n:])
  mask = rest.pop(0) if has_mask else None
  other = rest.pop(0) if has_other else None
  coords = base_coords(transforms)
  clamped = tuple(jnp.clip(c, 0, d - 1) for c, d in zip(coords, x.shape))
  y = x[clamped] if clamped else x
  keep = _in_range(coords, x.shape) if mask is None else (_in_range(coords, x.shape) & mask)
  fill = poison(y.shape, y.dtype) if other is None else jnp.broadcast_to(other, y.shape).astype(y.dtype)
  return (None,) * (1 + len(args)), jnp.where(keep, y, fill)


def _masked_swap_discharge(ctx, x, val, *args, tree, has_mask, evict=None):
  n = tree.num_leaves
  transforms = ji.tree_util.tree_unflatten(tree, args[:n])
  mask = args[n] if has_mask else None
  coords = base_coords(transforms)
  clamped = tuple(jnp.clip(c, 0, d - 1) for c, d in zip(coords, x.shape))
  old = x[clamped]
  keep = _in_range(coords, x.shape)
  if mask is not None:
    keep = keep & mask
  # Masked-off lanes point past the end and are dropped, so they never clobber a kept lane.
  target = tuple(jnp.where(keep, c, d) for c, d in zip(coords, x.shape))
  new_x = x.at[target].set(val, mode="drop")
  # A masked-off lane (or one outside the array) returns the value given for it, as in JAX
  # Pallas: its Ref keeps the old one.
  old = jnp.where(keep, old, val)
  return (new_x,) + (None,) * (1 + len(args)), old


ji.register_discharge_rule(masked_load_p)(_masked_load_discharge)
ji.register_discharge_rule(masked_swap_p)(_masked_swap_discharge)


def flat_access(ref, idx):
  base, views = split_ref(ref)
  shape = view_shape(base.aval if hasattr(base, "aval") else jax.typeof(base), views)
  transforms = views + (_indexer(idx, shape),)
  flat, tree = ji.tree_util.tree_flatten(transforms)
  return base, flat, tree


_EVICTION_POLICIES = (None, "", "evict_first", "evict_last")
_CACHE_MODIFIERS = (None, "", ".ca", ".cg", ".cv")


def _check_hint(name, value, allowed):
  if value not in allowed:
    raise ValueError(f"{name}={value!r} is not one of {[a for a in allowed if a]}")
  return value or None


def load(x_ref_or_view, idx=(), *, mask=None, other=None, cache_modifier=None,
         eviction_policy=None, volatile=False) -> jax.Array:
  """Reads ``x_ref[idx]``; with ``mask``, lanes where it is False read ``other``
  and may index past the Ref (as in Triton). The cache hints go to the GPU's load
  instruction; the interpreter ignores them."""
  del volatile
  cache = _check_hint("cache_modifier", cache_modifier, _CACHE_MODIFIERS)
  evict = _check_hint("eviction_policy", eviction_policy, _EVICTION_POLICIES)
  if cache and evict:
    raise ValueError(f"PTX cannot combine cache_modifier={cache!r} with eviction_policy="
                     f"{evict!r} in one load; pass one of them")
  if mask is None and other is None and cache is None and evict is None:
    return x_ref_or_view[idx]
  base, flat, tree = flat_access(x_ref_or_view, idx)
  extra = [m for m in (mask, other) if m is not None]
  extra = [jnp.asarray(e) for e in extra]
  return masked_load_p.bind(base, *flat, *extra, tree=tree, has_mask=mask is not None,
                            has_other=other is not None, cache=cache, evict=evict)


def swap(x_ref_or_view, idx, val, *, mask=None, eviction_policy=None) -> jax.Array:
  """Writes ``val`` at ``idx`` (only where ``mask`` is True) and returns the old values (``val``
  where ``mask`` is False, as in JAX Pallas)."""
  evict = _check_hint("eviction_policy", eviction_policy, _EVICTION_POLICIES)
  if mask is None and evict is None:
    old = x_ref_or_view[idx]
    x_ref_or_view[idx] = val
    return old
  base, flat, tree = flat_access(x_ref_or_view, idx)
  val = jnp.asarray(val)
  extra = [] if mask is None else [jnp.asarray(mask)]
  return masked_swap_p.bind(base, val, *flat, *extra, tree=tree, has_mask=mask is not None,
                            evict=evict)


def store(x_ref_or_view, idx, val, *, mask=None, eviction_policy=None) -> None:
  """Writes ``val`` at ``idx``; with ``mask``, only where it is True."""
  if mask is None and not _check_hint("eviction_policy", eviction_policy, _EVICTION_POLICIES):
    x_ref_or_view[idx] = val     # a plain store: swap would read the old values too
  else:
    swap(x_ref_or_view, idx, val, mask=mask, eviction_policy=eviction_policy)


# --- math ------------------------------------------------------------------------------

def dot(a, b, trans_a: bool = False, trans_b: bool = False, allow_tf32: bool | None = None,
        precision=None):
  """Matrix product of 2D (or batched) blocks, accumulated in float32 (int32 for ints)."""
  if a.ndim != b.ndim or a.ndim not in (2, 3):
    raise ValueError(f"pl.dot takes two 2D or two 3D arrays, got {a.shape} and {b.shape}")
  if allow_tf32 is not None:
    if precision is not None:
      raise ValueError("pass either allow_tf32 or precision to pl.dot, not both")
    precision = lax.Precision.DEFAULT if allow_tf32 else lax.Precision.HIGHEST
  lhs_c = a.ndim - 2 if trans_a else a.ndim - 1
  rhs_c = b.ndim - 1 if trans_b else b.ndim - 2
  batch = ((0,), (0,)) if a.ndim == 3 else ((), ())
  dtype = jnp.promote_types(a.dtype, b.dtype)
  out_dtype = jnp.int32 if jnp.issubdtype(dtype, jnp.integer) else jnp.float32
  return lax.dot_general(a, b, (((lhs_c,), (rhs_c,)), batch), precision=precision,
                         preferred_element_type=out_dtype)


def broadcast_to(a, shape):
  return jnp.broadcast_to(a, shape)


def empty(shape, dtype, *, out_sharding=None):
  """An array whose values must not be relied on (zeros here)."""
  del out_sharding
  return jnp.zeros(shape, dtype)


def empty_like(x):
  return jax.tree.map(lambda a: empty(jnp.shape(a), a.dtype), x)


# --- compiler hints ------------------------------------------------------------------

hint_p = ji.Primitive("compiler_hint")
hint_p.def_impl(lambda x, **_: x)
hint_p.def_abstract_eval(lambda x, **_: x)
ji.mlir.register_lowering(hint_p, lambda ctx, x, **_: [x])
ji.batching.primitive_batchers[hint_p] = lambda args, dims, **kw: (hint_p.bind(*args, **kw), dims[0])


def multiple_of(x, values):
  """Asserts to the compiler that ``x`` is a multiple of ``values``."""
  values = tuple(values) if isinstance(values, (list, tuple)) else (int(values),)
  return hint_p.bind(jnp.asarray(x), kind="multiple_of", values=values)


def max_contiguous(x, values):
  """Asserts to the compiler that the first ``values`` elements of ``x`` are contiguous."""
  values = tuple(values) if isinstance(values, (list, tuple)) else (int(values),)
  return hint_p.bind(jnp.asarray(x), kind="max_contiguous", values=values)


# --- control flow ----------------------------------------------------------------------

def when(condition, /):
  """``@pl.when(cond)`` runs the decorated function only when ``cond`` holds."""
  def decorator(f: Callable[[], None]) -> None:
    if isinstance(condition, (bool, np.bool_)):
      if condition:
        f()
    else:
      lax.cond(condition, lambda: (f(), None)[1], lambda: None)
  return decorator


def loop(lower, upper, *, init_carry=None, step=1, unroll=None):
  """``@pl.loop(lo, hi)`` runs the decorated ``body(i)`` (or ``body(i, carry)``
  when ``init_carry`` is given) for ``i`` in ``range(lo, hi, step)``."""
  def decorator(body):
    trips = cdiv(upper - lower, step) if not isinstance(upper - lower, int) else max(0, cdiv(upper - lower, step))
    idx_dtype = jnp.result_type(lower, upper)
    def fori_body(k, carry):
      i = jnp.asarray(lower, idx_dtype) + k * step
      if init_carry is None:
        body(i)
        return carry
      return body(i, carry)
    kw = {} if unroll is None else {"unroll": unroll}
    out = lax.fori_loop(0, trips, fori_body, init_carry, **kw)
    return out
  return decorator


# --- scoped scratch ------------------------------------------------------------------

run_scoped_p = ji.Primitive("run_scoped")
run_scoped_p.multiple_results = True


def body_effects(jaxpr, num_consts: int) -> set:
  """The effects of a primitive whose body ``jaxpr`` takes its ``num_consts`` operands first:
  the body's, its Ref-input effects renumbered to those operands (the others are its own)."""
  effects = set()
  for eff in jaxpr.effects:
    if isinstance(eff, ji.effects.JaxprInputEffect):
      pos = jaxpr.invars.index(eff.input) if eff.input in jaxpr.invars else None
      if pos is not None and pos < num_consts:
        effects.add(eff.replace(pos))
    else:
      effects.add(eff)
  return effects


def _run_scoped_abstract_eval(*args, jaxpr, num_consts, zeroed=(), **_):
  return [v.aval for v in jaxpr.outvars], body_effects(jaxpr, num_consts)


run_scoped_p.def_effectful_abstract_eval(_run_scoped_abstract_eval)


def _run_scoped_discharge(ctx, *args, jaxpr, num_consts, zeroed=(), second_fill=False, **_):
  # second_fill: the interpreter's uninitialized-data check runs a program twice, the second
  # time with its scratch filled with other values (interpret/uninit.py)
  fill = other_poison if second_fill else poison
  scratch = [(jnp.zeros if z else fill)(v.aval.shape, v.aval.dtype)
             for v, z in zip(jaxpr.invars[num_consts:], zeroed or [False] * len(jaxpr.invars))]
  pure = ji.discharge_state(jaxpr)
  res = ji.eval_jaxpr(pure, pure.consts, *args, *scratch)
  nout = len(jaxpr.outvars)
  outs, finals = res[:nout], iter(res[nout:])
  new_args = [next(finals) if ji.is_ref_aval(v.aval) else None for v in jaxpr.invars]
  return new_args[:num_consts], outs


ji.register_discharge_rule(run_scoped_p)(_run_scoped_discharge)


def _ref_aval_of(t):
  if isinstance(t, pc.MemoryRef) or hasattr(t, "get_ref_aval"):
    return t.get_ref_aval()
  if isinstance(t, jax.ShapeDtypeStruct):
    return ji.ref_aval(t.shape, t.dtype)
  raise TypeError(f"run_scoped takes scratch types such as pl.ANY((8,), jnp.float32), got {t!r}")


def _scoped_names(f, types, kw_types, n: int):
  """The parameter names of ``f`` that receive the scratch Refs (for error messages): a
  positional type's parameter, a keyword type's key; '' where a type is a pytree of several."""
  is_leaf = lambda t: hasattr(t, "get_ref_aval")
  try:
    params = [p.name for p in inspect.signature(f).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  except (TypeError, ValueError):
    params = []
  names = []
  for k, t in enumerate(types):
    leaves = len(jax.tree.leaves(t, is_leaf=is_leaf))
    one = params[k] if k < len(params) and leaves == 1 else ""
    names += [one] * leaves
  for key in sorted(kw_types):
    leaves = len(jax.tree.leaves(kw_types[key], is_leaf=is_leaf))
    names += [key if leaves == 1 else ""] * leaves
  return names if len(names) == n else None


def run_scoped(f: Callable[..., Any], *types, collective_axes=(), **kw_types):
  """Calls ``f`` with freshly allocated scratch Refs of the given types; returns its result.
  With ``collective_axes`` (a Mosaic GPU thread axis), the threads of a block share them."""
  if isinstance(collective_axes, str):
    collective_axes = (collective_axes,)
  flat_types, types_tree = jax.tree.flatten((types, kw_types), is_leaf=lambda t: hasattr(t, "get_ref_aval"))
  avals = [_ref_aval_of(t) for t in flat_types]
  out_tree_box = []

  def flat_f(*refs):
    args, kwargs = jax.tree.unflatten(types_tree, refs)
    out = f(*args, **kwargs)
    flat_out, tree = jax.tree.flatten(out)
    out_tree_box.append(tree)
    return flat_out

  jaxpr, _, consts = ji.trace_to_jaxpr(flat_f, avals, name=getattr(f, "__name__", "run_scoped"),
                                       arg_names=_scoped_names(f, types, kw_types, len(avals)))
  zeroed = tuple(getattr(t, "memory_space", None) is pc.MemorySpace.SEMAPHORE for t in flat_types)
  outs = run_scoped_p.bind(*consts, jaxpr=jaxpr, num_consts=len(consts), zeroed=zeroed,
                           scratch_types=tuple(flat_types), collective_axes=tuple(collective_axes))
  return jax.tree.unflatten(out_tree_box[0], outs)


def run_state(f: Callable[..., None]):
  """``pl.run_state(f)(init)``: ``f`` runs on Refs holding ``init`` (a pytree; ``plgpu.ACC.init``
  makes a WGMMA accumulator) and writes them; the call returns their final values. ``f``'s own
  result would be dropped, so ``f`` must return None (as in JAX Pallas)."""
  def body(*refs):
    out = f(*refs)
    if out is not None:
      where = ji.current_user_frame()
      raise ValueError(
          f"pl.run_state: the function {getattr(f, '__name__', f)} returned "
          f"{jax.tree.map(lambda x: getattr(jax.typeof(x), 'str_short', lambda: x)(), out)}"
          f"{f' at {where}' if where else ''}; pl.run_state returns the final values of the "
          "Refs it made, not the function's result: write the result into one of them "
          "(acc_ref[...] = value), and return None")
  body.__name__ = getattr(f, "__name__", "run_state")
  return ji.run_state(body)


# --- debugging --------------------------------------------------------------------------

def debug_check(condition, message: str) -> None:
  """Fails the kernel with ``message`` when ``condition`` is False, if
  ``pl.enable_debug_checks()`` is on at trace time; otherwise does nothing."""
  if pc.debug_checks_enabled():
    checkify.check(condition, message)


debug_print_p = ji.Primitive("debug_print")
debug_print_p.multiple_results = True
debug_print_p.def_effectful_abstract_eval(lambda *args, fmt: ([], {ji.debug_effect}))


def _debug_print_lowering(ctx, *args, fmt):
  def emit(*vals):
    jax.debug.print(fmt, *vals)
    return []
  return ji.mlir.lower_fun(emit, multiple_results=True)(ctx, *args)


ji.mlir.register_lowering(debug_print_p, _debug_print_lowering)
debug_print_p.def_impl(lambda *args, fmt: (print(fmt.format(*args)), [])[1])


def debug_print(fmt: str, *args) -> None:
  """Prints ``fmt.format(*args)`` from inside a kernel (once per program)."""
  debug_print_p.bind(*[jnp.asarray(a) for a in args], fmt=fmt)


@dataclasses.dataclass(frozen=True)
class Buffered:
  """``pl.BlockSpec(..., pipeline_mode=pl.Buffered(n))``: how many buffers a pipeline keeps
  for the block (a performance choice; where a pipeline does not take it, it says so)."""
  buffer_count: int
  use_lookahead: bool = False

  def __post_init__(self):
    if self.buffer_count < 1:
      raise ValueError(f"pl.Buffered: buffer_count must be at least 1, got {self.buffer_count}")

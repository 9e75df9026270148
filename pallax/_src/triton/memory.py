"""Refs in generated Triton: views of global memory, their addresses and masks, loads and stores.

A Ref view is a pointer and, per dimension of the array behind it, where the view starts, its
size, and the step between neighbouring elements: global coordinate = start + step * local.
"""
from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from pallax._src import jax_internals as ji
from pallax._src import primitives as prims
from pallax._src import ref_access
from pallax._src.gpu import expr as ex
from pallax._src.gpu.expr import add, mul
from pallax._src.gpu.source import Unsupported
from pallax._src.triton import lang as tl
from pallax._src.triton.writer import Access, rule


@dataclasses.dataclass(frozen=True)
class RefDim:
  start: ex.Expr      # element offset of local coordinate 0 (an int32 expression)
  size: int           # extent of the view (1 when the dimension is indexed away)
  array_size: int
  stride: int         # elements between neighbours in the array
  step: int = 1
  kept: bool = True   # a dimension of the view (False: squeezed or integer-indexed)
  exact: bool = True  # every local coordinate < size lies inside the array
  index: ex.Expr | None = None  # a tensor of offsets: global = start + step * index[local]
  index_rank: int = 1       # the index tensor's rank (> 1 when several arrays index the view)
  index_axis: int = 0       # this dimension's axis in the index tensor
  low: bool = False         # start may be negative (an Element block with low padding)


@dataclasses.dataclass(frozen=True)
class RefVal:
  ptr: ex.Name
  dtype: np.dtype
  dims: tuple
  origin: str

  @property
  def shape(self) -> tuple[int, ...]:
    return tuple(d.size for d in self.dims if d.kept)


def whole(ptr: ex.Name, dtype, shape, origin: str, lead: tuple = ()) -> RefVal:
  """A view of a whole array of ``shape`` (after the dimensions ``lead``)."""
  dims = tuple(lead) + tuple(RefDim(tl.i32(0), s, s, stride(shape, d)) for d, s in enumerate(shape))
  return RefVal(ptr, np.dtype(dtype), dims, origin)


def stride(shape, d) -> int:
  return int(math.prod(shape[d + 1:]))


# --- views ---------------------------------------------------------------------------------

def index_ref(gen, ref: RefVal, transforms, static=frozenset(), verb="access to") -> RefVal:
  """``ref`` viewed through ``transforms``. Indices whose ids are in ``static`` were literals in
  the jaxpr: negative ones count from the end, as in NumPy and the interpreter. Any other index
  known here (a folded constant) must lie inside the Ref, as the interpreter checks."""
  for t in transforms:
    if not isinstance(t, ji.NDIndexer):
      raise Unsupported(f"Ref transform {type(t).__name__}")
    kept = [i for i, d in enumerate(ref.dims) if d.kept]
    dims = list(ref.dims)
    gather = _gather_axes(t)
    for k, idx in zip(kept, t.indices):
      dims[k] = _index_dim(gen, ref, dims[k], idx, t, gather, static, verb, kept.index(k))
    ref = dataclasses.replace(ref, dims=tuple(dims))
  return ref


def _index_dim(gen, ref, d: RefDim, idx, t, gather, static, verb, axis) -> RefDim:
  if d.index is not None:   # only the whole of an array-indexed dimension can be taken
    if not (isinstance(idx, ji.Slice) and idx.start == 0 and idx.size == d.size and idx.stride == 1):
      raise Unsupported("indexing a Ref view that was itself indexed with an array")
    return d
  if isinstance(idx, ex.Expr) and len(idx.shape) == 1 and len(t.int_indexer_shape) == 1 and \
      sum(not isinstance(i, ji.Slice) for i in t.indices) == 1:
    # One array of indices (a gather): the dimension stays where it is (NumPy's rule).
    return dataclasses.replace(d, size=idx.shape[0], index=_index(idx), exact=False)
  if gather is not None and id(idx) in gather:
    m = gather[id(idx)]
    return dataclasses.replace(d, size=idx.shape[m], index=_index(idx), exact=False,
                               index_rank=len(idx.shape), index_axis=m)
  if isinstance(idx, ji.Slice):
    if not isinstance(idx.size, (int, np.integer)):
      raise Unsupported("slices of dynamic size")
    start = _int(idx.start)
    return dataclasses.replace(d, start=add(d.start, mul(start, d.step)),
                               size=int(idx.size), step=d.step * int(idx.stride))
  if isinstance(idx, (int, np.integer)) or isinstance(idx, ex.Expr) and idx.shape == ():
    i = _int(idx)
    lit = ex.literal(i)
    if lit is not None and id(idx) in static and -d.size <= lit < 0:
      i = tl.i32(lit + d.size)
    elif lit is not None and not 0 <= lit < d.size:
      raise IndexError(f"pallas_call {gen.kernel_name}: out-of-bounds {verb} {ref.origin} at "
                       f"{gen.enclosing_frame}: index {lit} along dimension {axis}, which has "
                       f"size {d.size}")
    return dataclasses.replace(d, start=add(d.start, mul(i, d.step)), size=1, kept=False)
  raise Unsupported("indexing a Ref with an array of indices (gather/scatter)")


def _gather_axes(t) -> dict | None:
  """For a view indexed by several arrays side by side (``ref.at[rows, cols]``, broadcast by
  JAX to one shape whose rank is their number): {id(index): its axis in that shape}."""
  pos = [k for k, i in enumerate(t.indices) if not isinstance(i, ji.Slice)]
  arrays = [t.indices[k] for k in pos]
  shape = tuple(t.int_indexer_shape)
  if len(arrays) < 2 or pos != list(range(pos[0], pos[0] + len(pos))) or len(shape) != len(arrays):
    return None
  if any(not isinstance(a, ex.Expr) or tuple(a.shape) != shape for a in arrays):
    return None
  return {id(a): m for m, a in enumerate(arrays)}


def _index(idx: ex.Expr) -> ex.Expr:
  """An index widened to 32 bits: address arithmetic in int8 would wrap."""
  if np.dtype(idx.dtype).itemsize < 4:
    if isinstance(idx, ex.Lit):
      return tl.i32(idx.value)
    return tl.to(idx, tl.I32)
  return idx


def _int(x) -> ex.Expr:
  return _index(x) if isinstance(x, ex.Expr) else tl.i32(int(x))


# --- addresses --------------------------------------------------------------------------------

def address(ref: RefVal, user_mask: ex.Expr | None):
  """(offsets, mask or None, view shape) of a Ref view: the mask keeps padded lanes, lanes past
  the array and negative coordinates out."""
  shape = ref.shape
  padded = tuple(ex.pow2(s) for s in shape)
  big = math.prod(d.array_size for d in ref.dims) >= 2**31
  offs, conds, j = tl.i32(0), [], 0
  for d in ref.dims:
    if d.kept:
      coord, dim_conds = _lane_coord(d, j, padded, user_mask is not None)
      j += 1
    else:
      coord = d.start
      dim_conds = [tl.compare("<", coord, ex.index_literal(d.array_size))] if not d.exact and \
          not ex.is_zero(coord) else []
      if d.low:
        dim_conds.append(tl.compare(">=", coord, tl.i32(0)))
    conds += dim_conds
    if not ex.is_zero(coord):
      offs = add(offs, mul(tl.to(coord, np.int64) if big else coord, d.stride))
  if user_mask is not None:
    conds.append(user_mask)
  return offs, tl.all_of(conds), shape


def _lane_coord(d: RefDim, j: int, padded, masked_by_user: bool):
  lane = tl.expand(tl.arange(padded[j]), j, len(padded))
  first = j - d.index_axis   # an index tensor spans the result axes of all arrays indexing the view
  local = lane if d.index is None else \
      tl.expand(d.index, range(first, first + d.index_rank), len(padded))
  coord = add(d.start, mul(local, d.step))
  conds = []
  if d.size != padded[j]:
    conds.append(tl.compare("<", lane, tl.i32(d.size)))
  if d.index is not None or d.low:
    conds.append(tl.compare(">=", coord, tl.i32(0)))
  if not d.exact or masked_by_user:
    conds.append(tl.compare("<", coord, ex.index_literal(d.array_size)))
  return coord, conds


def _pointer(ref: RefVal, offs: ex.Expr) -> ex.Expr:
  return ref.ptr if ex.is_zero(offs) else ex.binary("+", ref.ptr, offs)


def _hints(**hints) -> dict:
  """Cache hints as keyword arguments of tl.load / tl.store (none: empty)."""
  return {k: v for k, v in hints.items() if v}


def load(gen, ref: RefVal, user_mask=None, other=None, hint="", cache=None, evict=None) -> ex.Expr:
  offs, mask, shape = address(ref, user_mask)
  hint = hint or ref.ptr.name.removesuffix("_ref").removesuffix("_ptr") or "x"
  kwargs = {}
  if mask is not None:
    kwargs = {"mask": mask, "other": _fill(other, ref.dtype)}
  kwargs.update(_hints(cache_modifier=cache, eviction_policy=evict))
  gen.max_numel = max(gen.max_numel, math.prod(ex.pow2(s) for s in shape))
  gen.accesses.append(Access("load", ref.origin, shape, mask))
  value = ex.call("tl.load", _pointer(ref, offs), dtype=ref.dtype, shape=shape, **kwargs)
  if ref.dtype == np.bool_:   # bools live in memory as bytes
    value = tl.compare("!=", value, tl.i32(0))
  return gen.bind(value, hint)


def _fill(other, dtype) -> ex.Expr:
  """A masked load's value for masked-off lanes, in the Ref's dtype (an f32 -inf beside bf16
  data would make the loaded tensor f32)."""
  if other is None:
    return _zero(dtype)
  if np.dtype(other.dtype) == np.dtype(dtype) or np.dtype(dtype) == np.bool_:
    return other
  if isinstance(other, ex.Lit) and jnp.issubdtype(dtype, jnp.floating):
    return ex.Lit(float(other.value), dtype=np.dtype(dtype))
  return tl.to(other, dtype)


def _zero(dtype) -> ex.Lit:
  dtype = np.dtype(dtype)
  if dtype == np.bool_:
    return ex.Lit(False, dtype=dtype)
  return ex.Lit(0.0, dtype=tl.F32) if jnp.issubdtype(dtype, jnp.floating) else tl.i32(0)


def store(gen, ref: RefVal, val: ex.Expr, user_mask=None, evict=None):
  offs, mask, shape = address(ref, user_mask)
  if tuple(shape) != tuple(val.shape):
    raise Unsupported(f"store of shape {val.shape} into a Ref view of shape {shape}")
  v = tl.tensor(val)
  if ref.dtype == np.bool_:
    v = tl.to(val, np.int8)
  kwargs = {"mask": mask} if mask is not None else {}
  kwargs.update(_hints(eviction_policy=evict))
  gen.accesses.append(Access("store", ref.origin, shape, mask))
  gen.emit_expr(ex.call("tl.store", _pointer(ref, offs), v, **kwargs))
  if ref.ptr.name in gen.read_back:
    # The kernel reads this Ref again later, possibly through other threads: make the
    # stores visible to the whole program first.
    gen.emit("tl.debug_barrier()")


# --- hidden buffers ------------------------------------------------------------------------------

def scratch_ref(gen, aval, name: str, zeroed: bool = False, shared: bool = False) -> RefVal:
  """A Ref to a hidden global-memory buffer: one slice per concurrent program (scratch), or
  one for all (``shared``, pl.get_global). Scratch contents persist along the grid axes that
  run as loops inside a program, as in the interpreter."""
  shape = tuple(aval.shape)
  lanes = 1 if shared else gen.lanes
  ptr = ex.Name(gen.fresh(name), dtype=np.dtype(aval.dtype))
  gen.hidden.append((ptr.name, (lanes,) + shape, np.dtype(aval.dtype), zeroed))
  gen.read_back.add(ptr.name)
  lane = tl.i32(0) if shared else gen.lane
  lead = (RefDim(lane, 1, lanes, int(math.prod(shape)), kept=False),)
  return whole(ptr, aval.dtype, shape, name, lead)


def spill(gen, v: ex.Expr | None, aval=None) -> RefVal:
  """A scratch buffer private to this program, of ``v``'s shape (or ``aval``'s), holding
  ``v``: for data movement Triton cannot do in registers (movement.py)."""
  aval = aval if v is None else ji.ShapedArray(v.shape, v.dtype)
  buf = scratch_ref(gen, aval, "buf")
  if v is not None:
    store(gen, buf, v)
  return buf


# --- rules: Ref accesses ----------------------------------------------------------------------

def view(ctx, invals):
  """The Ref view an access equation reads or writes, and its decoded operands."""
  eqn = ctx.eqn
  acc = ref_access.split(eqn, invals)
  span = ref_access.leaf_span(eqn)
  static = {id(v) for a, v in zip(eqn.invars[span], invals[span]) if isinstance(a, ji.Literal)}
  v = index_ref(ctx.gen, acc.ref, acc.transforms, static, ref_access.verb(eqn))
  if acc.mask is None:   # a masked view may run past its Ref (Triton style)
    _check_known_bounds(ctx.gen, v, ref_access.verb(eqn))
  return v, acc


def _check_known_bounds(gen, ref: RefVal, verb: str):
  """A view whose extent is known here (constant starts) must lie inside its array, as the
  interpreter checks: unmasked, a GPU would read or write outside it."""
  for axis, d in enumerate(x for x in ref.dims if x.kept):
    lit = ex.literal(d.start)
    if lit is None or d.index is not None or d.size == 0:
      continue
    last = lit + (d.size - 1) * d.step
    lo, hi = min(lit, last), max(lit, last)
    if (lo < 0 and not d.low) or (hi >= d.array_size and d.exact):
      raise IndexError(f"pallas_call {gen.kernel_name}: out-of-bounds {verb} {ref.origin} at "
                       f"{gen.enclosing_frame}: index {lo if lo < 0 else hi} along dimension "
                       f"{axis}, which has size {d.array_size}")


@rule(ji.get_p)
def _get(ctx, *invals, **_):
  return load(ctx.gen, view(ctx, invals)[0])


@rule(ji.swap_p)
def _swap(ctx, *invals, **_):
  v, acc = view(ctx, invals)
  old = load(ctx.gen, v, hint="old") if ctx.is_used() else None
  store(ctx.gen, v, acc.values[0])
  return old if old is not None else acc.values[0]


@rule(ji.addupdate_p)
def _addupdate(ctx, *invals, **_):
  v, acc = view(ctx, invals)
  cur = load(ctx.gen, v, hint="cur")
  store(ctx.gen, v, ctx.gen.bind(ex.binary("+", cur, acc.values[0]), "upd"))
  return []


@rule(prims.masked_load_p)
def _masked_load(ctx, *invals, cache=None, evict=None, **_):
  v, acc = view(ctx, invals)
  return load(ctx.gen, v, acc.mask, acc.other, cache=cache, evict=evict)


@rule(prims.masked_swap_p)
def _masked_swap(ctx, *invals, evict=None, **_):
  v, acc = view(ctx, invals)
  old = load(ctx.gen, v, acc.mask, hint="old") if ctx.is_used() else None
  store(ctx.gen, v, acc.values[0], acc.mask, evict=evict)
  return old if old is not None else acc.values[0]


@rule(prims.run_scoped_p)
def _run_scoped(ctx, *args, jaxpr, num_consts, zeroed=None, **_):
  if any(zeroed or ()):
    raise Unsupported("semaphores in pl.run_scoped")
  scratch = [scratch_ref(ctx.gen, v.aval.inner_aval, "scoped") for v in jaxpr.invars[num_consts:]]
  return ctx.gen.lower_jaxpr(jaxpr, [*args, *scratch])

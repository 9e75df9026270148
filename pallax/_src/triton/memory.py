"""Refs in generated Triton: views of global memory, their addresses and masks, loads and stores.

A Ref view is a pointer and, per dimension of the array behind it, where the view starts, its
size, and the step between neighbouring elements: global coordinate = start + step * local.
A dimension indexed by an array takes its local coordinates from the array instead; the arrays of
one indexer span the view's gather axes, placed by NumPy's rule for advanced indexing.
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
from pallax._src.gpu import subbyte as gpu_subbyte
from pallax._src.gpu.expr import add, mul
from pallax._src.gpu.source import Unsupported
from pallax._src.triton import lang as tl
from pallax._src.triton import subbyte
from pallax._src.triton.writer import Access, rule


@dataclasses.dataclass(frozen=True)
class RefDim:
  start: ex.Expr      # element offset of local coordinate 0 (an int32 expression)
  size: int           # extent of the view (1 when the dimension is indexed away)
  array_size: int
  stride: int         # elements between neighbours in the array
  step: int = 1
  kept: bool = True   # an axis of the view (False: squeezed, or indexed by an integer or an array)
  exact: bool = True  # every local coordinate < size lies inside the array
  index: ex.Expr | None = None  # an index array: global = start + step * index[gather lanes]
  low: bool = False         # start may be negative (an Element block with low padding)


@dataclasses.dataclass(frozen=True)
class RefVal:
  ptr: ex.Name
  dtype: np.dtype
  dims: tuple
  origin: str
  gather: tuple = ()    # the shape the index arrays of the dimensions with an ``index`` broadcast to
  gather_at: int = 0    # where those axes sit among the view's axes (NumPy's rule)

  @property
  def shape(self) -> tuple[int, ...]:
    kept = tuple(d.size for d in self.dims if d.kept)
    return kept[:self.gather_at] + tuple(self.gather) + kept[self.gather_at:]

  def kept_axes(self) -> list[int]:
    """The view axis of each kept dimension, in order."""
    n = sum(d.kept for d in self.dims)
    return [k if k < self.gather_at else k + len(self.gather) for k in range(n)]


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
    ref = _index_view(gen, ref, t, static, verb)
  return ref


def _index_view(gen, ref: RefVal, t, static, verb) -> RefVal:
  """``ref`` indexed by one NDIndexer: one index per axis of the view. Index arrays (JAX has
  broadcast them, and any integer beside them, to ``t.int_indexer_shape``) select the gather
  axes, which go where NumPy puts them."""
  shape, owners = ref.shape, _owners(ref)
  arrays = bool(t.int_indexer_shape)
  if arrays and ref.gather:
    raise Unsupported("indexing with arrays a Ref view that was itself indexed with an array")
  dims = list(ref.dims)
  for axis, idx in enumerate(t.indices):
    k = owners[axis]
    if k is None:   # a gather axis of the view: only the whole of it can be taken
      if not (isinstance(idx, ji.Slice) and idx.start == 0 and idx.size == shape[axis] and idx.stride == 1):
        raise Unsupported("indexing part of a Ref view that was itself indexed with an array")
      continue
    if arrays and not isinstance(idx, ji.Slice):
      dims[k] = _gather_dim(gen, dims[k], idx, tuple(t.int_indexer_shape))
    else:
      dims[k] = _index_dim(gen, ref, dims[k], idx, static, verb, axis)
  if arrays:
    return dataclasses.replace(ref, dims=tuple(dims), gather=tuple(t.int_indexer_shape),
                               gather_at=_gather_position(t))
  before = [k for k in owners[:ref.gather_at] if k is not None]   # kept dims before the gather axes
  return dataclasses.replace(ref, dims=tuple(dims), gather_at=sum(dims[k].kept for k in before))


def _owners(ref: RefVal) -> list:
  """Per axis of the view: the position in ``ref.dims`` of the dimension it runs along, or None
  for a gather axis."""
  kept = [k for k, d in enumerate(ref.dims) if d.kept]
  return kept[:ref.gather_at] + [None] * len(ref.gather) + kept[ref.gather_at:]


def _gather_position(t) -> int:
  """NumPy's rule: the gather axes replace the integer-indexed ones where those are adjacent,
  and go first where slices separate them."""
  pos = [k for k, i in enumerate(t.indices) if not isinstance(i, ji.Slice)]
  return pos[0] if pos == list(range(pos[0], pos[0] + len(pos))) else 0


def _gather_dim(gen, d: RefDim, idx, gather: tuple) -> RefDim:
  """A dimension indexed by an array: its coordinates come from the array, along the gather axes."""
  if not isinstance(idx, ex.Expr) or idx.shape == ():   # a scalar that JAX did not broadcast
    idx = tl.full(gather, _int(idx), tl.I32)
  return dataclasses.replace(d, size=1, kept=False, exact=False, index=_from_end(gen, idx, d.size))


def _from_end(gen, idx: ex.Expr, size: int) -> ex.Expr:
  """NumPy's rule for index arrays, as in the interpreter: negative entries count from the end
  (entries below -size stay negative, outside the Ref, and are masked off)."""
  unsigned = np.issubdtype(idx.dtype, np.unsignedinteger)
  idx = _index(idx)
  known = ex.interval(idx)
  if unsigned or known is not None and known[0] >= 0:   # never negative: nothing to wrap
    return idx
  wrapped = tl.where(tl.compare("<", idx, tl.i32(0)), add(idx, tl.i32(size)), idx)
  return gen.bind(wrapped, "idx")


def _index_dim(gen, ref, d: RefDim, idx, static, verb, axis) -> RefDim:
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
  raise Unsupported(f"indexing a Ref with {type(idx).__name__}")


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
  lanes = [tl.expand(tl.arange(p), a, len(padded)) for a, p in enumerate(padded)]
  conds = [tl.compare("<", lanes[a], tl.i32(s)) for a, (s, p) in enumerate(zip(shape, padded)) if s != p]
  offs, axes = tl.i32(0), iter(ref.kept_axes())
  for d in ref.dims:
    if d.kept:
      local = lanes[next(axes)]
    elif d.index is not None:   # the index array spans the gather axes (aligned at their end)
      end = ref.gather_at + len(ref.gather)
      local = tl.expand(d.index, range(end - len(d.index.shape), end), len(padded))
    else:
      local = None
    coord = d.start if local is None else add(d.start, mul(local, d.step))
    conds += _coord_bounds(d, coord, local is None, user_mask is not None)
    if not ex.is_zero(coord):
      offs = add(offs, mul(tl.to(coord, np.int64) if big else coord, d.stride))
  if user_mask is not None:
    conds.append(user_mask)
  return offs, tl.all_of(conds), shape


def _coord_bounds(d: RefDim, coord, fixed: bool, masked_by_user: bool) -> list:
  """The conditions that keep one dimension's coordinates inside the array."""
  conds, known = [], ex.interval(coord)
  if (d.index is not None or d.low) and not (known and known[0] >= 0):
    conds.append(tl.compare(">=", coord, tl.i32(0)))
  past_end = (not d.exact and not ex.is_zero(coord)) if fixed else (not d.exact or masked_by_user)
  if past_end and not (known and known[1] < d.array_size):
    conds.append(tl.compare("<", coord, ex.index_literal(d.array_size)))
  return conds


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
  if gpu_subbyte.is_subbyte(ref.dtype):   # packed in memory: load the bytes and unpack
    value = subbyte.load(ref.ptr, offs, ref.dtype, shape, mask, _hints(cache_modifier=cache, eviction_policy=evict))
    if other is not None and mask is not None:
      value = tl.where(mask, value, _fill(other, ref.dtype))
    return gen.bind(value, hint)
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
  if tuple(ref.shape) != tuple(val.shape):
    raise Unsupported(f"store of shape {val.shape} into a Ref view of shape {ref.shape}")
  if gpu_subbyte.is_subbyte(ref.dtype):   # packed in memory: write whole bytes
    if user_mask is not None:
      raise Unsupported(f"a masked store to {ref.origin} ({ref.dtype.name}, packed in memory)")
    ref, val = subbyte.byte_view(ref, ref.origin), gen.bind(subbyte.pack(tl.tensor(val), ref.dtype), "packed")
  offs, mask, shape = address(ref, user_mask)
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
  dtype = np.dtype(aval.dtype)
  if gpu_subbyte.is_subbyte(dtype):   # a byte per value: only pallax reads this buffer
    dtype = gpu_subbyte.storage(dtype)
  ptr = ex.Name(gen.fresh(name), dtype=dtype)
  gen.hidden.append((ptr.name, (lanes,) + shape, dtype, zeroed))
  gen.read_back.add(ptr.name)
  lane = tl.i32(0) if shared else gen.lane
  lead = (RefDim(lane, 1, lanes, int(math.prod(shape)), kept=False),)
  return whole(ptr, dtype, shape, name, lead)


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
    if lit is None or d.size == 0:
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
  # Masked-off lanes of the old value are the new ones, as in JAX Pallas
  old = load(ctx.gen, v, acc.mask, acc.values[0], hint="old") if ctx.is_used() else None
  store(ctx.gen, v, acc.values[0], acc.mask, evict=evict)
  return old if old is not None else acc.values[0]


@rule(prims.run_scoped_p)
def _run_scoped(ctx, *args, jaxpr, num_consts, zeroed=None, **_):
  if any(zeroed or ()):
    raise Unsupported("semaphores in pl.run_scoped")
  scratch = [scratch_ref(ctx.gen, v.aval.inner_aval, "scoped") for v in jaxpr.invars[num_consts:]]
  return ctx.gen.lower_jaxpr(jaxpr, [*args, *scratch])


def load_constant(gen, name: str, a):
  """The value of constant array ``a``, an input of the launch named ``name``, read whole."""
  return load(gen, whole(ex.Name(name, dtype=a.dtype), a.dtype, a.shape, "a constant array"), hint=name)

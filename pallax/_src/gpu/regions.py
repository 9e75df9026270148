"""Which block-level values too large for one GPU program can be computed tile by tile.

A kernel body such as ``o_ref[...] = x_ref[...] + y_ref[...]`` on 512x512 blocks, or
``o_ref[...] = relu(x_ref[...] @ y_ref[...] + b_ref[...])``, holds values a program's registers
cannot. Where every such value is computed *separably* from Ref reads (each element of a stored
value depends on the same position of the values it is made of: elementwise math, broadcasts,
casts, ``jnp.where``, reductions along other dimensions, products with small operands), the
stores can be computed one tile at a time: read the Refs' tiles, compute, store.

This module finds such a *region* in one jaxpr (its own equations, not its sub-jaxprs'): the
equations to run per tile, and for each value in it which of its dimensions follow which *axis*
of the tile space (the stored value's dimensions). Dimensions a reduction or a whole-dimension
use needs entire stay whole. ``gpu/tiling.py`` writes the loop (or the grid axis) that runs the
region. A large matrix product of two Ref reads is a *leaf* of the region: its output tiles are
accumulated over K steps (``tiling.product_tile``), and what follows it is its epilogue.

A region that cannot be formed is a ``Refusal``: the value, its source line, and why.
"""
from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
from jax import lax

from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util

# A value over this many elements (each dimension padded to a power of two) does not fit one
# program (the Triton backend's limit); tiles aim at TILE_ELEMENTS.
MAX_ELEMENTS = 128 * 512
TILE_ELEMENTS = 8192
MIN_TILE = 16

# Above these sizes a single dot does not fit one program.
MAX_RESULT = 128 * 256
MAX_OPERAND_BYTES = 96 * 1024
MN_TILES = (128, 64, 32, 16)

_ELEMENTWISE_NAMES = (
    "abs", "acos", "acosh", "add", "and", "asin", "asinh", "atan", "atan2", "atanh", "cbrt", "ceil",
    "clamp", "clz", "convert_element_type", "copy", "cos", "cosh", "div", "eq", "erf", "erf_inv",
    "erfc", "exp", "exp2", "expm1", "floor", "ge", "gt", "imag", "integer_pow", "is_finite", "le",
    "lgamma", "digamma", "log", "log1p", "logistic", "lt", "max", "min", "mul", "ne", "neg",
    "nextafter", "not", "or", "population_count", "pow", "real", "reduce_precision", "rem", "round",
    "rsqrt", "select_n", "shift_left", "shift_right_arithmetic", "shift_right_logical", "sign",
    "sin", "sinh", "sqrt", "square", "sub", "tan", "tanh", "xor")
ELEMENTWISE = frozenset(getattr(lax, n + "_p") for n in _ELEMENTWISE_NAMES if hasattr(lax, n + "_p"))
_ACCUMULATED = frozenset(getattr(lax, n + "_p") for n in (
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
    "reduce_xor") if hasattr(lax, n + "_p"))
_REDUCTIONS = _ACCUMULATED | {lax.argmax_p, lax.argmin_p}
# Reductions whose tiles may overlap (a row counted twice gives the same answer).
IDEMPOTENT = frozenset({lax.reduce_max_p, lax.reduce_min_p, lax.reduce_and_p, lax.reduce_or_p})


def padded_numel(shape) -> int:
  return math.prod(1 << max(0, int(s) - 1).bit_length() for s in shape)


def is_large(v) -> bool:
  aval = getattr(v, "aval", None)
  return isinstance(v, ji.Var) and hasattr(aval, "shape") and not ji.is_ref_aval(aval) and \
      padded_numel(aval.shape) > MAX_ELEMENTS


@dataclasses.dataclass(frozen=True)
class Refusal:
  """Why a large value stays whole: shown in the backend's error."""
  eqn: object
  why: str
  value: object = None   # which of the equation's values (default: its first result)

  def message(self) -> str:
    e, v = self.eqn, self.value
    if v is None:
      v = e.invars[1] if e.primitive is ji.swap_p else e.outvars[0] if e.outvars else None
    what = f"the value {v.aval.str_short()} of" if v is not None else "the"
    where = ji.user_frame(e.source_info) or "an unknown line"
    return f"{what} `{e.primitive}` at {where} {self.why}"


@dataclasses.dataclass(frozen=True)
class Product:
  """A large matrix product of two Ref reads: a leaf of the region, tiled (bm, bn, bk)."""
  dot: object
  lhs_get: object
  rhs_get: object

  def tiles(self) -> tuple[int, int, int]:
    (m, k), n = self.dot.invars[0].aval.shape, self.dot.invars[1].aval.shape[1]
    dtype = self.dot.invars[0].aval.dtype
    return tile_of(m, mn_tiles(dtype)), tile_of(n, mn_tiles(dtype)), tile_of(k, k_tiles(dtype))


@dataclasses.dataclass(frozen=True)
class Region:
  eqns: tuple          # the equations run per tile, in the jaxpr's order (product gets excluded)
  maps: dict           # Var -> per dimension, the axis it follows (None: whole)
  sizes: tuple         # each axis's size
  tiles: tuple         # each axis's tile (== size: not split)
  products: dict       # dot equation -> Product
  exact: bool          # tiles must not overlap (a Ref is read and written): tiles divide sizes
  # A reduction of a large value to a small one (its last equation): the region accumulates
  # the reductions of the value's tiles, along the axes it reduces; None: the region stores.
  reduction: object = None

  @property
  def members(self) -> frozenset:
    """Its equations and the Ref reads its products consume."""
    reads = {g for p in self.products.values() for g in (p.lhs_get, p.rhs_get)}
    return frozenset(self.eqns) | reads

  def counts(self) -> tuple[int, ...]:
    return tuple(-(-s // t) for s, t in zip(self.sizes, self.tiles))

  def tile_shape(self, v) -> tuple[int, ...]:
    return tuple(s if a is None else self.tiles[a] for a, s in zip(self.maps[v], v.aval.shape))


def tile_of(n: int, options) -> int | None:
  return next((t for t in options if n % t == 0), None)


def mn_tiles(dtype) -> tuple[int, ...]:
  # float64 tiles of 128 would stage 128 KiB of operands: more shared memory than Turing has
  return MN_TILES[1:] if jnp.dtype(dtype).itemsize == 8 else MN_TILES


def k_tiles(dtype) -> tuple[int, ...]:
  # 8-bit operands: the tensor cores take K steps of 32 or more
  return (64, 32) if jnp.dtype(dtype).itemsize == 1 else (64, 32, 16)


def product_too_large(a, b) -> bool:
  (m, k), n = a.aval.shape, b.aval.shape[1]
  nbytes = m * k * jnp.dtype(a.aval.dtype).itemsize + k * n * jnp.dtype(b.aval.dtype).itemsize
  return m * n > MAX_RESULT or nbytes > MAX_OPERAND_BYTES


def consumers(jaxpr) -> dict:
  """Var -> the equations that read it (an output of the jaxpr counts as the key None)."""
  out: dict = {}
  for e in jaxpr.eqns:
    for v in e.invars:
      if isinstance(v, ji.Var):
        out.setdefault(v, []).append(e)
  for v in jaxpr.outvars:
    if isinstance(v, ji.Var):
      out.setdefault(v, []).append(None)
  return out


def plain_view(eqn, first: int) -> bool:
  """Whether a Ref access reads or writes a rectangular view (no integer-array indexers)."""
  leaves = eqn.invars[first:first + eqn.params["tree"].num_leaves]
  transforms = ji.tree_util.tree_unflatten(eqn.params["tree"], leaves)
  return all(isinstance(t, ji.NDIndexer) and not t.int_indexer_shape for t in transforms)


def needs_tiling(jaxpr) -> bool:
  return any(is_large(v) for e in jaxpr.eqns for v in e.outvars)


# --- the analysis ---------------------------------------------------------------------------

class _Conflict(Exception):
  """Two uses of a value need an axis split and whole: the axes must stay whole."""

  def __init__(self, axes, var):
    super().__init__(axes)
    self.axes, self.var = frozenset(axes), var


class _Refused(Exception):
  def __init__(self, refusal: Refusal):
    super().__init__(refusal.why)
    self.refusal = refusal


def _tiled(m) -> bool:
  return m is not None and any(a is not None for a in m)


def _same_rank_map(v, out_shape, om):
  """The map of an operand of an elementwise equation (size-1 dimensions broadcast: whole)."""
  if not isinstance(v, ji.Var) or not v.aval.shape:
    return None
  if len(v.aval.shape) != len(out_shape):
    return False
  return tuple(a if s == o else None for a, s, o in zip(om, v.aval.shape, out_shape))


def _dot_maps(eqn, om):
  (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
  a, b = eqn.invars
  lfree = [d for d in range(a.aval.ndim) if d not in lc and d not in lb]
  rfree = [d for d in range(b.aval.ndim) if d not in rc and d not in rb]
  nb = len(lb)

  def side(ndim, batch, contract, free, offset):
    return tuple(om[list(batch).index(d)] if d in batch else None if d in contract
                 else om[offset + free.index(d)] for d in range(ndim))
  return [(a, side(a.aval.ndim, lb, lc, lfree, nb)),
          (b, side(b.aval.ndim, rb, rc, rfree, nb + len(lfree)))]


def _product(eqn, om, graph) -> Product | None:
  """The product leaf ``eqn`` is, if it is a large product of two Ref reads used once each."""
  (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
  a, b = eqn.invars
  if lb or rb or tuple(lc) != (1,) or tuple(rc) != (0,) or a.aval.ndim != 2 or b.aval.ndim != 2:
    return None
  if len(om) != 2 or None in om or om[0] == om[1] or a.aval.dtype != b.aval.dtype:
    return None
  gets = []
  for v in (a, b):
    p = graph.producer.get(v)
    if p is None or p.primitive is not ji.get_p or graph.uses.get(v) != [eqn] or not plain_view(p, 1):
      return None
    gets.append(p)
  t = Product(eqn, *gets)
  return t if product_too_large(a, b) and None not in t.tiles() else None


def _input_maps(eqn, om, graph):
  """[(operand, its map)] that computing ``eqn``'s output tile by tile (map ``om``) needs; a
  Product where ``eqn`` is a product leaf."""
  prim, out_shape = eqn.primitive, eqn.outvars[0].aval.shape
  if prim is ji.get_p:
    if not plain_view(eqn, 1):
      raise _Refused(Refusal(eqn, "is read through an array of indices; tiles need rectangular views"))
    return []
  if prim is lax.iota_p:
    return []
  if prim in ELEMENTWISE:
    maps = [(v, _same_rank_map(v, out_shape, om)) for v in eqn.invars]
    if any(m is False for _, m in maps):
      raise _Refused(Refusal(eqn, "mixes operands of different ranks"))
    return maps
  if prim is lax.broadcast_in_dim_p:
    (v, *_), bd = eqn.invars, eqn.params["broadcast_dimensions"]
    return [(v, tuple(om[d] if s == out_shape[d] else None for s, d in zip(v.aval.shape, bd)))]
  if prim in _REDUCTIONS:
    axes, rest = eqn.params["axes"], iter(om)
    return [(eqn.invars[0], tuple(None if d in axes else next(rest)
                                   for d in range(eqn.invars[0].aval.ndim)))]
  if prim is lax.transpose_p:
    perm, m = eqn.params["permutation"], [None] * len(om)
    for i, p in enumerate(perm):
      m[p] = om[i]
    return [(eqn.invars[0], tuple(m))]
  if prim is lax.squeeze_p:
    dims, rest = eqn.params["dimensions"], iter(om)
    return [(eqn.invars[0], tuple(None if d in dims else next(rest)
                                   for d in range(eqn.invars[0].aval.ndim)))]
  if prim is lax.dot_general_p:
    product = _product(eqn, om, graph)
    return product if product is not None else _dot_maps(eqn, om)
  raise _Refused(Refusal(eqn, f"is computed by `{prim}`, which pallax does not split into tiles"))


@dataclasses.dataclass(frozen=True)
class _Graph:
  jaxpr: object
  uses: dict       # Var -> the equations that read it (None: an output of the jaxpr)
  producer: dict   # Var -> the equation that computes it

  @staticmethod
  def of(jaxpr) -> "_Graph":
    return _Graph(jaxpr, consumers(jaxpr), {v: e for e in jaxpr.eqns for v in e.outvars})


def _give(maps: dict, v, m, whole: frozenset):
  """Records that ``v`` is needed with map ``m`` (axes held whole become None)."""
  if not isinstance(v, ji.Var) or m is None:
    return
  m = tuple(None if a in whole else a for a in m)
  old = maps.setdefault(v, m)
  if old != m:
    raise _Conflict({a for x, y in zip(old, m) if x != y for a in (x, y) if a is not None}, v)


def _propagate(graph: _Graph, seeds: dict, whole: frozenset):
  """Maps from the seeds (equation -> (its operand computed by tiles, the operand's map)) back
  to the Ref reads: (maps, region equations, products)."""
  maps: dict = {}
  region: list = []
  products: dict = {}
  taken: set = set()   # the reads that products consume
  for eqn in reversed(graph.jaxpr.eqns):
    if eqn in seeds:
      _give(maps, *seeds[eqn], whole)
      region.append(eqn)
      continue
    if eqn in taken or not any(_tiled(maps.get(v)) for v in eqn.outvars):
      continue
    if len(eqn.outvars) != 1:
      v = next(v for v in eqn.outvars if _tiled(maps.get(v)))
      raise _Refused(Refusal(eqn, f"is a result of `{eqn.primitive}` (a loop's carry, a "
                                  "branch's result), which pallax does not split into tiles", v))
    found = _input_maps(eqn, maps[eqn.outvars[0]], graph)
    region.append(eqn)
    if isinstance(found, Product):
      products[eqn] = found
      taken |= {found.lhs_get, found.rhs_get}
      continue
    for v, m in found:
      _give(maps, v, m, whole)
  return maps, tuple(reversed(region)), products


def _accumulated(e) -> bool:
  """Whether ``e`` reduces a large value to a small one, which tiles can accumulate."""
  return e.primitive in _ACCUMULATED and is_large(e.invars[0]) and not is_large(e.outvars[0])


def _stores(graph: _Graph, roots) -> list:
  """The stores whose values are, or are computed from, large values (not through the
  reductions ``roots``, which accumulate over tiles: those are regions of their own)."""
  big: set = set()
  for e in graph.jaxpr.eqns:
    if e in roots:
      continue
    if any(is_large(v) or v in big for v in e.invars if isinstance(v, ji.Var)) or \
        any(is_large(v) for v in e.outvars):
      big.update(e.outvars)
  return [e for e in graph.jaxpr.eqns if e.primitive is ji.swap_p and e.invars[1] in big
          and not graph.uses.get(e.outvars[0])]


def _form(graph: _Graph, seeds):
  """(maps, equations, products, axes held whole, the value that made the last axis whole)."""
  whole: frozenset = frozenset()
  var = None
  while True:
    try:
      return (*_propagate(graph, seeds, whole), whole, var)
    except _Conflict as c:
      assert not c.axes <= whole, "a conflict on axes held whole"
      whole, var = whole | c.axes, c.var


def analyze(jaxpr) -> tuple[Region, ...] | Refusal | None:
  """The regions of ``jaxpr``'s own equations that compute its large values tile by tile (one
  per reduction that accumulates over tiles, then one for the stores); a Refusal where they
  cannot; None where no value is large."""
  if not needs_tiling(jaxpr):
    return None
  graph = _Graph.of(jaxpr)
  try:   # one pass over tiles if the stores' tiles can hold whole what they reduce
    return _regions(graph, accumulate=False)
  except _Refused:
    pass
  try:
    return _regions(graph, accumulate=True)
  except _Refused as r:
    return r.refusal


def _regions(graph: _Graph, accumulate: bool) -> tuple[Region, ...]:
  """The stores' region; with ``accumulate``, first a region for each reduction of a large
  value to a small one (the stores' region then reads their results)."""
  roots = [e for e in graph.jaxpr.eqns if _accumulated(e)] if accumulate else []
  found = [_reduction_region(graph, e) for e in roots]
  stores = _stores(graph, roots)
  if stores:
    found.append(_store_region(graph, stores))
  elif not found:
    raise _Refused(_untiled(graph, next(v for e in graph.jaxpr.eqns for v in e.outvars
                                        if is_large(v))))
  _check_uses(graph, found)
  return tuple(found)


def _store_region(graph: _Graph, stores) -> Region:
  shape = stores[0].invars[1].aval.shape
  for s in stores:
    if s.invars[1].aval.shape != shape:
      raise _Refused(Refusal(s, f"is stored beside a large value of another shape {shape}; "
                                "pallax tiles stores of one shape together"))
    if not plain_view(s, 2):
      raise _Refused(Refusal(s, "is stored through an array of indices; tiles need "
                                "rectangular views"))
  seed = tuple(range(len(shape)))
  return _region(graph, {s: (s.invars[1], seed) for s in stores}, shape, stores[0].invars[1])


def _reduction_region(graph: _Graph, eqn) -> Region:
  x, axes = eqn.invars[0], eqn.params["axes"]
  seed = tuple(axes.index(d) if d in axes else None for d in range(x.aval.ndim))
  sizes = tuple(x.aval.shape[d] for d in axes)
  return _region(graph, {eqn: (x, seed)}, sizes, x, eqn)


def _region(graph, seeds, sizes, value, reduction=None) -> Region:
  maps, eqns, products, whole, var = _form(graph, seeds)
  if len(whole) == len(sizes):
    raise _Refused(_untiled(graph, var if var is not None else _large_source(graph, value)))
  for v, m in maps.items():
    if _tiled(m) and v not in graph.producer:   # tiles are computed, never sliced from values
      user = next(u for u in graph.uses[v] if u is not None)
      raise _Refused(Refusal(user, "comes from outside the code that stores it (a loop's "
                                   "carry, a constant): tiles are read from Refs only", v))
  region = Region(eqns, maps, sizes, sizes, products, False, reduction)
  _check_effects(graph, region)
  exact = _in_place(eqns, products) or (reduction is not None and
                                        reduction.primitive not in IDEMPOTENT)
  tiles = _choose_tiles(graph, sizes, whole, maps, eqns, products, exact)
  return dataclasses.replace(region, tiles=tiles, exact=exact)


def _large_source(graph: _Graph, v):
  """The first large value that ``v`` is computed from (``v`` itself if it is large)."""
  if is_large(v):
    return v
  eqn = graph.producer.get(v)
  found = (_large_source(graph, w) for w in (eqn.invars if eqn else ()) if isinstance(w, ji.Var))
  return next((w for w in found if w is not None), None)


def _untiled(graph: _Graph, v, fine=frozenset()) -> Refusal:
  """Why the large value ``v`` stays whole (``fine``: its uses that take its tiles)."""
  users = [u for u in graph.uses.get(v, []) if u is not None]
  # a use that reduces the value's size first: the likeliest reason it is needed whole
  users.sort(key=lambda u: not (u.outvars and u.outvars[0].aval.size < v.aval.size))
  eqn = graph.producer.get(v) or users[0]
  if v in graph.jaxpr.outvars:
    return Refusal(eqn, "leaves the code that computes it (a loop's carry, a branch's result); "
                        "pallax tiles values stored to Refs only", v)
  user = next((u for u in users if u not in fine), None)
  if user is None:
    return Refusal(eqn, "is not stored to a Ref; pallax tiles values stored to Refs only", v)
  where = ji.user_frame(user.source_info) or "an unknown line"
  if user.primitive in _REDUCTIONS or user.primitive is lax.dot_general_p:
    how = "" if user.primitive in _ACCUMULATED else (
        " (pallax accumulates sums, products, maxima, minima and logical reductions over "
        "tiles, and tiles large products of two Ref reads, not this)")
    return Refusal(eqn, f"is reduced by `{user.primitive}` at {where} along every dimension "
                        f"tiles could split{how}", v)
  if any(True for _ in jaxpr_util.sub_jaxprs(user.params)):
    return Refusal(eqn, f"is passed whole into `{user.primitive}` at {where} (a loop or a "
                        "branch: pallax splits no value that crosses into one)", v)
  return Refusal(eqn, f"is used whole by `{user.primitive}` at {where}", v)


def _check_uses(graph: _Graph, found):
  """Every large value is a product's read, or is computed by tiles in the regions that use it,
  and used by those only."""
  reads = {v for r in found for p in r.products.values() for g in (p.lhs_get, p.rhs_get)
           for v in g.outvars}
  for e in reversed(graph.jaxpr.eqns):   # the last one is nearest to the use that needs it whole
    for v in e.outvars if e.primitive is not ji.swap_p else ():   # a store's old value: unused
      homes = [r for r in found if e in r.members and _tiled(r.maps.get(v))]
      if not (is_large(v) or homes) or v in reads:
        continue
      fine = {u for r in homes for u in r.members}
      if not homes or is_large(v) and any(u not in fine for u in graph.uses.get(v, [])):
        raise _Refused(_untiled(graph, v, fine))   # (a small value is computed whole too)


def _check_effects(graph, region: Region):
  """The region runs where its last equation was: what lies between its first and last
  equation moves above it, which reads of Refs the region does not write and writes of Refs
  it does not access may."""
  members = region.members
  where = [k for k, e in enumerate(graph.jaxpr.eqns) if e in members]
  written = {e.invars[0] for e in region.eqns if e.primitive is ji.swap_p}
  touched = written | {e.invars[0] for e in members if e.primitive is ji.get_p}
  for e in graph.jaxpr.eqns[where[0]:where[-1]]:
    if e in members:
      continue
    for eff in e.effects:
      ref = e.invars[eff.input_index] if hasattr(eff, "input_index") else None
      if isinstance(eff, ji.ReadEffect) and ref not in written:
        continue
      if isinstance(eff, (ji.WriteEffect, ji.AccumEffect)) and ref not in touched:
        continue
      raise _Refused(Refusal(e, "lies between the reads and the stores of a large value and "
                                f"has an effect ({eff}) their tiles would reorder"))


def _access_key(e):
  """The view a Ref access goes through: its indexers (a store's come after its value)."""
  first, n = (2 if e.primitive is ji.swap_p else 1), e.params["tree"].num_leaves
  return (e.params["tree"], tuple(v if isinstance(v, ji.Var) else repr(v.val)
                                  for v in e.invars[first:first + n]))


def _in_place(eqns, products) -> bool:
  """Whether the region reads a Ref it writes (then tiles must not overlap); such a Ref must be
  accessed through one view only (tile k then reads what tile k wrote, as the kernel did)."""
  gets = [e for e in eqns if e.primitive is ji.get_p]
  gets += [g for p in products.values() for g in (p.lhs_get, p.rhs_get)]
  swaps = [e for e in eqns if e.primitive is ji.swap_p]
  both = {e.invars[0] for e in gets} & {e.invars[0] for e in swaps}
  for ref in both:
    accesses = [e for e in gets + swaps if e.invars[0] is ref]
    if len({_access_key(e) for e in accesses}) > 1:
      raise _Refused(Refusal(accesses[0], "is read and written through different views of one "
                                          "Ref; tiles would read what other tiles wrote"))
  return bool(both)


def _largest_divisor(n: int, at_most: int) -> int:
  return next(d for d in range(min(n, at_most), 0, -1) if n % d == 0)


def _choose_tiles(graph, shape, whole, maps, eqns, products, exact) -> tuple[int, ...]:
  """Tiles of the axes: products fix theirs; the others are split in powers of two until each
  value's tile has at most TILE_ELEMENTS: the largest value's axes, leading ones first (rows
  stay contiguous), none below MIN_TILE while another can be split."""
  tiles = list(shape)
  fixed: dict = {}
  for p in products.values():
    bm, bn, _ = p.tiles()
    for a, t in zip(maps[p.dot.outvars[0]], (bm, bn)):
      if fixed.setdefault(a, t) != t:
        raise _Refused(Refusal(p.dot, "is tiled by another product with other tiles"))
      tiles[a] = t
  values = [v for e in eqns for v in e.outvars if _tiled(maps.get(v))]

  def tile_numel(v):
    if v is None:
      return 1
    return padded_numel(s if a is None else tiles[a] for a, s in zip(maps[v], v.aval.shape))

  def worst():
    return max(values, key=tile_numel, default=None)

  free = [a for a in range(len(shape)) if a not in whole and a not in fixed]
  while tile_numel(worst()) > TILE_ELEMENTS:
    mine = [a for a in free if a in maps[worst()] and tiles[a] > 1]
    # leading axes first, down to 16 (a product's operands: tiles of 16 or more each way)
    a = next((a for a in mine if tiles[a] > MIN_TILE), mine[0] if mine else None)
    if a is None:
      break
    tiles[a] = 1 << (tiles[a] - 1).bit_length() - 1   # the power of two below
    if exact:
      tiles[a] = _largest_divisor(shape[a], tiles[a])
  if tile_numel(worst()) > MAX_ELEMENTS:
    raise _Refused(Refusal(graph.producer[worst()], "keeps dimensions whole (reduced, or used by "
                                                    "a product) that alone exceed a program"))
  return tuple(tiles)

"""Block-level values too large for one program, rewritten as loops over Ref tiles.

``o_ref[...] = (x_ref[...] @ y_ref[...]).astype(...)`` on 512x1024 blocks (the seed notebook's
matmul) cannot be one GPU dot: its operands and result exceed a program's registers and shared
memory. When a store's value is such a product of two Ref reads (each used once), the kernel
jaxpr is rewritten into what a hand-written GPU matmul does: a loop over output tiles, an inner
loop over K accumulating small ``dot_general``s of Ref slices, and a store of each tile. The
backends' ordinary rules lower the result; there is one dot lowering.

Other large values (``x_ref[...] + y_ref[...]`` on 512x512 blocks, ``relu(x @ y + b)``,
``jnp.sum(x_ref[...])``) are computed by *regions* (``regions.py`` finds them): a loop over
tiles reads the Refs' tiles, computes and stores each tile (or accumulates a reduction).

When the product or region is all the kernel does, its tiles are independent: instead of a
loop, a new first grid axis enumerates them, so the tiles spread over concurrent programs.
"""
from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src.grid_mapping import with_leading_grid_axis
from pallax._src.gpu import regions


@dataclasses.dataclass(frozen=True)
class TiledDot:
  store: object          # the swap equation
  dot: object            # the dot_general equation
  lhs_get: object
  rhs_get: object
  cast: object | None    # convert_element_type between dot and store, if any

  @property
  def replaced(self) -> tuple:
    return tuple(e for e in (self.lhs_get, self.rhs_get, self.dot, self.cast) if e is not None)

  def tiles(self) -> tuple[int, int, int]:
    return regions.Product(self.dot, self.lhs_get, self.rhs_get).tiles()

  def tile_counts(self) -> tuple[int, int]:
    (m, _), n = self.dot.invars[0].aval.shape, self.dot.invars[1].aval.shape[1]
    bm, bn, _ = self.tiles()
    return m // bm, n // bn


def _use_counts(jaxpr) -> dict:
  uses: dict = {}
  for e in jaxpr.eqns:
    for v in e.invars:
      if isinstance(v, ji.Var):
        uses[v] = uses.get(v, 0) + 1
  for v in jaxpr.outvars:
    if isinstance(v, ji.Var):
      uses[v] = uses.get(v, 0) + 2
  return uses


def _product(e, producer, once) -> TiledDot | None:
  """The TiledDot for store ``e``, if its value is a too-large product of two Ref reads."""
  v = e.invars[1]
  if not once(v):
    return None
  p, cast = producer.get(v), None
  if p is not None and p.primitive is lax.convert_element_type_p and once(p.invars[0]):
    cast, p = p, producer.get(p.invars[0])
  if p is None or p.primitive is not lax.dot_general_p:
    return None
  (lc, rc), (lb, rb) = p.params["dimension_numbers"]
  a, b = p.invars
  if lb or rb or tuple(lc) != (1,) or tuple(rc) != (0,) or len(a.aval.shape) != 2 or \
      len(b.aval.shape) != 2 or not (once(a) and once(b)) or not regions.product_too_large(a, b):
    return None
  ga, gb = producer.get(a), producer.get(b)
  if ga is None or gb is None or ga.primitive is not ji.get_p or gb.primitive is not ji.get_p:
    return None
  t = TiledDot(e, p, ga, gb, cast)
  if a.aval.dtype != b.aval.dtype or None in t.tiles():
    return None
  return t


def find(jaxpr) -> list[TiledDot]:
  """The too-large products stored by ``jaxpr``'s own equations (not its sub-jaxprs')."""
  producer = {v: e for e in jaxpr.eqns for v in e.outvars}
  uses = _use_counts(jaxpr)
  once = lambda v: isinstance(v, ji.Var) and uses.get(v, 0) == 1   # literals are unhashable
  found = [_product(e, producer, once) for e in jaxpr.eqns if e.primitive is ji.swap_p]
  return [t for t in found if t is not None]


def _needs_rewrite(jaxpr) -> bool:
  return bool(find(jaxpr)) or any(_needs_rewrite(s) for e in jaxpr.eqns
                                  for s in jaxpr_util.sub_jaxprs(e.params))


def _whole_kernel(jaxpr) -> TiledDot | None:
  """The product, if it is all the kernel does besides index arithmetic."""
  found = find(jaxpr)
  if len(found) != 1:
    return None
  (t,) = found
  rest = [e for e in jaxpr.eqns if e not in t.replaced and e is not t.store]
  if any(e.effects or any(ji.is_ref_aval(v.aval) for v in e.invars) for e in rest):
    return None
  return t


# --- the rewrite ----------------------------------------------------------------------------

def _view(eqn, read, first: int):
  """The Ref view an access equation reads or writes (its transforms applied)."""
  leaves = [read(v) for v in eqn.invars[first:first + eqn.params["tree"].num_leaves]]
  transforms = ji.tree_util.tree_unflatten(eqn.params["tree"], leaves)
  return ji.TransformedRef(read(eqn.invars[0]), tuple(transforms))


def _i32(n: int):
  return np.int32(n)   # index arithmetic stays 32-bit with jax_enable_x64 too


def _acc_dtype(dtype):
  dtype = jnp.dtype(dtype)
  if jnp.issubdtype(dtype, jnp.integer):
    return jnp.dtype(jnp.int32)
  return jnp.dtype(jnp.float64) if dtype == jnp.float64 else jnp.dtype(jnp.float32)


def product_tile(dot, a, b, m0, n0, tiles):
  """The (bm, bn) tile at (m0, n0) of the product ``dot`` of the Ref views ``a`` and ``b``,
  accumulated over K steps and rounded to the product's dtype."""
  bm, bn, bk = tiles
  k = dot.invars[0].aval.shape[1]
  acc_dtype = _acc_dtype(dot.invars[0].aval.dtype)
  params = dict(dot.params, preferred_element_type=acc_dtype)

  def step(j, acc):
    x = a.at[ji.ds(m0, bm), ji.ds(j * _i32(bk), bk)][...]
    y = b.at[ji.ds(j * _i32(bk), bk), ji.ds(n0, bn)][...]
    return acc + lax.dot_general_p.bind(x, y, **params)

  acc = lax.fori_loop(_i32(0), _i32(k // bk), step, jnp.zeros((bm, bn), acc_dtype))
  return acc.astype(dot.outvars[0].aval.dtype)   # rounded as the product would be


def _one_tile(t: TiledDot, a, b, o, m0, n0):
  """o[m0:m0+bm, n0:n0+bn] = the product's tile, accumulated over K steps."""
  bm, bn, _ = t.tiles()
  out = product_tile(t.dot, a, b, m0, n0, t.tiles())
  if t.cast is not None:
    out = lax.convert_element_type_p.bind(out, **t.cast.params)
  o.at[ji.ds(m0, bm), ji.ds(n0, bn)][...] = out


def _emit(t: TiledDot, read, tile_id=None):
  a, b, o = _view(t.lhs_get, read, 1), _view(t.rhs_get, read, 1), _view(t.store, read, 2)
  bm, bn, _ = t.tiles()
  tm, tn = t.tile_counts()
  if tile_id is not None:   # one tile per program
    i, j = lax.div(tile_id, _i32(tn)), lax.rem(tile_id, _i32(tn))   # ids >= 0
    _one_tile(t, a, b, o, i * _i32(bm), j * _i32(bn))
    return

  def row(i, _):
    lax.fori_loop(_i32(0), _i32(tn), lambda j, _: _one_tile(t, a, b, o, i * _i32(bm), j * _i32(bn)),
                  None)

  lax.fori_loop(_i32(0), _i32(tm), row, None)


# --- regions: large values computed tile by tile (regions.py finds them) --------------------

def _tile_starts(region: regions.Region, tile_id) -> list:
  """Per axis, where tile ``tile_id`` starts (tiles in row-major order). Where a tile does not
  divide its axis, the last tile ends at the axis's end and overlaps the one before: it
  recomputes some rows, with the same result (regions.py allows overlaps only where no Ref is
  both read and written)."""
  starts, rest = [None] * len(region.sizes), tile_id
  for a in reversed(range(len(region.sizes))):
    count, size, t = region.counts()[a], region.sizes[a], region.tiles[a]
    if count == 1:
      starts[a] = _i32(0)
      continue
    outer = [c for c in region.counts()[:a] if c > 1]
    idx = lax.rem(rest, _i32(count)) if outer else rest   # ids >= 0
    rest = lax.div(rest, _i32(count)) if outer else None
    starts[a] = idx * _i32(t) if size % t == 0 else lax.min(idx * _i32(t), _i32(size - t))
  return starts


def _index(region: regions.Region, m, starts) -> tuple:
  return tuple(slice(None) if a is None or region.tiles[a] == region.sizes[a]
               else ji.ds(starts[a], region.tiles[a]) for a in m)


def _tile_of_eqn(region: regions.Region, e, get, starts) -> list:
  """The outputs of equation ``e`` of the region on the tile at ``starts``."""
  if e in region.products:
    p = region.products[e]
    m0, n0 = (starts[a] for a in region.maps[e.outvars[0]])
    return [product_tile(e, _view(p.lhs_get, get, 1), _view(p.rhs_get, get, 1), m0, n0, p.tiles())]
  if e.primitive is ji.swap_p:
    value = e.invars[1]
    _view(e, get, 2).at[_index(region, region.maps[value], starts)][...] = get(value)
    return [None]
  out = e.outvars[0]
  if e.primitive is ji.get_p:
    return [_view(e, get, 1).at[_index(region, region.maps[out], starts)][...]]
  if e.primitive is lax.iota_p:
    d, dtype = e.params["dimension"], e.params["dtype"]
    iota = lax.broadcasted_iota(dtype, region.tile_shape(out), d)
    a = region.maps[out][d]
    if a is None or region.tiles[a] == region.sizes[a]:
      return [iota]
    return [iota + lax.convert_element_type(starts[a], dtype)]
  params = dict(e.params, shape=region.tile_shape(out)) if e.primitive is lax.broadcast_in_dim_p \
      else None
  return jaxpr_util.rebind(e, [get(v) for v in e.invars], params)


def _identity(prim, dtype):
  """The value a reduction starts from (floats' sums from -0.0: a sum of -0.0s stays -0.0)."""
  dtype = jnp.dtype(dtype)
  if prim in (lax.reduce_max_p, lax.reduce_min_p):
    lowest = prim is lax.reduce_max_p
    if jnp.issubdtype(dtype, jnp.floating):
      return -np.inf if lowest else np.inf
    if dtype == np.bool_:
      return not lowest
    return jnp.iinfo(dtype).min if lowest else jnp.iinfo(dtype).max
  if prim is lax.reduce_and_p:
    return ~np.zeros((), dtype)
  if prim is lax.reduce_prod_p:
    return 1
  return -0.0 if jnp.issubdtype(dtype, jnp.floating) else 0


_COMBINE = {lax.reduce_sum_p: lax.add, lax.reduce_max_p: lax.max, lax.reduce_min_p: lax.min,
            lax.reduce_prod_p: lax.mul, lax.reduce_and_p: lax.bitwise_and,
            lax.reduce_or_p: lax.bitwise_or, lax.reduce_xor_p: lax.bitwise_xor}


def _invariant(region: regions.Region) -> list:
  """The region's equations whose results are the same for every tile (none of their axes is
  split, and they read no Ref the region writes): computed once, before the loop."""
  written = {e.invars[0] for e in region.eqns if e.primitive is ji.swap_p}
  made = {v for e in region.eqns for v in e.outvars}
  split = lambda v: any(a is not None and region.tiles[a] < region.sizes[a]
                        for a in region.maps.get(v, ()))
  found, known = [], set()
  for e in region.eqns:
    if e.primitive is ji.swap_p or e in region.products or e is region.reduction or \
        (e.primitive is ji.get_p and e.invars[0] in written) or any(split(v) for v in e.outvars):
      continue
    if all(v in known for v in e.invars if isinstance(v, ji.Var) and v in made):
      found.append(e)
      known.update(e.outvars)
  return found


def _run_eqns(region, eqns, env, read, starts):
  get = lambda v: env[v] if isinstance(v, ji.Var) and v in env else read(v)
  for e in eqns:
    with ji.source_info_util.user_context(e.source_info.traceback):
      env.update(zip(e.outvars, _tile_of_eqn(region, e, get, starts)))
  return env


def _emit_region(region: regions.Region, read, tile_id=None) -> list:
  """Every tile of the region, by a loop (or only the tile ``tile_id``: one per program); a
  region that reduces returns the reduction of all its tiles."""
  r = region.reduction
  hoisted = _invariant(region)
  before = _run_eqns(region, hoisted, {}, read, [None] * len(region.sizes))
  per_tile = [e for e in region.eqns if e is not r and e not in hoisted]

  def one(tid) -> dict:
    return _run_eqns(region, per_tile, dict(before), read, _tile_starts(region, tid))

  n = _i32(math.prod(region.counts()))
  if r is None and tile_id is not None:
    one(tile_id)
  elif r is None:
    lax.fori_loop(_i32(0), n, lambda i, _: one(i) and None, None)
  else:
    return [_accumulate(r, n, lambda i: one(i)[r.invars[0]])]
  return [None]


def _accumulate(r, n, tile):
  """The reduction ``r`` of all ``n`` tiles (``tile(i)``: the operand's tile ``i``). Sums and
  products of 16-bit floats accumulate in float32 and round once, as XLA's do."""
  out = r.outvars[0].aval
  wide = out.dtype
  if r.primitive in (lax.reduce_sum_p, lax.reduce_prod_p) and \
      jnp.issubdtype(out.dtype, jnp.floating) and jnp.dtype(out.dtype).itemsize < 4:
    wide = jnp.dtype(jnp.float32)
  combine = _COMBINE[r.primitive]

  def step(i, acc):
    with ji.source_info_util.user_context(r.source_info.traceback):
      return combine(acc, r.primitive.bind(tile(i).astype(wide), **r.params))

  init = jnp.full(out.shape, _identity(r.primitive, wide), wide)
  return lax.fori_loop(_i32(0), n, step, init).astype(out.dtype)


def _literal(v):
  # typed NumPy scalars: rules tell literals from traced values by them
  return np.array(v.val, v.aval.dtype)[()] if np.ndim(v.val) == 0 else v.val


def _retrace(jaxpr, emitters: dict, skip, spread: bool, sub):
  """``jaxpr`` traced again: ``emitters[eqn](read, tile)`` replaces ``eqn`` (and returns its
  outputs), equations in ``skip`` go, sub-jaxprs become ``sub(jaxpr)``. With ``spread``, the
  jaxpr takes a tile index as a new first argument (the ``tile`` the emitters get)."""
  def run(*args):
    tile = None
    if spread:
      tile, args = args[0], args[1:]
    env = dict(zip(jaxpr.all_invars, [*jaxpr.consts, *args]))
    read = lambda v: _literal(v) if isinstance(v, ji.Literal) else env[v]
    for e in jaxpr.eqns:
      if e in emitters:
        with ji.source_info_util.user_context(e.source_info.traceback):
          env.update(zip(e.outvars, emitters[e](read, tile)))
      elif e not in skip:
        params = jaxpr_util.map_sub_jaxprs(e.params, sub)
        env.update(zip(e.outvars, jaxpr_util.rebind(e, [read(v) for v in e.invars], params)))
    return [read(v) for v in jaxpr.outvars]

  run.__name__ = "tiled"
  avals = ([ji.ShapedArray((), jnp.int32)] if spread else []) + list(jaxpr.in_avals)
  new, _, consts = ji.trace_to_jaxpr(run, avals)
  return ji.closed(new, consts)


def _rewrite_products(jaxpr, spread=False):
  """``jaxpr`` with its too-large plain products tiled (sub-jaxprs too). With ``spread``, the
  jaxpr takes the tile index as a new first argument and computes that tile only."""
  found = {t.store: t for t in find(jaxpr)}
  emitters = {e: (lambda read, tile, t=t: _emit(t, read, tile) or [None]) for e, t in found.items()}
  skip = {e for t in found.values() for e in t.replaced}
  return _retrace(jaxpr, emitters, skip, spread, rewrite_products)


def rewrite_products(jaxpr):
  return _rewrite_products(jaxpr) if _needs_rewrite(jaxpr) else jaxpr


def _rewrite_regions(jaxpr, found, spread=False):
  """``jaxpr`` with each region of ``found`` run where its last equation was (a reduction
  where it was: its result is that of the reduction)."""
  emitters, members = {}, set()
  for region in found if isinstance(found, tuple) else ():
    anchor = region.reduction or [e for e in jaxpr.eqns if e in region.members][-1]
    emitters[anchor] = lambda read, tile, region=region: _emit_region(region, read, tile)
    members |= region.members
  # a small value a region computes that other code uses whole is computed there too
  uses = regions.consumers(jaxpr)
  skip = {e for e in members if all(u in members for v in e.outvars for u in uses.get(v, []))}
  return _retrace(jaxpr, emitters, skip, spread, rewrite_regions)


def _has_region(jaxpr) -> bool:
  return isinstance(regions.analyze(inline_calls(jaxpr)), tuple) or any(
      _has_region(s) for e in jaxpr.eqns for s in jaxpr_util.sub_jaxprs(e.params))


def rewrite_regions(jaxpr):
  """``jaxpr`` with the large values of each of its (sub)jaxprs computed tile by tile, where
  regions.py finds how (``refusal`` says why not)."""
  if not _has_region(jaxpr):
    return jaxpr
  jaxpr = inline_calls(jaxpr)
  return _rewrite_regions(jaxpr, regions.analyze(jaxpr))


def rewrite_jaxpr(jaxpr):
  return rewrite_regions(rewrite_products(jaxpr))


# --- calls that hold large values are inlined (their bodies' equations join the region) ------

def _call_body(eqn):
  return next(v for k, v in jaxpr_util.sub_jaxpr_params(eqn.params) if k in ("jaxpr", "call_jaxpr"))


def _inlined(jaxpr, args) -> list:
  """The body of a call, traced at the caller's source line where the body's own equations
  have none outside JAX (``jnp.cumsum``'s body: its user is the caller's line)."""
  env = dict(zip(jaxpr.all_invars, [*jaxpr.consts, *args]))
  read = lambda v: _literal(v) if isinstance(v, ji.Literal) else env[v]
  for e in jaxpr.eqns:
    invals = [read(v) for v in e.invars]
    if e.primitive in ji.CALL_PRIMITIVES:
      outs = _inlined(_call_body(e), invals)
    elif ji.user_location(e.source_info) is None:   # the caller's user_context stays
      outs = e.primitive.bind(*invals, **e.primitive.get_bind_params(e.params))
      outs = list(outs) if e.primitive.multiple_results else [outs]
    else:
      outs = jaxpr_util.rebind(e, invals)
    env.update(zip(e.outvars, outs))
  return [read(v) for v in jaxpr.outvars]


def _large_call(e) -> bool:
  return e.primitive in ji.CALL_PRIMITIVES and any(
      regions.is_large(v) for v in [*e.invars, *e.outvars])


def inline_calls(jaxpr):
  """``jaxpr`` with calls (jit, custom_jvp, ...) that take or give large values inlined: on the
  GPU a call is its body (the Triton backend inlines them too)."""
  return jaxpr_util.retrace(jaxpr, lambda e, invals, params: _inlined(_call_body(e), invals),
                            _large_call)


def refusal(jaxpr) -> str | None:
  """Why a value of ``jaxpr`` (or of a sub-jaxpr) too large for one program stays whole."""
  found = regions.analyze(inline_calls(jaxpr))
  if isinstance(found, regions.Refusal):
    return found.message()
  return next((r for e in jaxpr.eqns for s in jaxpr_util.sub_jaxprs(e.params)
               if (r := refusal(s)) is not None), None)


def _spreads(jaxpr, members) -> bool:
  """Whether all ``jaxpr`` does besides ``members`` is index arithmetic (then its tiles are
  independent and can run as programs of their own)."""
  rest = [e for e in jaxpr.eqns if e not in members]
  return not any(e.effects or any(ji.is_ref_aval(v.aval) for v in e.invars) for e in rest)


def rewrite(params, sequential_axes: bool):
  """``params`` with too-large block values tiled: plain products first, then regions of
  separable code (with products as leaves). Unless the grid has axes that run in order inside a
  program, a kernel that is just one such product or region gets a new first grid axis over its
  tiles (programs compute one tile each)."""
  jaxpr, gm = params.jaxpr, params.grid_mapping
  if _needs_rewrite(jaxpr):
    whole = None if sequential_axes else _whole_kernel(jaxpr)
    if whole is None:
      jaxpr = _rewrite_products(jaxpr)
    else:
      gm = with_leading_grid_axis(gm, math.prod(whole.tile_counts()), [False] * len(gm.block_mappings),
                                  vmapped=False)
      jaxpr = _rewrite_products(jaxpr, spread=True)
  jaxpr = inline_calls(jaxpr)
  found = regions.analyze(jaxpr)
  if isinstance(found, tuple) and len(found) == 1 and found[0].reduction is None and \
      not sequential_axes and gm is params.grid_mapping and _spreads(jaxpr, found[0].members):
    gm = with_leading_grid_axis(gm, math.prod(found[0].counts()), [False] * len(gm.block_mappings),
                                vmapped=False)
    jaxpr = _rewrite_regions(jaxpr, found, spread=True)
  elif _has_region(jaxpr):
    jaxpr = _rewrite_regions(jaxpr, found)
  if jaxpr is params.jaxpr:
    return params
  return dataclasses.replace(params, jaxpr=jaxpr, grid_mapping=gm)

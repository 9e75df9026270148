"""Block-level matrix products too large for one program, rewritten as loops over Ref tiles.

``o_ref[...] = (x_ref[...] @ y_ref[...]).astype(...)`` on 512x1024 blocks (the seed notebook's
matmul) cannot be one GPU dot: its operands and result exceed a program's registers and shared
memory. When a store's value is such a product of two Ref reads (each used once), the kernel
jaxpr is rewritten into what a hand-written GPU matmul does: a loop over output tiles, an inner
loop over K accumulating small ``dot_general``s of Ref slices, and a store of each tile. The
backends' ordinary rules lower the result; there is one dot lowering.

When the product is all the kernel does, its output tiles are independent: instead of a loop, a
new first grid axis enumerates them, so the tiles spread over concurrent programs.
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

# Above these sizes a single dot does not fit one program.
MAX_RESULT = 128 * 256
MAX_OPERAND_BYTES = 96 * 1024
_MN_TILES = (128, 64, 32, 16)


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
    (m, k), n = self.dot.invars[0].aval.shape, self.dot.invars[1].aval.shape[1]
    dtype = self.dot.invars[0].aval.dtype
    return _tile(m, _mn_tiles(dtype)), _tile(n, _mn_tiles(dtype)), _tile(k, _k_tiles(dtype))

  def tile_counts(self) -> tuple[int, int]:
    (m, _), n = self.dot.invars[0].aval.shape, self.dot.invars[1].aval.shape[1]
    bm, bn, _ = self.tiles()
    return m // bm, n // bn


def _tile(n: int, options) -> int | None:
  return next((t for t in options if n % t == 0), None)


def _mn_tiles(dtype) -> tuple[int, ...]:
  # float64 tiles of 128 would stage 128 KiB of operands: more shared memory than Turing has
  return _MN_TILES[1:] if jnp.dtype(dtype).itemsize == 8 else _MN_TILES


def _k_tiles(dtype) -> tuple[int, ...]:
  # 8-bit operands: the tensor cores take K steps of 32 or more
  return (64, 32) if jnp.dtype(dtype).itemsize == 1 else (64, 32, 16)


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


def _too_large(a, b) -> bool:
  (m, k), n = a.aval.shape, b.aval.shape[1]
  nbytes = m * k * jnp.dtype(a.aval.dtype).itemsize + k * n * jnp.dtype(b.aval.dtype).itemsize
  return m * n > MAX_RESULT or nbytes > MAX_OPERAND_BYTES


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
      len(b.aval.shape) != 2 or not (once(a) and once(b)) or not _too_large(a, b):
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


def _one_tile(t: TiledDot, a, b, o, m0, n0):
  """o[m0:m0+bm, n0:n0+bn] = the product's tile, accumulated over K steps."""
  bm, bn, bk = t.tiles()
  k = t.dot.invars[0].aval.shape[1]
  acc_dtype = _acc_dtype(t.dot.invars[0].aval.dtype)
  params = dict(t.dot.params, preferred_element_type=acc_dtype)

  def step(j, acc):
    x = a.at[ji.ds(m0, bm), ji.ds(j * _i32(bk), bk)][...]
    y = b.at[ji.ds(j * _i32(bk), bk), ji.ds(n0, bn)][...]
    return acc + lax.dot_general_p.bind(x, y, **params)

  acc = lax.fori_loop(_i32(0), _i32(k // bk), step, jnp.zeros((bm, bn), acc_dtype))
  out = acc.astype(t.dot.outvars[0].aval.dtype)   # rounded as the product would be
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


def _rewrite_jaxpr(jaxpr, tile_id=None, whole=None):
  """``jaxpr`` with its too-large products tiled (sub-jaxprs too). With ``whole``, the jaxpr
  takes the tile index as a new first argument and computes that tile only."""
  found = {t.store: t for t in find(jaxpr)}
  skip = {e for t in found.values() for e in t.replaced}

  def run(*args):
    if whole is not None:
      tile, args = args[0], args[1:]
    env = dict(zip(jaxpr.invars, args))
    read = lambda v: v.val if isinstance(v, ji.Literal) else env[v]
    for e in jaxpr.eqns:
      if e in skip:
        continue
      if e in found:
        with ji.source_info_util.user_context(e.source_info.traceback):
          _emit(found[e], read, tile if whole is not None else None)
        continue
      params = jaxpr_util.map_sub_jaxprs(e.params, rewrite_jaxpr)
      for v, x in zip(e.outvars, jaxpr_util.rebind(e, [read(v) for v in e.invars], params)):
        env[v] = x
    return [read(v) for v in jaxpr.outvars]

  run.__name__ = "tiled"
  avals = ([ji.ShapedArray((), jnp.int32)] if whole is not None else []) + list(jaxpr.in_avals)
  new, _, consts = ji.trace_to_jaxpr(lambda *a: run(*a), avals)
  return ji.closed(new, consts)


def rewrite_jaxpr(jaxpr):
  return _rewrite_jaxpr(jaxpr) if _needs_rewrite(jaxpr) else jaxpr


def rewrite(params, sequential_axes: bool):
  """``params`` with too-large block products tiled. Unless the grid has axes that run in order
  inside a program, a kernel that is just one such product gets a new first grid axis over its
  output tiles (programs compute one tile each)."""
  jaxpr = params.jaxpr
  if not _needs_rewrite(jaxpr):
    return params
  whole = None if sequential_axes else _whole_kernel(jaxpr)
  if whole is None:
    return dataclasses.replace(params, jaxpr=_rewrite_jaxpr(jaxpr))
  gm = params.grid_mapping
  n_tiles = math.prod(whole.tile_counts())
  new_gm = with_leading_grid_axis(gm, n_tiles, [False] * len(gm.block_mappings),
                                        vmapped=False)
  return dataclasses.replace(params, jaxpr=_rewrite_jaxpr(jaxpr, whole=whole), grid_mapping=new_gm)

"""Block-level matrix products too large for one program's registers, as loop nests.

``o_ref[...] = (x_ref[...] @ y_ref[...]).astype(...)`` on 512x1024 blocks (the seed
notebook's matmul) cannot be one ``tl.dot``: its operands and result exceed the
registers and shared memory of a program. When a store's value is such a product of two
Ref reads (each used once), the generator emits instead a loop over output tiles with an
inner loop over K, which is what a hand-written Triton matmul does.
"""
from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
from jax import lax

from pallax._src import jax_internals as ji
from pallax._src.triton import rules
from pallax._src.triton.values import Val, tl_dtype

# Above these sizes a single tl.dot does not fit one program.
MAX_RESULT = 128 * 256
MAX_OPERAND_BYTES = 96 * 1024


@dataclasses.dataclass
class TiledDot:
  store: object          # the swap equation
  dot: object            # the dot_general equation
  lhs_get: object
  rhs_get: object
  cast: object | None    # convert_element_type between dot and store, if any
  skip: set              # ids of the equations the loop nest replaces


def _single_use(jaxpr):
  uses = {}
  for e in jaxpr.eqns:
    for v in e.invars:
      if isinstance(v, ji.Var):
        uses[v] = uses.get(v, 0) + 1
  for v in jaxpr.outvars:
    if isinstance(v, ji.Var):
      uses[v] = uses.get(v, 0) + 2
  return lambda v: isinstance(v, ji.Var) and uses.get(v, 0) == 1   # literals are unhashable


def _tile(n: int, options) -> int | None:
  return next((t for t in options if n % t == 0), None)


def find(jaxpr) -> dict:
  """Store equations (by id) whose value is a too-large product of two Ref reads."""
  producer = {v: e for e in jaxpr.eqns for v in e.outvars}
  once = _single_use(jaxpr)
  found = {}
  for e in jaxpr.eqns:
    if e.primitive is not ji.swap_p or not once(e.invars[1]) or not isinstance(e.invars[1], ji.Var):
      continue
    v, cast = e.invars[1], None
    p = producer.get(v)
    if p is not None and p.primitive is lax.convert_element_type_p and once(p.invars[0]):
      cast, p = p, producer.get(p.invars[0])
    if p is None or p.primitive is not lax.dot_general_p:
      continue
    (lc, rc), (lb, rb) = p.params["dimension_numbers"]
    a, b = p.invars
    if lb or rb or tuple(lc) != (1,) or tuple(rc) != (0,) or len(a.aval.shape) != 2 or \
        len(b.aval.shape) != 2 or not (once(a) and once(b)):
      continue
    ga, gb = producer.get(a), producer.get(b)
    if ga is None or gb is None or ga.primitive is not ji.get_p or gb.primitive is not ji.get_p:
      continue
    (m, k), n = a.aval.shape, b.aval.shape[1]
    nbytes = (m * k * jnp.dtype(a.aval.dtype).itemsize + k * n * jnp.dtype(b.aval.dtype).itemsize)
    if m * n <= MAX_RESULT and nbytes <= MAX_OPERAND_BYTES:
      continue
    if a.aval.dtype != b.aval.dtype or \
        None in (_tile(m, (128, 64, 32, 16)), _tile(n, (128, 64, 32, 16)), _tile(k, _k_tiles(a))):
      continue
    skip = {id(x) for x in (ga, gb, p, cast) if x is not None}
    found[id(e)] = TiledDot(e, p, ga, gb, cast, skip)
  return found


def tile_sizes(t: TiledDot) -> tuple[int, int, int]:
  a, b = t.dot.invars
  (m, k), n = a.aval.shape, b.aval.shape[1]
  return _tile(m, (128, 64, 32, 16)), _tile(n, (128, 64, 32, 16)), _tile(k, _k_tiles(a))


def _k_tiles(a) -> tuple[int, ...]:
  # 8-bit operands: the tensor cores take K steps of 32 or more
  return (64, 32) if jnp.dtype(a.aval.dtype).itemsize == 1 else (64, 32, 16)


def whole_kernel(jaxpr, found: dict) -> TiledDot | None:
  """The product, if it is all the kernel does (besides index arithmetic): then its output
  tiles are independent and can be spread over programs instead of looped over."""
  if len(found) != 1:
    return None
  (t,) = found.values()
  rest = [e for e in jaxpr.eqns if id(e) not in t.skip and e is not t.store]
  if any(e.effects or any(ji.is_ref_aval(v.aval) for v in e.invars) for e in rest):
    return None
  return t


def emit(cg, t: TiledDot, read, tile_ids=None):
  """Emits the loop nest for ``t`` (``read`` maps jaxpr atoms to generator values); with
  ``tile_ids`` (expressions of the output tile's row and column) only that tile."""
  """Emits the loop nest for ``t`` (``read`` maps jaxpr atoms to generator values)."""
  from pallax._src.triton.codegen import _access   # the generator's Ref-access decoding
  a_view, _ = _access(cg, t.lhs_get, [read(v) for v in t.lhs_get.invars])
  b_view, _ = _access(cg, t.rhs_get, [read(v) for v in t.rhs_get.invars])
  o_view, _ = _access(cg, t.store, [read(v) if k != 1 else None      # [1] is the value: the product
                                    for k, v in enumerate(t.store.invars)])
  a, b = t.dot.invars
  (m, k), n = a.aval.shape, b.aval.shape[1]
  bm, bn, bk = _tile(m, (128, 64, 32, 16)), _tile(n, (128, 64, 32, 16)), _tile(k, (64, 32, 16))
  out_dtype = t.store.invars[0].aval.dtype
  int_acc = jnp.issubdtype(t.dot.outvars[0].aval.dtype, jnp.integer)
  acc_dtype = "tl.int32" if int_acc else "tl.float32"
  i32 = jnp.dtype(jnp.int32)
  m0, n0, k0 = cg.fresh("m0"), cg.fresh("n0"), cg.fresh("k0")

  def tile(view, rows, cols):
    idx = ji.NDIndexer((ji.Slice(Val(rows[0], (), i32), rows[1], 1),
                        ji.Slice(Val(cols[0], (), i32), cols[1], 1)), view.shape, (), validate=False)
    return cg.index_ref(view, [idx])

  cg.emit(f"# {m}x{k} @ {k}x{n} is too large for one program: tiles of {bm}x{bn}, K steps of {bk}")
  if tile_ids is None:
    cg.emit(f"for {m0} in range(0, {m}, {bm}):")
    cg.depth += 1
    cg.emit(f"for {n0} in range(0, {n}, {bn}):")
    cg.depth += 1
  else:
    cg.emit(f"{m0} = {tile_ids[0]} * {bm}")
    cg.emit(f"{n0} = {tile_ids[1]} * {bn}")
  acc = cg.fresh("acc")
  cg.emit(f"{acc} = tl.zeros([{bm}, {bn}], {acc_dtype})")
  cg.emit(f"for {k0} in range(0, {k}, {bk}):")
  cg.depth += 1
  x = cg.load(tile(a_view, (m0, bm), (k0, bk)), hint="a")
  y = cg.load(tile(b_view, (k0, bk), (n0, bn)), hint="b")
  cg.emit(f"{acc} = {acc} + tl.dot({x.expr}, {y.expr}{rules.input_precision(t.dot, x.dtype)}, "
          f"out_dtype={acc_dtype})")
  cg.depth -= 1
  val = Val(acc if jnp.dtype(out_dtype) == jnp.dtype(jnp.int32 if int_acc else jnp.float32)
            else f"{acc}.to({tl_dtype(out_dtype)})", (bm, bn), jnp.dtype(out_dtype))
  cg.store(tile(o_view, (m0, bm), (n0, bn)), cg.bind(val.expr, (bm, bn), out_dtype, "tile"))
  if tile_ids is None:
    cg.depth -= 2
  cg.max_numel = max(cg.max_numel, math.prod((bm, bn)))

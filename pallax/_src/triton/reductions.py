"""Triton rules for reductions, cumulative scans and matrix products.

Padded lanes (past a value's logical shape) are set to the reduction's identity first, and to
zero along a product's K dimension.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from pallax._src.gpu import expr as ex
from pallax._src.gpu.expr import Token, call
from pallax._src.triton import lang as tl
from pallax._src.triton.writer import is_float, rule


_REDUCE = {lax.reduce_sum_p: "sum", lax.reduce_max_p: "max", lax.reduce_min_p: "min",
           lax.reduce_and_p: "and", lax.reduce_or_p: "or", lax.reduce_prod_p: "prod",
           lax.reduce_xor_p: "xor"}
# combine functions of the prologue; max/min let NaN win, as lax does (tl.max would skip it)
_COMBINE = {"max": "_max", "min": "_min", "and": "_and", "or": "_or", "prod": "_mul"}


def _reduce_axis(x: ex.Expr, kind: str, a: int, shape) -> ex.Expr:
  boolean = kind in ("and", "or") and x.dtype == np.bool_
  cur = tl.to(x, np.int32) if boolean else x
  if kind == "sum":
    # (8- and 16-bit integer sums were legalized to 32 bits: tl.sum would widen them)
    e = call("tl.sum", cur, axis=tl.i32(a), dtype=cur.dtype, shape=shape)
  elif kind == "xor":
    e = call("tl.xor_sum", cur, axis=tl.i32(a), dtype=cur.dtype, shape=shape)
  else:
    e = call("tl.reduce", cur, tl.i32(a), Token(_COMBINE[kind]), dtype=cur.dtype, shape=shape)
  return tl.compare("!=", e, tl.i32(0)) if boolean else e


def _reduce_rule(kind):
  def lower(ctx, x, axes, **_):
    axes = sorted(axes, reverse=True)
    cur = ctx.gen.mask_padding(x, axes, ex.untyped(ex.neutral(kind, x.dtype)))
    shape = list(x.shape)
    for a in axes:
      del shape[a]
      cur = _reduce_axis(cur, kind, a, tuple(shape))
      if a != axes[-1]:
        cur = ctx.gen.bind(cur, "red", x.dtype, shape)
    return cur
  return lower


for _p, _kind in _REDUCE.items():
  rule(_p, hint=_kind)(_reduce_rule(_kind))


def _arg_rule(kind):
  def lower(ctx, x, axes, index_dtype):
    (axis,) = axes
    # NaN-free here (legalized): tl.argmax's answer is lax's, the first extremum winning ties
    cur = ctx.gen.mask_padding(x, [axis], ex.untyped(ex.neutral(kind, x.dtype)))
    e = call(f"tl.arg{kind}", cur, axis=tl.i32(axis), tie_break_left=True, dtype=tl.I32,
             shape=ctx.out.shape)
    return e if np.dtype(index_dtype) == np.int32 else tl.to(e, index_dtype)
  return lower


rule(lax.argmax_p, hint="argmax")(_arg_rule("max"))
rule(lax.argmin_p, hint="argmin")(_arg_rule("min"))


_CUMULATIVE = {lax.cumsum_p: "sum", lax.cummax_p: "max", lax.cummin_p: "min", lax.cumprod_p: "prod"}


def _cumulative_rule(kind):
  def lower(ctx, x, axis, reverse):
    cur = ctx.gen.mask_padding(x, [axis], ex.untyped(ex.neutral(kind, x.dtype))) if reverse else x
    if kind in ("sum", "prod"):
      e = call(f"tl.cum{kind}", cur, axis=tl.i32(axis), reverse=reverse, dtype=x.dtype, shape=x.shape)
    else:
      e = call("tl.associative_scan", cur, tl.i32(axis), Token(f"_{kind}"), reverse=reverse,
               dtype=x.dtype, shape=x.shape)
    if kind in ("sum", "prod") and np.dtype(x.dtype) == np.dtype("bfloat16"):
      e = tl.to(e, x.dtype)   # tl.cumsum/cumprod widen bf16 (narrow ints were legalized)
    return e
  return lower


for _p, _kind in _CUMULATIVE.items():
  rule(_p, hint="cum" + _kind)(_cumulative_rule(_kind))


# --- matrix products ------------------------------------------------------------------------

# tl.dot's input_precision for float32 operands: by lax.Precision (HIGH: tf32x3, where XLA uses
# tf32), and by the two presets that gpu/dot_algorithms.py leaves to tl.dot.
_PRECISION = {"DEFAULT": "tf32", "HIGH": "tf32x3", "HIGHEST": "ieee",
              "TF32_TF32_F32": "tf32", "TF32_TF32_F32_X3": "tf32x3"}


def _input_precision(precision, dtype) -> dict:
  """The ``input_precision=`` argument of tl.dot for float32 operands (none otherwise)."""
  if np.dtype(dtype) != np.float32:
    return {}
  if precision is None:
    precision = lax.Precision.DEFAULT
  if isinstance(precision, tuple):   # one per operand: the more precise one, as XLA
    precision = max(precision, key=lambda p: p.value)
  if precision.name not in _PRECISION:   # dot_algorithms.expand writes the others out
    raise NotImplementedError(f"a float32 matrix product with the dot algorithm {precision.name}: "
                              "the Triton backend has no such tl.dot")
  return {"input_precision": _PRECISION[precision.name]}


def _moved(shape, src, dst):
  s = list(shape)
  d = s.pop(src)
  s.insert(dst, d)
  return tuple(s)


def _operand(ctx, x, contract: int, to: int, nb: int, hint: str):
  """A dot operand with its contracting dimension moved to ``to`` and K padding zeroed."""
  shape = _moved(x.shape, contract, to)
  if contract != to:
    x = call("tl.trans", x, dtype=x.dtype, shape=shape) if nb == 0 else \
        call("tl.permute", x, tl.shape_token([0, 2, 1]), dtype=x.dtype, shape=shape)
  x = ctx.gen.bind(x, hint)
  return x, ctx.gen.mask_padding(x, [to], tl.i32(0))


def _check_dims(dimension_numbers, a, b):
  (lc, rc), (lb, rb) = dimension_numbers
  nb = len(lb)
  if (len(lc) != 1 or len(rc) != 1 or nb > 1 or tuple(lb) != tuple(range(nb))
      or tuple(rb) != tuple(range(nb)) or len(a.shape) - nb != 2 or len(b.shape) - nb != 2):
    raise NotImplementedError(f"dot_general with dimension numbers {dimension_numbers}: the "
                              "Triton backend multiplies (batched) matrices: both operands must be 2D "
                              "(3D with one batch dimension); reshape a vector to a (n, 1) matrix")
  return lc[0], rc[0], nb


def _operand_dtype(a, b):
  try:
    return np.dtype(jnp.promote_types(a.dtype, b.dtype))
  except TypeError:   # two fp8 formats: no implicit promotion
    return tl.F32


@rule(lax.dot_general_p, hint="dot")
def _dot_general(ctx, a, b, dimension_numbers, precision, preferred_element_type, **_):
  lc, rc, nb = _check_dims(dimension_numbers, a, b)
  a_val, ax = _operand(ctx, a, lc, nb + 1, nb, "lhs")   # (batch, M, K) x (batch, K, N)
  b_val, bx = _operand(ctx, b, rc, nb, nb, "rhs")
  m, n, k = a_val.padded[nb], b_val.padded[nb + 1], a_val.padded[nb + 1]
  dt = _operand_dtype(a, b)
  ax = ax if np.dtype(a.dtype) == dt else tl.to(ax, dt)   # tl.dot needs one operand type
  bx = bx if np.dtype(b.dtype) == dt else tl.to(bx, dt)
  acc = (np.dtype(np.float64) if dt == np.float64 else tl.F32) if is_float(dt) else tl.I32
  big = min(m, n, k) >= 16 and (dt.itemsize > 1 or k >= 32)   # 8-bit tensor-core dots need K >= 32
  if big and dt == np.int8 and ctx.gen.compute_capability < 80:
    raise NotImplementedError(
        f"an int8 matrix product of blocks this large on sm_{ctx.gen.compute_capability}: Triton "
        "multiplies int8 on the tensor cores from compute capability 8.0 only (convert the "
        "operands to float32, exact while the sums stay below 2**24, or use smaller blocks)")
  if big and not is_float(dt) and dt != np.int8:
    raise NotImplementedError(
        f"an integer matrix product of {np.dtype(a.dtype).name} and {np.dtype(b.dtype).name} "
        "blocks: the tensor cores multiply int8 only (convert the operands to int8, or to a float "
        "type where the products are exact)")
  shape = ctx.out.shape
  if big:
    e = call("tl.dot", ax, bx, dtype=acc, shape=shape, **_input_precision(precision, dt),
             out_dtype=tl.dtype(acc))
  else:   # too small for the tensor cores: multiply and sum
    a3 = ex.Subscript(tl.to(ax, acc), (slice(None),) * (nb + 2) + (None,), dtype=acc)
    b3 = ex.Subscript(tl.to(bx, acc), (slice(None),) * nb + (None, slice(None), slice(None)), dtype=acc)
    e = call("tl.sum", ex.binary("*", a3, b3), axis=tl.i32(nb + 1), dtype=acc, shape=shape)
  out = np.dtype(ctx.out.dtype)
  return e if out == acc else tl.to(e, out)

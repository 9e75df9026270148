"""Gluon rules of elementwise operations, reductions and hints: ``rule(ctx, *operands,
**params)`` as in ``gpu/source.py``. Operands of two layouts meet in one (``values.common_layout``).
"""
from __future__ import annotations

import numpy as np
from jax import lax

from pallax._src import jax_internals as ji
from pallax._src import primitives as prims
from pallax._src.gluon import layouts as L
from pallax._src.gluon.assign import Val, layout_rule
from pallax._src.gluon.values import common_layout, dtype_token, i32, masked, slice_layout
from pallax._src.gluon.writer import rule
from pallax._src.gpu import expr as ex
from pallax._src.gpu.expr import binary, call, method

_BINARY = {lax.add_p: "+", lax.sub_p: "-", lax.mul_p: "*", lax.and_p: "&", lax.or_p: "|",
           lax.xor_p: "^", lax.shift_left_p: "<<", lax.shift_right_arithmetic_p: ">>"}
_COMPARE = {lax.eq_p: "==", lax.ne_p: "!=", lax.lt_p: "<", lax.le_p: "<=", lax.gt_p: ">",
            lax.ge_p: ">="}


def _binary_rule(op, compare=False):
  def lower(ctx, x, y, **_):
    gen = ctx.gen
    (x, y), layout = common_layout(ctx, x, y)
    dtype = np.dtype(np.bool_) if compare else None
    return gen.value(binary(op, x, y, dtype=dtype), layout)
  return lower


for _p, _op in _BINARY.items():
  rule(_p)(_binary_rule(_op))
rule(ji.add_any_p)(_binary_rule("+"))
for _p, _op in _COMPARE.items():
  rule(_p)(_binary_rule(_op, compare=True))


@rule(lax.div_p)
def _div(ctx, x, y):
  (x, y), layout = common_layout(ctx, x, y)
  return ctx.gen.value(binary("/" if np.issubdtype(x.dtype, np.floating) else "//", x, y), layout)


@rule(lax.rem_p)
def _rem(ctx, x, y):
  if np.issubdtype(x.dtype, np.floating):
    ctx.gen.unsupported("floating-point rem")
  (x, y), layout = common_layout(ctx, x, y)
  return ctx.gen.value(binary("%", x, y), layout)


@rule(lax.max_p, lax.min_p)
def _max_min(ctx, x, y):
  (x, y), layout = common_layout(ctx, x, y)
  fn = "gl.maximum" if ctx.eqn.primitive is lax.max_p else "gl.minimum"
  return ctx.gen.value(call(fn, x, y, dtype=x.dtype, shape=ctx.out.shape), layout)


@rule(lax.not_p)
def _not(ctx, x):
  return ctx.gen.value(ex.Op("~", (x,), dtype=x.dtype, shape=x.shape), ctx.gen.layout_of(x))


@rule(lax.neg_p)
def _neg(ctx, x):
  return ctx.gen.value(ex.Op("-", (x,), dtype=x.dtype, shape=x.shape), ctx.gen.layout_of(x))


@rule(lax.select_n_p)
def _select(ctx, pred, *cases):
  if len(cases) != 2:
    ctx.gen.unsupported("select_n with more than two cases")
  gen = ctx.gen
  (pred, a, b), layout = common_layout(ctx, pred, *cases)
  return gen.value(call("gl.where", pred, b, a, dtype=a.dtype, shape=ctx.out.shape), layout)


@rule(lax.convert_element_type_p)
def _convert(ctx, x, *, new_dtype, **_):
  if np.dtype(new_dtype) == x.dtype:
    return x
  return ctx.gen.value(method(x, "to", dtype_token(new_dtype), dtype=new_dtype), ctx.gen.layout_of(x))


@rule(lax.bitcast_convert_type_p)
def _bitcast(ctx, x, *, new_dtype):
  new = np.dtype(new_dtype)
  if new.itemsize != np.dtype(x.dtype).itemsize:
    ctx.gen.unsupported(f"bitcast_convert_type from {np.dtype(x.dtype).name} to {new.name} "
                        "(types of different sizes)")
  return ctx.gen.value(method(x, "to", dtype_token(new), dtype=new, bitcast=True), ctx.gen.layout_of(x))



def _reduce_rule(fn, kind: str):
  def lower(ctx, x, *, axes, **_):
    gen = ctx.gen
    if len(axes) != 1 or gen.layout_of(x) is None:
      gen.unsupported("reductions over several axes, or of values without a layout")
    (axis,) = axes
    x = masked(gen, x, [axis], ex.untyped(ex.neutral(kind, x.dtype)))
    layout = slice_layout(gen, gen.layout_of(x), axis)
    return gen.value(call(fn, x, i32(axis), dtype=ctx.out.dtype, shape=ctx.out.shape), layout)
  return lower


rule(lax.reduce_max_p)(_reduce_rule("gl.max", "max"))
rule(lax.reduce_min_p)(_reduce_rule("gl.min", "min"))
rule(lax.reduce_sum_p)(_reduce_rule("gl.sum", "sum"))

_UNARY = {lax.exp_p: "gl.exp", lax.exp2_p: "gl.exp2", lax.log_p: "gl.log", lax.sqrt_p: "gl.sqrt",
          lax.rsqrt_p: "gl.rsqrt", lax.abs_p: "gl.abs"}


def _unary_rule(fn):
  return lambda ctx, x, **_: ctx.gen.value(call(fn, x, dtype=x.dtype, shape=x.shape), ctx.gen.layout_of(x))


for _p, _fn in _UNARY.items():
  rule(_p)(_unary_rule(_fn))


@rule(prims.hint_p)
def _hint(ctx, x, **_):
  return x


# --- layout assignment (assign.py): operations without a rule here take their operands' common
# layout (``assign.elementwise``) ------------------------------------------------------------------

@layout_rule(lax.convert_element_type_p)
def _convert_layouts(ctx, x, *, new_dtype, **_):
  if np.dtype(new_dtype) == x.dtype:
    return x
  return Val(tuple(x.shape), np.dtype(new_dtype), getattr(x, "layout", None))


@layout_rule(prims.hint_p)
def _hint_layouts(ctx, x, **_):
  return x


def _reduce_layouts(ctx, x, *, axes, **_):
  layout = getattr(x, "layout", None)
  if len(axes) != 1 or layout is None:
    return None
  return Val(tuple(ctx.out.shape), np.dtype(ctx.out.dtype), L.Slice(axes[0], layout))


for _p in (lax.reduce_max_p, lax.reduce_min_p, lax.reduce_sum_p):
  layout_rule(_p)(_reduce_layouts)

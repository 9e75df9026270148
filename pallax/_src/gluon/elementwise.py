"""Gluon rules of elementwise operations, reductions and hints: ``rule(ctx, *operands,
**params)`` as in ``gpu/source.py``. Operands of two layouts meet in one (``values.common_layout``).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
from jax import lax

from pallax._src import jax_internals as ji
from pallax._src import primitives as prims
from pallax._src.gluon import layouts as L
from pallax._src.gluon import subbyte
from pallax._src.gluon.assign import Val, layout_rule
from pallax._src.gluon.values import common_layout, dtype_token, i32, masked, slice_layout
from pallax._src.gluon.writer import rule
from pallax._src.gpu import expr as ex
from pallax._src.gpu import math_functions
from pallax._src.gpu.expr import binary, call, method

_BINARY = {lax.add_p: "+", lax.sub_p: "-", lax.mul_p: "*", lax.and_p: "&", lax.or_p: "|",
           lax.xor_p: "^", lax.shift_left_p: "<<", lax.shift_right_arithmetic_p: ">>",
           lax.shift_right_logical_p: ">>"}   # (legalized: unsigned operands, amounts in range)
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
  if isinstance(x, ex.Name) and subbyte.holds(x.dtype, new_dtype):   # (the same byte)
    return dataclasses.replace(x, dtype=np.dtype(new_dtype))
  if subbyte.is_packed(new_dtype):
    return ctx.gen.value(subbyte.wrap(x, new_dtype), ctx.gen.layout_of(x))
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
    if not axes:
      return x
    if gen.layout_of(x) is None:
      gen.unsupported("reductions of values without a layout")
    # several axes: one reduction per axis, the last first, so the others keep their numbers
    x = masked(gen, x, list(axes), ex.untyped(ex.neutral(kind, x.dtype)))
    layout, shape, dtype = gen.layout_of(x), tuple(x.shape), np.dtype(ctx.out.dtype)
    for axis in sorted(axes, reverse=True):
      layout, shape = slice_layout(gen, layout, axis), shape[:axis] + shape[axis + 1:]
      x = gen.value(call(fn, x, i32(axis), dtype=_widened(kind, dtype), shape=shape), layout)
    if x.dtype != dtype:   # back to the type JAX gives (exact for max and min; a sum wraps)
      x = gen.value(method(x, "to", dtype_token(dtype), dtype=dtype), layout)
    return x
  return lower


def _widened(kind: str, dtype: np.dtype) -> np.dtype:
  """The type of Gluon's reduction of ``dtype``: ``gl.max`` and ``gl.min`` reduce types
  narrower than 32 bits in float32 or int32, ``gl.sum`` integers in int32 or uint32."""
  if dtype.itemsize >= 4 or dtype == np.bool_:
    return dtype
  if kind == "sum":
    if not np.issubdtype(dtype, np.integer):
      return dtype
    return np.dtype(np.uint32 if np.issubdtype(dtype, np.unsignedinteger) else np.int32)
  return np.dtype(np.float32 if np.issubdtype(dtype, np.floating) or dtype.kind == "V" else np.int32)


rule(lax.reduce_max_p)(_reduce_rule("gl.max", "max"))
rule(lax.reduce_min_p)(_reduce_rule("gl.min", "min"))
rule(lax.reduce_sum_p)(_reduce_rule("gl.sum", "sum"))

_UNARY = {lax.abs_p: "gl.abs", lax.floor_p: "gl.floor", lax.ceil_p: "gl.ceil"}


def _unary_rule(fn):
  return lambda ctx, x, **_: ctx.gen.value(call(fn, x, dtype=x.dtype, shape=x.shape), ctx.gen.layout_of(x))


for _p, _fn in _UNARY.items():
  rule(_p)(_unary_rule(_fn))


@rule(lax.population_count_p, lax.clz_p)
def _bit_count(ctx, x):
  """libdevice's popc/clz (legalized to int32 or int64 operands), which count into an int32."""
  gen = ctx.gen
  fn = "popc" if ctx.eqn.primitive is lax.population_count_p else "clz"   # (int64: __nv_*ll)
  e = call(f"{_LIBDEVICE}.{fn}", x, dtype=np.dtype(np.int32), shape=x.shape)
  if np.dtype(x.dtype) != np.int32:
    e = method(e, "to", ex.Token(ex.dtype_name(x.dtype, "gl")), dtype=x.dtype, shape=x.shape)
  return gen.value(e, gen.layout_of(x))


# Float math: the Triton backend's choices (gpu/math_functions.py), XLA's functions unless the
# kernel's plgpu.CompilerParams(approx_math=True) asks for the GPU's fast approximations.
_LIBDEVICE = "gl.extra.libdevice"


def _approx(ctx) -> bool:
  return ctx.gen.approx_math   # set from the kernel's CompilerParams (codegen.generate)


def _math_rule(p):
  def lower(ctx, *xs, **_):
    gen = ctx.gen
    xs, layout = common_layout(gen, *xs) if len(xs) > 1 else (xs, gen.layout_of(xs[0]))
    fn = math_functions.choose(p, xs[0].dtype, _approx(ctx))
    return gen.value(math_functions.render(fn, list(xs), ctx.out, _LIBDEVICE, "gl"), layout)
  return lower


for _p in math_functions.EXACT:
  rule(_p)(_math_rule(_p))


@rule(lax.logistic_p)
def _logistic(ctx, x, **_):
  fn = math_functions.choose(lax.exp_p, x.dtype, _approx(ctx))
  return ctx.gen.value(math_functions.logistic(x, ctx.out, fn, _LIBDEVICE, "gl"),
                       ctx.gen.layout_of(x))


@rule(prims.hint_p)
def _hint(ctx, x, *, kind, values):
  """Gluon takes no hints; ``pl.multiple_of`` of a scalar is kept as what the value is known to
  be a multiple of (a run-time SMEM slice along a swizzled dimension needs it)."""
  if kind != "multiple_of" or x.shape or not np.issubdtype(np.dtype(x.dtype), np.integer):
    return x
  x = ctx.gen.bind(x, "v")
  return dataclasses.replace(x, divisor=math.lcm(ex.divisor(x), int(values[0])))


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
  if not axes or layout is None:
    return x if not axes else None
  for axis in sorted(axes, reverse=True):   # as _reduce_rule reduces them
    layout = L.Slice(axis, layout)
  return Val(tuple(ctx.out.shape), np.dtype(ctx.out.dtype), layout)


for _p in (lax.reduce_max_p, lax.reduce_min_p, lax.reduce_sum_p):
  layout_rule(_p)(_reduce_layouts)


@rule(lax.round_p)
def _round(ctx, x, rounding_method):
  # lax's TO_NEAREST_EVEN (1) is rint; AWAY_FROM_ZERO (0) is round (half-way cases away from 0)
  fn = f"{_LIBDEVICE}.rint" if int(rounding_method) == 1 else f"{_LIBDEVICE}.round"
  return ctx.gen.value(call(fn, x, dtype=x.dtype, shape=x.shape), ctx.gen.layout_of(x))

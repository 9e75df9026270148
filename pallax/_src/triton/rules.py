"""One Triton rule per JAX primitive of the legalized kernel jaxpr: ``rule(ctx, *operands, **params)``.

Operands are typed expressions (``gpu/expr.py``). The jaxpr has been legalized first
(``gpu/legalize.py``): where lax's meaning differs from what Triton computes (integer division by
zero, shifts past the bit width, NaN in argmax, f16 math, fp8 arithmetic, ...), the equation was
rewritten into primitives whose meaning both share, so these rules are plain translations. Values
live in tensors whose shape is the logical shape rounded up to powers of two; rules neutralise
the padded lanes where they could leak (reductions, dot).
"""
from __future__ import annotations

import numpy as np
from jax import lax

from pallax._src import jax_internals as ji
from pallax._src.gpu import expr as ex
from pallax._src.gpu import math_functions
from pallax._src.gpu import subbyte as gpu_subbyte
from pallax._src.gpu.expr import Token, binary, call
from pallax._src.triton import lang as tl
from pallax._src.triton import subbyte
from pallax._src.triton.writer import is_float, rule

_NAN_ALL = Token("tl.PropagateNan.ALL")

# --- elementwise -------------------------------------------------------------------------

_BINARY = {lax.add_p: "+", lax.sub_p: "-", lax.mul_p: "*", lax.and_p: "&", lax.or_p: "|",
           lax.xor_p: "^", lax.shift_left_p: "<<", lax.shift_right_logical_p: ">>",
           lax.shift_right_arithmetic_p: ">>"}
_COMPARE = {lax.eq_p: "==", lax.ne_p: "!=", lax.lt_p: "<", lax.le_p: "<=", lax.gt_p: ">",
            lax.ge_p: ">="}


def _binary_rule(op):
  return lambda ctx, x, y, **_: binary(op, x, y)


def _compare_rule(op):
  return lambda ctx, x, y, **_: tl.compare(op, x, y)


for _p, _op in _BINARY.items():
  rule(_p)(_binary_rule(_op))
rule(ji.add_any_p)(_binary_rule("+"))   # tangents summed in a JVP kernel
for _p, _op in _COMPARE.items():
  rule(_p)(_compare_rule(_op))


@rule(lax.div_p)
def _div(ctx, x, y):
  # floats are f32/f64 here; integer divisors are never 0 nor -1 under MIN (legalized)
  return binary("/" if is_float(x.dtype) else "//", x, y)


@rule(lax.rem_p)
def _rem(ctx, x, y):
  return call("libdevice.fmod", x, y, dtype=x.dtype) if is_float(x.dtype) else binary("%", x, y)


@rule(lax.max_p, lax.min_p)
def _max_min(ctx, x, y):
  fn = "tl.maximum" if ctx.eqn.primitive is lax.max_p else "tl.minimum"
  nan = {"propagate_nan": _NAN_ALL} if is_float(x.dtype) else {}   # NaN wins, as in lax
  e = call(fn, x, y, dtype=x.dtype, **nan)
  # Triton computes 16-bit float maxima in f32 and returns f32 (exact: convert back), which a
  # loop carry of the operands' type would reject
  return tl.to(e, x.dtype) if is_float(x.dtype) and np.dtype(x.dtype).itemsize == 2 else e


@rule(lax.neg_p)
def _neg(ctx, x):
  if is_float(x.dtype):
    raise NotImplementedError("a float negation was not legalized (Triton's -x gives +0.0 for +0.0)")
  return ex.Op("-", (x,), dtype=x.dtype, shape=x.shape)


@rule(lax.not_p)
def _not(ctx, x):
  if x.dtype == np.bool_:
    return tl.compare("==", x, tl.i32(0))
  return ex.Op("~", (x,), dtype=x.dtype, shape=x.shape)


@rule(lax.square_p)
def _square(ctx, x):
  return binary("*", x, x)


@rule(lax.abs_p)
def _abs(ctx, x):
  return call("tl.abs", x, dtype=x.dtype)


# Float math on f32 and f64 (f16/bf16/fp8 were legalized to f32): XLA's functions by default,
# the GPU's fast approximations with approx_math (gpu/math_functions.py says which and why).
_ROUNDING = {lax.floor_p: "tl.floor", lax.ceil_p: "tl.ceil"}


def _math_rule(p):
  def lower(ctx, *xs, **_):
    fn = math_functions.choose(p, xs[0].dtype, ctx.gen.approx_math, ctx.gen.compute_capability)
    ctx.gen.math_calls.append((p.name, fn))
    return math_functions.render(fn, list(xs), ctx.out, "libdevice", "tl")
  return lower


for _p in math_functions.EXACT:
  rule(_p)(_math_rule(_p))
for _p, _fn in _ROUNDING.items():
  rule(_p)(lambda ctx, x, _fn=_fn, **_: call(_fn, x, dtype=x.dtype))


@rule(lax.logistic_p)
def _logistic(ctx, x, **_):
  fn = math_functions.choose(lax.exp_p, x.dtype, ctx.gen.approx_math)
  ctx.gen.math_calls.append(("logistic", fn))
  return math_functions.logistic(x, ctx.out, fn, "libdevice", "tl")


@rule(lax.round_p)
def _round(ctx, x, rounding_method):
  fn = "libdevice.rint" if int(rounding_method) == 1 else "libdevice.round"
  return call(fn, x, dtype=x.dtype)


@rule(lax.population_count_p, lax.clz_p)
def _bit_count(ctx, x):
  # legalized to int32/int64 operands; libdevice returns int32
  fn = "libdevice.popc" if ctx.eqn.primitive is lax.population_count_p else "libdevice.clz"
  e = call(fn, x, dtype=tl.I32, shape=x.shape)
  return e if np.dtype(x.dtype) == np.int32 else tl.to(e, x.dtype)


@rule(lax.select_n_p)
def _select_n(ctx, pred, *cases):
  if len(cases) == 1:
    return cases[0]
  if len(cases) == 2:
    p = pred if pred.dtype == np.bool_ else tl.compare("!=", pred, tl.i32(0))
    return tl.where(p, cases[1], cases[0], ctx.out.dtype)
  e = cases[-1]
  for k in range(len(cases) - 2, -1, -1):
    e = tl.where(tl.compare("==", pred, tl.i32(k)), cases[k], e, ctx.out.dtype)
  return e


@rule(lax.convert_element_type_p)
def _convert(ctx, x, new_dtype, **_):
  new = np.dtype(new_dtype)
  if new == np.dtype(x.dtype):
    return x
  if new == np.bool_:
    return tl.compare("!=", x, tl.i32(0))
  if gpu_subbyte.is_subbyte(new):
    return subbyte.wrap(x, new)
  return tl.to(x, new)   # legalized: values that overflow or are NaN were handled before


@rule(lax.bitcast_convert_type_p)
def _bitcast(ctx, x, new_dtype):
  new = np.dtype(new_dtype)
  if new.itemsize != np.dtype(x.dtype).itemsize:
    raise NotImplementedError(f"bitcast_convert_type from {np.dtype(x.dtype).name} to {new.name} "
                              "(types of different sizes)")
  return tl.to(x, new, bitcast=True)


@rule(ji.copy_p)
def _copy(ctx, x):
  return x


@rule(ji.optimization_barrier_p)
def _barrier(ctx, *xs):
  return list(xs)


@rule(*ji.sharding_marks)
def _sharding_mark(ctx, *xs, **_):
  """(sharding marks values traced under a mesh: ``jax.shard_map(check_vma=True)``'s vma casts,
  explicit sharding's ``reshard``; in a kernel's program they change nothing)"""
  return list(xs)


@rule(ji.axis_index_p)
def _axis_index(ctx, *, axis_name):
  """A mesh axis (a kernel's grid axes are program ids already): its coordinate, which the
  kernel reads at its start (``codegen.mesh_coordinates``)."""
  if axis_name not in ctx.gen.mesh:
    raise NotImplementedError(f"lax.axis_index({axis_name!r}): no such axis")
  return ctx.gen.mesh[axis_name]

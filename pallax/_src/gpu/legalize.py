"""Legalization: a kernel jaxpr rewritten so that every equation means the same in lax and on a GPU.

Where lax defines what C leaves undefined (or Triton computes differently), the equation is
replaced by a few lax equations whose meaning lax and the GPU share. The result is an ordinary
jaxpr with the same signature: CI runs it under XLA and compares it with the original, bitwise.

What a GPU emitter may assume about ``legalize(jaxpr, cc)`` (sub-jaxprs included):

1. Integer ``div``/``rem``: the divisor is never 0, nor -1 with a MIN dividend (guarded with
   ``select_n``: lax's ``x // 0 = -1`` (all ones unsigned), ``x % 0 = x``, ``MIN // -1 = MIN``,
   ``MIN % -1 = 0``), except literal divisors, which are neither. C's truncation is then lax's.
2. Shifts: amounts are in ``[0, bits)``; ``shift_right_logical`` sees unsigned and
   ``shift_right_arithmetic`` signed operands only (bitcasts around them).
3. Float -> int8/uint8 (and sub-byte integer) conversions see values in the target's range, never NaN (lax saturates
   and maps NaN to 0; a GPU converts to 16 bits and truncates). Wider targets are left alone: the
   GPU's conversions saturate and map NaN to 0 there, as lax does.
4. fp8 (float8_e4m3fn, float8_e5m2): no arithmetic, comparison or math on fp8 values; only
   ``convert_element_type``, ``bitcast_convert_type``, ``select_n``, data movement, ``dot_general``
   with a wider result, and Ref access see them (the rest runs in float32). A conversion to fp8
   comes from float16, bfloat16 or float32 (float32 only for compute capability 9.0 and newer)
   and sees no value that overflows the format: the GPU saturates, where lax gives NaN for
   e4m3fn above 464 (those lanes convert a NaN) and +-inf for e5m2 from 61440 (they convert 0,
   replaced by +-inf after). Before 9.0 a float32 source is first rounded to float16 "to odd":
   the GPU's float32 -> float16 step (towards zero) is then exact, and the fp8 rounded once.
5. float16/bfloat16 ``div``, ``rem``, ``round`` and the math functions (``MATH``) run in
   float32: those equations see float32 or float64 only. ``pow`` has a float exponent.
6. Float ``neg`` is a sign-bit flip; 7. ``sign``, 9. ``clamp``, 10. ``integer_pow`` and
   13. ``is_finite`` are gone (compares and selects; ``max``/``min``, which must propagate NaN;
   multiplications in lax's order; ``abs(x) < inf``).
8. ``nextafter`` remains for 64-bit floats only (the others step on the bits).
11. ``population_count``/``clz`` see int32 or int64 only.
12. Float ``argmax``/``argmin`` see no NaN (a NaN anywhere wins, the first one: lax's rule).
14. ``reduce_sum``/``cumsum`` see no 8- or 16-bit integers (summed in 32 bits, converted back).
15. ``one_minus_square`` (tanh's derivative, in JVP kernels) is ``1 - x * x``.
16. Sub-byte integers (int4, uint4, int2, uint2): only conversions, ``select_n``, data movement
   and Ref access see them; the rest runs in 32 bits and is converted back (gpu/subbyte.py).

Left to the emitter: NaN-propagating ``max``/``min`` and max/min reductions, padding lanes with
neutral values, float32 ``div`` (Triton's ``/`` is ``div.full.f32``, within 2 ulps, as in
Triton and JAX Pallas: a documented difference, not rewritten).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np
from jax import lax

from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src.gpu import subbyte

F8 = (np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e5m2))
_F16, _BF16, _F32, _F64 = (np.dtype(t) for t in (jnp.float16, jnp.bfloat16, np.float32, np.float64))
_HALF = (_F16, _BF16)
# Largest magnitudes a conversion may see: beyond, lax gives NaN (e4m3fn, from just above 464,
# half way between its largest value 448 and 480) or +-inf (e5m2, from 61440, half way between
# 57344 and 65536, where a tie rounds to the even inf).
_E4M3_NAN_ABOVE = 464.0
_E5M2_INF_FROM = 61440.0


@dataclasses.dataclass(frozen=True)
class Ctx:
  compute_capability: int
  out_avals: tuple          # the original equation's


Rule = Callable[..., object]   # rule(ctx, *operands, **params) -> outputs, or None: keep it
RULES: dict[ji.Primitive, Rule] = {}


def legalize(jaxpr: ji.Jaxpr, compute_capability: int) -> ji.Jaxpr:
  """``jaxpr`` rewritten to the contract above (the same object if nothing needed it)."""
  return jaxpr_util.retrace(jaxpr, lambda eqn, invals, params: _rewrite(
      eqn, invals, params, Ctx(compute_capability, tuple(v.aval for v in eqn.outvars))), _applies)


def _applies(eqn) -> bool:
  return eqn.primitive in RULES or _fp8_arith(eqn) or subbyte.computes(eqn)


def _rewrite(eqn, invals, params, ctx):
  """The equation's rule applied (None: keep the equation), as a list of outputs."""
  rule = RULES.get(eqn.primitive)
  try:
    if _fp8_arith(eqn):
      out = _via_f32(ctx, eqn, rule, invals, params)
    elif subbyte.computes(eqn):
      out = subbyte.via_i32(eqn, rule, invals, params, ctx, _cast)
    else:
      out = None if rule is None else rule(ctx, *invals, **params)
  except NotImplementedError as e:
    frame = ji.user_frame(eqn.source_info)
    raise NotImplementedError(f"{e}, at {frame}" if frame else str(e)) from None
  if out is None:
    return None
  return list(out) if isinstance(out, (list, tuple)) else [out]


# --- helpers ---------------------------------------------------------------------------------

def _dtype(x) -> np.dtype:
  return np.dtype(x.dtype)


def _is_float(dtype) -> bool:
  return jnp.issubdtype(dtype, jnp.floating)


def _int(bits: int, signed: bool) -> np.dtype:
  return np.dtype(f"{'i' if signed else 'u'}{bits // 8}")


def _bits(dtype) -> int:
  return np.dtype(dtype).itemsize * 8


def _const(x):
  """The value of a literal (a NumPy scalar in the re-trace), None for a traced value."""
  return x if isinstance(x, (np.ndarray, np.generic)) else None


def _scalar(v, dtype):
  return np.array(v, dtype)[()]


def _bcast(x, shape):
  return x if np.shape(x) == tuple(shape) else lax.broadcast_in_dim(x, tuple(shape), ())


def _where(c, a, b):
  """``a`` where ``c`` else ``b``; scalars (NumPy ones included) are broadcast."""
  shape = np.broadcast_shapes(np.shape(c), np.shape(a), np.shape(b))
  return lax.select_n(_bcast(c, shape), _bcast(b, shape), _bcast(a, shape))


def _bitcast(x, dtype):
  dtype = np.dtype(dtype)
  if _dtype(x) == dtype:
    return x
  if _const(x) is not None:
    return np.asarray(x).view(dtype)[()]
  return lax.bitcast_convert_type(x, dtype)


def _to_f32(x):
  if _const(x) is not None:
    return np.asarray(x).astype(np.float32)[()]
  return lax.convert_element_type(x, _F32)


# --- 1. integer division ---------------------------------------------------------------------

def _div_rem(prim):
  def rule(ctx, x, y):
    dtype = np.dtype(ctx.out_avals[0].dtype)
    if _is_float(dtype):
      return _in_f32(ctx, prim, (x, y), {}) if dtype in _HALF else None
    signed = jnp.issubdtype(dtype, jnp.signedinteger)
    k = _const(y)
    if k is not None and np.ndim(k) == 0:
      if k == 0:                       # lax: x // 0 = -1 (all ones), x % 0 = x
        return _bcast(_scalar(-1 if signed else np.iinfo(dtype).max, dtype) if prim is lax.div_p
                      else x, ctx.out_avals[0].shape)
      if signed and k == -1:           # MIN // -1 = MIN (= -MIN, wrapped), x % -1 = 0
        return lax.neg(x) if prim is lax.div_p else lax.full(ctx.out_avals[0].shape, 0, dtype)
      return None                      # index arithmetic stays as it is
    zero = bad = lax.eq(y, _scalar(0, dtype))
    if signed:
      bad = lax.bitwise_or(zero, lax.bitwise_and(lax.eq(x, _scalar(np.iinfo(dtype).min, dtype)),
                                                 lax.eq(y, _scalar(-1, dtype))))
    q = prim.bind(x, _where(bad, _scalar(1, dtype), y))   # MIN // 1 = MIN, MIN % 1 = 0
    if prim is lax.div_p:
      return _where(zero, _scalar(-1 if signed else np.iinfo(dtype).max, dtype), q)
    return _where(zero, x, q)
  return rule


RULES[lax.div_p] = _div_rem(lax.div_p)
RULES[lax.rem_p] = _div_rem(lax.rem_p)


# --- 2. shifts -------------------------------------------------------------------------------

def _shift(prim, signed: bool | None):
  """lax's shifts: by ``bits`` or more (or a negative amount), 0, or the sign for an arithmetic
  right shift, which shifts in the top bit of unsigned values too. ``signed``: the operand kind
  the shift needs (None: either)."""
  def rule(ctx, x, y):
    dtype = np.dtype(ctx.out_avals[0].dtype)
    bits = _bits(dtype)
    work = dtype if signed is None else _int(bits, signed)
    xw = _bitcast(x, work)
    yu = _bitcast(y, _int(bits, False))          # a negative amount is out of range too
    if _const(yu) is not None and np.ndim(yu) == 0:
      if yu < bits and work == dtype:
        return None
      if yu >= bits and not signed:
        return lax.full(ctx.out_avals[0].shape, 0, dtype)
      return _bitcast(prim.bind(xw, _scalar(min(int(yu), bits - 1), work)), dtype)
    out = prim.bind(xw, _bitcast(lax.min(yu, _scalar(bits - 1, yu.dtype)), work))
    if not signed:                               # by bits - 1, an arithmetic shift gives the sign
      out = _where(lax.lt(yu, _scalar(bits, yu.dtype)), out, _scalar(0, work))
    return _bitcast(out, dtype)
  return rule


RULES[lax.shift_left_p] = _shift(lax.shift_left_p, None)
RULES[lax.shift_right_logical_p] = _shift(lax.shift_right_logical_p, False)
RULES[lax.shift_right_arithmetic_p] = _shift(lax.shift_right_arithmetic_p, True)


# --- 3, 4. conversions -----------------------------------------------------------------------

def _convert(ctx, x, new):
  """lax's ``convert_element_type(x, new)`` in legal equations; None if a plain one is legal."""
  src, new = _dtype(x), np.dtype(new)
  if src == new:
    return None
  if new in F8:
    return _to_fp8(ctx, x, new)
  if src in F8 and new not in (_F16, _BF16, _F32):   # the GPU converts fp8 to floats only
    return _cast(ctx, _to_f32(x), new)
  if _is_float(src) and new.itemsize == 1 and jnp.issubdtype(new, jnp.integer):
    lo, hi = (_scalar(v, src) for v in (jnp.iinfo(new).min, jnp.iinfo(new).max))
    x = _where(lax.eq(x, x), lax.min(lax.max(x, lo), hi), _scalar(0, src))   # saturate; NaN -> 0
    return lax.convert_element_type(x, new)
  return None


def _cast(ctx, x, new):
  out = _convert(ctx, x, new)
  if out is None:
    return x if _dtype(x) == np.dtype(new) else lax.convert_element_type(x, new)
  return out


def _convert_rule(ctx, x, *, new_dtype, weak_type, sharding):
  del weak_type, sharding
  return _convert(ctx, x, new_dtype)


RULES[lax.convert_element_type_p] = _convert_rule


def _to_fp8(ctx, x, new):
  cc = ctx.compute_capability
  if cc < 89:
    raise NotImplementedError(f"conversion to {new.name} needs compute capability 8.9 or newer "
                              f"(this target is sm_{cc})")
  if _dtype(x) == _F64:
    raise NotImplementedError(f"conversion from float64 to {new.name} (convert to float32 first)")
  if _dtype(x) not in (_F16, _BF16, _F32):
    x = _to_f32(x)            # ints, bools, fp8: exact in float32 below the overflow thresholds
  e4m3 = new == F8[0]
  big = lax.gt(lax.abs(x), _scalar(_E4M3_NAN_ABOVE, x.dtype)) if e4m3 else \
      lax.ge(lax.abs(x), _scalar(_E5M2_INF_FROM, x.dtype))
  v = _where(big, _scalar(np.nan if e4m3 else 0, x.dtype), x)
  if cc < 90 and _dtype(v) == _F32:
    v = _round_to_odd_f16(v)
  out = lax.convert_element_type(v, new)
  if e4m3:
    return out
  inf = _bitcast(_where(lax.lt(x, _scalar(0, x.dtype)), np.uint8(0xFC), np.uint8(0x7C)), new)
  return _where(big, inf, out)


def _round_to_odd_f16(v):
  """``v`` (float32) truncated to float16, with the last bit set where that was inexact.
  Rounding this to a format of 9 or fewer significant bits gives what rounding ``v`` once gives
  (before sm_90 Triton converts float32 to fp8 through float16 rounded towards zero: exact on
  this value, so the fp8 is rounded once)."""
  h = lax.convert_element_type(v, _F16)       # to nearest, in lax and on the GPU
  back = lax.convert_element_type(h, _F32)
  away = lax.convert_element_type(lax.gt(lax.abs(back), lax.abs(v)), np.int16)   # back towards 0
  inexact = lax.convert_element_type(lax.ne(back, v), np.int16)
  return _bitcast(lax.bitwise_or(lax.sub(_bitcast(h, np.int16), away), inexact), _F16)


def _dot_general(ctx, a, b, *, preferred_element_type, **params):
  # An fp8 result: the GPU accumulates in float32 and converts (saturating): convert as lax does.
  out = np.dtype(ctx.out_avals[0].dtype)
  if out not in F8:
    return None
  acc = lax.dot_general_p.bind(a, b, preferred_element_type=_F32, **params)
  return _to_fp8(ctx, acc, out)


RULES[lax.dot_general_p] = _dot_general


# --- 4. fp8 arithmetic in float32 ------------------------------------------------------------

# Primitives that take fp8 operands as they are: their rules (if any) handle fp8 themselves.
_FP8_OK = {
    lax.convert_element_type_p, lax.bitcast_convert_type_p, lax.select_n_p, lax.dot_general_p,
    lax.neg_p, lax.nextafter_p, lax.integer_pow_p,
    lax.broadcast_in_dim_p, ji.broadcast_to_p, lax.reshape_p, lax.squeeze_p, lax.transpose_p,
    lax.rev_p, lax.slice_p, lax.dynamic_slice_p, lax.dynamic_update_slice_p, lax.concatenate_p,
    lax.pad_p, lax.gather_p, lax.scatter_p, lax.split_p, ji.copy_p, ji.optimization_barrier_p,
}


def _fp8_arith(eqn) -> bool:
  """Whether ``eqn`` computes on fp8 values (a GPU cannot): not movement, control flow (its
  sub-jaxprs are legalized) nor Ref access."""
  if eqn.primitive in _FP8_OK or any(True for _ in jaxpr_util.sub_jaxprs(eqn.params)):
    return False
  avals = [a.aval for a in eqn.invars] + [v.aval for v in eqn.outvars]
  if any(ji.is_ref_aval(a) for a in avals):
    return False
  return any(np.dtype(getattr(a, "dtype", np.bool_)) in F8 for a in avals)


def _via_f32(ctx, eqn, rule, invals, params):
  """``eqn`` on fp8 values, computed in float32 (exact for fp8 operands) and converted back as lax
  rounds. The rule, if any, sees float32 operands and the original ``ctx``."""
  wide: dict = {}   # each operand converted once
  for x in invals:
    if _dtype(x) in F8 and id(x) not in wide:
      wide[id(x)] = _to_f32(x)
  xs = [wide.get(id(x), x) for x in invals]
  outs = None if rule is None else rule(ctx, *xs, **params)
  if outs is None:
    outs = eqn.primitive.bind(*xs, **eqn.primitive.get_bind_params(params))
  outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
  return [_cast(ctx, o, a.dtype) for o, a in zip(outs, ctx.out_avals)]


# --- 5. float16/bfloat16 math in float32 -----------------------------------------------------

MATH = (lax.exp_p, lax.exp2_p, lax.log_p, lax.log2_p, lax.sin_p, lax.cos_p, lax.sqrt_p, lax.rsqrt_p,
        lax.erf_p, lax.floor_p, lax.ceil_p, lax.logistic_p, lax.log1p_p, lax.expm1_p, lax.tan_p,
        lax.tanh_p, lax.asin_p, lax.acos_p, lax.atan_p, lax.sinh_p, lax.cosh_p, lax.asinh_p,
        lax.acosh_p, lax.atanh_p, lax.cbrt_p, lax.erf_inv_p, lax.erfc_p, lax.atan2_p, lax.pow_p,
        lax.round_p)


def _in_f32(ctx, prim, xs, params):
  """``prim`` on float16/bfloat16 operands computed in float32, rounded back as lax converts."""
  out = prim.bind(*[_to_f32(x) if _dtype(x) in _HALF else x for x in xs], **params)
  return _cast(ctx, out, ctx.out_avals[0].dtype)


def _exponent(ctx, y):
  # lax's pow converts an integer exponent to the result's type
  out = np.dtype(ctx.out_avals[0].dtype)
  if _const(y) is not None and out not in F8:
    return np.asarray(y).astype(out)[()]
  y = _cast(ctx, y, out)
  return _to_f32(y) if out in F8 else y


def _math(prim):
  def rule(ctx, *xs, **params):
    int_exponent = prim is lax.pow_p and not _is_float(_dtype(xs[1]))
    if int_exponent:
      xs = (xs[0], _exponent(ctx, xs[1]))
    if _dtype(xs[0]) in _HALF:
      return _in_f32(ctx, prim, xs, params)
    return prim.bind(*xs, **params) if int_exponent else None
  return rule


for _p in MATH:
  RULES[_p] = _math(_p)


# XLA's float32 erf_inv (the expansion of chlo.erf_inv): M. Giles' single-precision
# approximation, "Approximating the erfinv function" (GPU Computing Gems, 2011). Written in lax
# here, the GPU computes lax's polynomial with its own log1p and sqrt (libdevice's erfinv is
# another approximation, several ulps away).
_ERF_INV_W_BELOW_5 = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06,
                      0.00021858087, -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_ERF_INV_W_FROM_5 = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844,
                     0.00573950773, -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


def _erf_inv_f32(x):
  f = lambda v: _scalar(v, _F32)
  w = _neg(None, lax.log1p(lax.mul(x, _neg(None, x))))   # sign flips: no float neg remains
  below = lax.lt(w, f(5.0))
  w = _where(below, lax.sub(w, f(2.5)), lax.sub(lax.sqrt(w), f(3.0)))
  p = _where(below, f(_ERF_INV_W_BELOW_5[0]), f(_ERF_INV_W_FROM_5[0]))
  for a, b in zip(_ERF_INV_W_BELOW_5[1:], _ERF_INV_W_FROM_5[1:]):
    p = lax.add(_where(below, f(a), f(b)), lax.mul(p, w))
  return _where(lax.eq(lax.abs(x), f(1.0)), lax.mul(x, f(np.inf)), lax.mul(p, x))


def _erf_inv(ctx, x, **params):
  dtype = _dtype(x)
  if dtype == _F32:
    return _erf_inv_f32(x)
  if dtype in _HALF:   # as lax: in float32, rounded back
    return _cast(ctx, _erf_inv_f32(_to_f32(x)), dtype)
  return None          # float64: libdevice's erfinv


RULES[lax.erf_inv_p] = _erf_inv


def _one_minus_square(ctx, x):
  """tanh's derivative in JVP kernels: ``1 - x * x``, as XLA expands it."""
  return lax.sub(lax.full_like(x, 1), lax.mul(x, x))


RULES[ji.one_minus_square_p] = _one_minus_square


# --- 6-9, 13. sign bits, compares and selects -------------------------------------------------

def _neg(ctx, x):
  dtype = _dtype(x)
  if not _is_float(dtype):
    return None
  u = _int(_bits(dtype), False)     # a GPU's -x is 0 - x: +0.0 for +0.0
  return _bitcast(lax.bitwise_xor(_bitcast(x, u), _scalar(1 << (_bits(dtype) - 1), u)), dtype)


def _sign(ctx, x):
  dtype = _dtype(x)
  zero = _scalar(0, dtype)
  s = lax.sub(lax.convert_element_type(lax.gt(x, zero), dtype),
              lax.convert_element_type(lax.lt(x, zero), dtype))
  if not _is_float(dtype):
    return s
  return _where(lax.bitwise_or(lax.eq(x, zero), lax.ne(x, x)), x, s)   # +-0.0 and NaN: x


def _order_key(x, i):
  # The float's bits as an integer that orders as the float does (-0.0 and 0.0 both 0).
  xi = _bitcast(x, i)
  return _where(lax.lt(xi, _scalar(0, i)), lax.sub(_scalar(np.iinfo(i).min, i), xi), xi)


def _nextafter(ctx, x, y):
  dtype = _dtype(x)
  if _bits(dtype) == 64:
    return None
  # One step on the bits: through float32, float16 would round back to x, and the GPU's float32
  # nextafter flushes subnormals.
  i = _int(_bits(dtype), True)
  shape = ctx.out_avals[0].shape
  x, y = _bcast(x, shape), _bcast(y, shape)
  kx, ky, xi = _order_key(x, i), _order_key(y, i), _bitcast(x, i)
  zero = _scalar(0, i)
  up = lax.eq(lax.lt(kx, ky), lax.gt(kx, zero))   # away from zero
  step = lax.add(xi, _where(up, _scalar(1, i), _scalar(-1, i)))
  # from +-0.0: the smallest subnormal, signed as y
  smallest = _where(lax.gt(ky, zero), _scalar(1, i), _scalar(np.iinfo(i).min + 1, i))
  out = _bitcast(_where(lax.eq(kx, zero), smallest, step), dtype)
  xc = _to_f32(x) if dtype in F8 else x            # fp8 has no compares
  yc = _to_f32(y) if dtype in F8 else y
  out = _where(lax.eq(xc, yc), y, out)   # a float compare, as lax's (a CPU may flush subnormals)
  return _where(lax.ne(xc, xc), x, _where(lax.ne(yc, yc), y, out))


def _clamp(ctx, lo, x, hi):
  return lax.min(lax.max(x, lo), hi)   # max/min propagate NaN (the emitter's part)


def _is_finite(ctx, x):
  return lax.lt(lax.abs(x), _scalar(np.inf, _dtype(x)))   # False for NaN


RULES.update({lax.neg_p: _neg, lax.sign_p: _sign, lax.nextafter_p: _nextafter,
              lax.clamp_p: _clamp, lax.is_finite_p: _is_finite})


# --- 10. integer_pow -------------------------------------------------------------------------

def _mul(ctx, a, b):
  if _dtype(a) in F8:   # each product rounded to fp8, as lax's
    return _to_fp8(ctx, lax.mul(_to_f32(a), _to_f32(b)), _dtype(a))
  return lax.mul(a, b)


def _integer_pow(ctx, x, *, y):
  dtype = _dtype(x)
  if y == 0:
    return lax.full(ctx.out_avals[0].shape, 1, dtype)
  acc, n = None, abs(y)
  while n:                   # lax's order of products (square and multiply): floats round alike
    if n & 1:
      acc = x if acc is None else _mul(ctx, acc, x)
    n >>= 1
    if n:
      x = _mul(ctx, x, x)
  if y > 0:
    return acc
  if dtype in _HALF or dtype in F8:
    return _cast(ctx, lax.div(_scalar(1, _F32), _to_f32(acc)), dtype)
  return lax.div(_scalar(1, dtype), acc)


RULES[lax.integer_pow_p] = _integer_pow


# --- 11. bit counts --------------------------------------------------------------------------

def _bit_count(prim):
  def rule(ctx, x):
    dtype = _dtype(x)
    bits, signed = _bits(dtype), jnp.issubdtype(dtype, jnp.signedinteger)
    if bits >= 32 and signed:
      return None
    if bits < 32:               # counted on the zero-extended int32
      n = prim.bind(lax.convert_element_type(_bitcast(x, _int(bits, False)), np.int32))
      if prim is lax.clz_p:
        n = lax.sub(n, _scalar(32 - bits, np.int32))
    else:                       # unsigned: the same bits, signed
      n = prim.bind(_bitcast(x, _int(bits, True)))
    return lax.convert_element_type(n, dtype)
  return rule


RULES[lax.population_count_p] = _bit_count(lax.population_count_p)
RULES[lax.clz_p] = _bit_count(lax.clz_p)


# --- 12. argmax/argmin -----------------------------------------------------------------------

def _arg(prim, fill: float):
  """lax's float argmax: the first NaN if there is one, else the first largest value."""
  def rule(ctx, x, *, axes, index_dtype):
    dtype = _dtype(x)
    if not _is_float(dtype):
      return None
    nan = lax.ne(x, x)
    first_nan = lax.argmax_p.bind(lax.convert_element_type(nan, np.int32), axes=axes,
                                  index_dtype=index_dtype)      # ties: the first index
    best = prim.bind(_where(nan, _scalar(fill, dtype), x), axes=axes, index_dtype=index_dtype)
    return _where(lax.reduce_or(nan, axes), first_nan, best)
  return rule


RULES[lax.argmax_p] = _arg(lax.argmax_p, -np.inf)
RULES[lax.argmin_p] = _arg(lax.argmin_p, np.inf)


# --- 14. sums of narrow integers ---------------------------------------------------------------

def _int_sum(prim):
  # The GPU sums 8- and 16-bit integers in 32 bits (tl.sum, tl.cumsum); lax wraps, as the 32-bit
  # sum converted back does.
  def rule(ctx, x, **params):
    dtype = _dtype(x)
    if not jnp.issubdtype(dtype, jnp.integer) or _bits(dtype) >= 32:
      return None
    wide = _int(32, jnp.issubdtype(dtype, jnp.signedinteger))
    return lax.convert_element_type(prim.bind(lax.convert_element_type(x, wide), **params), dtype)
  return rule


RULES[lax.reduce_sum_p] = _int_sum(lax.reduce_sum_p)
RULES[lax.cumsum_p] = _int_sum(lax.cumsum_p)

"""One lowering rule per JAX primitive: jaxpr equation -> Triton expression.

A rule takes the code generator, the equation's params and its operands (``Val``s)
and returns the result ``Val`` (or a list). Values live in tensors whose shape is
the logical shape rounded up to powers of two; lanes past the logical shape hold
garbage that rules must neutralise where it could leak (reductions, dot).
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from pallax._src import jax_internals as ji
from pallax._src.triton.values import Val, literal, tl_dtype

RULES: dict = {}


def rule(*prims):
  def register(f):
    for p in prims:
      RULES[p] = f
    return f
  return register


def _is_float(dtype) -> bool:
  return jnp.issubdtype(dtype, jnp.floating)


def _low_float(dtype) -> bool:
  return jnp.dtype(dtype) in (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16)) or \
      jnp.dtype(dtype).itemsize == 1 and _is_float(dtype)


# --- elementwise -------------------------------------------------------------------------

_BINARY_OPS = {lax.add_p: "+", lax.sub_p: "-", lax.mul_p: "*", lax.and_p: "&", lax.or_p: "|",
               lax.xor_p: "^", lax.eq_p: "==", lax.ne_p: "!=", lax.lt_p: "<", lax.le_p: "<=",
               lax.gt_p: ">", lax.ge_p: ">="}


def _out(cg, expr, eqn, hint="v"):
  aval = eqn.outvars[0].aval
  return cg.bind(expr, aval.shape, aval.dtype, hint)


def _fp8(dtype) -> bool:
  return _is_float(dtype) and jnp.dtype(dtype).itemsize == 1


def _via_f32(cg, eqn, template: str, *xs: Val) -> Val:
  """An op on fp8 values (Triton has no fp8 arithmetic): computed in f32, where it is exact for
  +, -, * of two fp8 values, and rounded back as lax converts (_to_fp8)."""
  args = [cg.bind(f"{cg.tensor(x)}.to(tl.float32)", x.shape, jnp.float32, "f") if _fp8(x.dtype) else x
          for x in xs]
  out = eqn.outvars[0].aval
  res = template.format(*[a.expr for a in args])
  if not _fp8(out.dtype):
    return _out(cg, res, eqn)
  return _out(cg, _to_fp8(cg, cg.bind(res, out.shape, jnp.float32, "f"), out.dtype), eqn)


def _binary(op):
  def lower(cg, eqn, x, y):
    if _fp8(x.dtype) or _fp8(y.dtype):
      return _via_f32(cg, eqn, f"{{0}} {op} {{1}}", x, y)
    return _out(cg, f"{x.expr} {op} {y.expr}", eqn)
  return lower


for _p, _op in _BINARY_OPS.items():
  RULES[_p] = _binary(_op)


def _int_div_rem(cg, x, y, op: str) -> str:
  """Integer x // y or x % y (Triton's truncate, like lax's). Where C leaves the answer undefined,
  lax defines it, and so do we: x // 0 = -1 (all ones), x % 0 = x, MIN // -1 = MIN, MIN % -1 = 0."""
  if type(literal(y)) is int and literal(y) not in (0, -1):
    return f"{x.expr} {op} {y.expr}"    # a literal divisor needs no guard
  dtype, d = jnp.dtype(x.dtype), tl_dtype(x.dtype)
  xt, yt = cg.tensor(x), cg.tensor(y)
  signed = jnp.issubdtype(dtype, jnp.signedinteger)
  bad = f"({yt} == 0) | (({xt} == {jnp.iinfo(dtype).min}) & ({yt} == -1))" if signed else f"{yt} == 0"
  quotient = f"{xt} {op} tl.where({bad}, 1, {yt}).to({d})"
  if op == "%":
    return f"tl.where({yt} == 0, {xt}, {quotient})"
  return f"tl.where({yt} == 0, tl.full([], {-1 if signed else jnp.iinfo(dtype).max}, {d}), {quotient})"


@rule(lax.div_p)
def _div(cg, eqn, x, y):
  if _fp8(x.dtype):
    return _via_f32(cg, eqn, "{0} / {1}", x, y)
  if _is_float(x.dtype):   # f16/bf16 through f32 and back (Triton's / would leave f32)
    return _out(cg, cg.f32_math("{0} / {1}", x, y), eqn)
  return _out(cg, _int_div_rem(cg, x, y, "//"), eqn)


@rule(lax.rem_p)
def _rem(cg, eqn, x, y):
  if _is_float(x.dtype):
    return _out(cg, cg.f32_math("libdevice.fmod({0}, {1})", x, y), eqn)
  return _out(cg, _int_div_rem(cg, x, y, "%"), eqn)


@rule(lax.max_p, lax.min_p)
def _max_min(cg, eqn, x, y):
  fn = "tl.maximum" if eqn.primitive is lax.max_p else "tl.minimum"
  nan = ", propagate_nan=tl.PropagateNan.ALL" if _is_float(x.dtype) else ""
  if _fp8(x.dtype):
    return _via_f32(cg, eqn, f"{fn}({{0}}, {{1}}{nan})", x, y)
  return _out(cg, f"{fn}({x.expr}, {y.expr}{nan})", eqn)


def _shift(cg, eqn, x, y, op: str, signed: bool | None = None):
  """lax's shifts, which define what C leaves undefined: a shift by the bit width or more (or by
  a negative amount) gives 0, or the sign for an arithmetic right shift; an arithmetic right
  shift of an unsigned value still shifts in its top bit. ``signed`` is the integer kind the
  shift needs (None: either). Literal amounts in range are unguarded."""
  dtype = jnp.dtype(x.dtype)
  bits = dtype.itemsize * 8
  xt, work = cg.tensor(x), tl_dtype(dtype)
  if signed is not None and signed != jnp.issubdtype(dtype, jnp.signedinteger):
    work = f"tl.{'' if signed else 'u'}int{bits}"
    xt = f"{xt}.to({work}, bitcast=True)"
  k = literal(y) if type(literal(y)) is int else None
  if k is not None and 0 <= k < bits:
    expr = f"{xt} {op} {k}"
  elif k is not None:                              # out of range: the sign, or 0
    expr = f"{xt} >> {bits - 1}" if signed else f"tl.zeros_like({xt})"
  else:
    yt = cg.tensor(y)
    if jnp.issubdtype(y.dtype, jnp.signedinteger):
      yt = f"{yt}.to(tl.uint{bits}, bitcast=True)"   # a negative amount is out of range too
    amount = f"tl.minimum({yt}, {bits - 1})"
    if not work.startswith("tl.uint"):
      amount += f".to({work})"                       # else Triton would shift unsigned
    if signed:                                       # shifting by bits - 1 leaves the sign
      expr = f"{xt} {op} {amount}"
    else:
      expr = f"tl.where({yt} < {bits}, {xt} {op} {amount}, 0)"
  if xt != cg.tensor(x):
    expr = f"({expr}).to({tl_dtype(dtype)}, bitcast=True)"
  return _out(cg, expr, eqn)


@rule(lax.shift_left_p)
def _shl(cg, eqn, x, y):
  return _shift(cg, eqn, x, y, "<<")


@rule(lax.shift_right_logical_p)
def _shr_logical(cg, eqn, x, y):
  return _shift(cg, eqn, x, y, ">>", signed=False)


@rule(lax.shift_right_arithmetic_p)
def _shr_arith(cg, eqn, x, y):
  return _shift(cg, eqn, x, y, ">>", signed=True)


@rule(lax.neg_p)
def _neg(cg, eqn, x):
  if _fp8(x.dtype):        # flip the sign bit
    return _out(cg, f"({cg.tensor(x)}.to(tl.uint8, bitcast=True) ^ 0x80).to({tl_dtype(x.dtype)}, "
                    "bitcast=True)", eqn)
  if _is_float(x.dtype):   # Triton's -x is 0 - x, which gives +0.0 for +0.0
    return _out(cg, f"{cg.tensor(x)} * -1.0", eqn)
  return _out(cg, f"-{x.expr}", eqn)


@rule(lax.not_p)
def _not(cg, eqn, x):
  return _out(cg, f"~{x.expr}" if x.dtype != jnp.bool_ else f"{x.expr} == 0", eqn)


# Float math: Triton's own op where it has one, libdevice otherwise; f16/bf16 go through f32.
_MATH = {
    lax.exp_p: "_exp2({0} * 1.4426950408889634)", lax.exp2_p: "_exp2({0})", lax.log_p: "tl.log({0})",
    lax.log2_p: "tl.log2({0})",
    lax.sin_p: "tl.sin({0})", lax.cos_p: "tl.cos({0})", lax.sqrt_p: "tl.sqrt_rn({0})",
    lax.rsqrt_p: "tl.rsqrt({0})", lax.erf_p: "tl.erf({0})", lax.floor_p: "tl.floor({0})",
    lax.ceil_p: "tl.ceil({0})", lax.logistic_p: "tl.sigmoid({0})",
    lax.log1p_p: "libdevice.log1p({0})", lax.expm1_p: "libdevice.expm1({0})",
    lax.tan_p: "libdevice.tan({0})", lax.tanh_p: "libdevice.tanh({0})",
    lax.asin_p: "libdevice.asin({0})", lax.acos_p: "libdevice.acos({0})",
    lax.atan_p: "libdevice.atan({0})", lax.sinh_p: "libdevice.sinh({0})",
    lax.cosh_p: "libdevice.cosh({0})", lax.asinh_p: "libdevice.asinh({0})",
    lax.acosh_p: "libdevice.acosh({0})", lax.atanh_p: "libdevice.atanh({0})",
    lax.cbrt_p: "libdevice.cbrt({0})", lax.erf_inv_p: "libdevice.erfinv({0})",
    lax.erfc_p: "libdevice.erfc({0})",
    lax.atan2_p: "libdevice.atan2({0}, {1})", lax.pow_p: "libdevice.pow({0}, {1})",
}
# float64 where the op above takes float32 only
_MATH_F64 = {lax.sqrt_p: "libdevice.sqrt({0})", lax.rsqrt_p: "libdevice.rsqrt({0})",
             lax.exp_p: "tl.exp({0})", lax.exp2_p: "tl.exp2({0})"}


def _math_rule(p, tmpl):
  def lower(cg, eqn, *xs):
    if jnp.dtype(xs[0].dtype) == jnp.float64 and p in _MATH_F64:
      return _out(cg, _MATH_F64[p].format(*[x.expr for x in xs]), eqn)
    return _out(cg, cg.f32_math(tmpl, *xs), eqn)
  return lower


for _p, _tmpl in _MATH.items():
  RULES[_p] = _math_rule(_p, _tmpl)


@rule(lax.round_p)
def _round(cg, eqn, x, rounding_method=None):
  method = eqn.params["rounding_method"]
  fn = "libdevice.rint({0})" if int(method) == 1 else "libdevice.round({0})"
  return _out(cg, cg.f32_math(fn, x), eqn)


@rule(lax.abs_p)
def _abs(cg, eqn, x):
  return _out(cg, f"tl.abs({x.expr})", eqn)


@rule(lax.sign_p)
def _sign(cg, eqn, x):
  d, t = tl_dtype(x.dtype), cg.tensor(x)
  expr = f"(({t} > 0).to({d}) - ({t} < 0).to({d}))"
  if _is_float(x.dtype):   # NaN, -0.0 and 0.0 are their own sign, as in lax
    expr = f"tl.where(({t} == 0) | ({t} != {t}), {t}, {expr})"
  return _out(cg, expr, eqn)


@rule(lax.is_finite_p)
def _is_finite(cg, eqn, x):
  return _out(cg, cg.f32_math("tl.abs({0}) < INF", x, keep_f32=True), eqn)   # False for NaN


@rule(lax.nextafter_p)
def _nextafter(cg, eqn, x, y):
  dtype = jnp.dtype(x.dtype)
  if dtype.itemsize == 8:
    return _out(cg, f"libdevice.nextafter({x.expr}, {y.expr})", eqn)
  # One step on the bits: through f32, f16/bf16 would round back to x, and libdevice's f32
  # version flushes subnormals (nextafter(0, 1) would be the smallest normal number).
  d, i, xt, yt = tl_dtype(dtype), f"tl.int{dtype.itemsize * 8}", cg.tensor(x), cg.tensor(y)
  shape = eqn.outvars[0].aval.shape
  step = cg.bind(f"({xt}.to({i}, bitcast=True) + tl.where(({xt} < {yt}) == ({xt} > 0), 1, -1).to({i}))"
                 f".to({d}, bitcast=True)", shape, dtype, "step")
  smallest = 1 - 2 ** (dtype.itemsize * 8 - 1)   # the bits of -(smallest subnormal)
  tiny = f"tl.where({yt} > 0, 1, {smallest}).to({i}).to({d}, bitcast=True)"
  return _out(cg, f"tl.where(({xt} != {xt}) | ({yt} != {yt}), {xt} + {yt}, tl.where({xt} == {yt}, {yt}, "
                  f"tl.where({xt} == 0, {tiny}, {step.expr})))", eqn)


@rule(lax.square_p)
def _square(cg, eqn, x):
  return _out(cg, f"{x.expr} * {x.expr}", eqn)


@rule(lax.integer_pow_p)
def _integer_pow(cg, eqn, x):
  y = eqn.params["y"]
  if y == 0:
    return _out(cg, f"tl.full({list(x.padded)}, 1, {tl_dtype(x.dtype)})", eqn)
  # lax's order of products (square and multiply), so that floats round the same way
  acc, base, n = None, x, abs(y)
  while n:
    if n & 1:
      acc = base if acc is None else cg.bind(f"{acc.expr} * {base.expr}", x.shape, x.dtype, "pw")
    n >>= 1
    if n:
      base = cg.bind(f"{base.expr} * {base.expr}", x.shape, x.dtype, "sq")
  return _out(cg, cg.f32_math("1.0 / {0}", acc) if y < 0 else acc.expr, eqn)


@rule(lax.population_count_p, lax.clz_p)
def _bit_count(cg, eqn, x):
  # libdevice counts 32 or 64 bits of a signed int: narrower values are zero-extended first
  dtype = jnp.dtype(x.dtype)
  bits, xt = dtype.itemsize * 8, cg.tensor(x)
  signed = jnp.issubdtype(dtype, jnp.signedinteger)
  if bits < 32:
    xt = f"{xt}.to(tl.uint{bits}, bitcast=True).to(tl.int32)" if signed else f"{xt}.to(tl.int32)"
  elif not signed:
    xt = f"{xt}.to(tl.int{bits}, bitcast=True)"
  fn = "popc" if eqn.primitive is lax.population_count_p else "clz"
  expr = f"libdevice.{fn}({xt})"
  if fn == "clz" and bits < 32:
    expr = f"({expr} - {32 - bits})"
  return _out(cg, expr if dtype == jnp.int32 else f"{expr}.to({tl_dtype(dtype)})", eqn)


@rule(lax.select_n_p)
def _select_n(cg, eqn, pred, *cases):
  if len(cases) == 1:
    return cases[0]
  if len(cases) == 2:
    p = pred.expr if pred.dtype == jnp.bool_ else f"({pred.expr} != 0)"
    return _out(cg, f"tl.where({p}, {cases[1].expr}, {cases[0].expr})", eqn)
  expr = cases[-1].expr
  for k in range(len(cases) - 2, -1, -1):
    expr = f"tl.where({pred.expr} == {k}, {cases[k].expr}, {expr})"
  return _out(cg, expr, eqn)


@rule(lax.clamp_p)
def _clamp(cg, eqn, lo, x, hi):
  nan = ", propagate_nan=tl.PropagateNan.ALL" if _is_float(x.dtype) else ""   # NaN stays NaN, as in lax
  return _out(cg, f"tl.minimum(tl.maximum({x.expr}, {lo.expr}{nan}), {hi.expr}{nan})", eqn)


@rule(lax.convert_element_type_p)
def _convert(cg, eqn, x):
  new = eqn.params["new_dtype"]
  if jnp.dtype(new) == jnp.dtype(x.dtype):
    return x
  if jnp.dtype(new) == jnp.bool_:
    return _out(cg, f"{x.expr} != 0", eqn)
  src, new = jnp.dtype(x.dtype), jnp.dtype(new)
  if _is_float(new) and new.itemsize == 1:
    return _out(cg, _to_fp8(cg, x, new), eqn)
  xt = cg.tensor(x)
  if _is_float(src) and new.itemsize == 1:
    # The GPU converts to 16 bits and truncates (300.0 -> 44); lax saturates and maps NaN to 0.
    if src.itemsize == 1:
      xt = cg.bind(f"{xt}.to(tl.float32)", x.shape, jnp.float32, "f").expr
    lo, hi = jnp.iinfo(new).min, jnp.iinfo(new).max
    xt = f"tl.where({xt} == {xt}, tl.minimum(tl.maximum({xt}, {lo}.0), {hi}.0), 0)"
  return _out(cg, f"{xt}.to({tl_dtype(new)})", eqn)


def _to_fp8(cg, x: Val, new) -> str:
  """Triton's fp8 conversions saturate (500.0 -> 448); lax's overflow as the format does:
  to NaN for e4m3fn (no infinities; above 464 rounds past the largest value, 448), to +-inf for
  e5m2 (from 61440, half way between its largest value, 57344, and 2**16)."""
  if cg.compute_capability < 89:
    raise NotImplementedError(f"conversion to {jnp.dtype(new).name} needs compute capability 8.9 "
                              f"or newer (this target is sm_{cg.compute_capability})")
  if jnp.dtype(x.dtype) == jnp.float64:
    raise NotImplementedError(f"conversion from float64 to {jnp.dtype(new).name} (convert to "
                              "float32 first)")
  e4m3 = new == jnp.dtype(jnp.float8_e4m3fn)
  d = "tl.float8e4nv" if e4m3 else "tl.float8e5"
  v = x
  if not _is_float(x.dtype) or jnp.dtype(x.dtype).itemsize == 1:
    v = cg.bind(f"{cg.tensor(x)}.to(tl.float32)", x.shape, jnp.float32, "f")
  if e4m3:
    v = cg.bind(f"tl.where(tl.abs({v.expr}) <= 464.0, {cg.tensor(v)}, NAN)", x.shape, v.dtype, "f")
  if cg.compute_capability < 90 and v.dtype == jnp.float32 and jnp.dtype(x.dtype).itemsize > 1:
    # Before Hopper, Triton converts f32 to f16 rounding towards zero, then to fp8: rounded
    # twice, a value just past half way between two fp8 values can go the wrong way. Rounding
    # to odd in f16 (setting the last bit when the first step was inexact) keeps it right.
    h = cg.bind(f'{v.expr}.to(tl.float16, fp_downcast_rounding="rtz")', x.shape, jnp.float16, "h")
    v = cg.bind(f"({h.expr}.to(tl.int16, bitcast=True) | ({h.expr}.to(tl.float32) != {v.expr})"
                f".to(tl.int16)).to(tl.float16, bitcast=True)", x.shape, jnp.float16, "h")
  if e4m3:
    return f"{v.expr}.to({d})"
  inf = f"tl.where({v.expr} > 0, 0x7C, 0xFC).to(tl.uint8).to({d}, bitcast=True)"
  return f"tl.where(tl.abs({v.expr}) >= 61440.0, {inf}, {v.expr}.to({d}))"


@rule(lax.bitcast_convert_type_p)
def _bitcast(cg, eqn, x):
  new = jnp.dtype(eqn.params["new_dtype"])
  if new.itemsize != jnp.dtype(x.dtype).itemsize:
    raise NotImplementedError(f"bitcast_convert_type from {jnp.dtype(x.dtype).name} to {new.name} "
                              "(types of different sizes)")
  return _out(cg, f"{cg.tensor(x)}.to({tl_dtype(eqn.params['new_dtype'])}, bitcast=True)", eqn)


# --- shapes ------------------------------------------------------------------------------------

@rule(lax.iota_p)
def _iota(cg, eqn):
  aval = eqn.outvars[0].aval
  shape = Val("", aval.shape, aval.dtype).padded
  d = eqn.params["dimension"]
  expr = f"tl.arange(0, {shape[d]})"
  if len(shape) > 1:
    expr = f"tl.broadcast_to({expr}{_expand(d, len(shape))}, {list(shape)})"
  if jnp.dtype(aval.dtype) != jnp.int32:
    expr = f"{expr}.to({tl_dtype(aval.dtype)})"
  return _out(cg, expr, eqn, "iota")


def _expand(kept_positions, rank) -> str:
  """Indexing suffix that places the kept dims at ``kept_positions`` of a ``rank``-d tensor."""
  kept = {kept_positions} if isinstance(kept_positions, int) else set(kept_positions)
  if len(kept) == rank:
    return ""
  return "[" + ", ".join(":" if i in kept else "None" for i in range(rank)) + "]"


@rule(lax.broadcast_in_dim_p)
def _broadcast_in_dim(cg, eqn, x, *dyn):
  aval = eqn.outvars[0].aval
  target = Val("", aval.shape, aval.dtype).padded
  if x.shape == ():
    return _out(cg, f"tl.full({list(target)}, {cg.scalar(x)}, {tl_dtype(x.dtype)})", eqn, "bcast")
  dims = eqn.params["broadcast_dimensions"]
  expr = f"{cg.tensor(x)}{_expand(dims, len(target))}"
  if tuple(x.padded) != tuple(target[d] for d in dims) or len(dims) != len(target):
    expr = f"tl.broadcast_to({expr}, {list(target)})"
  return _out(cg, expr, eqn, "bcast")


@rule(ji.broadcast_to_p)
def _broadcast_to(cg, eqn, x):
  aval = eqn.outvars[0].aval
  target = Val("", aval.shape, aval.dtype).padded
  if x.shape == ():
    return _out(cg, f"tl.full({list(target)}, {cg.scalar(x)}, {tl_dtype(x.dtype)})", eqn, "bcast")
  if len(x.shape) != len(target):
    x = Val(f"{cg.tensor(x)}{_expand(range(len(target) - len(x.shape), len(target)), len(target))}",
            (1,) * (len(target) - len(x.shape)) + tuple(x.shape), x.dtype)
  return _out(cg, f"tl.broadcast_to({cg.tensor(x)}, {list(target)})", eqn, "bcast")


def _reshape(cg, eqn, x):
  aval = eqn.outvars[0].aval
  new = Val("", aval.shape, aval.dtype)
  if [d for d in x.shape if d != 1] != [d for d in aval.shape if d != 1] and (x.is_padded or new.is_padded):
    raise NotImplementedError(
        f"reshape {x.shape} -> {aval.shape}: the Triton backend reshapes blocks whose sizes are "
        "powers of two, or only adds/removes dimensions of size 1")
  if aval.shape == ():
    return _out(cg, f"tl.reshape({x.expr}, [])" if x.shape else x.expr, eqn)
  if x.shape == ():
    return _out(cg, f"tl.full({list(new.padded)}, {cg.scalar(x)}, {tl_dtype(x.dtype)})", eqn)
  return _out(cg, f"tl.reshape({x.expr}, {list(new.padded)})", eqn)


RULES[lax.reshape_p] = lambda cg, eqn, x, *dyn: _reshape(cg, eqn, x)
RULES[lax.squeeze_p] = _reshape


@rule(lax.transpose_p)
def _transpose(cg, eqn, x):
  perm = tuple(eqn.params["permutation"])
  if perm == tuple(range(len(perm))):
    return x
  if len(perm) == 2:
    return _out(cg, f"tl.trans({x.expr})", eqn)
  return _out(cg, f"tl.permute({x.expr}, {list(perm)})", eqn)


# --- reductions --------------------------------------------------------------------------------

def _neutral(kind: str, dtype) -> str:
  dtype = jnp.dtype(dtype)
  if kind in ("sum", "or", "xor"):
    return "0"
  if kind == "and":   # all bits set
    return "1" if dtype == jnp.bool_ else "-1" if jnp.issubdtype(dtype, jnp.signedinteger) else \
        str(int(jnp.iinfo(dtype).max))
  if kind == "prod":
    return "1"
  if _is_float(dtype):
    return "-float('inf')" if kind == "max" else "float('inf')"
  if dtype == jnp.bool_:
    return "0" if kind == "max" else "1"
  info = jnp.iinfo(dtype)
  return str(int(info.min if kind == "max" else info.max))


_REDUCE = {lax.reduce_sum_p: ("sum", "tl.sum({x}, axis={a})"),
           # NaN wins, as in lax.max (tl.max would skip it)
           lax.reduce_max_p: ("max", "tl.reduce({x}, {a}, _max)"),
           lax.reduce_min_p: ("min", "tl.reduce({x}, {a}, _min)"),
           lax.reduce_and_p: ("and", "tl.reduce({x}, {a}, _and)"),
           lax.reduce_or_p: ("or", "tl.reduce({x}, {a}, _or)"),
           lax.reduce_prod_p: ("prod", "tl.reduce({x}, {a}, _mul)"),
           lax.reduce_xor_p: ("xor", "tl.xor_sum({x}, axis={a})")}


def _reduce_rule(kind, tmpl):
  def lower(cg, eqn, x):
    axes = sorted(eqn.params["axes"], reverse=True)
    cur = cg.mask_padding(x, axes, _neutral(kind, x.dtype))
    shape = list(x.shape)
    for a in axes:
      if kind in ("and", "or") and x.dtype == jnp.bool_:
        cur = f"({cur}).to(tl.int32)"
      cur = tmpl.format(x=cur, a=a)
      if kind == "sum" and not _is_float(x.dtype) and jnp.dtype(x.dtype).itemsize < 4:
        cur = f"{cur}.to({tl_dtype(x.dtype)})"   # tl.sum widens to 32 bits; lax wraps
      del shape[a]
      if kind in ("and", "or") and x.dtype == jnp.bool_:
        cur = f"({cur} != 0)"
      if a != axes[-1]:
        cur = cg.bind(cur, tuple(shape), x.dtype, "red").expr
    return _out(cg, cur, eqn, kind)
  return lower


for _p, (_k, _t) in _REDUCE.items():
  RULES[_p] = _reduce_rule(_k, _t)


@rule(lax.argmax_p, lax.argmin_p)
def _argmax(cg, eqn, x):
  (axis,) = eqn.params["axes"]
  kind = "max" if eqn.primitive is lax.argmax_p else "min"
  cur = cg.mask_padding(x, [axis], _neutral(kind, x.dtype))
  if _is_float(x.dtype):   # NaN-aware: reduce (value, index) pairs
    padded = x.padded
    idx = f"tl.arange(0, {padded[axis]})"
    if len(padded) > 1:
      idx = f"tl.broadcast_to({idx}{_expand(axis, len(padded))}, {list(padded)})"
    expr = f"tl.reduce(({cur}, {idx}), {axis}, _arg{kind})[1]"
  else:
    expr = f"tl.arg{kind}({cur}, axis={axis}, tie_break_left=True)"
  out = eqn.outvars[0].aval
  if jnp.dtype(out.dtype) != jnp.int32:
    expr = f"({expr}).to({tl_dtype(out.dtype)})"
  return _out(cg, expr, eqn, "arg" + kind)


@rule(lax.cumsum_p, lax.cummax_p, lax.cummin_p, lax.cumprod_p)
def _cumulative(cg, eqn, x):
  axis, reverse = eqn.params["axis"], eqn.params["reverse"]
  kind = {lax.cumsum_p: "sum", lax.cummax_p: "max", lax.cummin_p: "min", lax.cumprod_p: "prod"}[eqn.primitive]
  cur = cg.mask_padding(x, [axis], _neutral(kind, x.dtype)) if reverse else x.expr
  if kind == "sum":
    expr = f"tl.cumsum({cur}, axis={axis}, reverse={reverse})"
  elif kind == "prod":
    expr = f"tl.cumprod({cur}, axis={axis}, reverse={reverse})"
  else:
    expr = f"tl.associative_scan({cur}, {axis}, _{kind}, reverse={reverse})"
  dtype = jnp.dtype(x.dtype)
  if kind in ("sum", "prod") and dtype == jnp.bfloat16 or kind == "sum" and not _is_float(dtype) \
      and dtype.itemsize < 4:
    expr = f"{expr}.to({tl_dtype(dtype)})"   # tl.cumsum/cumprod widen these
  return _out(cg, expr, eqn, "cum" + kind)


# --- matrix products ------------------------------------------------------------------------

_PRECISION = {None: "tf32", "DEFAULT": "tf32", "HIGH": "tf32x3", "HIGHEST": "ieee"}


def input_precision(eqn, dtype) -> str:
  """The ``input_precision=`` argument of tl.dot for float32 operands (empty otherwise)."""
  if jnp.dtype(dtype) != jnp.float32:
    return ""
  prec = eqn.params.get("precision")
  p = prec[0] if isinstance(prec, tuple) else prec
  return f', input_precision="{_PRECISION.get(getattr(p, "name", p), "tf32")}"'


@rule(lax.dot_general_p)
def _dot_general(cg, eqn, a, b):
  (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
  out = eqn.outvars[0].aval
  nb = len(lb)
  if (len(lc) != 1 or len(rc) != 1 or nb > 1 or tuple(lb) != tuple(range(nb))
      or tuple(rb) != tuple(range(nb)) or len(a.shape) - nb != 2 or len(b.shape) - nb != 2):
    raise NotImplementedError(f"dot_general with dimension numbers {eqn.params['dimension_numbers']}: "
                              "the Triton backend multiplies (batched) matrices")
  # Bring both to (batch, M, K) x (batch, K, N) with K padded by zeros.
  ax, bx = a.expr, b.expr
  if lc[0] != nb + 1:
    ax = f"tl.trans({ax})" if nb == 0 else f"tl.permute({ax}, [0, 2, 1])"
  if rc[0] != nb:
    bx = f"tl.trans({bx})" if nb == 0 else f"tl.permute({bx}, [0, 2, 1])"
  a_val = cg.bind(ax, _moved(a.shape, lc[0], nb + 1), a.dtype, "lhs")
  b_val = cg.bind(bx, _moved(b.shape, rc[0], nb), b.dtype, "rhs")
  ax = cg.mask_padding(a_val, [nb + 1], "0")
  bx = cg.mask_padding(b_val, [nb], "0")
  m, n = a_val.padded[nb], b_val.padded[nb + 1]
  try:
    dt = jnp.promote_types(a.dtype, b.dtype)
  except TypeError:   # two fp8 formats: no implicit promotion
    dt = jnp.dtype(jnp.float32)
  if jnp.dtype(a.dtype) != dt:   # tl.dot needs one operand type
    ax = f"({ax}).to({tl_dtype(dt)})"
  if jnp.dtype(b.dtype) != dt:
    bx = f"({bx}).to({tl_dtype(dt)})"
  acc_float = _is_float(dt)
  acc = ("tl.float64" if dt == jnp.float64 else "tl.float32") if acc_float else "tl.int32"
  k = a_val.padded[nb + 1]
  big = min(m, n, k) >= 16 and (dt.itemsize > 1 or k >= 32)   # 8-bit tensor-core dots need K >= 32
  if big and not acc_float and dt != jnp.int8:
    raise NotImplementedError(
        f"an integer matrix product of {jnp.dtype(a.dtype).name} and {jnp.dtype(b.dtype).name} "
        "blocks: the tensor cores multiply int8 only (convert the operands to int8, or to a float "
        "type where the products are exact)")
  if big:
    expr = f"tl.dot({ax}, {bx}{input_precision(eqn, dt)}, out_dtype={acc})"
  else:   # too small for the tensor cores: multiply and sum
    a3 = f"({ax}).to({acc})[:, :, None]" if nb == 0 else f"({ax}).to({acc})[:, :, :, None]"
    b3 = f"({bx}).to({acc})[None, :, :]" if nb == 0 else f"({bx}).to({acc})[:, None, :, :]"
    expr = f"tl.sum({a3} * {b3}, axis={nb + 1})"
  if tl_dtype(out.dtype) != acc:
    expr = f"({expr}).to({tl_dtype(out.dtype)})"
  return _out(cg, expr, eqn, "dot")


def _moved(shape, src, dst):
  s = list(shape)
  d = s.pop(src)
  s.insert(dst, d)
  return tuple(s)

"""Legalization (gpu/legalize.py): each legalized jaxpr, run by XLA on the CPU, gives the original's
answers bit for bit (NaN matches any NaN; -0.0 is not 0.0), and has the form GPU emitters rely on:
the contract is checked on the equations (recursively) and on the operand values they see. On a
GPU (marker ``gpu``), the Triton backend gives the interpreter's answers bit for bit, family by
family."""
import contextlib
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src.gpu import legalize as lg

E4M3, E5M2 = np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e5m2)
F16, BF16, F32, F64 = (np.dtype(t) for t in (jnp.float16, jnp.bfloat16, np.float32, np.float64))
FP8 = (E4M3, E5M2)
FLOATS = (F16, BF16, F32, F64, E4M3, E5M2)
INTS = tuple(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64,
                                   np.uint8, np.uint16, np.uint32, np.uint64))
N = 384   # random values per draw (one shape: jax.random compiles once)
# Test data overflows and holds NaN on purpose (300.0 as int8, 1e5 as float16).
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")


def _ids(dtypes):
  return [np.dtype(d).name for d in dtypes]


def _x64(*dtypes):
  wide = any(np.dtype(d).itemsize == 8 for d in dtypes)
  return jax.enable_x64(True) if wide else contextlib.nullcontext()


def _key(*parts):
  return jax.random.key(zlib.crc32(repr(parts).encode()))


def _bits(dtype) -> int:
  return np.dtype(dtype).itemsize * 8


def _is_float(dtype) -> bool:
  return jnp.issubdtype(dtype, jnp.floating)


def _is_subnormal(x):
  x = np.asarray(x)
  return (x != 0) & (np.abs(x.astype(np.float64)) < float(jnp.finfo(x.dtype).tiny))


# --- inputs ----------------------------------------------------------------------------------

def random(dtype, n, *seed, subnormals=True):
  """``n`` (at most N) random values of ``dtype``: all bit patterns, and (floats) ordinary
  magnitudes. Without ``subnormals``, none where a CPU flushes them (bfloat16, float32, float64)."""
  dtype = np.dtype(dtype)
  k1, k2, k3 = jax.random.split(_key(dtype.name, *seed), 3)
  raw = np.asarray(jax.random.bits(k1, (N, 8), jnp.uint8))[:n, :dtype.itemsize]
  x = np.ascontiguousarray(raw).view(dtype).reshape(n)
  if _is_float(dtype):
    ordinary = np.asarray(jax.random.normal(k2, (N,))) * \
        2.0 ** np.asarray(jax.random.randint(k3, (N,), -8, 12))
    x = np.where(np.arange(n) % 2 == 0, x, ordinary[:n].astype(dtype))
    if not subnormals and dtype not in (F16,) + FP8:
      x = np.where(_is_subnormal(x), np.ones((), dtype), x)
  return x.astype(dtype)


def float_edges(dtype, subnormals=True):
  dtype = np.dtype(dtype)
  fi = jnp.finfo(dtype)
  v = [0.0, -0.0, np.inf, -np.inf, np.nan, 1, -1, 0.5, -1.5, 2.5, 3, float(fi.max), -float(fi.max),
       float(fi.tiny), -float(fi.tiny), 127.5, 128, -128.5, 255.5, 256, 300, -300, 448, 464, 465,
       -464, -465, 480, 57344, 61439, 61440, -61440, 65504, 1e5, 3e9,
       float(np.nextafter(np.float32(464), np.float32(0))),
       float(np.nextafter(np.float32(464), np.float32(np.inf))),
       float(np.nextafter(np.float32(61440), np.float32(0)))]
  if subnormals or dtype in (F16,) + FP8:
    tiny = float(fi.smallest_subnormal)
    v += [tiny, -tiny, 3 * tiny]
  with np.errstate(over="ignore", invalid="ignore"):
    return np.array(v, np.float64).astype(dtype)


def int_edges(dtype):
  info, bits = np.iinfo(dtype), _bits(dtype)
  v = [0, 1, -1, 2, -2, 3, 7, -7, bits - 1, bits, bits + 1, 100, info.min, info.min + 1,
       info.max, info.max - 1]
  return np.array([int(x) % 2 ** bits for x in v], np.uint64).astype(np.dtype(f"u{bits // 8}")) \
      .view(dtype)


def edges(dtype, subnormals=True):
  return float_edges(dtype, subnormals) if _is_float(dtype) else int_edges(dtype)


def values(dtype, *seed, subnormals=True):
  return np.concatenate([edges(dtype, subnormals), random(dtype, N, *seed, subnormals=subnormals)])


def pairs(dtype, *seed, subnormals=True):
  """Every pair of edge values, and random pairs."""
  e = edges(dtype, subnormals)
  x = np.concatenate([np.repeat(e, len(e)), random(dtype, N, "x", *seed, subnormals=subnormals)])
  y = np.concatenate([np.tile(e, len(e)), random(dtype, N, "y", *seed, subnormals=subnormals)])
  return x, y


# --- the contract ------------------------------------------------------------------------------

MOVEMENT = {lax.broadcast_in_dim_p, ji.broadcast_to_p, lax.reshape_p, lax.squeeze_p,
            lax.transpose_p, lax.rev_p, lax.slice_p, lax.dynamic_slice_p,
            lax.dynamic_update_slice_p, lax.concatenate_p, lax.pad_p, lax.gather_p, lax.scatter_p,
            lax.split_p, ji.copy_p, ji.optimization_barrier_p}
FP8_OK = MOVEMENT | {lax.convert_element_type_p, lax.bitcast_convert_type_p, lax.select_n_p,
                     lax.dot_general_p}
GONE = (lax.sign_p, lax.clamp_p, lax.integer_pow_p, lax.is_finite_p)
IN_F32 = set(lg.MATH) | {lax.div_p, lax.rem_p}
SHIFTS = (lax.shift_left_p, lax.shift_right_logical_p, lax.shift_right_arithmetic_p)


def _dt(a):
  return np.dtype(getattr(a.aval, "dtype", np.bool_))


def assert_legal(jaxpr, cc: int):
  """The equation-level contract of legalize(), on every equation (sub-jaxprs included)."""
  for e in jaxpr_util.equations(jaxpr):
    p, ins, outs = e.primitive, [_dt(a) for a in e.invars], [_dt(v) for v in e.outvars]
    what = f"{e} (cc {cc})"
    assert p not in GONE, what
    if any(ji.is_ref_aval(a.aval) for a in e.invars) or \
        next(jaxpr_util.sub_jaxprs(e.params), None) is not None:
      continue
    assert not (p not in FP8_OK and any(d in FP8 for d in ins + outs)), what
    assert not (p in IN_F32 and ins[0] in (F16, BF16)), what
    assert not (p is lax.neg_p and _is_float(ins[0])), what
    assert not (p is lax.nextafter_p and _bits(ins[0]) != 64), what
    assert not (p in (lax.population_count_p, lax.clz_p) and ins[0] not in (np.int32, np.int64)), \
        what
    signed = jnp.issubdtype(ins[0], jnp.signedinteger) if ins else None
    assert not (p is lax.shift_right_logical_p and signed), what
    assert not (p is lax.shift_right_arithmetic_p and not signed), what
    assert not (p is lax.pow_p and not _is_float(ins[1])), what
    assert not (p in (lax.reduce_sum_p, lax.cumsum_p) and jnp.issubdtype(ins[0], jnp.integer)
                and ins[0].itemsize < 4), what
    assert not (p is lax.dot_general_p and outs[0] in FP8), what
    k = e.invars[-1].val if isinstance(e.invars[-1], ji.Literal) else None
    if p in SHIFTS and k is not None:
      assert 0 <= int(k) < _bits(ins[0]), what
    if p in (lax.div_p, lax.rem_p) and k is not None and not _is_float(ins[0]):
      assert int(k) not in (0, -1), what
    if p is lax.convert_element_type_p and outs[0] in FP8:
      assert ins[0] in (F16, BF16) or ins[0] == F32 and cc >= 90, what
    if p is lax.convert_element_type_p and ins[0] in FP8:
      assert outs[0] in (F16, BF16, F32), what


def _watch(e) -> str | None:
  """The kind of operand-value check an equation gets, if any."""
  p, d = e.primitive, _dt(e.invars[0]) if e.invars else None
  if p in (lax.div_p, lax.rem_p) and not _is_float(d):
    return "divisor"
  if p in SHIFTS:
    return "amount"
  if p is lax.convert_element_type_p:
    new = np.dtype(e.params["new_dtype"])
    if new in FP8:
      return "to_fp8"
    if _is_float(d) and new.itemsize == 1 and jnp.issubdtype(new, jnp.integer):
      return "to_int8"
  if p in (lax.argmax_p, lax.argmin_p) and _is_float(d):
    return "no_nan"
  return None


def _check_operands(e, kind, vals):
  vals = [np.asarray(v) for v in vals]
  x = vals[0]
  if kind == "divisor":
    y = vals[1]
    bad = (y == 0)
    if jnp.issubdtype(x.dtype, jnp.signedinteger):
      bad = bad | ((x == np.iinfo(x.dtype).min) & (y == -1))
    assert not bad.any(), f"{e}: a divisor of 0, or -1 with MIN"
  elif kind == "amount":
    amount = vals[1].view(np.dtype(f"u{vals[1].dtype.itemsize}"))
    assert (amount < _bits(vals[1].dtype)).all(), f"{e}: shift amounts {amount}"
  elif kind == "to_int8":
    info = np.iinfo(np.dtype(e.params["new_dtype"]))
    f = x.astype(np.float64)
    assert not (np.isnan(f) | (f < info.min) | (f > info.max)).any(), f"{e}: out of range {f}"
  elif kind == "to_fp8":
    f = np.abs(x.astype(np.float64))
    limit_ok = f <= 464 if np.dtype(e.params["new_dtype"]) == E4M3 else f < 61440
    assert (limit_ok | np.isnan(f)).all(), f"{e}: overflowing values {f[~(limit_ok | np.isnan(f))]}"
  elif kind == "no_nan":
    assert not np.isnan(x.astype(np.float64)).any(), f"{e}: NaN"


def _literal(a):
  return np.array(a.val, a.aval.dtype)[()] if np.ndim(a.val) == 0 else a.val


def eval_watching(jaxpr, watched, args):
  """``jaxpr``'s outputs, and the operands of the ``watched`` equations (top level)."""
  env = dict(zip(jaxpr.all_invars, [*jaxpr.consts, *args]))
  read = lambda v: _literal(v) if isinstance(v, ji.Literal) else env[v]
  seen = {}
  for i, e in enumerate(jaxpr.eqns):
    seen[i] = [read(v) for v in e.invars]
    for v, x in zip(e.outvars, jaxpr_util.rebind(e, seen[i])):
      env[v] = x
  return [read(v) for v in jaxpr.outvars], [seen[i] for i, _ in watched]


# Every operation rounds to its type, as on a GPU: XLA's CPU would otherwise keep bfloat16 (and
# fp8) products in float32 across a conversion (1 / (x * x) in bfloat16 differs). LLVM's -O0
# halves compile times (the tests' cost) and changes no answer.
EXACT = {"xla_allow_excess_precision": False, "xla_backend_optimization_level": 0}


def jit(fn):
  return jax.jit(fn, compiler_options=EXACT)


def run(jaxpr, args):
  return jit(lambda *a: ji.eval_jaxpr(jaxpr, jaxpr.consts, *a))(*args)


def assert_same(want, got, what, args=()):
  want, got = np.asarray(want), np.asarray(got)
  assert want.dtype == got.dtype and want.shape == got.shape, (what, want.dtype, got.dtype)
  u = np.dtype(f"u{want.dtype.itemsize}") if want.dtype != np.bool_ else np.bool_
  same = want.view(u) == got.view(u)
  if _is_float(want.dtype):
    same |= np.isnan(want.astype(np.float32)) & np.isnan(got.astype(np.float32))
  if not same.all():
    bad = np.flatnonzero(~same)[:5]
    ins = [np.asarray(a).reshape(-1)[bad] if np.size(a) == want.size else a for a in args]
    raise AssertionError(f"{what}: {np.count_nonzero(~same)} of {same.size} differ, e.g. at "
                         f"inputs {ins}: want {want.reshape(-1)[bad]}, got {got.reshape(-1)[bad]}")


def check(fn, *args, cc=90, ref=None, changed=True):
  """Legalizes ``fn``'s jaxpr and checks the contract and the answers against ``fn``'s (or
  ``ref``'s) bitwise; returns the legalized jaxpr."""
  jx = jax.make_jaxpr(fn)(*args)
  new = lg.legalize(jx, cc)
  assert (new is not jx) == changed
  assert [v.aval for v in new.invars] == [v.aval for v in jx.invars]
  assert [(v.aval.shape, v.aval.dtype) for v in new.outvars] == \
      [(v.aval.shape, v.aval.dtype) for v in jx.outvars]
  assert_legal(new, cc)
  watched = [(i, k) for i, e in enumerate(new.eqns) if (k := _watch(e))]

  def both(*a):   # one compilation
    want = ji.eval_jaxpr(jx, jx.consts, *a) if ref is None else ref(*a)
    return want, *eval_watching(new, watched, a)

  want, got, ops = jit(both)(*args)
  for (i, kind), vals in zip(watched, ops):
    _check_operands(new.eqns[i], kind, vals)
  want = want if isinstance(want, (list, tuple)) else [want]
  assert len(want) == len(got)
  for i, (w, g) in enumerate(zip(want, got)):
    assert_same(w, g, f"out[{i}]", args)
  return new


def prims(jaxpr):
  return [e.primitive for e in jaxpr_util.equations(jaxpr)]


# --- 1. integer div/rem ----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", INTS, ids=_ids(INTS))
def test_int_div_rem(dtype):
  signed = jnp.issubdtype(dtype, jnp.signedinteger)
  d = lambda v: np.array(v, dtype)[()]

  def f(x, y):
    out = [lax.div(x, y), lax.rem(x, y), lax.div(x, d(0)), lax.rem(x, d(0)), lax.div(x, d(7)),
           lax.rem(x, d(3)), lax.div(d(5), y)]
    if signed:
      out += [lax.div(x, d(-1)), lax.rem(x, d(-1)), lax.rem(x, d(-7))]
    return out

  with _x64(dtype):
    new = check(f, *pairs(dtype))
  # literal divisors other than 0 and -1 stay as they are: index arithmetic does not grow
  lits = [e for e in new.eqns if e.primitive in (lax.div_p, lax.rem_p)
          and isinstance(e.invars[1], ji.Literal)]
  assert len(lits) == (3 if signed else 2)


# --- 2. shifts -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", INTS, ids=_ids(INTS))
def test_shifts(dtype):
  bits = _bits(dtype)
  k = lambda v: np.array(v % 2 ** bits, np.dtype(f"u{bits // 8}")).view(dtype)[()]
  ops = (lax.shift_left, lax.shift_right_logical, lax.shift_right_arithmetic)

  def f(x, y):
    out = [op(x, y) for op in ops]
    for amount in (-1, 0, 1, bits - 1, bits, bits + 1, 100):
      out += [op(x, k(amount)) for op in ops]
    return out

  x, y = pairs(dtype)
  y = np.concatenate([y, random(np.int8, N, "amounts").astype(dtype)])   # small amounts too
  with _x64(dtype):
    check(f, np.concatenate([x, x[:N]]), y)


# --- 3. float -> int8/uint8 -------------------------------------------------------------------

@pytest.mark.parametrize("src", FLOATS, ids=_ids(FLOATS))
def test_float_to_small_int(src):
  def f(x):
    return [lax.convert_element_type(x, t) for t in (np.int8, np.uint8, np.int16, np.uint16,
                                                     np.int32, np.uint32)]
  with _x64(src):
    new = check(f, values(src, subnormals=False))
  if src not in FP8:   # wider targets keep their one conversion: the GPU saturates there too
    wide = [e for e in new.eqns if e.primitive is lax.convert_element_type_p
            and e.invars[0] in new.invars and _bits(e.params["new_dtype"]) > 8]
    assert len(wide) == 4


def test_float_to_wide_int_is_unchanged():
  jx = jax.make_jaxpr(lambda x: (x.astype(jnp.int32), x.astype(jnp.uint16)))(np.ones(4, F32))
  assert lg.legalize(jx, 90) is jx


# --- 4. fp8 ----------------------------------------------------------------------------------

UNARY_MATH = {p.name: getattr(lax, p.name) for p in lg.MATH
              if p not in (lax.atan2_p, lax.pow_p, lax.round_p)}
FP8_SOURCES = (F16, BF16, F32, E4M3, E5M2, np.dtype(np.int8), np.dtype(np.int16),
               np.dtype(np.int32), np.dtype(np.uint8), np.dtype(np.uint32), np.dtype(np.bool_))


@pytest.mark.parametrize("cc", (89, 90))
@pytest.mark.parametrize("src", FP8_SOURCES, ids=_ids(FP8_SOURCES))
def test_conversion_to_fp8_overflows_as_lax(src, cc):
  x = values(src) if src != np.bool_ else np.array([True, False] * 8)
  if jnp.issubdtype(src, jnp.integer):
    x = np.concatenate([x, np.arange(-300, 70000, 37).astype(src)])
  check(lambda x: (x.astype(E4M3), x.astype(E5M2)), x, cc=cc)


def _halfway_cases(dst):
  """float32 values on, next to, and just either side of the midpoints between fp8 values."""
  f = np.unique(np.arange(256, dtype=np.uint8).view(dst).astype(np.float32))
  f = f[np.isfinite(f) & (f >= 0)]
  mid = (f[:-1] + f[1:]) / 2
  near = [mid, f]
  for towards in (0, np.inf):
    step = mid
    for _ in range(3):
      step = np.nextafter(step, np.float32(towards))
      near.append(step)
  # just past the float16 neighbours of each midpoint: a truncating float16 lands on the midpoint
  h = mid.astype(np.float16)
  near.append(np.nextafter(h.astype(np.float32), np.float32(np.inf)))
  v = np.concatenate(near).astype(np.float32)
  return np.concatenate([v, -v])


def _rtz_f16(x):
  h = x.astype(np.float16)
  hb = h.view(np.int16).astype(np.int32) - (np.abs(h.astype(np.float32)) > np.abs(x))
  return hb.astype(np.int16).view(np.float16)


@pytest.mark.parametrize("dst", FP8, ids=_ids(FP8))
def test_fp8_rounding_before_sm90(dst):
  x = np.concatenate([_halfway_cases(dst), float_edges(F32, subnormals=False)] +
                     [random(F32, N, "rtz", i, subnormals=False) for i in range(3)])
  with np.errstate(invalid="ignore", over="ignore"):
    naive = _rtz_f16(x).astype(dst)   # what Triton does before sm_90 without legalization
  direct = np.asarray(jit(lambda v: v.astype(dst))(x))
  assert (naive.view(np.uint8) != direct.view(np.uint8)).sum() > 10   # the cases do bite
  new = check(lambda v: v.astype(dst), x, cc=89)
  assert any(e.primitive is lax.convert_element_type_p and _dt(e.invars[0]) == F16
             and np.dtype(e.params["new_dtype"]) == dst for e in new.eqns)


FP8_BINARY = {"add": lax.add, "sub": lax.sub, "mul": lax.mul, "div": lax.div, "max": lax.max,
              "min": lax.min, "rem": lax.rem, "lt": lax.lt, "eq": lax.eq, "ne": lax.ne,
              "ge": lax.ge}
FP8_UNARY = {"abs": lax.abs, "neg": lax.neg, "sign": lax.sign, "square": lax.square,
             "is_finite": lax.is_finite, "floor": lax.floor, "round": lax.round,
             "pow3": lambda x: lax.integer_pow(x, 3), "pow-2": lambda x: lax.integer_pow(x, -2),
             "reduce_max": lambda x: lax.reduce_max(x.reshape(16, 16), (1,)),
             "argmin": lambda x: lax.argmin(x.reshape(16, 16), 0, np.int32),
             "clamp": lambda x: lax.clamp(np.array(-2, x.dtype), x, np.array(100, x.dtype))}


@pytest.mark.parametrize("dtype", FP8, ids=_ids(FP8))
def test_fp8_arithmetic_in_f32(dtype):
  everything = np.arange(256, dtype=np.uint8).view(dtype)
  x, y = np.repeat(everything, 256), np.tile(everything, 256)   # every pair
  check(lambda x, y: [op(x, y) for op in FP8_BINARY.values()], x, y)
  check(lambda x: [op(x) for op in FP8_UNARY.values()], everything)


def test_fp8_dot_with_fp8_result():
  a = np.asarray(jax.random.randint(_key("a"), (16, 32), -3, 4)).astype(E4M3)
  b = np.asarray(jax.random.randint(_key("b"), (32, 16), -3, 4)).astype(E4M3)
  dot = lambda a, b: [lax.dot(a, b), lax.dot(a * np.array(8, E4M3), b),
                      lax.dot(a, b, preferred_element_type=np.float32)]
  new = check(dot, a, b)
  assert [np.dtype(e.params["preferred_element_type"]) for e in new.eqns
          if e.primitive is lax.dot_general_p] == [F32] * 3


@pytest.mark.parametrize("dtype", FP8, ids=_ids(FP8))
def test_fp8_math_in_f32(dtype):
  # XLA computes fp8 math in float16 (rounding twice) and has no fp8 erfc: the reference is the
  # float32 answer rounded once, as the legalized jaxpr computes it on a GPU.
  everything = np.arange(256, dtype=np.uint8).view(dtype)
  f = lambda x: [fn(x) for fn in UNARY_MATH.values()]
  ref = lambda x: [fn(x.astype(np.float32)).astype(dtype) for fn in UNARY_MATH.values()]
  check(f, everything, ref=ref)


def test_fp8_errors():
  x = np.ones(4, np.float32)
  with pytest.raises(NotImplementedError, match=r"conversion to float8_e4m3fn needs compute "
                     r"capability 8.9 or newer \(this target is sm_80\), at .*test_legalize.py"):
    lg.legalize(jax.make_jaxpr(lambda x: x.astype(E4M3))(x), 80)
  with pytest.raises(NotImplementedError, match="sm_86"):   # fp8 arithmetic converts back
    lg.legalize(jax.make_jaxpr(lambda x: x * x)(x.astype(E5M2)), 86)
  with jax.enable_x64(True):
    jx = jax.make_jaxpr(lambda x: x.astype(E5M2))(np.ones(4, np.float64))
  with pytest.raises(NotImplementedError, match=r"conversion from float64 to float8_e5m2 "
                     r"\(convert to float32 first\)"):
    lg.legalize(jx, 90)
  # reading fp8 and widening it is fine on any target
  jx = jax.make_jaxpr(lambda x: x.astype(np.float32) + 1)(x.astype(E4M3))
  assert lg.legalize(jx, 80) is jx


# --- 5. float16/bfloat16 math in float32 ------------------------------------------------------

# XLA's CPU computes these in float16/bfloat16 itself, less accurately than float32 (asin(6e-8)
# = 0, exp2 off by an ulp): compared with the float32 answer rounded once, the GPU's.
CPU_LOW_PRECISION = ("exp2", "log2", "logistic", "expm1", "asin", "acos", "asinh", "acosh", "atanh")


@pytest.mark.parametrize("dtype", (F16, BF16), ids=_ids((F16, BF16)))
def test_half_math_in_f32(dtype):
  x = values(dtype)
  same = [fn for name, fn in UNARY_MATH.items() if name not in CPU_LOW_PRECISION]
  f = lambda x: [fn(x) for fn in same] + [lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN),
                                             lax.round(x), lax.is_finite(x)]
  check(f, x)
  low = [UNARY_MATH[name] for name in CPU_LOW_PRECISION]
  check(lambda x: [fn(x) for fn in low], x,
        ref=lambda x: [fn(x.astype(np.float32)).astype(dtype) for fn in low])
  xs, ys = pairs(dtype)
  # (not lax.pow(x, 3): XLA rewrites it into float16 products, rounded twice)
  two = lambda x, y: [lax.div(x, y), lax.rem(x, y), lax.atan2(x, y), lax.pow(x, y),
                      lax.pow(x, (y.astype(np.float32) * 8).astype(np.int32))]
  check(two, xs, ys)


def test_f32_pow_int_exponent_and_f64_math():
  x = values(F32, subnormals=False)
  new = check(lambda x: [lax.pow(x, np.int32(-3)), lax.pow(x, (x * 4).astype(np.int32))], x)
  assert lax.convert_element_type_p in prims(new)
  with jax.enable_x64(True):
    jx = jax.make_jaxpr(lambda x: [fn(x) for fn in UNARY_MATH.values()] + [x / x])(np.ones(4, F64))
    assert lg.legalize(jx, 90) is jx


# --- 6-9, 13. neg, sign, nextafter, clamp, is_finite ------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS, ids=_ids(FLOATS))
def test_float_neg(dtype):
  with _x64(dtype):
    new = check(lambda x: [lax.neg(x), lax.neg(lax.neg(x))], values(dtype))
  assert lax.xor_p in prims(new)


def test_int_neg_is_unchanged():
  jx = jax.make_jaxpr(lax.neg)(np.ones(4, np.int32))
  assert lg.legalize(jx, 90) is jx


SIGN_TYPES = FLOATS + INTS


@pytest.mark.parametrize("dtype", SIGN_TYPES, ids=_ids(SIGN_TYPES))
def test_sign(dtype):
  # (the CPU flushes float32 subnormals: there, sign(1e-45) = 0; a GPU gives 1)
  with _x64(dtype):
    check(lax.sign, values(dtype, subnormals=False))


NEXTAFTER_TYPES = (F16, BF16, F32, E4M3, E5M2)


@pytest.mark.parametrize("dtype", NEXTAFTER_TYPES, ids=_ids(NEXTAFTER_TYPES))
def test_nextafter(dtype):
  # (XLA's CPU flushes bfloat16 subnormal operands in fused selects: not those)
  x, y = pairs(dtype, subnormals=dtype != BF16)
  close = random(dtype, N, "close", subnormals=dtype != BF16)
  x = np.concatenate([x, close, close])
  y = np.concatenate([y, -close, (close.astype(np.float32) * 2).astype(dtype)])
  check(lambda x, y: [lax.nextafter(x, y), lax.nextafter(x, np.array(0, dtype))], x, y)


def test_nextafter_f64_is_unchanged():
  with jax.enable_x64(True):
    jx = jax.make_jaxpr(lax.nextafter)(np.ones(4), np.ones(4))
    assert lg.legalize(jx, 90) is jx


CLAMP_TYPES = FLOATS + INTS


@pytest.mark.parametrize("dtype", CLAMP_TYPES, ids=_ids(CLAMP_TYPES))
def test_clamp(dtype):
  x, lo = pairs(dtype, subnormals=False)
  hi = np.concatenate([edges(dtype, False)[::-1].repeat(len(edges(dtype, False))),
                       random(dtype, N, "hi", subnormals=False)])
  one, two = np.array(1, dtype), np.array(2, dtype)
  with _x64(dtype):
    check(lambda lo, x, hi: [lax.clamp(lo, x, hi), lax.clamp(one, x, two)], lo, x, hi)


@pytest.mark.parametrize("dtype", FLOATS, ids=_ids(FLOATS))
def test_is_finite(dtype):
  with _x64(dtype):
    check(lax.is_finite, values(dtype))


# --- 10. integer_pow ---------------------------------------------------------------------------

POW_TYPES = FLOATS + INTS


@pytest.mark.parametrize("dtype", POW_TYPES, ids=_ids(POW_TYPES))
def test_integer_pow(dtype):
  ys = [0, 1, 2, 3, 4, 5, 7, 8, 11, 16, 31] + ([-1, -2, -3, -5, -8] if _is_float(dtype) else [])
  x = values(dtype, subnormals=False)
  if _is_float(dtype):   # magnitudes near 1 too, where the order of products shows
    x = np.concatenate([x, (1 + random(np.float32, N, "near1") / 64).astype(dtype)])
  with _x64(dtype):
    check(lambda x: [lax.integer_pow(x, y) for y in ys], x)


# --- 11. population_count/clz ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", INTS, ids=_ids(INTS))
def test_bit_counts(dtype):
  with _x64(dtype):
    check(lambda x: [lax.population_count(x), lax.clz(x)], values(dtype),
          changed=dtype not in (np.int32, np.int64))


# --- 12. argmax/argmin -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS, ids=_ids(FLOATS))
def test_argmax_nan(dtype):
  x = random(dtype, 16 * 24, "arg", subnormals=False).reshape(16, 24)
  x = np.where(np.isnan(x.astype(np.float32)), np.ones((), dtype), x)   # NaN only where placed
  nan, inf, m = np.array(np.nan, dtype), np.array(np.inf, dtype), np.array(-0.0, dtype)
  x[0, 5], x[0, 9] = nan, nan       # two NaNs: the first wins
  x[1, :] = nan                     # all NaN
  x[2, 3], x[2, 7] = inf, inf       # ties: the first
  x[3, :], x[3, 4] = -inf, nan
  x[4, :], x[4, 2], x[4, 6] = np.array(0, dtype), m, np.array(0, dtype)   # -0.0 ties 0.0
  x[5, :] = inf
  x[7, 23] = nan                    # the last one
  x[:, 11] = np.where(np.arange(16) % 3 == 0, nan, x[:, 11])
  fns = lambda x: [op(x, axis, np.int32) for op in (lax.argmax, lax.argmin) for axis in (0, 1)]
  with _x64(dtype):
    check(fns, x)


def test_int_argmax_is_unchanged():
  jx = jax.make_jaxpr(lambda x: lax.argmax(x, 0, np.int32))(np.ones(4, np.int32))
  assert lg.legalize(jx, 90) is jx


# --- 14. sums of narrow integers ----------------------------------------------------------------

NARROW = tuple(np.dtype(t) for t in (np.int8, np.int16, np.uint8, np.uint16))


@pytest.mark.parametrize("dtype", NARROW, ids=_ids(NARROW))
def test_narrow_int_sums(dtype):
  x = random(dtype, N, "sum").reshape(12, 32)
  sums = lambda x: [lax.reduce_sum(x, (1,)), lax.reduce_sum(x, (0, 1)), lax.cumsum(x, 1),
                    lax.cumsum(x, 0, reverse=True)]
  new = check(sums, x)
  assert all(_dt(e.invars[0]).itemsize == 4 for e in new.eqns
             if e.primitive in (lax.reduce_sum_p, lax.cumsum_p))


def test_wide_sums_are_unchanged():
  jx = jax.make_jaxpr(lambda x, y: (lax.reduce_sum(x, (0,)), lax.cumsum(y, 0)))(
      np.ones(4, np.int32), np.ones(4, F16))
  assert lg.legalize(jx, 90) is jx


# --- recursion, Refs, and what stays ----------------------------------------------------------

def test_loop_bodies_and_branches_are_legalized():
  def f(x, y, p):
    z = lax.fori_loop(0, 3, lambda i, c: lax.div(c, y) + lax.rem(c, y), x)
    w = lax.cond(p, lambda: lax.shift_right_logical(x, y), lambda: lax.shift_left(x, y))
    return z, w, lax.cond(p, lambda: lax.neg(y.astype(F16)), lambda: lax.sign(y.astype(F16)))
  x, y = pairs(np.int32)
  for p in (True, False):
    new = check(f, x, y, np.bool_(p))
  outer = [e.primitive for e in new.eqns]
  assert lax.div_p not in outer and lax.shift_right_logical_p not in outer
  body = [e for e in jaxpr_util.equations(new) if e.primitive is lax.div_p]
  assert body and all(not isinstance(e.invars[1], ji.Literal) for e in body)
  assert lax.select_n_p in prims(new)


def test_ref_kernel():
  def kernel(x_ref, y_ref, o_ref, p_ref):
    x = x_ref[...]
    o_ref[...] = lax.div(x, y_ref[...]) + lax.div(x, np.int32(0))
    p_ref[...] = lax.population_count(x.astype(np.uint8)).astype(np.int32)
    return ()
  avals = [ji.ref_aval((8, 16), np.int32)] * 4
  jx, _, consts = ji.trace_to_jaxpr(kernel, avals)
  jx = ji.closed(jx, consts)
  new = lg.legalize(jx, 90)
  assert new is not jx and new.in_avals == jx.in_avals
  assert_legal(new, 90)
  assert ji.get_p in prims(new) and ji.swap_p in prims(new)
  x = random(np.int32, 128, "ref").reshape(8, 16)
  y = random(np.int32, 128, "ry").reshape(8, 16)
  y[:, ::5] = 0
  zeros = np.zeros((8, 16), np.int32)
  ran = [run(ji.discharge_state(j), (x, y, zeros, zeros)) for j in (jx, new)]
  for i, (w, g) in enumerate(zip(*ran)):
    assert_same(w, g, f"ref {i}")


def test_unchanged_jaxpr_is_the_same_object():
  def f(x, i):
    return lax.exp(x) * 2 + x / x, lax.div(i, np.int32(4)), lax.shift_left(i, np.int32(3)), \
        lax.max(x, x), x.astype(np.int32), lax.argmax(i, 0, np.int32)
  jx = jax.make_jaxpr(f)(np.ones(4, F32), np.ones(4, np.int32))
  assert lg.legalize(jx, 90) is jx
  jx = jax.make_jaxpr(lambda x: lax.fori_loop(0, 2, lambda i, c: c * 2, x))(np.ones(4, F32))
  assert lg.legalize(jx, 90) is jx


# --- on a GPU: Triton computes the legalized jaxpr as lax does ----------------------------------

def _exact_families():
  """name -> (function, its arguments) for the families whose Triton answers are lax's bit for
  bit (arguments built when used: collecting the tests computes nothing)."""
  i8, i32, u16, u32 = (np.dtype(t) for t in (np.int8, np.int32, np.uint16, np.uint32))
  out = {}
  for d in (i8, i32, u32):
    out[f"div_rem_{d.name}"] = (lambda x, y: [lax.div(x, y), lax.rem(x, y)], lambda d=d: pairs(d))
  for d in (i8, i32, u16):
    shifts = lambda x, y: [lax.shift_left(x, y), lax.shift_right_logical(x, y),
                           lax.shift_right_arithmetic(x, y)]
    out[f"shifts_{d.name}"] = (shifts, lambda d=d: pairs(d))
  targets = (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32)
  clamp = lambda x: lax.clamp(np.array(-2, x.dtype), x, np.array(3, x.dtype))
  for d in (F16, BF16, F32):
    one = lambda d=d: (values(d),)
    out[f"to_ints_{d.name}"] = (lambda x: [x.astype(t) for t in targets], one)
    out[f"to_fp8_{d.name}"] = (lambda x: [x.astype(E4M3), x.astype(E5M2)], one)
    out[f"signs_{d.name}"] = (lambda x: [lax.neg(x), lax.sign(x), lax.is_finite(x), clamp(x)], one)
    out[f"pow_{d.name}"] = (lambda x: [lax.integer_pow(x, y) for y in (2, 3, 5, -1, -2)],
                            lambda d=d: (values(d, subnormals=False),))
    out[f"nextafter_{d.name}"] = (lambda x, y: [lax.nextafter(x, y)], lambda d=d: pairs(d))
    out[f"argmax_{d.name}"] = (
        lambda x: [lax.argmax(x, 1, np.int32), lax.argmin(x, 0, np.int32)],
        lambda d=d: (np.concatenate([values(d)[:192], np.full(64, np.nan, d)]).reshape(8, 32),))
  every = lambda d: np.arange(256, dtype=np.uint8).view(d)
  for d in FP8:
    out[f"fp8_{d.name}"] = (
        lambda x, y: [lax.add(x, y), lax.mul(x, y), lax.max(x, y), lax.lt(x, y), lax.neg(x)],
        lambda d=d: (np.repeat(every(d), 256), np.tile(every(d), 256)))
  for d in (i8, u16, u32):
    out[f"bits_{d.name}"] = (lambda x: [lax.population_count(x), lax.clz(x)],
                             lambda d=d: (values(d),))
  out["sums_int8"] = (lambda x: [lax.reduce_sum(x, (1,)), lax.cumsum(x, 1)],
                      lambda: (random(i8, 256, "gpu").reshape(8, 32),))
  return out


EXACT_ON_GPU = _exact_families()


@pytest.mark.gpu
@pytest.mark.parametrize("name", EXACT_ON_GPU)
def test_triton_gives_lax_answers(name):
  if jax.devices()[0].platform != "gpu":
    pytest.skip("needs an NVIDIA GPU")
  from pallax._src.triton import launch
  from forced_target import refused_on_forced_target
  before = launch.LAUNCHES
  with refused_on_forced_target():
    assert_triton_is_lax(name, interpret=False)
  assert launch.LAUNCHES > before, "the Triton backend was not used"


def assert_triton_is_lax(name, interpret: bool):
  """The family's kernel on the Triton backend (or, ``interpret``, the interpreter) against the
  interpreter, bitwise."""
  import pallax as pl
  fn, make_args = EXACT_ON_GPU[name]
  args = make_args()
  shapes = jax.eval_shape(fn, *args)

  def kernel(*refs):
    ins, outs = refs[:len(args)], refs[len(args):]
    for r, v in zip(outs, fn(*[r[...] for r in ins])):
      r[...] = v

  call = lambda interpret: pl.pallas_call(kernel, out_shape=shapes, interpret=interpret)(*args)
  for k, (g, w) in enumerate(zip(call(interpret), call(True))):
    assert_same(w, g, f"{name} out[{k}]", args)


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["float32", "float16", "bfloat16"])
def test_erf_inv_is_lax_own_expansion(dtype):
  # libdevice's erfinv is another approximation (up to ~5 float32 ulps from lax on a GPU); the
  # rewrite computes XLA's own polynomial, so only log1p/sqrt can differ there.
  x = np.concatenate([np.asarray(jax.random.uniform(jax.random.key(3), (4000,), np.float32, -1, 1)),
                      np.array([1, -1, 0, -0.0, 0.999999, -0.9999, 1e-30, 2, -3, np.nan], np.float32)])
  new = check(lambda x: [lax.erf_inv(x)], x.astype(dtype))
  assert lax.erf_inv_p not in prims(new)

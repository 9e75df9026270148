"""On a GPU (``make gpu-test``): float math of the GPU backends against XLA on the same GPU.

By default (XLA's functions, ``gpu/math_functions.py``) the functions claimed here give XLA's
bits: float32 on random values of each function's domain, random bit patterns, log-uniform
magnitudes and edge values (zeros, denormals, extremes, infinities, NaN); float16 and bfloat16 on
every value of the type. With ``approx_math=True``: within the error bounds of the GPU's
instructions, against float64 NumPy. Each test prints its table (``pytest -s``)."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu
import pallax.triton as plt_
from gpu_math import ulps

pytestmark = pytest.mark.gpu

S = jax.ShapeDtypeStruct
TINY = float(np.finfo(np.float32).tiny)


@pytest.fixture(autouse=True, scope="module")
def _needs_gpu():
  if jax.devices()[0].platform != "gpu":
    pytest.skip("needs an NVIDIA GPU")


# name -> (function, the domain of its random inputs, the float64 truth)
FUNCTIONS = {
    "exp": (jnp.exp, (-90, 90), np.exp), "exp2": (jnp.exp2, (-130, 130), np.exp2),
    "log": (jnp.log, (1e-30, 1e30), np.log), "log2": (jnp.log2, (1e-30, 1e30), np.log2),
    "log1p": (jnp.log1p, (-0.99, 1e4), np.log1p), "expm1": (jnp.expm1, (-20, 20), np.expm1),
    "sin": (jnp.sin, (-100, 100), np.sin), "cos": (jnp.cos, (-100, 100), np.cos),
    "tan": (jnp.tan, (-1.5, 1.5), np.tan), "sqrt": (jnp.sqrt, (0, 1e30), np.sqrt),
    "rsqrt": (lax.rsqrt, (1e-30, 1e30), lambda x: 1 / np.sqrt(x)),
    "cbrt": (jnp.cbrt, (-1e6, 1e6), np.cbrt), "tanh": (jnp.tanh, (-12, 12), np.tanh),
    "sinh": (jnp.sinh, (-90, 90), np.sinh), "cosh": (jnp.cosh, (-90, 90), np.cosh),
    "asin": (jnp.arcsin, (-1, 1), np.arcsin), "acos": (jnp.arccos, (-1, 1), np.arccos),
    "atan": (jnp.arctan, (-1e3, 1e3), np.arctan), "asinh": (jnp.arcsinh, (-1e3, 1e3), np.arcsinh),
    "acosh": (jnp.arccosh, (1, 1e3), np.arccosh), "atanh": (jnp.arctanh, (-1, 1), np.arctanh),
    "erf": (lax.erf, (-5, 5), scipy.special.erf), "erfc": (lax.erfc, (-5, 10), scipy.special.erfc),
    "erf_inv": (lax.erf_inv, (-1, 1), scipy.special.erfinv),
    "logistic": (jax.nn.sigmoid, (-30, 30), scipy.special.expit),
    "floor": (jnp.floor, (-1e4, 1e4), np.floor), "ceil": (jnp.ceil, (-1e4, 1e4), np.ceil),
}
BINARY = {"pow": (lax.pow, (0.01, 100), (-30, 30)), "atan2": (jnp.arctan2, (-100, 100), (-100, 100)),
          "div": (lax.div, (-1e3, 1e3), (-1e3, 1e3))}

# Exact mode: XLA's bits (measured on an H200, XLA's libdevice linked; the rest, computed by XLA
# its own way, are a few ulps away)
XLA_EXACT_F32 = ("exp", "log", "log2", "log1p", "expm1", "sin", "cos", "tan", "sinh", "cosh",
                 "atanh", "sqrt", "rsqrt", "logistic", "floor", "ceil", "div", "cbrt", "asin", "acos",
                 "atan", "asinh", "acosh", "atan2")
XLA_EXACT_16 = {   # XLA computes 16-bit exp, exp2, log, log2 and logistic its own ways
    "float16": ("log1p", "expm1", "sin", "cos", "tan", "sqrt", "rsqrt", "cbrt", "tanh", "sinh",
                "cosh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "erf", "erf_inv", "floor",
                "ceil"),
    "bfloat16": ("log", "log1p", "expm1", "sin", "cos", "tan", "sqrt", "rsqrt", "cbrt", "tanh",
                 "sinh", "cosh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "erf", "erf_inv",
                 "floor", "ceil"),
}


def _edges() -> np.ndarray:
  e = np.asarray([0.0, 1e-45, 1e-44, 1e-40, 1.1754942e-38, TINY, 1e-30, 1e-7, 0.5, 1.0, 1.5, 2.0,
                  10.0, 87.3, 88.72, 88.73, 89.0, 103.0, 104.0, 126.0, 128.0, 150.0, 1e10, 1e30,
                  3.4028235e38, np.inf, np.nan], np.float32)
  return np.concatenate([e, -e])


def _inputs(rng, domain, n=1 << 17) -> tuple[np.ndarray, int]:
  """(float32 inputs, how many leading ones are the domain's random values)."""
  dom = rng.uniform(*domain, n).astype(np.float32)
  bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
  mag = (rng.choice([-1.0, 1.0], n) * 10.0 ** rng.uniform(-45, 38.5, n)).astype(np.float32)
  x = np.concatenate([dom, bits, mag, _edges()])
  return x, n


def _same(got, want) -> np.ndarray:
  """Elementwise: the same bits, or both NaN."""
  got, want = np.asarray(got), np.asarray(want)
  u = np.dtype(f"u{got.dtype.itemsize}")
  return (got.view(u) == want.view(u)) | (np.isnan(got.astype(np.float32)) & np.isnan(want.astype(np.float32)))


def _triton(fn, args, approx=False, block=2048):
  """``fn`` elementwise in a pallas_call on the Triton backend (the last block partial)."""
  n = args[0].shape[0]
  def kernel(*refs):
    refs[-1][...] = fn(*[r[...] for r in refs[:-1]])
  spec = pl.BlockSpec((block,), lambda i: (i,))
  return jax.jit(pl.pallas_call(
      kernel, out_shape=S((n,), args[0].dtype), grid=(pl.cdiv(n, block),), in_specs=[spec] * len(args),
      out_specs=spec, compiler_params=plt_.CompilerParams(approx_math=approx)))(*args)


def _cases(rng):
  """name -> (function, float32 arguments, how many leading ones are the domain's values)."""
  out = {}
  for name, (fn, dom, _) in FUNCTIONS.items():
    x, nd = _inputs(rng, dom)
    out[name] = (fn, [x], nd)
  for name, (fn, d1, d2) in BINARY.items():
    a, nd = _inputs(rng, d1)
    b, _ = _inputs(rng, d2)
    b = np.concatenate([b[:nd // 2], np.round(b[nd // 2:nd]), rng.permutation(b[nd:])])  # integer powers
    out[name] = (fn, [a, b], nd)
  return out


def test_float32_math_is_xlas_bit_for_bit():
  from pallax._src.triton import launch
  before = launch.LAUNCHES
  rng = np.random.default_rng(int.from_bytes(np.random.bytes(4), "little"))
  rows, failures = [], []
  for name, (fn, args, _) in _cases(rng).items():
    got = np.asarray(_triton(fn, [jnp.asarray(a) for a in args]))
    want = np.asarray(jax.jit(fn)(*args))
    bad = ~_same(got, want)
    finite = np.isfinite(got) & np.isfinite(want)
    rows.append(f"{name:9} {int(bad.sum()):7} of {bad.size} differ, at most "
                f"{int(ulps(got, want)[finite].max(initial=0))} ulps")
    if name in XLA_EXACT_F32 and bad.any():
      k = int(np.argmax(bad))
      failures.append(f"{name}: {int(bad.sum())} differ, e.g. at {[float(a[k]) for a in args]}: "
                      f"pallax {got[k]!r}, XLA {want[k]!r}")
  print("\nfloat32, exact mode, against XLA:\n" + "\n".join(rows))
  assert launch.LAUNCHES > before, "the Triton backend was not used"
  assert not failures, "\n".join(failures)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_math_is_xlas_on_every_value(dtype):
  every = np.arange(1 << 16, dtype=np.uint16).view(jnp.dtype(dtype))
  rows, failures = [], []
  for name, (fn, _, _) in FUNCTIONS.items():
    got = np.asarray(_triton(fn, [jnp.asarray(every)]))
    want = np.asarray(jax.jit(fn)(every))
    bad = ~_same(got, want)
    rows.append(f"{name:9} {int(bad.sum()):6} of 65536 differ")
    if name in XLA_EXACT_16[dtype] and bad.any():
      k = int(np.argmax(bad))
      failures.append(f"{name}: {int(bad.sum())} differ, e.g. at {every[k]!r}: pallax {got[k]!r}, "
                      f"XLA {want[k]!r}")
  print(f"\n{dtype}, exact mode, every value, against XLA:\n" + "\n".join(rows))
  assert not failures, "\n".join(failures)


# approx_math=True: bounds from the instructions' specifications (PTX ISA), on values of each
# domain whose results are normal numbers: (domain, ulps, absolute, relative); a result must be
# within one of the bounds given: float32 ulps from the truth (a number or a function of x), an
# absolute error, or a relative one.
APPROX_BOUNDS = {
    # ex2 (within 3 ulps) of t = x*log2(e) rounded: 2**t is off by |t| ln 2 2**-24 relative for
    # the product's rounding (|x| ulps) and |t| ln 2 1.3e-8 for log2(e)'s in float32 (0.22 |x|)
    "exp": ((-87, 88), lambda x: 3 + 1.25 * np.abs(x), None, None),
    "exp2": ((-125, 127), 2, None, None),
    "log": ((1e-30, 1e30), 2, 2.0 ** -21, None),   # lg2: absolute near 1, relative elsewhere
    "log2": ((1e-30, 1e30), 2, 2.0 ** -21, None),
    "sin": ((-math.pi, math.pi), None, 2.0 ** -20, None),
    "cos": ((-math.pi, math.pi), None, 2.0 ** -20, None),
    "tanh": ((-12, 12), None, None, 2.0 ** -10.9),
    "logistic": ((-30, 30), lambda x: 6 + 1.25 * np.abs(x), None, None),   # exp's, 1 / (1 + e)
}


def _within(x, got, true, ulp_bound, abs_bound, rel_bound) -> np.ndarray:
  ok = np.zeros(x.shape, bool)
  err = np.abs(got.astype(np.float64) - true)
  if ulp_bound is not None:
    ok |= ulps(got, true.astype(np.float32)) <= (ulp_bound(x) if callable(ulp_bound) else ulp_bound)
  if abs_bound is not None:
    ok |= err <= abs_bound
  if rel_bound is not None:
    ok |= err <= rel_bound * np.abs(true)
  return ok


@pytest.mark.parametrize("name", list(APPROX_BOUNDS))
def test_approx_math_is_within_its_bounds(name):
  fn, _, truth = FUNCTIONS[name]
  domain, *bounds = APPROX_BOUNDS[name]
  rng = np.random.default_rng(int.from_bytes(np.random.bytes(4), "little"))
  x = rng.uniform(*domain, 1 << 20).astype(np.float32)
  if name in ("log", "log2"):   # and around 1, where the error is absolute
    x = np.concatenate([x, rng.uniform(0.5, 2.0, 1 << 18).astype(np.float32)])
  got = np.asarray(_triton(fn, [jnp.asarray(x)], approx=True))
  exact = np.asarray(_triton(fn, [jnp.asarray(x)]))
  with np.errstate(all="ignore"):
    true = truth(x.astype(np.float64))
  normal = np.isfinite(true) & (np.abs(true) >= TINY)
  good = _within(x, got, true, *bounds) | ~normal
  with np.errstate(all="ignore"):
    err = np.abs(got.astype(np.float64) - true)
    rel = float((err / np.abs(true))[normal].max())
  print(f"\n{name} approx: at most {int(ulps(got, true.astype(np.float32))[normal].max())} ulps, "
        f"absolute {float(err[normal].max()):.3g}, relative {rel:.3g}")
  assert good.all(), (name, float(x[np.argmin(good)]), float(got[np.argmin(good)]))
  if name != "exp2":   # libdevice's exp2f, the exact mode's, is ex2.approx.f32 (no .ftz) itself
    assert (got != exact).any(), "approx_math=True computed the exact functions"


def _rows(x_ref, o_ref, smem, bar, fn=None):
  i = lax.axis_index("m")
  plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(i * 64, 64)], smem, bar)
  plgpu.barrier_wait(bar)
  smem[...] = fn(smem[...])
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(smem, o_ref.at[pl.ds(i * 64, 64)])
  plgpu.wait_smem_to_gmem(0)


def _gluon(fn, x):
  import functools
  return jax.jit(plgpu.kernel(
      functools.partial(_rows, fn=fn), out_type=S(x.shape, x.dtype), grid=(pl.cdiv(x.shape[0], 64),),
      grid_names=("m",), scratch_types=[plgpu.SMEM((64, x.shape[1]), x.dtype), plgpu.Barrier()]))(x)


def test_gluon_float32_math_is_xlas_bit_for_bit():
  """The Gluon backend's exact mode, denormal operands and results included."""
  from pallax._src.gluon import compile as gluon_compile
  before = gluon_compile.LAUNCHES
  rng = np.random.default_rng(int.from_bytes(np.random.bytes(4), "little"))
  failures = []
  for name, (fn, args, _) in _cases(rng).items():
    if name not in XLA_EXACT_F32 or len(args) > 1:
      continue
    x = jnp.asarray(args[0][:(args[0].size // 128) * 128].reshape(-1, 128)[:-3])   # a partial block
    got, want = np.asarray(_gluon(fn, x)), np.asarray(jax.jit(fn)(x))
    bad = ~_same(got, want)
    if bad.any():
      k = np.argwhere(bad)[0]
      failures.append(f"{name}: {int(bad.sum())} differ, e.g. at {float(x[tuple(k)])}: "
                      f"pallax {got[tuple(k)]!r}, XLA {want[tuple(k)]!r}")
  assert gluon_compile.LAUNCHES > before, "the Gluon backend was not used"
  assert not failures, "\n".join(failures)

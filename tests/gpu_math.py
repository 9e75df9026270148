"""The float math functions of the Triton backend against lax (XLA on the same GPU), elementwise:
the functions, their input domains, a distance in units of the last place, and the rule each
result must meet: within JAX's own Pallas test tolerance of lax (``rtol=1e-6``,
tests/pallas/ops_test.py), or at least as close as lax to the true value (float64 NumPy on the
same float32 inputs) where lax itself is the one further off."""
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import pallax as pl

UNARY = {   # name -> (function, low, high): inputs drawn in [low, high]
    "exp": (lax.exp, -80.0, 80.0), "exp2": (lax.exp2, -120.0, 120.0), "log": (lax.log, 1e-6, 1e6),
    "log2": (lax.log2, 1e-6, 1e6), "log1p": (lax.log1p, -0.9, 1e3), "expm1": (lax.expm1, -10.0, 10.0),
    "sin": (lax.sin, -10.0, 10.0), "cos": (lax.cos, -10.0, 10.0), "tan": (lax.tan, -1.5, 1.5),
    "sqrt": (lax.sqrt, 0.0, 1e6), "rsqrt": (lax.rsqrt, 1e-6, 1e6), "cbrt": (lax.cbrt, -1e3, 1e3),
    "tanh": (lax.tanh, -10.0, 10.0), "sinh": (lax.sinh, -10.0, 10.0), "cosh": (lax.cosh, -10.0, 10.0),
    "asin": (lax.asin, -1.0, 1.0), "acos": (lax.acos, -1.0, 1.0), "atan": (lax.atan, -100.0, 100.0),
    "asinh": (lax.asinh, -100.0, 100.0), "acosh": (lax.acosh, 1.0, 100.0),
    "atanh": (lax.atanh, -0.99, 0.99), "erf": (lax.erf, -4.0, 4.0), "erfc": (lax.erfc, -4.0, 9.0),
    "erf_inv": (lax.erf_inv, -0.999, 0.999), "logistic": (lax.logistic, -20.0, 20.0),
}
BINARY = {
    "pow": (lax.pow, (0.01, 10.0), (-8.0, 8.0)), "atan2": (lax.atan2, (-10.0, 10.0), (-10.0, 10.0)),
}


def ulps(a, b) -> np.ndarray:
  """|a - b| in units of the last place of float32 (0 where both are NaN or equal)."""
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  ia, ib = (np.where(x < 0, np.int64(-2**31) - x.view(np.int32), x.view(np.int32)).astype(np.int64)
            for x in (a, b))
  d = np.abs(ia - ib)
  return np.where(np.isnan(a) & np.isnan(b), 0, np.where(np.isnan(a) | np.isnan(b), 2**31, d))


def _kernel(fn, n_in):
  def kernel(*refs):
    refs[n_in][...] = fn(*[r[...] for r in refs[:n_in]])
  return kernel


# The true values: float64 functions of the same float32 inputs (None: no float64 reference).
TRUE = {
    "exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "log1p": np.log1p,
    "expm1": np.expm1, "sin": np.sin, "cos": np.cos, "tan": np.tan, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x), "cbrt": np.cbrt, "tanh": np.tanh, "sinh": np.sinh,
    "cosh": np.cosh, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
    "erf": np.vectorize(math.erf), "erfc": np.vectorize(math.erfc),
    "logistic": lambda x: 1 / (1 + np.exp(-x)), "pow": np.power, "atan2": np.arctan2,
    "erf_inv": None,
}
RTOL = 1e-6   # JAX's test_elementwise on the GPU


def run(fn, *args):
  """(Triton's result, lax's) of ``fn`` on the arrays ``args``, as float32 NumPy arrays."""
  call = pl.pallas_call(_kernel(fn, len(args)),
                        out_shape=jax.ShapeDtypeStruct(args[0].shape, jnp.float32))
  return np.asarray(call(*args)), np.asarray(jax.jit(fn)(*args))


def misses(name, got, want, args) -> np.ndarray:
  """Where ``got`` is neither within RTOL of lax's ``want`` nor as close as lax to the truth."""
  with np.errstate(all="ignore"):
    close = (np.abs(got.astype(np.float64) - want) <= RTOL * np.abs(want.astype(np.float64))) | \
        (ulps(got, want) == 0)
    if TRUE[name] is None:
      return ~close
    truth = TRUE[name](*[np.asarray(a, np.float64) for a in args]).astype(np.float32)
  return ~close & (ulps(got, truth) > ulps(want, truth))


def report(name, got, want, args) -> str:
  d = ulps(got, want)
  k = int(np.argmax(d))
  x = [float(np.asarray(a)[k]) for a in args]
  return f"{name:10} max {int(d[k]):>6} ulps from lax at {x}: triton {got[k]!r} lax {want[k]!r}"


def inputs(key, low, high, n=4096):
  return jax.random.uniform(key, (n,), jnp.float32, low, high)


# JAX's own GPU test points (tests/pallas/ops_test.py): test_elementwise and its scalar form at
# rtol 1e-6, test_pow at NumPy's default rtol (1e-7), test_erf_inv exactly.
JAX_ELEMENTWISE = ("exp", "exp2", "sin", "cos", "log", "sqrt", "expm1", "log1p", "cbrt", "rsqrt",
                   "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh",
                   "atanh")
JAX_ELEMENTWISE_INPUTS = (0.42, 2.4, 1.4)
JAX_ERF_INV_INPUTS = (-3.2, -1.0, -0.999517, -0.4, 0.0, 0.72, 0.999517, 1.0, 2.4)

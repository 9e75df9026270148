"""Which GPU function computes each float math primitive of lax, in the two math modes.

Shared by the GPU backends' rule tables (Triton, Gluon), which write a choice in their own
language (``render``). Operands are float32 or float64 here: float16/bfloat16 math was legalized
to float32 (``gpu/legalize.py``).

Exact (the default): the functions XLA computes on an NVIDIA GPU, found by running both on the
same inputs (``benchmarks/probes/probe_math_xla.py``, on an H200):
- libdevice's function where XLA calls it (``exp`` is ``__nv_expf``, ``log``, ``sin``, ...);
- XLA's own expansions: ``exp2(x) = exp(x * ln 2)`` and ``log2(x) = log(x) * log2(e)`` with the
  constant and the product rounded to the operand's type, ``logistic(x) = 1 / (1 + exp(-x))``;
- for float32 ``sqrt`` and ``rsqrt`` the GPU's ``sqrt.approx.f32`` and ``rsqrt.approx.f32``, which
  XLA's are (its ``sqrt`` is not the correctly rounded ``sqrt.rn``).
libdevice is the copy XLA links (``gpu/compile.py``), so its functions give XLA's bits where XLA
calls them (the inverse trigonometric and hyperbolic functions and ``cbrt`` too). Where XLA
computes a function its own way (``tanh``, ``erf``, ``erfc``, ``pow``), libdevice's, as JAX Pallas's
Triton lowering does: a few ulps from XLA (``tests/test_math_gpu.py`` measures how far).

Approximate (``approx_math=True`` in ``pallax.triton.CompilerParams`` or ``plgpu.CompilerParams``):
float32 ``exp``, ``exp2``, ``log``, ``log2``, ``sin``, ``cos``, ``tanh`` and ``logistic`` become the
GPU's special-function instructions, as in Mosaic GPU's ``approx_math``; the error bounds measured
are in ``docs/triton.md``. Float64 math is the same in both modes.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
from jax import lax

from pallax._src.gpu import expr as ex


@dataclasses.dataclass(frozen=True)
class Fn:
  """``out_scale * f(in_scale * x, ...)``: ``f`` is a libdevice function (its name without the
  ``__nv_`` prefix and ``f`` suffix) or one float32 PTX instruction."""
  libdevice: str | None = None
  ptx: str | None = None
  in_scale: float | None = None
  out_scale: float | None = None


LN2 = math.log(2.0)
LOG2E = 1.0 / math.log(2.0)

_LIBDEVICE = {
    lax.exp_p: "exp", lax.log_p: "log", lax.log1p_p: "log1p", lax.expm1_p: "expm1",
    lax.sin_p: "sin", lax.cos_p: "cos", lax.tan_p: "tan", lax.sinh_p: "sinh", lax.cosh_p: "cosh",
    lax.tanh_p: "tanh", lax.asin_p: "asin", lax.acos_p: "acos", lax.atan_p: "atan",
    lax.asinh_p: "asinh", lax.acosh_p: "acosh", lax.atanh_p: "atanh", lax.cbrt_p: "cbrt",
    lax.erf_p: "erf", lax.erfc_p: "erfc", lax.erf_inv_p: "erfinv", lax.atan2_p: "atan2",
    lax.pow_p: "pow", lax.nextafter_p: "nextafter", lax.sqrt_p: "sqrt", lax.rsqrt_p: "rsqrt",
}
EXACT = {p: Fn(libdevice=f) for p, f in _LIBDEVICE.items()}
# exp2 is libdevice's (JAX Pallas's choice), not XLA's exp(x * ln 2): bit for bit XLA's would
# cost JAX's Triton attention, whose inner loop calls exp2, a third of its speed
# (docs/performance.md); libdevice's exp2f is within 2 ulps.
EXACT[lax.exp2_p] = Fn(libdevice="exp2")
EXACT[lax.log2_p] = Fn(libdevice="log", out_scale=LOG2E)
# float32 only (float64 keeps libdevice's, which are XLA's there too)
EXACT_F32 = {lax.sqrt_p: Fn(ptx="sqrt.approx.f32"), lax.rsqrt_p: Fn(ptx="rsqrt.approx.f32")}
APPROX_F32 = {
    lax.exp_p: Fn(ptx="ex2.approx.ftz.f32", in_scale=LOG2E),
    lax.exp2_p: Fn(ptx="ex2.approx.ftz.f32"),
    lax.log_p: Fn(ptx="lg2.approx.ftz.f32", out_scale=LN2),
    lax.log2_p: Fn(ptx="lg2.approx.ftz.f32"),
    lax.sin_p: Fn(ptx="sin.approx.f32"), lax.cos_p: Fn(ptx="cos.approx.f32"),
    lax.tanh_p: Fn(ptx="tanh.approx.f32"),
}

def choose(prim, dtype, approx: bool, compute_capability: int = 90) -> Fn:
  """The function computing ``prim`` on ``dtype`` operands (float32 or float64) for a GPU of
  ``compute_capability`` (``tanh.approx`` needs 7.5)."""
  if np.dtype(dtype) == np.float32:
    if approx and prim in APPROX_F32 and (prim is not lax.tanh_p or compute_capability >= 75):
      return APPROX_F32[prim]
    if prim in EXACT_F32:
      return EXACT_F32[prim]
  return EXACT[prim]


def render(fn: Fn, xs: list, out, libdevice: str, ns: str) -> ex.Expr:
  """``fn`` of the operands ``xs`` as an expression of the language ``ns`` (``tl``, ``gl``) whose
  libdevice module is written ``libdevice``; ``out`` is the result's aval."""
  dtype = np.dtype(xs[0].dtype)
  if fn.in_scale is not None:
    xs = [ex.binary("*", xs[0], _constant(fn.in_scale, dtype))] + list(xs[1:])
  if fn.ptx is not None:
    e = ex.Call(f"{ns}.inline_asm_elementwise", (f"{fn.ptx} $0, $1;", "=r,r", ex.Seq((xs[0],))),
                (("dtype", ex.Token(f"{ns}.float32")), ("is_pure", True), ("pack", 1)),
                dtype=dtype, shape=tuple(out.shape))
  else:
    e = ex.call(f"{libdevice}.{fn.libdevice}", *xs, dtype=dtype, shape=out.shape)
  if fn.out_scale is not None:
    e = ex.binary("*", e, _constant(fn.out_scale, dtype))
  return e


def logistic(x, out, exp_fn: Fn, libdevice: str, ns: str) -> ex.Expr:
  """``1 / (1 + exp(-x))``, as XLA expands it (its division is the GPU's ``div.full.f32``, which
  is Triton's ``/`` too)."""
  dtype = np.dtype(x.dtype)
  minus_x = ex.Op("-", (x,), dtype=dtype, shape=x.shape)
  e = render(exp_fn, [minus_x], out, libdevice, ns)
  return ex.binary("/", _constant(1.0, dtype), ex.binary("+", _constant(1.0, dtype), e))


def _constant(value: float, dtype) -> ex.Lit:
  """``value`` rounded to ``dtype`` (XLA rounds its constants so)."""
  return ex.Lit(float(np.asarray(value, dtype)), dtype=np.dtype(dtype))

"""Float math on the GPU backends in its two modes (``gpu/math_functions.py``): XLA's functions by
default, the GPU's fast approximations with ``approx_math=True``. On any machine: which function
each math equation of a kernel became (the Triton writer records it), the instructions in the
PTX, the flag reaching both backends, and the interpreter ignoring it. The comparisons with XLA
on a GPU are in ``test_math_gpu.py``."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu
import pallax.triton as plt_
from pallax._src.triton import codegen

S = jax.ShapeDtypeStruct
LN2, LOG2E = float(np.float32(np.log(2))), float(np.float32(1 / np.log(2)))

UNARY = {"exp": jnp.exp, "exp2": jnp.exp2, "log": jnp.log, "log2": jnp.log2, "log1p": jnp.log1p,
         "expm1": jnp.expm1, "sin": jnp.sin, "cos": jnp.cos, "tan": jnp.tan, "sqrt": jnp.sqrt,
         "rsqrt": lax.rsqrt, "cbrt": jnp.cbrt, "tanh": jnp.tanh, "sinh": jnp.sinh, "cosh": jnp.cosh,
         "asin": jnp.arcsin, "acos": jnp.arccos, "atan": jnp.arctan, "asinh": jnp.arcsinh,
         "acosh": jnp.arccosh, "atanh": jnp.arctanh, "erf": lax.erf, "erfc": lax.erfc,
         "logistic": jax.nn.sigmoid}
BINARY = {"pow": lax.pow, "atan2": jnp.arctan2}

# What each float32 function must become: (libdevice function or PTX instruction, the factor on
# its operand, the factor on its result), by default (XLA's choice on the GPU) ...
LIBDEVICE = {n: (f"libdevice {n}", None, None) for n in list(UNARY) + list(BINARY)}
EXACT = dict(LIBDEVICE, log2=("libdevice log", None, LOG2E),
             sqrt=("ptx sqrt.approx.f32", None, None), rsqrt=("ptx rsqrt.approx.f32", None, None),
             logistic=("libdevice exp", None, None))
# ... and with approx_math=True (Mosaic GPU's approximations)
APPROX = dict(EXACT, exp=("ptx ex2.approx.ftz.f32", LOG2E, None),
              exp2=("ptx ex2.approx.ftz.f32", None, None), log=("ptx lg2.approx.ftz.f32", None, LN2),
              log2=("ptx lg2.approx.ftz.f32", None, None), sin=("ptx sin.approx.f32", None, None),
              cos=("ptx cos.approx.f32", None, None), tanh=("ptx tanh.approx.f32", None, None),
              logistic=("ptx ex2.approx.ftz.f32", LOG2E, None))


def _kernel(fn, n_in):
  def kernel(*refs):
    refs[n_in][...] = fn(*[r[...] for r in refs[:n_in]])
  return kernel


def _call(fn, n_in, shape, dtype, compiler_params):
  return pl.pallas_call(_kernel(fn, n_in), out_shape=S(shape, dtype),
                        compiler_params=compiler_params)


def _params(f, *args):
  (eqn,) = [e for e in jax.make_jaxpr(f)(*args).eqns if e.primitive.name == "pallas_call"]
  return eqn.params["params"]


def _recorded(name, dtype=jnp.float32, compiler_params=None, cc=90):
  """What the Triton writer recorded for the math of a kernel applying ``name``."""
  fn, n_in = (UNARY[name], 1) if name in UNARY else (BINARY[name], 2)
  x = S((8, 100), dtype)
  ks = codegen.generate(_params(_call(fn, n_in, x.shape, dtype, compiler_params), *[x] * n_in), cc)
  out = []
  for prim, f in ks.math:
    what = f"libdevice {f.libdevice}" if f.libdevice else f"ptx {f.ptx}"
    scale = lambda s: None if s is None else float(np.float32(s))  # noqa: E731
    out.append((prim, (what, scale(f.in_scale), scale(f.out_scale))))
  return out, ks


@pytest.mark.parametrize("name", list(UNARY) + list(BINARY))
def test_each_function_is_xlas_by_default_and_the_fast_one_with_approx_math(name):
  got, _ = _recorded(name)
  assert got == [(name, EXACT[name])]
  got, _ = _recorded(name, compiler_params=plt_.CompilerParams(approx_math=True))
  assert got == [(name, APPROX[name])]


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("name", ["exp", "log2", "sqrt", "tanh", "logistic"])
def test_16_bit_math_is_the_float32_function(name, dtype):
  got, _ = _recorded(name, dtype)
  assert got == [(name, EXACT[name])]
  got, _ = _recorded(name, dtype, plt_.CompilerParams(approx_math=True))
  assert got == [(name, APPROX[name])]


def test_the_dict_form_of_compiler_params_selects_the_mode_too():
  got, _ = _recorded("exp", compiler_params={"triton": {"approx_math": True, "num_warps": 4}})
  assert got == [("exp", APPROX["exp"])]
  got, _ = _recorded("exp", compiler_params={"triton": {"num_warps": 4}})
  assert got == [("exp", EXACT["exp"])]


def test_tanh_approx_needs_turing():
  got, _ = _recorded("tanh", compiler_params=plt_.CompilerParams(approx_math=True), cc=70)
  assert got == [("tanh", EXACT["tanh"])]
  got, _ = _recorded("tanh", compiler_params=plt_.CompilerParams(approx_math=True), cc=75)
  assert got == [("tanh", APPROX["tanh"])]


def _instructions(ptx: str) -> set:
  return set(re.findall(r"\b((?:ex2|lg2|sin|cos|tanh|sqrt|rsqrt|div)\.[a-z0-9.]+)", ptx))


def _math_kernel(x_ref, o_ref):
  x = x_ref[...]
  o_ref[...] = (jnp.exp(x) + jnp.log(x) + jnp.sin(x) + jnp.cos(x) + jnp.tanh(x) + jnp.sqrt(x)
                + lax.rsqrt(x) + jax.nn.sigmoid(x))


@pytest.mark.parametrize("cc", [80, 90])
def test_the_ptx_has_the_instructions_of_each_mode(cc):
  x = S((4, 160), jnp.float32)
  exact, approx = (
      _instructions(plt_.lower(lambda a: pl.pallas_call(
          _math_kernel, out_shape=x, compiler_params=plt_.CompilerParams(approx_math=m))(a),
          x, compute_capability=cc)[0].ptx)
      for m in (False, True))
  # XLA's sqrt and rsqrt, and its division (logistic), in both modes; libdevice's sin, cos,
  # tanh and log are code, not these instructions
  assert {"sqrt.approx.f32", "rsqrt.approx.f32", "div.full.f32"} <= exact & approx
  assert not {"sqrt.rn.f32", "lg2.approx.ftz.f32", "sin.approx.f32", "cos.approx.f32",
              "tanh.approx.f32"} & exact
  assert {"ex2.approx.ftz.f32", "lg2.approx.ftz.f32", "sin.approx.f32", "cos.approx.f32",
          "tanh.approx.f32"} <= approx


def test_libdevice_keeps_denormals_as_xla_does():
  """Triton flushes denormals in libdevice by default; XLA does not (``sin(1e-40)`` is 1e-40
  there): the compiled PTX uses no flushing instruction for a libdevice function."""
  x = S((256,), jnp.float32)
  (k,) = plt_.lower(lambda a: pl.pallas_call(_kernel(jnp.sin, 1), out_shape=x)(a), x)
  assert re.search(r"\bfma\.rn\.f32\b", k.ptx) and not re.search(r"\.ftz\.", k.ptx)


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("shape", [(1,), (37,), (3, 130)], ids=["size1", "odd", "partial_rows"])
def test_the_interpreter_computes_lax_in_both_modes(dtype, shape):
  """approx_math is a GPU compiler option: the interpreter, the reference, gives lax's values."""
  x = jax.random.uniform(jax.random.key(sum(shape)), shape, jnp.float32, 0.1, 8.0).astype(dtype)
  fn = lambda v: jnp.exp(v) - jnp.log(v) + jnp.tanh(v) * jnp.sin(v) + jax.nn.sigmoid(v)  # noqa: E731
  want = np.asarray(fn(x), np.float32)
  for mode in (False, True):
    got = _call(fn, 1, shape, dtype, plt_.CompilerParams(approx_math=mode))(x)
    # one kernel and the same XLA expression: equal but for XLA's fusion of the two (float32:
    # a few ulps; 16-bit: one rounding of the result)
    rtol = 1e-6 if dtype == jnp.float32 else float(jnp.finfo(dtype).eps)
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=rtol, atol=0)


# --- Gluon (Mosaic GPU kernels) ---------------------------------------------------------------

BLOCK = 64


def _math_rows(x_ref, o_ref, smem, bar):
  i = lax.axis_index("m")
  plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(i * BLOCK, BLOCK)], smem, bar)
  plgpu.barrier_wait(bar)
  x = smem[...]
  smem[...] = jnp.exp(x) + jnp.exp2(x) + jnp.log(x) + jnp.tanh(x) + jnp.sqrt(x) + jax.nn.sigmoid(x)
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(smem, o_ref.at[pl.ds(i * BLOCK, BLOCK)])
  plgpu.wait_smem_to_gmem(0)


def _gluon_math(x, approx=False):
  return plgpu.kernel(
      _math_rows, out_type=S(x.shape, x.dtype), grid=(x.shape[0] // BLOCK,), grid_names=("m",),
      scratch_types=[plgpu.SMEM((BLOCK, x.shape[1]), x.dtype), plgpu.Barrier()],
      compiler_params=plgpu.CompilerParams(approx_math=approx))(x)


def _gluon_source(approx=False):
  (k,) = plgpu.lower(_gluon_math, S((128, 64), jnp.float32), approx=approx)
  return k.source, _instructions(k.ptx)


def test_gluon_math_is_the_triton_backends_choice():
  source, ptx = _gluon_source()
  calls = re.findall(r"(gl\.extra\.libdevice\.\w+|inline_asm_elementwise\('[^']*')\((\w*)( \* [0-9.]+)?",
                     source)
  assert [(f, s) for f, _, s in calls] == [
      ("gl.extra.libdevice.exp", ""), ("gl.extra.libdevice.exp2", ""),
      ("gl.extra.libdevice.log", ""), ("gl.extra.libdevice.tanh", ""),
      ("gl.extra.libdevice.exp", "")], source   # the last: logistic's exp(-x)
  assert "'sqrt.approx.f32 $0, $1;'" in source and "1.0 / (1.0 + gl.extra.libdevice.exp(-" in source
  assert "sqrt.approx.f32" in ptx and not {"tanh.approx.f32", "lg2.approx.ftz.f32"} & ptx


def test_plgpu_compiler_params_approx_math_reaches_gluon():
  source, ptx = _gluon_source(approx=True)
  assert "tanh.approx.f32" in ptx and "gl.extra.libdevice.tanh" not in source

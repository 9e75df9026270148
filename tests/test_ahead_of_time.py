"""Lowering for CUDA ahead of time: `jit(f).trace(x).lower(lowering_platforms=("cuda",))` and
`jax.export(..., platforms=("cuda",))`, on a machine without a GPU (CI) and, exported, run on one.

The Triton backend compiles a kernel to PTX while lowering and puts the PTX in XLA's own kernel
call (`__gpu$xla.gpu.ptx`), so the lowered module is self-contained; without a GPU to ask, the
target must be named. Mosaic GPU kernels go through jaxlib's Triton kernel call, which needs JAX's
CUDA plugin installed to be lowered at all."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import pallax as pl
import pallax.mosaic_gpu as plgpu
import pallax.triton as plt

PTX_CALL = "__gpu$xla.gpu.ptx"


def _scale_shift(x_ref, o_ref):
  o_ref[...] = x_ref[...] * 3.0 - 1.0


def _call(compiler_params=None):
  def f(x):
    block = pl.BlockSpec((128,), lambda i: (i,))
    return pl.pallas_call(_scale_shift, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          grid=(pl.cdiv(x.shape[0], 128),), in_specs=[block], out_specs=block,
                          compiler_params=compiler_params)(x)
  return f


def _exported(f, x):
  return export.export(jax.jit(f), platforms=("cuda",),
                       disabled_checks=[export.DisabledSafetyCheck.custom_call(PTX_CALL)])(x)


def _no_gpu():
  if jax.devices()[0].platform == "gpu":
    pytest.skip("about a machine without a GPU")


def test_triton_kernel_lowers_for_cuda_without_a_gpu_for_the_target_named():
  _no_gpu()
  x = jax.ShapeDtypeStruct((300,), jnp.float32)
  text = jax.jit(_call(plt.CompilerParams(compute_capability=90))).trace(x).lower(
      lowering_platforms=("cuda",)).as_text()
  assert PTX_CALL in text and ".target sm_90" in text
  exp = _exported(_call(plt.CompilerParams(compute_capability=80)), x)
  assert exp.platforms == ("cuda",) and exp.out_avals[0].shape == (300,)


def test_without_a_gpu_or_a_target_the_error_says_how_to_name_one(monkeypatch):
  _no_gpu()
  x = jax.ShapeDtypeStruct((300,), jnp.float32)
  with pytest.raises(ValueError, match="without a GPU.*CompilerParams\\(compute_capability=90\\)"):
    jax.jit(_call()).trace(x).lower(lowering_platforms=("cuda",))
  monkeypatch.setenv("PALLAX_TRITON_COMPUTE_CAPABILITY", "80")
  assert ".target sm_80" in jax.jit(_call()).trace(x).lower(lowering_platforms=("cuda",)).as_text()


def test_a_mosaic_gpu_kernel_without_jaxs_cuda_plugin_says_what_to_install():
  _no_gpu()
  from jax._src.lib import gpu_triton
  if hasattr(gpu_triton, "TritonKernel"):
    pytest.skip("JAX's CUDA plugin is installed here")

  @plgpu.kernel(out_shape=jax.ShapeDtypeStruct((128,), jnp.float32))
  def double(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2
  x = jax.ShapeDtypeStruct((128,), jnp.float32)
  with pytest.raises(RuntimeError, match="CUDA plugin.*jax\\[cuda12\\]"):
    jax.jit(double).trace(x).lower(lowering_platforms=("cuda",))


@pytest.mark.gpu
def test_an_exported_triton_kernel_runs_on_the_gpu():
  if jax.devices()[0].platform != "gpu":
    pytest.skip("needs an NVIDIA GPU")
  x = jax.random.normal(jax.random.key(7), (300,), jnp.float32)
  exp = _exported(_call(plt.CompilerParams(compute_capability=80)), jax.ShapeDtypeStruct(x.shape, x.dtype))
  # rtol 1e-6: ptxas may contract the multiply and subtract into one fma (a rounding less)
  np.testing.assert_allclose(np.asarray(exp.call(x)), np.asarray(x) * 3.0 - 1.0, rtol=1e-6, atol=1e-6)

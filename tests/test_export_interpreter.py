"""Interpreted kernels under ``jax.export`` and ahead-of-time lowering for another platform.

The checked interpreter reports failed checks through host callbacks, which an exported module
cannot hold (JAX serializes none) and a lowering for a platform without a local device cannot
emit: pallax says so and how to lower without them. Shape polymorphism: symbolic grids export
(tests/test_shape_polymorphism.py); a symbolic block shape is refused with words JAX users know. (The Triton
backend lowered for CUDA on a machine without a GPU: tests/test_ahead_of_time.py.)
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import pallax as pl

pytestmark = pytest.mark.interpreter   # about the interpreter's own lowering

S = jax.ShapeDtypeStruct
UNCHECKED = pl.InterpretParams(check_bounds=False)


def _affine(interpret):
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 3.0 - 1.0
  spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
  return jax.jit(lambda x: pl.pallas_call(
      kernel, out_shape=S(x.shape, x.dtype), grid=(x.shape[0] // 8,), in_specs=[spec],
      out_specs=spec, interpret=interpret)(x))


def _x(shape=(24, 128)):
  return jnp.asarray(np.random.default_rng(7).standard_normal(shape).astype(np.float32))


def test_export_of_a_checked_kernel_says_what_to_do():
  with pytest.raises(NotImplementedError, match=r"pallas_call kernel: .*host callbacks, which "
                     r"jax\.export cannot serialize; pass interpret=pl\.InterpretParams\("
                     r"check_bounds=False\)"):
    export.export(_affine(True), platforms=["cpu"])(S((24, 128), jnp.float32))


def test_export_without_the_checks_runs_the_kernel():
  x = _x()
  exp = export.export(_affine(UNCHECKED), platforms=["cpu"])(S(x.shape, x.dtype))
  np.testing.assert_allclose(exp.call(x), np.asarray(x) * 3 - 1, rtol=1e-6, atol=1e-6)
  assert "callback" not in exp.mlir_module()


def test_lowering_for_a_platform_without_a_device_here():
  if any(d.platform == "gpu" for d in jax.devices()):
    pytest.skip("this machine has a CUDA device: callbacks can be lowered for it")
  spec = S((24, 128), jnp.float32)
  with pytest.raises(NotImplementedError, match=r"a lowering for cuda without such a device "
                     r"here cannot hold"):
    _affine(True).trace(spec).lower(lowering_platforms=("cuda",))
  text = _affine(UNCHECKED).trace(spec).lower(lowering_platforms=("cuda",)).as_text()
  assert "custom_call" not in text or "callback" not in text   # no host callback in the module


def test_symbolic_grids_export():
  """(More in tests/test_shape_polymorphism.py.)"""
  w, = export.symbolic_shape("w")

  def copy(x):
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
                          out_shape=S(x.shape, x.dtype), grid=(pl.cdiv(x.shape[0], 8),),
                          in_specs=[spec], out_specs=spec, interpret=UNCHECKED)(x)

  exp = export.export(jax.jit(copy), platforms=["cpu"])(S((w, 128), jnp.float32))
  x = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (20, 128)), jnp.float32)
  np.testing.assert_array_equal(np.asarray(exp.call(x)), np.asarray(x))


def test_whole_array_blocks_of_symbolic_shape_are_refused_with_jax_words():
  w, h = export.symbolic_shape("w, h")

  def double(x):
    return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., 2 * x_ref[...]),
                          out_shape=S(x.shape, x.dtype), interpret=UNCHECKED)(x)

  with pytest.raises(ValueError, match=r"shape polymorphism for Pallas does not support "
                     r"dynamically-shaped blocks\. Block spec for args\[0\] has block_shape: "
                     r"\(w, h\)"):
    export.export(jax.jit(double), platforms=["cpu"])(S((w, h), jnp.float32))


def test_symbolic_block_sizes_are_refused_with_jax_words():
  w, = export.symbolic_shape("w")

  def halves(x):
    spec = pl.BlockSpec((x.shape[0] // 2, 128), lambda i: (i, 0))
    return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
                          out_shape=S(x.shape, x.dtype), grid=(2,), in_specs=[spec],
                          out_specs=spec, interpret=UNCHECKED)(x)

  with pytest.raises(ValueError, match="does not support dynamically-shaped blocks"):
    export.export(jax.jit(halves), platforms=["cpu"])(S((w, 128), jnp.float32))

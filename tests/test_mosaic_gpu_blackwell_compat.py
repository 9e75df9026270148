"""Blackwell (issue 28) behaviours that JAX's own ``TCGen05`` test classes of
``mosaic_gpu_test.py`` use and the interpreter lacked (found by running them through an import
alias, the GPU faked as sm_100a): each against a jnp reference on random inputs, and each new
check with a kernel that breaks it.

Tolerances: integer products exactly.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax.mosaic_gpu as plgpu

pytestmark = [pytest.mark.interpreter, pytest.mark.gluon_refuses("Blackwell's (sm_100a)")]

S = jax.ShapeDtypeStruct


def rand_bytes(key, shape, dtype):
  info = jnp.iinfo(dtype)
  return jax.random.randint(jax.random.key(key), shape, info.min, info.max + 1, jnp.int32).astype(dtype)


def byte_matmul(m, n, k, a_dtype, b_dtype):
  """a (m, k) @ b (k, n) of bytes into an int32 accumulator in TMEM, in one MMA."""
  @plgpu.kernel(out_shape=S((m, n), jnp.int32), scratch_shapes=dict(
      a_smem=plgpu.SMEM((m, k), a_dtype), b_smem=plgpu.SMEM((k, n), b_dtype),
      acc=plgpu.TMEM((m, n), jnp.int32), done=plgpu.Barrier(orders_tensor_core=True)))
  def kernel(a_ref, b_ref, o_ref, a_smem, b_smem, acc, done):
    a_smem[...] = a_ref[...]
    b_smem[...] = b_ref[...]
    plgpu.commit_smem()
    plgpu.tcgen05_mma(acc, a_smem, b_smem, done, accumulate=False)
    plgpu.barrier_wait(done)
    o_ref[...] = plgpu.async_load_tmem(acc)
  return kernel


@pytest.mark.parametrize("m,n", [(128, 64), (64, 32)])
def test_uint8_products_in_int32(m, n):
  """Unsigned bytes (kind::i8 with unsigned operands): every value 0..255, products summed
  exactly in int32 (no wrap to signed bytes)."""
  k = 128
  a, b = rand_bytes(1, (m, k), jnp.uint8), rand_bytes(2, (k, n), jnp.uint8)
  out = byte_matmul(m, n, k, jnp.uint8, jnp.uint8)(a, b)
  np.testing.assert_array_equal(out, np.asarray(a, np.int32) @ np.asarray(b, np.int32))


def test_signed_and_unsigned_bytes_do_not_mix():
  a, b = rand_bytes(3, (128, 128), jnp.int8), rand_bytes(4, (128, 32), jnp.uint8)
  with pytest.raises(ValueError, match="MMA requires A and B to have the same element type"):
    byte_matmul(128, 32, 128, jnp.int8, jnp.uint8)(a, b)

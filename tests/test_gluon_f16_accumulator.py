"""wgmma accumulating in float16 (``pl.run_state(body)(plgpu.ACC.init(x))`` with ``x`` of
float16, and ``plgpu.ACC(shape, jnp.float16)``): the Gluon backend keeps the accumulator in
float16 registers, as Mosaic GPU does (192 wide: pieces of 128 and 64). A float16 value given to
``pl.run_state`` that no wgmma accumulates into stays a value the body reads. Checked in the
interpreter against float64 NumPy with JAX's own tolerance for these tests (rtol=2e-3: float16
sums of products of values in [0, 1)), and on a GPU the Gluon kernel against the interpreter
(conftest.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax as pl
import pallax.mosaic_gpu as plgpu

pytestmark = pytest.mark.interpreter

S = jax.ShapeDtypeStruct
F16_ACC = dict(rtol=2e-3)


def uniform(seed, shape):
  return np.random.default_rng(seed).uniform(0.05, 1.0, shape).astype(np.float16)


def init_then_wgmma(m, k, n, scale_first: bool):
  """o = (i * 2 if scale_first else i) + a @ b, accumulated in float16 from ACC.init(i)."""
  def body(a_ref, b_ref, i_ref, o_ref, a_smem, b_smem, bar):
    plgpu.copy_gmem_to_smem(a_ref, a_smem, bar)
    plgpu.copy_gmem_to_smem(b_ref, b_smem, bar)
    plgpu.barrier_wait(bar)

    def scope(acc_ref):
      if scale_first:
        acc_ref[...] *= 2
      plgpu.wgmma(acc_ref, a_smem, b_smem)
      plgpu.wgmma_wait(0)
    o_ref[...] = pl.run_state(scope)(plgpu.ACC.init(i_ref[...]))

  return plgpu.kernel(body, out_shape=S((m, n), jnp.float16),
                      scratch_shapes=[plgpu.SMEM((m, k), jnp.float16), plgpu.SMEM((k, n), jnp.float16),
                                      plgpu.Barrier(num_arrivals=2)])


@pytest.mark.parametrize("m,k,n", [(64, 128, 128), (64, 128, 192), (128, 64, 64)])
@pytest.mark.parametrize("scale_first", [False, True])
def test_an_accumulator_initialized_from_float16(m, k, n, scale_first):
  a, b, i = uniform(1, (m, k)), uniform(2, (k, n)), uniform(3, (m, n)) * np.float16(10)
  got = init_then_wgmma(m, k, n, scale_first)(a, b, i)
  assert got.dtype == np.float16
  want = i.astype(np.float64) * (2 if scale_first else 1) + a.astype(np.float64) @ b.astype(np.float64)
  np.testing.assert_allclose(np.asarray(got, np.float64), want, **F16_ACC)


def test_a_float16_value_no_wgmma_accumulates_into_is_read():
  """pl.run_state over a float16 value that the body only reads (no wgmma into it)."""
  m, n = 64, 128
  x = uniform(4, (m, n))

  def body(x_ref, o_ref):
    def scope(ref):
      o_ref[...] = ref[...] * 3
    pl.run_state(scope)(x_ref[...])

  got = plgpu.kernel(body, out_shape=S((m, n), jnp.float16))(x)
  np.testing.assert_array_equal(got, (x * np.float16(3)).astype(np.float16))


@pytest.mark.parametrize("n", [128, 192])
def test_a_float16_accumulator_allocated_with_acc(n):
  m, k = 64, 64
  a, b = uniform(5, (m, k)), uniform(6, (k, n))

  def body(a_ref, b_ref, o_ref, a_smem, b_smem, bar):
    plgpu.copy_gmem_to_smem(a_ref, a_smem, bar)
    plgpu.copy_gmem_to_smem(b_ref, b_smem, bar)
    plgpu.barrier_wait(bar)

    def scope(acc_ref):
      plgpu.wgmma(acc_ref, a_smem, b_smem)
      plgpu.wgmma_wait(0)
      return acc_ref[...]
    o_ref[...] = pl.run_scoped(scope, plgpu.ACC((m, n), jnp.float16))

  kernel = plgpu.kernel(body, out_shape=S((m, n), jnp.float16),
                        scratch_shapes=[plgpu.SMEM((m, k), jnp.float16), plgpu.SMEM((k, n), jnp.float16),
                                        plgpu.Barrier(num_arrivals=2)])
  want = a.astype(np.float64) @ b.astype(np.float64)
  np.testing.assert_allclose(np.asarray(kernel(a, b), np.float64), want, **F16_ACC)

"""A tile loaded from SMEM is read in the layout its first user computes in (Gluon reads shared
memory in any register layout): an epilogue adding a bias tile from SMEM to a wgmma accumulator
reads the bias in the accumulator's layout, and converts nothing (a conversion moves data
through shared memory, which JAX's hopper matmul with a float32 ``c`` cannot spare: 8 of its
test configurations needed 30 KiB more than sm_90 has). Checked on the recorded conversions, in
the interpreter against numpy, and on a Hopper GPU against the interpreter."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax as pl
import pallax.mosaic_gpu as plgpu
from pallax._src.gluon import layouts as L


def _bias_epilogue(a, b, c, interpret=False):
  """``a @ b + c`` for one (64, n) tile: c arrives in SMEM by TMA, the sum goes out by TMA."""
  n = b.shape[1]

  def body(a_ref, b_ref, c_ref, o_ref, a_smem, b_smem, c_smem, bar):
    plgpu.copy_gmem_to_smem(a_ref, a_smem, bar)
    plgpu.copy_gmem_to_smem(b_ref, b_smem, bar)
    plgpu.copy_gmem_to_smem(c_ref, c_smem, bar)
    plgpu.barrier_wait(bar)

    def scope(acc):
      plgpu.wgmma(acc, a_smem, b_smem)
      plgpu.wgmma_wait(0)
      c_smem[...] = c_smem[...] + acc[...]
    pl.run_scoped(scope, plgpu.ACC((64, n)))
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(c_smem, o_ref)
    plgpu.wait_smem_to_gmem(0)

  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((64, n), jnp.float32),
                      scratch_types=[plgpu.SMEM(a.shape, a.dtype), plgpu.SMEM(b.shape, b.dtype),
                                     plgpu.SMEM((64, n), jnp.float32), plgpu.Barrier(num_arrivals=3)],
                      interpret=interpret)(a, b, c)


def _inputs(n, seed):
  ka, kb, kc = jax.random.split(jax.random.key(seed), 3)
  return (jax.random.normal(ka, (64, 64), jnp.float16), jax.random.normal(kb, (64, n), jnp.float16),
          jax.random.normal(kc, (64, n), jnp.float32))


@pytest.mark.parametrize("n", [64, 128])
def test_the_bias_is_read_in_the_accumulators_layout(n):
  s = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in _inputs(n, 0)]
  (k,) = plgpu.lower(_bias_epilogue, *s)
  assert k.generated.conversions == ()   # before: the accumulator converted to the bias's layout
  assert any(isinstance(x, L.Layout) and x.kind == "wgmma" for x in k.generated.layouts)


@pytest.mark.parametrize("n", [64, 128])
def test_the_sum_is_the_product_plus_the_bias(n):
  a, b, c = _inputs(n, 1)
  want = np.asarray(a, np.float32) @ np.asarray(b, np.float32) + np.asarray(c)
  got = np.asarray(_bias_epilogue(a, b, c))
  # wgmma sums fp16 products in float32 in its own order: relative to the output's scale.
  np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3 * float(np.abs(want).max()))

"""wgmmas into column views of an accumulator (``plgpu.wgmma(acc.at[:, 128:], a, b)``, as JAX's
``test_wgmma_sliced_acc_flip``): the Gluon backend holds such an accumulator as column pieces
that make up every view (``acc_pieces.for_views``), each view's wgmma writes its pieces, and a
read of the whole accumulator joins them. Checked in the interpreter against float64 NumPy
(rtol=1e-5, atol=1e-5 as the suite's other wgmma tests: products of bfloat16 are exact in
float32), the pieces the PTX's wgmmas write, the refusal of other views, and on a GPU the Gluon
kernel against the interpreter (conftest.py)."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax as pl
import pallax.mosaic_gpu as plgpu
from helpers import rand_seeded as rand

pytestmark = pytest.mark.interpreter

S = jax.ShapeDtypeStruct
F32_DOT = dict(rtol=1e-5, atol=1e-5)
K = 64


def views_kernel(m, n, steps):
  """acc (m, n) = 0; for each (start, width, b_start) of ``steps``: acc[:, start:start+width]
  += a @ b[:, b_start:b_start+width] (a wgmma into the view; width None: the whole acc += a @
  b[:, :n]); out = acc."""
  def body(a_ref, b_ref, o_ref, a_smem, b_smem, bar):
    plgpu.copy_gmem_to_smem(a_ref, a_smem, bar)
    plgpu.copy_gmem_to_smem(b_ref, b_smem, bar)
    plgpu.barrier_wait(bar)

    def scope(acc_ref):
      for start, width, b_start in steps:
        if width is None:
          plgpu.wgmma(acc_ref, a_smem, b_smem.at[:, :n])
        else:
          plgpu.wgmma(acc_ref.at[:, start:start + width], a_smem, b_smem.at[:, b_start:b_start + width])
      plgpu.wgmma_wait(0)
      return acc_ref[...]
    o_ref[...] = pl.run_scoped(scope, plgpu.ACC((m, n), jnp.float32))

  return plgpu.kernel(body, out_shape=S((m, n), jnp.float32),
                      scratch_shapes=[plgpu.SMEM((m, K), jnp.bfloat16), plgpu.SMEM((K, 256), jnp.bfloat16),
                                      plgpu.Barrier(num_arrivals=2)])


def expected(a, b, m, n, steps):
  a, b = a.astype(np.float64), b.astype(np.float64)
  out = np.zeros((m, n))
  for start, width, b_start in steps:
    if width is None:
      out += a @ b[:, :n]
    else:
      out[:, start:start + width] += a @ b[:, b_start:b_start + width]
  return out


CASES = {
    "halves flipped": (64, 256, [(0, 128, 128), (128, 128, 0)], {128}),
    "64 and 128 of 192": (64, 192, [(0, 64, 0), (64, 128, 128)], {64}),
    "one view twice, then the whole": (128, 256, [(0, 128, 0), (0, 128, 128), (0, None, 0)], {128}),
    "the upper half, then the whole": (64, 128, [(64, 64, 192), (0, None, 0)], {64}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_wgmmas_into_column_views(case):
  m, n, steps, widths = CASES[case]
  a, b = rand(1, (m, K), jnp.bfloat16), rand(2, (K, 256), jnp.bfloat16)
  kernel = views_kernel(m, n, steps)
  np.testing.assert_allclose(kernel(a, b), expected(a, b, m, n, steps), **F32_DOT)
  (compiled,) = plgpu.lower(kernel, S(a.shape, a.dtype), S(b.shape, b.dtype))
  assert {int(w) for w in re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16", compiled.ptx)} == widths


def test_a_view_of_rows_is_refused():
  m, n = 128, 128

  def body(a_ref, b_ref, o_ref, a_smem, b_smem, bar):
    plgpu.copy_gmem_to_smem(a_ref, a_smem, bar)
    plgpu.copy_gmem_to_smem(b_ref, b_smem, bar)
    plgpu.barrier_wait(bar)

    def scope(acc_ref):
      plgpu.wgmma(acc_ref.at[:64], a_smem.at[:64], b_smem)
      plgpu.wgmma_wait(0)
      return acc_ref[...]
    o_ref[...] = pl.run_scoped(scope, plgpu.ACC((m, n), jnp.float32))

  kernel = plgpu.kernel(body, out_shape=S((m, n), jnp.float32),
                        scratch_shapes=[plgpu.SMEM((m, K), jnp.bfloat16), plgpu.SMEM((K, n), jnp.bfloat16),
                                        plgpu.Barrier(num_arrivals=2)])
  with pytest.raises(NotImplementedError, match="wgmma into a view of an accumulator"):
    plgpu.lower(kernel, S((m, K), jnp.bfloat16), S((K, n), jnp.bfloat16))

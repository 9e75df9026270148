"""An SMEM buffer whose shape is not a power of two lives in a padded Gluon buffer. Its padding
is zeroed where the buffer is allocated only when something may read it: a wgmma whose K is
padded adds padding times padding into real results, so zeros (not whatever the memory held,
NaN bit patterns included) must sit there. A buffer only written by TMA and read by wgmmas along
an unpadded K is not zeroed: what a wgmma reads of the padding of M or N lands in the
accumulator's padding, which reaches no result. (JAX's ragged dot with 192-wide tiles zeroed four
64x256 pipeline slots at each output tile before this.)

Checked on the zeroings the Gluon backend records (``events.ZeroPadding``), on what each kernel
computes in the interpreter against float64 NumPy (rtol=1e-5, atol=1e-5, as the suite's other
wgmma tests: products of bfloat16 operands are exact in float32), and on a GPU by comparing the
Gluon kernel with the interpreter (conftest.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax as pl
import pallax.mosaic_gpu as plgpu
from helpers import rand_seeded as rand
from pallax._src.gluon import events as ev

pytestmark = pytest.mark.interpreter

S = jax.ShapeDtypeStruct
F32_DOT = dict(rtol=1e-5, atol=1e-5)


def matmul(m, k, n, *, b_read_by_registers=False):
  """a (m, k) @ b (k, n), both copied into SMEM by TMA, one wgmma; with
  ``b_read_by_registers`` (m == k) the kernel adds b, read from its SMEM through registers, to
  the product."""
  @plgpu.kernel(out_shape=S((m, n), jnp.float32),
                scratch_shapes=[plgpu.SMEM((m, k), jnp.bfloat16), plgpu.SMEM((k, n), jnp.bfloat16),
                                plgpu.Barrier(num_arrivals=2)])
  def mm(a_ref, b_ref, o_ref, a_smem, b_smem, bar):
    plgpu.copy_gmem_to_smem(a_ref, a_smem, bar)
    plgpu.copy_gmem_to_smem(b_ref, b_smem, bar)
    plgpu.barrier_wait(bar)

    def compute(acc_ref):
      plgpu.wgmma(acc_ref, a_smem, b_smem)
      plgpu.wgmma_wait(0)
      return acc_ref[...]

    out = pl.run_scoped(compute, plgpu.ACC((m, n)))
    if b_read_by_registers:
      out = out + b_smem[...].astype(jnp.float32)
    o_ref[...] = out

  return mm


def zeroed(kernel, *args) -> list[tuple]:
  (compiled,) = plgpu.lower(kernel, *(S(x.shape, x.dtype) for x in args))
  return [(e.ref, e.stored) for p in compiled.generated.partitions for e in p.events
          if isinstance(e, ev.ZeroPadding)]


@pytest.mark.parametrize("m,k,n,want_zeroed", [
    (64, 64, 192, []),        # b's N padded to 256, split into wgmmas of 128 and 64: unread
    (128, 64, 96, []),        # b's N padded to 128, read into the accumulator's padding
    (64, 64, 64, []),         # nothing padded
    (64, 48, 64, [("smem[0]", (64, 64)), ("smem[1]", (64, 64))]),   # K padded in a and b
])
def test_padding_is_zeroed_only_where_a_wgmma_reads_it_along_k(m, k, n, want_zeroed):
  a = rand(1, (m, k), jnp.bfloat16)
  b = rand(2, (k, n), jnp.bfloat16)
  kernel = matmul(m, k, n)
  want = a.astype(np.float64) @ b.astype(np.float64)
  np.testing.assert_allclose(kernel(a, b), want, **F32_DOT)
  assert zeroed(kernel, a, b) == want_zeroed


def test_a_buffer_registers_read_is_still_zeroed():
  """Registers reading b's SMEM count as reading its padding (the pass does not follow the
  loaded value): b stays zeroed although the wgmma reads it along an unpadded K."""
  m, k, n = 64, 64, 96
  a = rand(3, (m, k), jnp.bfloat16)
  b = rand(4, (k, n), jnp.bfloat16)
  kernel = matmul(m, k, n, b_read_by_registers=True)
  want = a.astype(np.float64) @ b.astype(np.float64)
  want += b.astype(np.float64)
  np.testing.assert_allclose(kernel(a, b), want, **F32_DOT)
  assert zeroed(kernel, a, b) == [("smem[1]", (64, 128))]

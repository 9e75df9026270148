"""wgmma accumulators whose width is a multiple of 64 but not a power of two (192): the Gluon
backend keeps them as column pieces (128 + 64), one wgmma each, instead of one
accumulator padded to the next power of two (gluon/acc_pieces.py). What each kernel computes is
checked in the interpreter against float64 NumPy; its sm_90a PTX (compiled on the CPU) is read
for the wgmma widths; on a GPU the Gluon kernel is compared with the interpreter (conftest.py).

Products of bfloat16 operands are exact in float32, so only the summation order differs from
NumPy's: rtol=1e-5, atol=1e-5, as the other wgmma tests of this suite."""
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


def wgmma_widths(kernel, *args) -> set[int]:
  (compiled,) = plgpu.lower(kernel, *(S(x.shape, x.dtype) for x in args))
  return {int(n) for n in re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16", compiled.ptx)}


def matmul_kernel(m, n, a_in, b_major):
  """acc = a @ b (two steps of K/2 where a is in SMEM; b (K, N), or (N, K) read through a transposed view; copied
  by TMA in parts of at most 256 along N, where wider)."""
  b_shape = (K, n) if b_major == "n" else (n, K)
  parts = [pl.ds(o, min(256, n - o)) for o in range(0, n, 256)]
  # (a register a is read whole: Gluon reads registers from SMEM at whole swizzle atoms)
  steps = [pl.ds(0, K // 2), pl.ds(K // 2, K // 2)] if a_in == "smem" else [pl.ds(0, K)]

  @plgpu.kernel(out_shape=S((m, n), jnp.float32),
                scratch_shapes=[plgpu.SMEM((m, K), jnp.bfloat16), plgpu.SMEM(b_shape, jnp.bfloat16),
                                plgpu.Barrier(num_arrivals=1 + len(parts))])
  def mm(a_ref, b_ref, o_ref, a_smem, b_smem, bar):
    plgpu.copy_gmem_to_smem(a_ref, a_smem, bar)
    for ns in parts:
      at = (slice(None), ns) if b_major == "n" else (ns,)
      plgpu.copy_gmem_to_smem(b_ref.at[at], b_smem.at[at], bar)
    plgpu.barrier_wait(bar)

    def compute(acc_ref):
      for ks in steps:
        a = a_smem.at[:, ks] if a_in == "smem" else a_smem[:, ks]
        b = b_smem.at[ks, :] if b_major == "n" else b_smem.at[:, ks].transpose((1, 0))
        plgpu.wgmma(acc_ref, a, b)
      plgpu.wgmma_wait(0)
      return acc_ref[...]

    o_ref[...] = pl.run_scoped(compute, plgpu.ACC((m, n)))

  return mm


@pytest.mark.parametrize("m,n,pieces", [(128, 192, {128, 64}), (64, 192, {128, 64}),
                                         (128, 96, {128})])   # (not a multiple of 64: padded)
@pytest.mark.parametrize("a_in", ["smem", "registers"])
@pytest.mark.parametrize("b_major", ["n", "k"])
def test_an_accumulator_in_pieces_computes_the_product(m, n, pieces, a_in, b_major):
  a = rand(1, (m, K), jnp.bfloat16)
  b = rand(2, (K, n), jnp.bfloat16)
  b_in = b if b_major == "n" else np.ascontiguousarray(b.T)
  kernel = matmul_kernel(m, n, a_in, b_major)
  want = a.astype(np.float64) @ b.astype(np.float64)
  np.testing.assert_allclose(kernel(a, b_in), want, **F32_DOT)
  assert wgmma_widths(kernel, a, b_in) == pieces


def test_pieces_initialized_updated_and_read_between_wgmmas():
  """ACC.init(c) (split into the pieces), a wgmma, the accumulator halved through a read and a
  store (joined, then split again), another wgmma: acc = (c + a @ b) / 2 + a @ b."""
  m, n = 128, 192
  a, b, c = rand(3, (m, K), jnp.bfloat16), rand(4, (K, n), jnp.bfloat16), rand(5, (m, n))

  @plgpu.kernel(out_shape=S((m, n), jnp.float32),
                scratch_shapes=[plgpu.SMEM((m, K), jnp.bfloat16), plgpu.SMEM((K, n), jnp.bfloat16),
                                plgpu.Barrier(num_arrivals=2)])
  def mm(a_ref, b_ref, c_ref, o_ref, a_smem, b_smem, bar):
    plgpu.copy_gmem_to_smem(a_ref, a_smem, bar)
    plgpu.copy_gmem_to_smem(b_ref, b_smem, bar)
    plgpu.barrier_wait(bar)

    def body(acc_ref):
      plgpu.wgmma(acc_ref, a_smem, b_smem)
      plgpu.wgmma_wait(0)
      acc_ref[...] = acc_ref[...] * 0.5
      plgpu.wgmma(acc_ref, a_smem, b_smem)
      plgpu.wgmma_wait(0)

    o_ref[...] = pl.run_state(body)(plgpu.ACC.init(c_ref[...]))

  prod = a.astype(np.float64) @ b.astype(np.float64)
  np.testing.assert_allclose(mm(a, b, c), (c + prod) / 2 + prod, **F32_DOT)
  assert wgmma_widths(mm, a, b, c) == {128, 64}


@pytest.mark.parametrize("a_in", ["smem", "registers"])
def test_an_int8_accumulator_192_wide_runs_as_pieces_of_at_most_128(a_in):
  """Triton 3.6 writes int8 wgmmas up to N=128 only: an int32 accumulator 192 wide runs as pieces
  of 128 and 64 (a wider one is refused). int8 products summed in int32 are exact."""
  m, k, n = 64, 128, 192
  a = rand(6, (m, k), jnp.int8)
  b_t = rand(7, (n, k), jnp.int8)   # (N, K): 8-bit wgmmas read b K-major

  @plgpu.kernel(out_shape=S((m, n), jnp.int32),
                scratch_shapes=[plgpu.SMEM((m, k), jnp.int8), plgpu.SMEM((n, k), jnp.int8),
                                plgpu.Barrier(num_arrivals=2)])
  def mm(a_ref, b_ref, o_ref, a_smem, b_smem, bar):
    plgpu.copy_gmem_to_smem(a_ref, a_smem, bar)
    plgpu.copy_gmem_to_smem(b_ref, b_smem, bar)
    plgpu.barrier_wait(bar)

    def compute(acc_ref):
      a_op = a_smem if a_in == "smem" else plgpu.load(a_smem, (), layout=plgpu.Layout.WGMMA_8BIT)
      plgpu.wgmma(acc_ref, a_op, b_smem.transpose((1, 0)))
      plgpu.wgmma_wait(0)
      return acc_ref[...]

    o_ref[...] = pl.run_scoped(compute, plgpu.ACC((m, n), jnp.int32))

  np.testing.assert_array_equal(mm(a, b_t), a.astype(np.int64) @ b_t.T.astype(np.int64))
  (compiled,) = plgpu.lower(mm, S(a.shape, a.dtype), S(b_t.shape, b_t.dtype))
  widths = {int(w) for w in re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k32\.s32\.s8\.s8",
                                       compiled.ptx)}
  assert widths == {128, 64}

"""Block-scaled ``tcgen05_mma`` over a cluster's pair of blocks (``collective_axis=``, with
``a_scale=``/``b_scale=``) in the interpreter: each block holds half of ``a``'s rows with their
scales and half of ``b``'s rows; the leader copies each block's scales into that block's TMEM
(``async_copy_scales_to_tmem(..., collective_axis=)``) and issues the MMA, which scales each
block's rows of ``a`` by that block's ``a_scale`` and all of ``b`` by the ``b_scale`` both
blocks hold. With 64 rows a block, the B scales are in ``TMEMLayout.SCALES_M64_COLLECTIVE_LAYOUT``
(each half of N at 128 rows of a 256-row TMEM) and the A scales fill the first 64 of 128 rows.

Inputs are exact in float8/float4 and every product and partial sum is exact in float32
(halves times powers of two), so the result equals NumPy's exactly. The Gluon backend refuses
two-block MMAs by name (Gluon 3.6 has no cluster launch or two-CTA tcgen05)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax as pl
import pallax.mosaic_gpu as plgpu
from test_mosaic_gpu_blackwell_scaled import dequantized_product, exact_operand, scales, tiles

pytestmark = [pytest.mark.interpreter, pytest.mark.gluon_refuses("collective TMEM")]

E8M0 = jnp.float8_e8m0fnu
BLOCK = 32
K = 256


def m64_pair_tiles(s, n):
  """B scales (n, kk) in the SMEM tiles of SCALES_M64_COLLECTIVE_LAYOUT: per 4 scales of K a
  (64, 16) tile, row r of N's half h (32-row group g) and scale c at [h * 32 + r % 32,
  g * 4 + c % 4], columns past the half's groups zero."""
  s = np.asarray(s)
  kk, half = s.shape[1], n // 2
  out = np.zeros((1, kk // 4, 64, 16), s.dtype)
  for row in range(n):
    h, r = divmod(row, half)
    for c in range(kk):
      out[0, c // 4, h * 32 + r % 32, r // 32 * 4 + c % 4] = s[row, c]
  return jnp.asarray(out)


def pair_kernel(m, n, dtype):
  """(m, n) = a (m, K) scaled @ (b (n, K) scaled).T on a pair of blocks, m // 2 rows a block."""
  mb, nb = m // 2, n // 2
  tr = (plgpu.TilingTransform((8, 128 * 8 // jnp.dtype(dtype).itemsize // 8)),
        plgpu.SwizzleTransform(128))
  m64 = mb == 64

  def body(a_g, b_g, sa_g, sb_g, out, a_s, b_s, sa_s, sb_s, tma, mma, ready, acc, sa_t, sb_t):
    i = jax.lax.axis_index("x")
    plgpu.copy_gmem_to_smem(a_g.at[pl.ds(i * mb, mb)], a_s, tma)
    plgpu.copy_gmem_to_smem(b_g.at[pl.ds(i * nb, nb)], b_s, tma)
    plgpu.copy_gmem_to_smem(sa_g.at[pl.ds(i, 1)], sa_s, tma)
    plgpu.copy_gmem_to_smem(sb_g, sb_s, tma)
    plgpu.barrier_wait(tma)
    plgpu.barrier_arrive(ready)   # both blocks' operands are in SMEM before the leader reads them
    plgpu.barrier_wait(ready)

    @pl.when(i == 0)
    def _():
      plgpu.async_copy_scales_to_tmem(sa_s, sa_t, collective_axis="x")
      plgpu.async_copy_scales_to_tmem(sb_s, sb_t, collective_axis="x")
      plgpu.tcgen05_mma(acc, a_s, plgpu.transpose_ref(b_s, (1, 0)), mma, a_scale=sa_t,
                        b_scale=sb_t, accumulate=False, collective_axis="x")

    plgpu.barrier_wait(mma)
    out[pl.ds(i * mb, mb), :] = plgpu.async_load_tmem(acc)

  kk = K // BLOCK
  sb_shape = (1, kk // 4, 64, 16) if m64 else (n // 128, kk // 4, 32, 16)
  scratch = [plgpu.SMEM((mb, K), dtype, transforms=tr), plgpu.SMEM((nb, K), dtype, transforms=tr),
             plgpu.SMEM((1, kk // 4, 32, 16), E8M0), plgpu.SMEM(sb_shape, E8M0),
             plgpu.Barrier(num_arrivals=4), plgpu.Barrier(orders_tensor_core=True),
             plgpu.ClusterBarrier(collective_axes=("x",)),
             plgpu.TMEM((mb, n), jnp.float32, collective=True),
             plgpu.TMEM((128, kk), E8M0, layout=plgpu.TMEMLayout.SCALES_LAYOUT, collective=True),
             plgpu.TMEM((256 if m64 else n, kk), E8M0, collective=True,
                        layout=plgpu.TMEMLayout.SCALES_M64_COLLECTIVE_LAYOUT if m64
                        else plgpu.TMEMLayout.SCALES_LAYOUT)]
  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((m, n), jnp.float32),
                      scratch_types=scratch, cluster=(2,), cluster_names=("x",))


@pytest.mark.parametrize("m,n,dtype", [
    (256, 128, jnp.float8_e4m3fn), (256, 256, jnp.float4_e2m1fn),
    (128, 64, jnp.float8_e5m2), (128, 192, jnp.float8_e4m3fn)])
def test_each_block_scales_its_rows_and_the_pairs_b(m, n, dtype):
  a, b = exact_operand(1, (m, K), dtype), exact_operand(2, (n, K), dtype)
  sa, sb = scales(3, m, K), scales(4, n, K)
  mb = m // 2
  # Each block's A scales in one tile of 128 rows (with 64 rows a block, its rows then padding).
  padded = np.concatenate([np.asarray(sa[i * mb:(i + 1) * mb]) for i in range(2)
                           for _ in range(128 // mb)]) if mb == 64 else np.asarray(sa)
  sa_tiles = tiles(padded)
  sb_tiles = m64_pair_tiles(sb, n) if mb == 64 else tiles(sb)
  got = pair_kernel(m, n, dtype)(a, b, sa_tiles, sb_tiles)
  np.testing.assert_array_equal(np.asarray(got), dequantized_product(a, sa, b, sb))


def test_scale_tiles_of_the_other_layout_are_reported():
  """B scales tiled for SCALES_LAYOUT copied into a SCALES_M64_COLLECTIVE_LAYOUT TMEM."""
  kk = K // BLOCK

  def body(sb_g, out, sb_s, tma, sb_t):
    plgpu.copy_gmem_to_smem(sb_g, sb_s, tma)
    plgpu.barrier_wait(tma)
    plgpu.async_copy_scales_to_tmem(sb_s, sb_t)
    out[...] = jnp.zeros(out.shape, out.dtype)

  kernel = plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((8, 128), jnp.float32),
      scratch_types=[plgpu.SMEM((1, kk // 4, 64, 16), E8M0), plgpu.Barrier(),
                     plgpu.TMEM((256, kk), E8M0, layout=plgpu.TMEMLayout.SCALES_LAYOUT)])
  with pytest.raises(ValueError, match=r"do not fill the TMEM .* \(its tiles: \(2, 2, 32, 16\)\)"):
    kernel(m64_pair_tiles(scales(5, 128, K), 128))

"""Sparse ``plgpu.tcgen05_mma`` (``a_sparse_metadata=``): ``a`` holds two of every four values
along K, the metadata (formatted by ``plgpu.format_tcgen05_sparse_metadata``, copied to TMEM by
``async_copy_sparse_metadata_to_tmem``) says where. The interpreter against NumPy (the logical
``a``, zeros elsewhere, times ``b``), with the tolerance JAX's own sparse tests use; one block
and a cluster's pair (``collective_axis``); what it reports; and the Gluon backend's refusal
(Gluon 3.6 has no sparse MMA)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax as pl
import pallax.mosaic_gpu as plgpu
from pallax._src.mosaic_gpu import tcgen05_sparse

SPARSE_GLUON = "SPARSE_METADATA_LAYOUT"
pytestmark = [pytest.mark.interpreter, pytest.mark.gluon_refuses(SPARSE_GLUON)]

PAIRS = np.array([(i, j) for i in range(4) for j in range(4) if i < j])   # the 6 valid ones
TOL = dict(atol=7e-5, rtol=5e-6)


def positions(seed, m, k):
  """(m, k // 4, 2) increasing positions within each group of four, drawn at random."""
  return PAIRS[np.random.default_rng(seed).integers(0, 6, (m, k // 4))]


def logical(a, meta):
  m, h = a.shape
  out = np.zeros((m, h // 2, 4), np.float64)
  np.put_along_axis(out, meta, np.asarray(a, np.float64).reshape(m, h // 2, 2), axis=-1)
  return out.reshape(m, 2 * h)


def sparse_kernel(m, n, k, dtype, cluster=False):
  """One sparse MMA of a (m, k // 2) compressed by b (n, k) read transposed; with ``cluster``,
  a pair of blocks each holding half of a's rows and of b's rows."""
  tr = (plgpu.TilingTransform((8, 128 // jnp.dtype(dtype).itemsize)), plgpu.SwizzleTransform(128))
  mb, nb = (m // 2, n // 2) if cluster else (m, n)
  axis = "x" if cluster else None

  def body(a_g, b_g, meta_g, out, a_s, b_s, meta_s, tma, mma, acc, meta_t, *sync):
    i = jax.lax.axis_index("x") if cluster else 0
    plgpu.copy_gmem_to_smem(a_g.at[pl.ds(i * mb, mb)], a_s, tma)
    plgpu.copy_gmem_to_smem(b_g.at[pl.ds(i * nb, nb)], b_s, tma)
    plgpu.copy_gmem_to_smem(meta_g.at[pl.ds(i * (mb // 128), mb // 128)], meta_s, tma)
    plgpu.barrier_wait(tma)
    if cluster:   # both blocks' operands are in SMEM before the leader's copy and MMA read them
      plgpu.barrier_arrive(sync[0])
      plgpu.barrier_wait(sync[0])
    plgpu.async_copy_sparse_metadata_to_tmem(meta_s, meta_t, collective_axis=axis)
    plgpu.tcgen05_mma(acc, a_s, plgpu.transpose_ref(b_s, (1, 0)), mma, a_sparse_metadata=meta_t,
                      accumulate=False, collective_axis=axis)
    plgpu.barrier_wait(mma)
    out[pl.ds(i * mb, mb), :] = plgpu.async_load_tmem(acc)

  scratch = [plgpu.SMEM((mb, k // 2), dtype, transforms=tr), plgpu.SMEM((nb, k), dtype, transforms=tr),
             plgpu.SMEM((mb // 128, k // 128, 128, 64), jnp.uint2), plgpu.Barrier(num_arrivals=3),
             plgpu.Barrier(orders_tensor_core=True), plgpu.TMEM((mb, n), jnp.float32, collective=cluster),
             plgpu.TMEM((mb, k // 2), jnp.uint2, layout=plgpu.TMEMLayout.SPARSE_METADATA_LAYOUT,
                        collective=cluster)]
  extra = dict(cluster=(2,), cluster_names=("x",)) if cluster else {}
  if cluster:
    scratch.append(plgpu.ClusterBarrier(collective_axes=("x",)))
  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((m, n), jnp.float32),
                      scratch_types=scratch, **extra)


@pytest.mark.parametrize("m,n,k,dtype,cluster", [
    (128, 128, 128, jnp.float16, False),
    (128, 256, 256, jnp.bfloat16, False),
    (128, 128, 256, jnp.float8_e4m3fn, False),
    pytest.param(256, 256, 128, jnp.float16, True, marks=pytest.mark.gluon_refuses("collective TMEM")),
], ids=["f16", "bf16-n256-k256", "f8e4m3", "f16-pair"])
def test_the_product_is_that_of_the_logical_a(m, n, k, dtype, cluster):
  rng = np.random.default_rng(m + n + k)
  a = jnp.asarray(rng.uniform(-1, 1, (m, k // 2)), dtype)
  b = jnp.asarray(rng.uniform(-1, 1, (n, k)), dtype)
  meta = positions(k, m, k)
  formatted = plgpu.format_tcgen05_sparse_metadata(jnp.asarray(meta, jnp.uint2), dtype)
  got = sparse_kernel(m, n, k, dtype, cluster)(a, b, formatted)
  want = logical(a, meta) @ np.asarray(b, np.float64).T
  np.testing.assert_allclose(np.asarray(got), want, **TOL)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.float8_e5m2])
def test_the_metadata_tiles_read_back_as_written(dtype):
  meta = positions(3, 256, 256)
  tiles = np.asarray(plgpu.format_tcgen05_sparse_metadata(jnp.asarray(meta, jnp.uint2), dtype))
  assert tiles.shape == (2, 2, 128, 64)
  back = tcgen05_sparse.indices(tiles.reshape(256, 128), jnp.dtype(dtype).itemsize * 8)
  np.testing.assert_array_equal(back, meta)


def test_metadata_that_names_a_position_twice_is_reported():
  m, n, k = 128, 128, 128
  meta = positions(5, m, k)
  meta[17, 3] = (2, 2)
  formatted = plgpu.format_tcgen05_sparse_metadata(jnp.asarray(meta, jnp.uint2), jnp.float16)
  a = jnp.ones((m, k // 2), jnp.float16)
  b = jnp.ones((n, k), jnp.float16)
  with pytest.raises(ValueError, match="row 17, group 3 of K names positions"):
    sparse_kernel(m, n, k, jnp.float16)(a, b, formatted)


def test_format_takes_uint2_positions_in_groups():
  with pytest.raises(ValueError, match="uint2"):
    plgpu.format_tcgen05_sparse_metadata(jnp.zeros((128, 32, 2), jnp.int8), jnp.float16)
  with pytest.raises(ValueError, match=r"\(M, K // 4, 2\)"):
    plgpu.format_tcgen05_sparse_metadata(jnp.zeros((128, 64), jnp.uint2), jnp.float16)


def test_the_gluon_backend_refuses_sparse_mmas_by_name():
  m = n = k = 128
  kernel = sparse_kernel(m, n, k, jnp.float16)
  args = [jax.ShapeDtypeStruct((m, k // 2), jnp.float16), jax.ShapeDtypeStruct((n, k), jnp.float16),
          jax.ShapeDtypeStruct((1, 1, 128, 64), jnp.uint2)]
  with pytest.raises(NotImplementedError, match=SPARSE_GLUON):
    plgpu.lower(kernel, *args, compute_capability=100)

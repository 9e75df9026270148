"""JAX's own warp-specialized Hopper matmul (``hopper_matmul_mgpu.py``, its imports switched and
nothing else) on the Gluon backend: three threads (a TMA producer and two wgmma consumers) as
``gl.warp_specialize`` partitions, static SMEM column/row slices as wgmma operands, and an
epilogue that slices the accumulator in registers. On any machine: sm_90a PTX, and the pieces
checked in the interpreter; on a Hopper GPU: JAX's own test configurations, bit for bit against
XLA's dot as JAX's test compares, and with a C operand against the interpreter."""
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import mgpu_ops
import pallax as pl
import pallax.mosaic_gpu as plgpu
from pallax._src.gluon import events as ev
from test_mosaic_gpu_pipeline import check_matmul, rand


@functools.cache
def hopper_matmul(num_sms: int):
  return mgpu_ops.load("hopper_matmul_mgpu", num_sms=num_sms)


def config(hm, tile_m, tile_n, tile_k, steps, epi_m, epi_n, wg, **kw):
  return hm.TuningConfig(tile_m=tile_m, tile_n=tile_n, tile_k=tile_k, max_concurrent_steps=steps,
                         epi_tile_m=epi_m, epi_tile_n=epi_n, wg_dimension=hm.MatmulDimension(wg),
                         **kw)


def fits_in_smem(tile_m, tile_n, tile_k, steps, epi_m, epi_n, wg):
  """JAX's own test skips the configurations whose buffers exceed an H100's SMEM."""
  epi = (epi_m or tile_m) * (epi_n or tile_n)
  cta_m, cta_n = tile_m * (1 + (wg == 0)), tile_n * (1 + (wg == 1))
  return ((cta_m + cta_n) * tile_k * steps + 2 * min(2, tile_m * tile_n // epi) * epi) * 2 <= 228000


# JAX's test_hopper_matmul product (m = n = k = 4096, float16).
JAX_CONFIGS = [c for c in itertools.product((64, 128), (64, 128), (64, 128), (2, 4), (None, 64),
                                            (None, 64), (0, 1)) if fits_in_smem(*c)]


def _on_hopper() -> bool:
  d = jax.devices()[0]
  return d.platform == "gpu" and float(getattr(d, "compute_capability", "0")) >= 9.0


gpu = pytest.mark.skipif(not _on_hopper(), reason="needs a Hopper GPU")


@pytest.mark.parametrize("cfg", [JAX_CONFIGS[0], JAX_CONFIGS[-1], (128, 64, 64, 4, 64, 64, 0)], ids=str)
@pytest.mark.parametrize("with_c", [False, True])
def test_jax_hopper_matmul_lowers_to_warp_specialized_sm90a_ptx(cfg, with_c):
  hm = hopper_matmul(132)
  s = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float16)
  args = (s(512, 256), s(256, 512), s(512, 512) if with_c else None)
  (k,) = plgpu.lower(lambda a, b, c: hm.matmul(a, b, c, config(hm, *cfg)), *args)
  assert len(k.generated.partitions) == 3 and k.num_warps == 12   # two compute threads, one memory
  assert all(w in k.ptx for w in ("wgmma.mma_async", "setmaxnreg", "cp.async.bulk.tensor"))
  # A and B go through one TMA box each: they are passed as descriptors made on the host. An
  # operand with several boxes (the epilogue's C and output tiles, in some configurations) keeps
  # descriptors built in the kernel, which need scratch memory.
  assert k.host_descriptors[0] is not None and k.host_descriptors[1] is not None
  assert len(k.tensordesc_meta) == sum(h is not None for h in k.host_descriptors)
  assert (k.global_scratch_size == 0) == all(h is not None for h in k.host_descriptors)


def test_a_configuration_too_large_for_smem_is_a_clear_error():
  hm = hopper_matmul(132)
  s = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float16)
  with pytest.raises(ValueError, match="bytes of shared memory but sm_90 offers"):
    plgpu.lower(lambda a, b: hm.matmul(a, b, None, config(hm, 128, 128, 128, 4, 64, 64, 1)),
                s(512, 1024), s(1024, 512))


# --- the new pieces, small: slices of SMEM and of register tiles ------------------------------

def _sliced_matmul(a_ref, b_ref, o_ref, a_smem, b_smem, o_smem, bar):
  """Two wgmmas on the halves of a swizzled B (columns) and of A (rows), and an epilogue that
  stores the accumulators tile by tile from register slices."""
  plgpu.copy_gmem_to_smem(a_ref, a_smem, bar)
  plgpu.copy_gmem_to_smem(b_ref, b_smem, bar)
  plgpu.barrier_wait(bar)
  for i in range(2):
    for j in range(2):
      def scope(acc_ref):
        plgpu.wgmma(acc_ref, a_smem.at[pl.ds(i * 64, 64)], b_smem.at[:, pl.ds(j * 64, 64)])
        plgpu.wgmma_wait(0)
        acc = acc_ref[...].astype(o_smem.dtype)
        for ei in range(2):
          for ej in range(2):
            o_smem[i * 2 + ei, j * 2 + ej] = acc[ei * 32:(ei + 1) * 32, ej * 32:(ej + 1) * 32]
      pl.run_scoped(scope, plgpu.ACC((64, 64)))
  plgpu.commit_smem()
  for t in range(4):
    for u in range(4):
      plgpu.copy_smem_to_gmem(o_smem.at[t, u], o_ref.at[pl.ds(t * 32, 32), pl.ds(u * 32, 32)])
  plgpu.wait_smem_to_gmem(0)


def sliced_matmul(a, b, interpret=False):
  return plgpu.kernel(
      _sliced_matmul, out_type=jax.ShapeDtypeStruct((128, 128), a.dtype),
      scratch_types=[plgpu.SMEM((128, 64), a.dtype), plgpu.SMEM((64, 128), a.dtype),
                     plgpu.SMEM((4, 4, 32, 32), a.dtype), plgpu.Barrier(num_arrivals=2)],
      interpret=interpret)(a, b)


def test_slices_of_smem_and_registers_in_the_interpreter():
  a, b = rand(1, (128, 64), jnp.float16), rand(2, (64, 128), jnp.float16)
  check_matmul(sliced_matmul(a, b, interpret=True), a, b)


def test_slices_of_smem_and_registers_lower():
  s = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16)
  (k,) = plgpu.lower(sliced_matmul, s(128, 64), s(64, 128))
  events = k.generated.partitions[0].events
  # Four wgmmas on the halves of A (rows) and of B (columns), in the order of the loops.
  halves = lambda dim: [(("slice", start, 64, dim),) for start in (0, 64)]
  assert [(e.a.steps, e.b.steps) for e in events if isinstance(e, ev.Wgmma)] == [
      (a, b) for a in halves(0) for b in halves(1)]
  # Each of the 4 epilogue tiles of each accumulator is cut out in registers: its rows' half,
  # then its columns' half.
  assert [(e.shape, e.dim) for e in events if isinstance(e, ev.Halve)] == [
      ((64, 64), 0), ((32, 64), 1)] * 4 * 4
  assert "wgmma.mma_async" in k.ptx


@pytest.mark.parametrize("start,size,message", [
    (32, 32, r"slice \[32:64\].*multiple of 64 elements \(its 128-byte swizzle\)"),
    (64, 128, r"slice \[64:192\].*does not start at a multiple of its size 128")])
def test_smem_slices_gluon_cannot_take_are_refused(start, size, message):
  def kernel(b_ref, o_ref, b_smem, bar):
    plgpu.copy_gmem_to_smem(b_ref, b_smem, bar)
    plgpu.barrier_wait(bar)
    o_ref[...] = b_smem[:, pl.ds(start, size)].astype(jnp.float32)
  f = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((64, size), jnp.float32),
                   scratch_types=[plgpu.SMEM((64, 256), jnp.float16), plgpu.Barrier()])
  with pytest.raises(NotImplementedError, match=message):
    plgpu.lower(f, jax.ShapeDtypeStruct((64, 256), jnp.float16))


def assert_close_to_interpreter(got, want):
  """wgmma sums in float32 in its own order: the two may round to neighbouring values of the
  output dtype (within two units of its last place at the output's largest magnitude)."""
  u = {jnp.dtype(jnp.float16): 2.0**-11, jnp.dtype(jnp.bfloat16): 2.0**-8}[jnp.dtype(got.dtype)]
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  np.testing.assert_allclose(got, want, rtol=0, atol=2 * u * np.abs(want).max())


# --- on the GPU ------------------------------------------------------------------------------

@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_slices_of_smem_and_registers_on_the_gpu(dtype):
  a, b = rand(3, (128, 64), dtype), rand(4, (64, 128), dtype)
  got = jax.jit(sliced_matmul)(a, b)
  check_matmul(got, a, b)
  assert_close_to_interpreter(got, sliced_matmul(a, b, interpret=True))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("cfg", JAX_CONFIGS, ids=str)
def test_jax_hopper_matmul_configurations_on_the_gpu(cfg):
  """JAX's test: 4096^3 float16, equal to XLA's dot with the F16_F16_F32 preset."""
  hm = hopper_matmul(jax.devices()[0].core_count)
  ka, kb = jax.random.split(jax.random.key(42))
  a = jax.random.normal(ka, (4096, 4096), jnp.float16)
  b = jax.random.normal(kb, (4096, 4096), jnp.float16)
  out = jax.jit(lambda a, b: hm.matmul(a, b, None, config(hm, *cfg)))(a, b)
  ref = jnp.dot(a, b, precision=lax.DotAlgorithmPreset.F16_F16_F32)
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("grid_minor_dim", [0, 1])
@pytest.mark.parametrize("grid_tile_width", [1, 3, 4])
def test_jax_hopper_matmul_grid_tiling_on_the_gpu(grid_minor_dim, grid_tile_width):
  hm = hopper_matmul(jax.devices()[0].core_count)
  ka, kb = jax.random.split(jax.random.key(43))
  a = jax.random.normal(ka, (4096, 4096), jnp.float16)
  b = jax.random.normal(kb, (4096, 4096), jnp.float16)
  cfg = config(hm, 64, 64, 64, 2, 64, 64, 0, grid_minor_dim=hm.MatmulDimension(grid_minor_dim),
               grid_tile_width=grid_tile_width)
  out = jax.jit(lambda a, b: hm.matmul(a, b, None, cfg))(a, b)
  ref = jnp.dot(a, b, precision=lax.DotAlgorithmPreset.F16_F16_F32)
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("cfg", [(64, 64, 64, 2, None, None, 1), (64, 64, 64, 3, 32, 32, 0)], ids=str)
def test_jax_hopper_matmul_with_c_on_the_gpu_matches_the_interpreter(dtype, cfg, monkeypatch):
  """With a C operand (TMA-loaded into the epilogue's SMEM, added in registers), on the shapes
  the interpreter runs quickly: 2 SMs, each looping over two output tiles."""
  from pallax._src import backends
  hm = hopper_matmul(2)
  a, b, c = rand(40, (256, 256), dtype), rand(41, (256, 128), dtype), rand(42, (256, 128), dtype)
  run = lambda a, b, c: hm.matmul(a, b, c, config(hm, *cfg))
  got = jax.jit(run)(a, b, c)
  check_matmul(got, a, b, c)
  monkeypatch.setattr(backends, "choose", lambda params, platform: None)   # the interpreter
  assert_close_to_interpreter(got, run(a, b, c))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("cfg", [c for c in itertools.product((64, 128), (64, 128), (0, 1), ("M", "N"))
                                 if fits_in_smem(c[0], c[1], 64, 4, 64, 64, c[2])], ids=str)
def test_jax_hopper_matmul_cluster_configurations_on_the_gpu(cfg):
  """(Here, not in test_mosaic_gpu_clusters.py, whose tests run in the interpreter.) JAX's test_hopper_matmul_cluster: 4096^3 float16, equal to XLA's dot with the F16_F16_F32
  preset (the emulated clusters compute exactly what real ones do)."""
  tile_m, tile_n, wg, cluster_dim = cfg
  hm = hopper_matmul(jax.devices()[0].core_count)
  ka, kb = jax.random.split(jax.random.key(44))
  a = jax.random.normal(ka, (4096, 4096), jnp.float16)
  b = jax.random.normal(kb, (4096, 4096), jnp.float16)
  c = config(hm, tile_m, tile_n, 64, 4, 64, 64, wg,
                      cluster_dimension=getattr(hm.MatmulDimension, cluster_dim))
  out = jax.jit(lambda a, b: hm.matmul(a, b, None, c))(a, b)
  ref = jnp.dot(a, b, precision=lax.DotAlgorithmPreset.F16_F16_F32)
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32))

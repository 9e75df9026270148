"""Blackwell's tensor cores in the interpreter (issue 28): ``plgpu.TMEM``, ``tcgen05_mma``,
``tcgen05_commit_arrive``, TMEM loads and stores with their waits and commits, SMEM->TMEM
copies, block-scaled products, ``warp_map`` and ``dynamic_scheduling_loop``.

1. Products against jnp on random inputs: bfloat16, float16, int8, float8 with scales; ``a``
   in SMEM or TMEM, ``b`` transposed, M=128 and M=64, ``accumulate`` over K, an accumulator
   started by ``async_store_tmem``, reductions of TMEM loads, two threads, four warps.
2. JAX's ``blackwell_matmul_mgpu.py`` (import lines switched) at small shapes against ``a @ b``.
3. Each rule JAX's docs leave to the user, broken by a kernel, and the error (naming the
   buffer or barrier, the thread, the block and the line); and kernels that keep the rules
   (pipelined MMAs, completions passed on through barriers) running without one.
4. Gluon for sm_100a (``plgpu.lower(..., compute_capability=100)``): every kernel here is also
   compiled to sm_100a PTX holding the tcgen05 instruction of each of its operations
   (``gluon_check.py``), or refused with an error naming what Gluon 3.6 cannot express
   (``gluon_refuses``); tests of what the PTX and the source hold.

Tolerances: products of 16-bit inputs accumulated in float32 against jnp's float32 dot,
rtol=atol=1e-5 (the same products, summed in another order); integer and copied data exactly.
"""
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu
from pallax import KernelCheckError

import mgpu_ops

pytestmark = [pytest.mark.interpreter]

# What the Gluon backend refuses for sm_100a (each kernel here that it lowers, it compiles to
# sm_100a PTX holding the tcgen05 instructions of its operations: gluon_check.py).
FLOAT4 = "of float4_e2m1fn, packed two or four values a byte"
COLLECTIVE = "collective (two-block) MMAs over a cluster for sm_100a"
S = jax.ShapeDtypeStruct
CLOSE = dict(rtol=1e-5, atol=1e-5)
HERE = "test_mosaic_gpu_blackwell.py"
F32 = jnp.float32


def rand(key, shape, dtype):
  x = jax.random.normal(jax.random.key(key), shape, F32)
  if jnp.issubdtype(dtype, jnp.integer):
    return jnp.clip(jnp.round(x * 20), -100, 100).astype(dtype)
  return x.astype(dtype)


def ref_dot(a, b):
  return jnp.dot(a.astype(F32), b.astype(F32), precision="highest")


def tma_barrier(n=2):
  return plgpu.Barrier(num_arrivals=n)


def mma_barrier(**kw):
  return plgpu.Barrier(orders_tensor_core=True, **kw)


def fetch(pairs, bar):
  """TMA copies of (GMEM, SMEM) pairs, awaited."""
  for src, dst in pairs:
    plgpu.copy_gmem_to_smem(src, dst, bar)
  plgpu.barrier_wait(bar)


def matmul(m, n, k, dtype=jnp.bfloat16, acc_dtype=F32, **scratch):
  """A kernel computing ``a @ b`` (a (m, k), b (k, n)) in one MMA; ``scratch`` adds buffers."""
  types = dict(a_smem=plgpu.SMEM((m, k), dtype), b_smem=plgpu.SMEM((k, n), dtype),
               acc=plgpu.TMEM((m, n), acc_dtype, packed=acc_dtype == jnp.float16 or None),
               tma=tma_barrier(), done=mma_barrier(), **scratch)
  return plgpu.kernel(out_shape=S((m, n), acc_dtype), scratch_shapes=types)


# --- 1. products ---------------------------------------------------------------------------------

@pytest.mark.parametrize("m,n,k,dtype", [
    (128, 128, 64, jnp.bfloat16), (128, 256, 128, jnp.float16), (64, 64, 64, jnp.bfloat16),
    (128, 16, 128, jnp.float16),
    pytest.param(128, 128, 32, jnp.float32, marks=pytest.mark.gluon_refuses(
        "tcgen05_mma of float32 (tf32) operands for sm_100a with a or b stored M- or N-major"))])
def test_one_mma(m, n, k, dtype):
  a, b = rand(1, (m, k), dtype), rand(2, (k, n), dtype)

  @matmul(m, n, k, dtype)
  def kernel(a_ref, b_ref, o_ref, a_smem, b_smem, acc, tma, done):
    fetch([(a_ref, a_smem), (b_ref, b_smem)], tma)
    plgpu.tcgen05_mma(acc, a_smem, b_smem, done, accumulate=False)
    plgpu.barrier_wait(done)
    o_ref[...] = plgpu.async_load_tmem(acc)

  np.testing.assert_allclose(kernel(a, b), ref_dot(a, b), **CLOSE)


def k_loop_kernel():
  """K in steps of 64 through a two-slot ring: each MMA accumulates (the first overwrites),
  b kept (N, K) and passed transposed, the SMEM tiled and swizzled as JAX's kernels do.
  Returns (kernel, operands, the reference)."""
  m, n, k, tk = 128, 128, 256, 64
  a, bt = rand(3, (m, k), jnp.bfloat16), rand(4, (n, k), jnp.bfloat16)
  tiles = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))

  @plgpu.kernel(out_shape=S((m, n), F32), scratch_shapes=dict(
      a_smem=plgpu.SMEM((2, m, tk), jnp.bfloat16, transforms=tiles),
      b_smem=plgpu.SMEM((2, n, tk), jnp.bfloat16, transforms=tiles),
      acc=plgpu.TMEM((m, n), F32), tma=plgpu.Barrier(num_arrivals=2, num_barriers=2),
      free=mma_barrier(num_barriers=2), done=mma_barrier()))
  def kernel(a_ref, b_ref, o_ref, a_smem, b_smem, acc, tma, free, done):
    def step(i, _):
      s = lax.rem(i, 2)

      @pl.when(i >= 2)
      def _():
        plgpu.barrier_wait(free.at[s])   # the MMA two steps ago read this slot
      ks = pl.ds(i * tk, tk)
      plgpu.copy_gmem_to_smem(a_ref.at[:, ks], a_smem.at[s], tma.at[s])
      plgpu.copy_gmem_to_smem(b_ref.at[:, ks], b_smem.at[s], tma.at[s])
      plgpu.barrier_wait(tma.at[s])
      plgpu.tcgen05_mma(acc, a_smem.at[s], b_smem.at[s].T, free.at[s], accumulate=i > 0)
    lax.fori_loop(0, k // tk, step, None)
    plgpu.tcgen05_commit_arrive(done)
    plgpu.barrier_wait(done)
    plgpu.barrier_wait(free.at[0])   # the last completions of each slot, awaited
    plgpu.barrier_wait(free.at[1])
    o_ref[...] = plgpu.async_load_tmem(acc)

  return kernel, (a, bt), ref_dot(a, bt.T)


def test_k_loop_with_swizzled_tiles_and_transposed_b():
  kernel, args, want = k_loop_kernel()
  np.testing.assert_allclose(kernel(*args), want, **CLOSE)


def _a_in_tmem(dtype):
  """A (128, 128) @ (128, 64) product whose a is copied SMEM->TMEM and fed to the MMA at once
  (a pipelined pair: no wait in between), packed two or four to a TMEM column."""
  @matmul(128, 64, 128, dtype, a_tmem=plgpu.TMEM((128, 128), dtype, packed=True))
  def kernel(a_ref, b_ref, o_ref, a_smem, b_smem, acc, tma, done, a_tmem):
    fetch([(a_ref, a_smem), (b_ref, b_smem)], tma)
    plgpu.async_copy_smem_to_tmem(a_smem, a_tmem)
    plgpu.tcgen05_mma(acc, a_tmem, b_smem, done, accumulate=False)
    plgpu.barrier_wait(done)
    o_ref[...] = plgpu.async_load_tmem(acc)
  return kernel


def test_a_in_tmem_copied_from_smem():
  a, b = rand(5, (128, 128), jnp.float16), rand(6, (128, 64), jnp.float16)
  np.testing.assert_allclose(_a_in_tmem(jnp.float16)(a, b), ref_dot(a, b), **CLOSE)


def test_accumulator_started_by_a_store_and_reduced_loads():
  a, b, c = rand(7, (128, 64), jnp.bfloat16), rand(8, (64, 128), jnp.bfloat16), rand(9, (128, 128), F32)

  @plgpu.kernel(out_shape=(S((128, 128), F32), S((128,), F32), S((128,), F32)), scratch_shapes=dict(
      a_smem=plgpu.SMEM((128, 64), jnp.bfloat16), b_smem=plgpu.SMEM((64, 128), jnp.bfloat16),
      acc=plgpu.TMEM((128, 128), F32), tma=tma_barrier(), done=mma_barrier()))
  def kernel(a_ref, b_ref, c_ref, o_ref, mx_ref, amin_ref, a_smem, b_smem, acc, tma, done):
    plgpu.async_store_tmem(acc, c_ref[...])
    plgpu.commit_tmem()
    fetch([(a_ref, a_smem), (b_ref, b_smem)], tma)
    plgpu.tcgen05_mma(acc, a_smem, b_smem, done)   # accumulate=True: acc = c + a @ b
    plgpu.barrier_wait(done)
    o_ref[...], mx_ref[...] = plgpu.async_load_tmem(acc, reduce="max",
                                                    layout=plgpu.Layout.TCGEN05)
    _, amin_ref[...] = plgpu.async_load_tmem(acc.at[:, pl.ds(32, 64)], reduce="absmin")

  out, mx, amin = kernel(a, b, c)
  want = c + ref_dot(a, b)
  np.testing.assert_allclose(out, want, **CLOSE)
  np.testing.assert_array_equal(mx, np.asarray(out).max(1))
  np.testing.assert_array_equal(amin, np.abs(np.asarray(out)[:, 32:96]).min(1))


@pytest.mark.gluon_refuses("tcgen05_mma of int8 operands into an int32 accumulator for sm_100a")
def test_int8_products_in_int32():
  a, b = rand(10, (128, 128), jnp.int8), rand(11, (128, 32), jnp.int8)

  @matmul(128, 32, 128, jnp.int8, jnp.int32)
  def kernel(a_ref, b_ref, o_ref, a_smem, b_smem, acc, tma, done):
    fetch([(a_ref, a_smem), (b_ref, b_smem)], tma)
    plgpu.tcgen05_mma(acc, a_smem, b_smem, done, accumulate=False)
    plgpu.barrier_wait(done)
    o_ref[...] = plgpu.async_load_tmem(acc)

  np.testing.assert_array_equal(kernel(a, b), a.astype(np.int32) @ b.astype(np.int32))


def test_block_scaled_float8():
  """float8 operands with one float8_e8m0 scale per 32 elements of K (scales copied to TMEM)."""
  m, n, k, blk = 128, 128, 128, 32
  e4m3, e8m0 = jnp.float8_e4m3fn, jnp.float8_e8m0fnu
  a, b = rand(12, (m, k), e4m3), rand(13, (k, n), e4m3)
  sa = (2.0 ** jax.random.randint(jax.random.key(14), (m, k // blk), -3, 4)).astype(e8m0)
  sb = (2.0 ** jax.random.randint(jax.random.key(15), (n, k // blk), -3, 4)).astype(e8m0)

  @matmul(m, n, k, e4m3, sa_smem=plgpu.SMEM(sa.shape, e8m0), sb_smem=plgpu.SMEM(sb.shape, e8m0),
          sa_tmem=plgpu.TMEM(sa.shape, e8m0, layout=plgpu.TMEMLayout.SCALES_LAYOUT()),
          sb_tmem=plgpu.TMEM(sb.shape, e8m0, layout=plgpu.TMEMLayout.SCALES_LAYOUT()))
  def kernel(a_ref, b_ref, sa_ref, sb_ref, o_ref, a_smem, b_smem, acc, tma, done, sa_smem,
             sb_smem, sa_tmem, sb_tmem):
    fetch([(a_ref, a_smem), (b_ref, b_smem)], tma)
    sa_smem[...] = sa_ref[...]
    sb_smem[...] = sb_ref[...]
    plgpu.commit_smem()
    plgpu.async_copy_scales_to_tmem(sa_smem, sa_tmem)
    plgpu.async_copy_scales_to_tmem(sb_smem, sb_tmem)
    plgpu.tcgen05_mma(acc, a_smem, b_smem, done, a_scale=sa_tmem, b_scale=sb_tmem,
                      accumulate=False)
    plgpu.barrier_wait(done)
    o_ref[...] = plgpu.async_load_tmem(acc)

  expand = lambda s: jnp.repeat(s.astype(F32), blk, axis=1)   # noqa: E731
  want = ref_dot(a.astype(F32) * expand(sa), (b.astype(F32).T * expand(sb)).T)
  np.testing.assert_allclose(kernel(a, b, sa, sb), want, **CLOSE)


def two_thread_kernel():
  """Thread 0 issues the MMA; thread 1 waits on its barrier and writes the result out."""
  a, b = rand(16, (128, 64), jnp.bfloat16), rand(17, (64, 128), jnp.bfloat16)

  @plgpu.kernel(out_shape=S((128, 128), F32), num_threads=2, thread_name="wg", scratch_shapes=dict(
      a_smem=plgpu.SMEM((128, 64), jnp.bfloat16), b_smem=plgpu.SMEM((64, 128), jnp.bfloat16),
      acc=plgpu.TMEM((128, 128), F32), tma=tma_barrier(), done=mma_barrier()))
  def kernel(a_ref, b_ref, o_ref, a_smem, b_smem, acc, tma, done):
    @pl.when(lax.axis_index("wg") == 0)
    def _():
      fetch([(a_ref, a_smem), (b_ref, b_smem)], tma)
      plgpu.tcgen05_mma(acc, a_smem, b_smem, accumulate=False)
      plgpu.tcgen05_commit_arrive(done)

    @pl.when(lax.axis_index("wg") == 1)
    def _():
      plgpu.barrier_wait(done)
      o_ref[...] = plgpu.async_load_tmem(acc)

  return kernel, (a, b), ref_dot(a, b)


def tile_scales(s):
  """(rows, k) scales in the SMEM tiles the tensor core reads (JAX's tests store them so)."""
  mn, kk = s.shape
  return s.reshape(mn // 128, 4, 32, kk // 4, 4).transpose(0, 3, 2, 1, 4).reshape(
      mn // 128, kk // 4, 32, 16)


@pytest.mark.parametrize("dtype,block", [
    pytest.param(jnp.float4_e2m1fn, 16, marks=pytest.mark.gluon_refuses(FLOAT4)),
    (jnp.float8_e5m2, 32)])
def test_block_scaled_with_tiled_scales_and_transposed_b(dtype, block):
  m, n, k = 128, 256, 256
  a, bt = rand(43, (m, k), dtype), rand(44, (n, k), dtype)
  e8m0 = jnp.float8_e8m0fnu
  sa, sb = (lax.bitcast_convert_type(jax.random.randint(jax.random.key(s), (r, k // block), 122,
                                                        132, dtype=jnp.uint8), e8m0)
            for s, r in ((45, m), (46, n)))
  sa_t, sb_t = tile_scales(sa), tile_scales(sb)

  @plgpu.kernel(out_shape=S((m, n), F32), scratch_shapes=dict(
      a_smem=plgpu.SMEM((m, k), dtype), b_smem=plgpu.SMEM((n, k), dtype),
      sa_smem=plgpu.SMEM(sa_t.shape, e8m0), sb_smem=plgpu.SMEM(sb_t.shape, e8m0),
      acc=plgpu.TMEM((m, n), F32), done=mma_barrier(),
      sa_tmem=plgpu.TMEM(sa.shape, e8m0, layout=plgpu.TMEMLayout.SCALES_LAYOUT),
      sb_tmem=plgpu.TMEM(sb.shape, e8m0, layout=plgpu.TMEMLayout.SCALES_LAYOUT)))
  def kernel(a_ref, b_ref, sa_ref, sb_ref, o_ref, a_smem, b_smem, sa_smem, sb_smem, acc, done,
             sa_tmem, sb_tmem):
    for src, dst in ((a_ref, a_smem), (b_ref, b_smem), (sa_ref, sa_smem), (sb_ref, sb_smem)):
      dst[...] = src[...]
    plgpu.commit_smem()
    plgpu.async_copy_scales_to_tmem(sa_smem, sa_tmem)
    plgpu.async_copy_scales_to_tmem(sb_smem, sb_tmem)
    plgpu.tcgen05_mma(acc, a_smem, plgpu.transpose_ref(b_smem, (1, 0)), a_scale=sa_tmem,
                      b_scale=sb_tmem, accumulate=False)
    plgpu.tcgen05_commit_arrive(done)
    plgpu.barrier_wait(done)
    o_ref[...] = plgpu.async_load_tmem(acc)

  expand = lambda s: jnp.repeat(s.astype(F32), block, axis=1)   # noqa: E731
  want = ref_dot(a.astype(F32) * expand(sa), (bt.astype(F32) * expand(sb)).T)
  np.testing.assert_allclose(kernel(a, bt, sa_t, sb_t), want, **CLOSE)


def test_two_threads_mma_and_epilogue():
  kernel, args, want = two_thread_kernel()
  np.testing.assert_allclose(kernel(*args), want, **CLOSE)


@pytest.mark.gluon_refuses("plgpu.warp_map: warp 0 waits on barrier[1][?] and warp 1, which would "
                            "be written after it")
def test_warp_map_producer_and_mma_warps():
  """Warp 0 copies K-slices into a two-slot ring, warp 1 multiplies; they wait on each other."""
  m, n, k, tk = 128, 64, 256, 64
  a, b = rand(18, (m, k), jnp.float16), rand(19, (k, n), jnp.float16)

  @plgpu.kernel(out_shape=S((m, n), F32), scratch_shapes=dict(
      a_smem=plgpu.SMEM((2, m, tk), jnp.float16), b_smem=plgpu.SMEM((2, tk, n), jnp.float16),
      acc=plgpu.TMEM((m, n), F32), ready=plgpu.Barrier(num_arrivals=2, num_barriers=2),
      free=mma_barrier(num_barriers=2), done=mma_barrier()))
  def kernel(a_ref, b_ref, o_ref, a_smem, b_smem, acc, ready, free, done):
    @plgpu.warp_map
    def _(warp):
      @pl.when(warp == 0)
      def _():
        @pl.loop(0, k // tk)
        def _(i):
          s = lax.rem(i, 2)

          @pl.when(i >= 2)
          def _():
            plgpu.barrier_wait(free.at[s])
          plgpu.copy_gmem_to_smem(a_ref.at[:, pl.ds(i * tk, tk)], a_smem.at[s], ready.at[s])
          plgpu.copy_gmem_to_smem(b_ref.at[pl.ds(i * tk, tk)], b_smem.at[s], ready.at[s])

      @pl.when(warp == 1)
      def _():
        @pl.loop(0, k // tk)
        def _(i):
          s = lax.rem(i, 2)
          plgpu.barrier_wait(ready.at[s])
          plgpu.tcgen05_mma(acc, a_smem.at[s], b_smem.at[s], free.at[s], accumulate=i > 0)
        plgpu.tcgen05_commit_arrive(done)
    plgpu.barrier_wait(done)
    o_ref[...] = plgpu.async_load_tmem(acc)

  np.testing.assert_allclose(kernel(a, b), ref_dot(a, b), **CLOSE)


def test_dynamic_scheduling_loop_covers_the_grid_once():
  """The first block takes over the others' work: every grid position once, with the step
  numbers 0, 1, 2, ... of that block."""
  x = rand(20, (6, 128), F32)

  @plgpu.kernel(out_shape=(S((6, 128), F32), S((6, 128), jnp.int32)), grid=(2, 3),
                grid_names=("i", "j"))
  def kernel(x_ref, o_ref, step_ref):
    @plgpu.dynamic_scheduling_loop(grid_names=("i", "j"))
    def _(info):
      i, j = info.index
      row = i * 3 + j
      o_ref[row] = x_ref[row] * 2
      step_ref[row] = jnp.full((128,), info.local_index, jnp.int32)

  out, steps = kernel(x)
  np.testing.assert_array_equal(out, x * 2)
  np.testing.assert_array_equal(np.asarray(steps)[:, 0], np.arange(6))


# --- 2. JAX's Blackwell matmul ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def blackwell_matmul():
  return mgpu_ops.load("blackwell_matmul_mgpu")


@pytest.mark.parametrize("shape,config", [
    ((256, 256, 128), dict(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2)),
    ((256, 384, 256), dict(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=3,
                           epilogue_tile_n=32, grid_minor_dim=0, grid_tile_width=2)),
    ((128, 512, 128), dict(tile_m=128, tile_n=256, tile_k=64, max_concurrent_steps=2)),
])
def test_jax_blackwell_matmul(blackwell_matmul, shape, config):
  m, n, k = shape
  a, b = rand(21, (m, k), jnp.float16), rand(22, (k, n), jnp.float16)
  if "grid_minor_dim" in config:
    config["grid_minor_dim"] = blackwell_matmul.MatmulDimension(config["grid_minor_dim"])
  cfg = blackwell_matmul.TuningConfig(collective=False, **config)
  out = blackwell_matmul.matmul_kernel(a, b, cfg)
  want = ref_dot(a, b).astype(jnp.float16)   # the kernel rounds its float32 sums to float16
  np.testing.assert_allclose(np.asarray(out, F32), np.asarray(want, F32), rtol=1e-3, atol=1e-3)


@pytest.mark.gluon_refuses(COLLECTIVE)
def test_jax_blackwell_matmul_collective(blackwell_matmul):
  """collective=True: pairs of blocks (a cluster of 2), partitioned copies, two-block MMAs."""
  a, b = rand(23, (256, 256), jnp.float16), rand(24, (256, 256), jnp.float16)
  cfg = blackwell_matmul.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2,
                                      collective=True)
  out = blackwell_matmul.matmul_kernel(a, b, cfg)
  want = ref_dot(a, b).astype(jnp.float16)   # the kernel rounds its float32 sums to float16
  np.testing.assert_allclose(np.asarray(out, F32), np.asarray(want, F32), rtol=1e-3, atol=1e-3)


# --- 3. the rules, broken --------------------------------------------------------------------------

def fails(kernel, args, pattern, cls=KernelCheckError, line=True):
  """The kernel fails with ``pattern``, its block and (``line``) a line of this file."""
  with pytest.raises(cls) as e:
    kernel(*args)
  msg = str(e.value)
  assert re.search(pattern, msg), msg
  assert "block (0)" in msg and (HERE in msg or not line), msg
  return msg


AB = (rand(30, (128, 128), jnp.bfloat16), rand(31, (128, 128), jnp.bfloat16))


def test_tmem_read_before_the_mma_completed():
  @matmul(128, 128, 128)
  def kernel(a_ref, b_ref, o_ref, a_smem, b_smem, acc, tma, done):
    fetch([(a_ref, a_smem), (b_ref, b_smem)], tma)
    plgpu.tcgen05_mma(acc, a_smem, b_smem, done, accumulate=False)
    o_ref[...] = plgpu.async_load_tmem(acc)   # no barrier_wait(done)
    plgpu.barrier_wait(done)

  fails(kernel, AB, r"the kernel .*async_load_tmem reads TMEM acc before the tcgen05_mma writing "
                    r"it \(issued by the kernel at .*\) completed")


def test_commit_arrive_covers_only_this_threads_mmas():
  @plgpu.kernel(out_shape=S((128, 128), F32), num_threads=2, thread_name="wg", scratch_shapes=dict(
      a_smem=plgpu.SMEM((128, 128), jnp.bfloat16), b_smem=plgpu.SMEM((128, 128), jnp.bfloat16),
      acc=plgpu.TMEM((128, 128), F32), tma=tma_barrier(), handoff=mma_barrier(),
      mine=mma_barrier(), theirs=mma_barrier()))
  def kernel(a_ref, b_ref, o_ref, a_smem, b_smem, acc, tma, handoff, mine, theirs):
    @pl.when(lax.axis_index("wg") == 0)
    def _():
      fetch([(a_ref, a_smem), (b_ref, b_smem)], tma)
      plgpu.tcgen05_mma(acc, a_smem, b_smem, accumulate=False)
      plgpu.barrier_arrive(handoff)
      plgpu.tcgen05_commit_arrive(mine)
      plgpu.barrier_wait(mine)

    @pl.when(lax.axis_index("wg") == 1)
    def _():
      plgpu.barrier_wait(handoff)
      plgpu.tcgen05_commit_arrive(theirs)   # tracks thread 1's MMAs: none
      plgpu.barrier_wait(theirs)
      o_ref[...] = plgpu.async_load_tmem(acc)

  fails(kernel, AB, r"thread wg=1 of block \(0\).*reads TMEM acc before the tcgen05_mma .*issued "
                    r"by thread wg=0")


def test_tmem_operand_overwritten_while_the_mma_reads_it():
  @matmul(128, 128, 128, a_tmem=plgpu.TMEM((128, 128), jnp.bfloat16, packed=True))
  def kernel(a_ref, b_ref, o_ref, a_smem, b_smem, acc, tma, done, a_tmem):
    fetch([(a_ref, a_smem), (b_ref, b_smem)], tma)
    plgpu.async_copy_smem_to_tmem(a_smem, a_tmem)
    plgpu.tcgen05_mma(acc, a_tmem, b_smem, done, accumulate=False)
    plgpu.async_store_tmem(a_tmem, jnp.zeros((128, 128), jnp.bfloat16))
    plgpu.commit_tmem()
    plgpu.barrier_wait(done)
    o_ref[...] = plgpu.async_load_tmem(acc)

  fails(kernel, AB, r"async_store_tmem overwrites TMEM a_tmem while the tcgen05_mma issued by the "
                    r"kernel at .* may still read it")


def test_accumulator_stored_while_the_mma_writes_it():
  @matmul(128, 128, 128)
  def kernel(a_ref, b_ref, o_ref, a_smem, b_smem, acc, tma, done):
    fetch([(a_ref, a_smem), (b_ref, b_smem)], tma)
    plgpu.tcgen05_mma(acc, a_smem, b_smem, done, accumulate=False)
    plgpu.async_store_tmem(acc, jnp.zeros((128, 128), F32))
    plgpu.commit_tmem()
    plgpu.barrier_wait(done)
    o_ref[...] = plgpu.async_load_tmem(acc)

  fails(kernel, AB, r"async_store_tmem overwrites TMEM acc while the tcgen05_mma .* may still write")


@pytest.mark.parametrize("writer", ["store", "tma"])
def test_smem_operand_overwritten_before_the_commit(writer):
  @matmul(128, 128, 128)
  def kernel(a_ref, b_ref, o_ref, a_smem, b_smem, acc, tma, done):
    fetch([(a_ref, a_smem), (b_ref, b_smem)], tma)
    plgpu.tcgen05_mma(acc, a_smem, b_smem, accumulate=False)
    if writer == "store":
      b_smem[...] = jnp.zeros((128, 128), jnp.bfloat16)
    else:
      fetch([(a_ref, b_smem), (b_ref, a_smem)], tma)
    plgpu.tcgen05_commit_arrive(done)
    plgpu.barrier_wait(done)
    o_ref[...] = plgpu.async_load_tmem(acc)

  what = "a store" if writer == "store" else "copy_gmem_to_smem"
  fails(kernel, AB, rf"{what} overwrites SMEM b_smem while the tcgen05_mma issued by the kernel "
                    r"at .* may still read it: wait on a barrier")


def test_smem_written_from_registers_needs_commit_smem():
  @matmul(128, 128, 128)
  def kernel(a_ref, b_ref, o_ref, a_smem, b_smem, acc, tma, done):
    a_smem[...] = a_ref[...]
    b_smem[...] = b_ref[...]
    plgpu.tcgen05_mma(acc, a_smem, b_smem, done, accumulate=False)   # no commit_smem()
    plgpu.barrier_wait(done)
    o_ref[...] = plgpu.async_load_tmem(acc)

  fails(kernel, AB, r"tcgen05_mma reads SMEM b_smem, written from registers .* without "
                    r"plgpu.commit_smem\(\)")


def test_tmem_overwritten_before_wait_load_tmem():
  @matmul(128, 128, 128)
  def kernel(a_ref, b_ref, o_ref, a_smem, b_smem, acc, tma, done):
    fetch([(a_ref, a_smem), (b_ref, b_smem)], tma)
    plgpu.tcgen05_mma(acc, a_smem, b_smem, done, accumulate=False)
    plgpu.barrier_wait(done)
    o_ref[...] = plgpu.async_load_tmem(acc)
    plgpu.tcgen05_mma(acc, a_smem, b_smem, done, accumulate=False)   # no wait_load_tmem()
    plgpu.barrier_wait(done)

  fails(kernel, AB, r"tcgen05_mma overwrites TMEM acc while the async_load_tmem of it by the "
                    r"kernel at .* may still be reading: call plgpu.wait_load_tmem\(\)")


@pytest.mark.parametrize("producer_waits", [False, True])
def test_handoff_needs_the_loading_threads_wait(producer_waits):
  """A barrier arrival does not carry the completion of the arriving thread's TMEM loads."""
  @plgpu.kernel(out_shape=S((128, 128), F32), num_threads=2, thread_name="wg", scratch_shapes=dict(
      tmem=plgpu.TMEM((128, 128), F32), handoff=mma_barrier()))
  def kernel(x_ref, o_ref, tmem, handoff):
    @pl.when(lax.axis_index("wg") == 0)
    def _():
      plgpu.async_store_tmem(tmem, x_ref[...])
      plgpu.commit_tmem()
      o_ref[...] = plgpu.async_load_tmem(tmem)
      if producer_waits:
        plgpu.wait_load_tmem()
      plgpu.barrier_arrive(handoff)

    @pl.when(lax.axis_index("wg") == 1)
    def _():
      plgpu.barrier_wait(handoff)
      plgpu.async_store_tmem(tmem, jnp.zeros((128, 128), F32))
      plgpu.commit_tmem()

  x = rand(32, (128, 128), F32)
  if producer_waits:
    np.testing.assert_array_equal(kernel(x), x)
  else:
    fails(kernel, (x,), r"thread wg=1 .*async_store_tmem overwrites TMEM tmem while the "
                        r"async_load_tmem of it by thread wg=0")


@pytest.mark.parametrize("second", ["load", "store"])
def test_tmem_stores_need_commit_tmem(second):
  @plgpu.kernel(out_shape=S((128, 64), F32), scratch_shapes=dict(tmem=plgpu.TMEM((128, 64), F32)))
  def kernel(x_ref, o_ref, tmem):
    plgpu.async_store_tmem(tmem, x_ref[...])
    if second == "store":
      plgpu.async_store_tmem(tmem, x_ref[...] * 2)
    plgpu.commit_tmem()
    plgpu.async_store_tmem(tmem.at[:, pl.ds(0, 16)], jnp.ones((128, 16), F32))
    o_ref[...] = plgpu.async_load_tmem(tmem)

  how = "async_store_tmem" if second == "store" else "async_load_tmem"
  fails(kernel, (rand(33, (128, 64), F32),),
        rf"{how} uses TMEM tmem while the async_store_tmem into it by the kernel at .* is not "
        r"committed: call plgpu.commit_tmem\(\)")


def test_tmem_over_budget():
  @plgpu.kernel(out_shape=S((128, 128), F32), scratch_shapes=dict(
      acc=plgpu.TMEM((128, 256), F32), more=plgpu.TMEM((2, 128, 128), F32),
      packed=plgpu.TMEM((128, 16), jnp.bfloat16, packed=True)))
  def kernel(o_ref, acc, more, packed):
    o_ref[...] = jnp.zeros((128, 128), F32)

  # The kernel's own scratch: no line of the kernel allocates it.
  msg = fails(kernel, (), r"TMEM allocations of 520 columns \(acc: 256; more: 256; packed: 8\), "
                          r"exceeding the limit of 512", ValueError, line=False)
  assert "the kernel of block (0)" in msg


def test_tmem_budget_counts_scopes_alive_together():
  """Scopes one after another may each take all 512 columns; nested ones add up."""
  def kernel(o_ref, nest):
    for _ in range(2):
      @functools.partial(pl.run_scoped, t=plgpu.TMEM((128, 512), F32))
      def _(t):
        plgpu.async_store_tmem(t.at[:, pl.ds(0, 128)], jnp.ones((128, 128), F32))
        plgpu.commit_tmem()
        o_ref[...] = plgpu.async_load_tmem(t.at[:, pl.ds(0, 128)])
        plgpu.wait_load_tmem()
        if nest:
          pl.run_scoped(lambda u: None, plgpu.TMEM((64, 32), F32))

  ok = plgpu.kernel(lambda o: kernel(o, False), out_shape=S((128, 128), F32))
  np.testing.assert_array_equal(ok(), np.ones((128, 128)))
  bad = plgpu.kernel(lambda o: kernel(o, True), out_shape=S((128, 128), F32))
  fails(bad, (), r"TMEM allocations of 528 columns .*already held: t: 512\), exceeding the "
                 r"limit of 512", ValueError)


@pytest.mark.parametrize("m,n,k,dtype,acc,pattern,cls", [
    (32, 128, 64, jnp.bfloat16, F32, r"Only M=128 and M=64 are supported for MMA, but got M=32",
     ValueError),
    (128, 12, 32, F32, F32, r"In 1 CTA MMA, N must be a multiple of 8, got N=12", ValueError),
    (64, 24, 64, jnp.bfloat16, F32, r"with 2 lane groups, N must be a multiple of 16, got N=24",
     ValueError),
    (128, 384, 64, jnp.bfloat16, F32, r"The only supported N > 256, is 512, but got N=384",
     NotImplementedError),
    (128, 128, 32, jnp.bfloat16, F32, r"K must be a multiple of 64, got: 32", ValueError),
    (128, 128, 64, jnp.bfloat16, jnp.float16, r"MMA with element type bfloat16 only supports "
     r"accumulators of type float32, but got: float16", ValueError),
    (128, 128, 64, jnp.int8, F32, r"element type int8 only supports accumulators of type int32",
     ValueError),
])
def test_shapes_tcgen05_cannot_run(m, n, k, dtype, acc, pattern, cls):
  a, b = rand(34, (m, k), dtype), rand(35, (k, n), dtype)
  rows = max(m, 64)   # TMEM has 64 or 128 rows; M=32 is a view of them

  @plgpu.kernel(out_shape=S((m, n), acc), scratch_shapes=dict(
      a_smem=plgpu.SMEM((m, k), dtype), b_smem=plgpu.SMEM((k, n), dtype),
      acc=plgpu.TMEM((rows, n), acc, packed=acc == jnp.float16 or None), done=mma_barrier()))
  def kernel(a_ref, b_ref, o_ref, a_smem, b_smem, acc, done):
    a_smem[...] = a_ref[...]
    b_smem[...] = b_ref[...]
    plgpu.commit_smem()
    plgpu.tcgen05_mma(acc.at[pl.ds(0, m)], a_smem, b_smem, done, accumulate=False)

  fails(kernel, (a, b), pattern, cls)


def test_operand_rules():
  @matmul(128, 128, 128, plain=plgpu.Barrier())
  def no_tc_order(a_ref, b_ref, o_ref, a_smem, b_smem, acc, tma, done, plain):
    fetch([(a_ref, a_smem), (b_ref, b_smem)], tma)
    plgpu.tcgen05_mma(acc, a_smem, b_smem, plain, accumulate=False)

  fails(no_tc_order, AB, r"MMA barrier must have orders_tensor_core set to True. \(barrier plain",
        ValueError)

  @matmul(128, 128, 128)
  def plain_read(a_ref, b_ref, o_ref, a_smem, b_smem, acc, tma, done):
    o_ref[...] = acc[...]

  fails(plain_read, AB, r"TMEM acc: Loads from TMEM are asynchronous operations", RuntimeError)

  @matmul(128, 128, 128, c_smem=plgpu.SMEM((128, 128), F32))
  def acc_in_smem(a_ref, b_ref, o_ref, a_smem, b_smem, acc, tma, done, c_smem):
    fetch([(a_ref, a_smem), (b_ref, b_smem)], tma)
    plgpu.tcgen05_mma(c_smem, a_smem, b_smem, done, accumulate=False)

  fails(acc_in_smem, AB, r"tcgen05_mma: the accumulator must be a TMEM Ref, but SMEM c_smem",
        ValueError)
  # Collective MMAs (collective_axis=) run now: test_mosaic_gpu_blackwell_compat.py.


@pytest.mark.parametrize("make,pattern", [
    (lambda: plgpu.TMEM((96, 128), F32), "TMEM references must have either 128 or 64 rows"),
    (lambda: plgpu.TMEM((128, 128), jnp.bfloat16), "require either the packed argument"),
    (lambda: plgpu.TMEM((128,), F32), "TMEM can only represent 2D shapes"),
    (lambda: plgpu.SMEM((128, 128), F32, packed=True), "only supported for TMEM"),
])
def test_tmem_types(make, pattern):
  with pytest.raises(ValueError, match=pattern):
    make()
  assert plgpu.TMEM((128, 256), jnp.float16, packed=True).columns == 128
  assert plgpu.TMEM((64, 128), F32).columns == 64


def test_deadlock_inside_warp_map_names_the_warp():
  @plgpu.kernel(out_shape=S((128, 128), F32), scratch_shapes=dict(bar=mma_barrier()))
  def kernel(o_ref, bar):
    @plgpu.warp_map
    def _(warp):
      @pl.when(warp == 2)
      def _():
        plgpu.barrier_wait(bar)
    o_ref[...] = jnp.zeros((128, 128), F32)

  with pytest.raises(KernelCheckError, match=r"deadlock.*\(warp 2\) barrier bar"):
    kernel()


# --- ... and kept ------------------------------------------------------------------------------------

def test_pipelined_mmas_and_completions_passed_on():
  """No wait between MMAs into one accumulator (even across threads, ordered by a barrier):
  the last one's completion covers the earlier ones; a thread that learned of a completion
  passes it on through an orders_tensor_core barrier."""
  a, b = rand(36, (128, 64), jnp.bfloat16), rand(37, (64, 128), jnp.bfloat16)

  @plgpu.kernel(out_shape=S((128, 128), F32), num_threads=2, thread_name="wg", scratch_shapes=dict(
      a_smem=plgpu.SMEM((128, 64), jnp.bfloat16), b_smem=plgpu.SMEM((64, 128), jnp.bfloat16),
      acc=plgpu.TMEM((128, 128), F32), tma=tma_barrier(), turn=mma_barrier(), done=mma_barrier(),
      told=mma_barrier()))
  def kernel(a_ref, b_ref, o_ref, a_smem, b_smem, acc, tma, turn, done, told):
    @pl.when(lax.axis_index("wg") == 0)
    def _():
      fetch([(a_ref, a_smem), (b_ref, b_smem)], tma)
      plgpu.tcgen05_mma(acc, a_smem, b_smem, accumulate=False)
      plgpu.tcgen05_mma(acc, a_smem, b_smem)
      plgpu.barrier_arrive(turn)

    @pl.when(lax.axis_index("wg") == 1)
    def _():
      plgpu.barrier_wait(tma)   # both threads wait for the copies
      plgpu.barrier_wait(turn)
      plgpu.tcgen05_mma(acc, a_smem, b_smem, done)
      plgpu.barrier_wait(done)
      plgpu.barrier_arrive(told)

    @pl.when(lax.axis_index("wg") == 0)
    def _():
      plgpu.barrier_wait(told)
      o_ref[...] = plgpu.async_load_tmem(acc)

  np.testing.assert_allclose(kernel(a, b), 3 * ref_dot(a, b), **CLOSE)


# --- 4. Gluon ----------------------------------------------------------------------------------------

def test_gluon_refuses_blackwell_kernels_naming_the_interpreter():
  from pallax._src.gpu.source import Unsupported

  def kernel(o_ref, t):
    plgpu.async_store_tmem(t, jnp.ones((128, 32), F32))
    plgpu.commit_tmem()
    o_ref[...] = plgpu.async_load_tmem(t)

  k = plgpu.kernel(kernel, out_shape=S((128, 32), F32), scratch_shapes=[plgpu.TMEM((128, 32), F32)])
  with pytest.raises(Unsupported, match=r"is Blackwell's \(sm_100a\).*interpret=True"):
    plgpu.lower(k)


def _ptx_counts(kernel, *args):
  (c,) = plgpu.lower(kernel, *args, compute_capability=100)
  assert ".target sm_100a" in c.ptx
  return {w: c.ptx.count(w) for w in ("tcgen05.mma", "tcgen05.ld", "tcgen05.st", "tcgen05.commit",
                                      "tcgen05.alloc", "cp.async.bulk.tensor")}


def test_gluon_compiles_tcgen05_kernels_for_sm_100a():
  """plgpu.lower(..., compute_capability=100): Gluon for Blackwell, compiled on this machine
  (never run on Blackwell hardware here): the MMA, the TMEM load and the commit in the PTX."""
  a, b = rand(40, (128, 64), jnp.bfloat16), rand(41, (64, 128), jnp.bfloat16)

  @matmul(128, 128, 64)
  def one(a_ref, b_ref, o_ref, a_smem, b_smem, acc, tma, done):
    fetch([(a_ref, a_smem), (b_ref, b_smem)], tma)
    plgpu.tcgen05_mma(acc, a_smem, b_smem, done, accumulate=False)
    plgpu.barrier_wait(done)
    o_ref[...] = plgpu.async_load_tmem(acc)

  counts = _ptx_counts(one, a, b)
  assert all(counts[w] for w in ("tcgen05.mma", "tcgen05.ld", "tcgen05.alloc")), counts
  assert counts["cp.async.bulk.tensor"] == 2, counts
  np.testing.assert_allclose(one(a, b), ref_dot(a, b), **CLOSE)   # and the interpreter agrees


@pytest.mark.parametrize("make", [k_loop_kernel, two_thread_kernel])
def test_gluon_compiles_pipelined_and_threaded_tcgen05_kernels_for_sm_100a(make):
  kernel, args, want = make()
  counts = _ptx_counts(kernel, *args)
  assert all(counts[w] for w in ("tcgen05.mma", "tcgen05.ld", "tcgen05.commit")), counts
  np.testing.assert_allclose(kernel(*args), want, **CLOSE)


def test_gluon_compiles_tmem_stores_for_sm_100a():
  """An accumulator started by a TMEM store (a bias), then an MMA accumulating into it."""
  a, b, c = rand(47, (128, 64), jnp.float16), rand(48, (64, 128), jnp.float16), rand(49, (128, 128), F32)

  @matmul(128, 128, 64, jnp.float16)
  def kernel(a_ref, b_ref, c_ref, o_ref, a_smem, b_smem, acc, tma, done):
    plgpu.async_store_tmem(acc, c_ref[...])
    plgpu.commit_tmem()
    fetch([(a_ref, a_smem), (b_ref, b_smem)], tma)
    plgpu.tcgen05_mma(acc, a_smem, b_smem, done)
    plgpu.barrier_wait(done)
    for half in (0, 64):   # static column slices of the accumulator
      o_ref[:, pl.ds(half, 64)] = plgpu.async_load_tmem(acc.at[:, pl.ds(half, 64)]) * 2

  np.testing.assert_allclose(kernel(a, b, c), 2 * (c + ref_dot(a, b)), **CLOSE)
  counts = _ptx_counts(kernel, a, b, c)
  assert all(counts[w] for w in ("tcgen05.mma", "tcgen05.ld", "tcgen05.st")), counts


def test_gluon_for_sm_100a_refuses_what_it_does_not_write_yet():
  """What Gluon 3.6 cannot express, or pallax does not write, for sm_100a: an error naming it
  and pointing to the interpreter."""
  from pallax._src.gpu.source import Unsupported

  @plgpu.kernel(out_shape=S((128, 128), F32), scratch_shapes=[plgpu.TMEM((128, 256), F32)],
                grid=(2,), grid_names=("i",))
  def unaligned_slice(o_ref, t):   # a run-time start not known to be a multiple of 128
    o_ref[...] = plgpu.async_load_tmem(t.at[:, pl.ds(lax.axis_index("i") * 64, 128)])

  def int8_mma(o_ref, a, b, acc, bar):
    plgpu.tcgen05_mma(acc, a, b, bar, accumulate=False)

  int8 = plgpu.kernel(int8_mma, out_shape=S((128, 128), F32), scratch_shapes=[
      plgpu.SMEM((128, 64), jnp.int8), plgpu.SMEM((64, 128), jnp.int8),
      plgpu.TMEM((128, 128), jnp.int32), mma_barrier()])
  @plgpu.kernel(out_shape=S((128, 128), F32), cluster=(2,), cluster_names=("x",),
                scratch_shapes=[plgpu.TMEM((128, 128), F32, collective=True)])
  def collective(o_ref, t):
    o_ref[...] = plgpu.async_load_tmem(t)

  cases = [(unaligned_slice, r"TMEM column slices of size 128 from a run-time start not known to "
                             r"be a multiple of 128"),
           (int8, r"tcgen05_mma of int8 operands into an int32 accumulator"),
           (collective, r"collective TMEM .*collective \(two-block\) MMAs over a cluster")]
  for kernel, pattern in cases:
    with pytest.raises(Unsupported, match=pattern + r".*interpret=True"):
      plgpu.lower(kernel, compute_capability=100)


@pytest.mark.parametrize("index", [(1, 0), (0, 1)])
def test_mma_completion_on_a_barrier_of_a_2d_array(index):
  """``Barrier(num_barriers=(2, 2))`` indexed in both dimensions (Gluon allocates it flat)."""
  a, b = rand(58, (128, 64), jnp.float16), rand(59, (64, 128), jnp.float16)

  @matmul(128, 128, 64, jnp.float16, bars=mma_barrier(num_barriers=(2, 2)))
  def kernel(a_ref, b_ref, o_ref, a_smem, b_smem, acc, tma, done, bars):
    fetch([(a_ref, a_smem), (b_ref, b_smem)], tma)
    plgpu.tcgen05_mma(acc, a_smem, b_smem, bars.at[index], accumulate=False)
    plgpu.barrier_wait(bars.at[index])
    o_ref[...] = plgpu.async_load_tmem(acc)

  np.testing.assert_allclose(kernel(a, b), ref_dot(a, b), **CLOSE)
  (c,) = plgpu.lower(kernel, a, b, compute_capability=100)
  assert f"mbarriers=[bar.index({2 * index[0] + index[1]})]" in c.source, c.source


@pytest.mark.parametrize("outside", [False, True])
def test_gluon_splits_a_thread_into_warps_only_if_it_does_nothing_else(outside):
  """Thread 0's warp_map: a TMA warp and an MMA warp, each a partition of one warp for sm_100a;
  unless thread 0 also does something outside warp_map (each warp's partition would do it once
  more), where its warps' bodies are written one after another in its warpgroup."""
  a, b = rand(60, (128, 64), jnp.float16), rand(61, (64, 128), jnp.float16)

  @plgpu.kernel(out_shape=S((128, 128), F32), num_threads=2, thread_name="wg", scratch_shapes=dict(
      a_smem=plgpu.SMEM((128, 64), jnp.float16), b_smem=plgpu.SMEM((64, 128), jnp.float16),
      acc=plgpu.TMEM((128, 128), F32), tma=tma_barrier(), done=mma_barrier(),
      told=plgpu.Barrier()))
  def kernel(a_ref, b_ref, o_ref, a_smem, b_smem, acc, tma, done, told):
    @pl.when(lax.axis_index("wg") == 0)
    def _():
      @plgpu.warp_map
      def _(warp):
        @pl.when(warp == 0)
        def _():
          plgpu.copy_gmem_to_smem(a_ref, a_smem, tma)
          plgpu.copy_gmem_to_smem(b_ref, b_smem, tma)

        @pl.when(warp == 1)
        def _():
          plgpu.barrier_wait(tma)
          plgpu.tcgen05_mma(acc, a_smem, b_smem, done, accumulate=False)
      if outside:
        plgpu.barrier_arrive(told)

    @pl.when(lax.axis_index("wg") == 1)
    def _():
      plgpu.barrier_wait(done)
      if outside:
        plgpu.barrier_wait(told)
      o_ref[...] = plgpu.async_load_tmem(acc)

  np.testing.assert_allclose(kernel(a, b), ref_dot(a, b), **CLOSE)
  (c,) = plgpu.lower(kernel, a, b, compute_capability=100)
  workers = re.search(r"gl\.warp_specialize\(.*\], (\[[\d, ]*\]), \[", c.source).group(1)
  assert workers == ("[4]" if outside else "[1, 4]"), c.source[-600:]
  assert all(w in c.ptx for w in ("tcgen05.mma", "tcgen05.ld", "tcgen05.commit"))


@pytest.mark.gluon_refuses("warp 0 waits on barrier[0] and warp 1")   # (for sm_90a, in CI)
def test_gluon_splits_a_kernel_of_warps_waiting_on_each_other_for_sm_100a():
  """A kernel of one thread that is all per-warp code: warps 0 and 1 each arrive on a barrier
  of two arrivals and wait for it, so neither may run before the other (written one after the
  other they would deadlock): for sm_100a a partition of one warp each."""
  @plgpu.kernel(out_shape=S((4,), jnp.int32), scratch_shapes=[plgpu.Barrier(num_arrivals=2)])
  def kernel(o_ref, bar):
    @plgpu.warp_map
    def _(warp):
      @pl.when(warp < 2)
      def _():
        plgpu.barrier_arrive(bar)
        plgpu.barrier_wait(bar)
        o_ref[warp] = warp + 10

      @pl.when(warp >= 2)
      def _():
        o_ref[warp] = -warp

  np.testing.assert_array_equal(kernel(), [10, 11, -2, -3])
  with pytest.raises(NotImplementedError, match=r"warp 0 waits on barrier\[0\] and warp 1"):
    plgpu.lower(kernel)   # sm_90a writes the warps one after another
  (c,) = plgpu.lower(kernel, compute_capability=100)
  assert re.search(r"gl\.warp_specialize\(.*\], \[1, 1, 1\], \[", c.source), c.source[-600:]
  assert c.ptx.count("mbarrier.try_wait") >= 2


def test_gluon_writes_one_mma_warp_inside_warpgroup_code_for_sm_100a():
  """One warp issues the MMA, the warpgroup around it copies, waits and reads the result: the
  warps' bodies stay in the warpgroup's code (no split: the code around them would run once
  per warp)."""
  a, b = rand(62, (128, 128), jnp.float16), rand(63, (128, 128), jnp.float16)

  @matmul(128, 128, 128, jnp.float16)
  def kernel(a_ref, b_ref, o_ref, a_smem, b_smem, acc, tma, done):
    fetch([(a_ref, a_smem), (b_ref, b_smem)], tma)

    @plgpu.warp_map
    def _(warp):
      @pl.when(warp == 0)
      def _():
        plgpu.tcgen05_mma(acc, a_smem, b_smem, done, accumulate=False)
    plgpu.barrier_wait(done)
    o_ref[...] = plgpu.async_load_tmem(acc)

  np.testing.assert_allclose(kernel(a, b), ref_dot(a, b), **CLOSE)
  (c,) = plgpu.lower(kernel, a, b, compute_capability=100)
  assert "warp_specialize" not in c.source and "# warp 0 of plgpu.warp_map" in c.source
  assert all(w in c.ptx for w in ("tcgen05.mma", "tcgen05.ld", "tcgen05.commit"))


def test_gluon_knows_what_run_time_starts_are_multiples_of():
  """The proof a TMEM slot from a run-time start needs (gluon/multiples.py)."""
  from pallax._src.gluon.multiples import ANY, known_multiple
  from pallax._src.gpu import expr as ex
  i32 = np.dtype(np.int32)
  i, j = ex.Name("i", dtype=i32), ex.Name("j", dtype=i32)
  lit = lambda v: ex.Lit(v, dtype=i32)   # noqa: E731
  known = {"j": 64}
  assert known_multiple(ex.mul(i, lit(128)), known) == 128
  assert known_multiple(ex.binary("+", ex.mul(i, lit(128)), j), known) == 64
  assert known_multiple(ex.binary("+", ex.mul(i, lit(128)), lit(32)), known) == 32
  assert known_multiple(ex.binary("//", j, lit(2)), known) == 1   # (not proven)
  assert known_multiple(i, known) == 1 and known_multiple(lit(0), known) == ANY


def test_gluon_compiles_tf32_products_of_k_major_operands_for_sm_100a():
  """float32 operands (tf32) both K-major: a (M, K), b the transpose of an (N, K) buffer."""
  a, bt = rand(56, (128, 32), F32), rand(57, (64, 32), F32)

  @plgpu.kernel(out_shape=S((128, 64), F32), scratch_shapes=dict(
      a_smem=plgpu.SMEM((128, 32), F32), b_smem=plgpu.SMEM((64, 32), F32),
      acc=plgpu.TMEM((128, 64), F32), tma=tma_barrier(), done=mma_barrier()))
  def kernel(a_ref, b_ref, o_ref, a_smem, b_smem, acc, tma, done):
    fetch([(a_ref, a_smem), (b_ref, b_smem)], tma)
    plgpu.tcgen05_mma(acc, a_smem, b_smem.T, done, accumulate=False)
    plgpu.barrier_wait(done)
    o_ref[...] = plgpu.async_load_tmem(acc)

  np.testing.assert_allclose(kernel(a, bt), ref_dot(a, bt.T), **CLOSE)
  counts = _ptx_counts(kernel, a, bt)
  assert all(counts[w] for w in ("tcgen05.mma", "tcgen05.ld", "tcgen05.commit")), counts
  assert "kind::tf32" in plgpu.lower(kernel, a, bt, compute_capability=100)[0].ptx


@pytest.mark.parametrize("dtype,kind", [(jnp.float16, "f16"), (jnp.float8_e4m3fn, "f8f6f4")])
def test_gluon_compiles_a_in_tmem_and_smem_to_tmem_copies_for_sm_100a(dtype, kind):
  """An SMEM->TMEM copy (a register round trip: tcgen05.st) feeding an MMA whose a is in TMEM
  (the ``tcgen05.mma [d], [a], b`` form), a packed two or four to a column."""
  a, b = rand(50, (128, 128), dtype), rand(51, (128, 64), dtype)
  kernel = _a_in_tmem(dtype)
  np.testing.assert_allclose(kernel(a, b), ref_dot(a, b), **CLOSE)
  (c,) = plgpu.lower(kernel, a, b, compute_capability=100)
  assert all(w in c.ptx for w in ("tcgen05.st", "tcgen05.ld", "tcgen05.commit")), c.ptx[-2000:]
  assert re.search(rf"tcgen05\.mma\.cta_group::1\.kind::{kind} \[ %r\d+ \+ 0 \], \[ %r", c.ptx)


def test_gluon_compiles_m64_reduced_loads_and_dynamic_slices_for_sm_100a():
  """M=64 MMAs; a TMEM load reduced along its rows; accumulator slots picked at run time
  (``acc.at[:, pl.ds(slot * n, n)]``, as JAX's Blackwell matmul picks them)."""
  a, b = rand(52, (64, 64), jnp.bfloat16), rand(53, (64, 64), jnp.bfloat16)

  @plgpu.kernel(out_shape=(S((2, 64, 64), F32), S((2, 64), F32)), grid=(2,), grid_names=("i",),
                scratch_shapes=dict(a_smem=plgpu.SMEM((64, 64), jnp.bfloat16),
                                    b_smem=plgpu.SMEM((64, 64), jnp.bfloat16),
                                    acc=plgpu.TMEM((64, 128), F32), tma=tma_barrier(),
                                    done=mma_barrier()))
  def kernel(a_ref, b_ref, o_ref, mx_ref, a_smem, b_smem, acc, tma, done):
    i = lax.axis_index("i")
    fetch([(a_ref, a_smem), (b_ref, b_smem)], tma)
    slot = acc.at[:, pl.ds(i * 64, 64)]
    plgpu.tcgen05_mma(slot, a_smem, b_smem, done, accumulate=False)
    plgpu.barrier_wait(done)
    o_ref[i], mx_ref[i] = plgpu.async_load_tmem(slot, reduce="absmax")

  out, mx = kernel(a, b)
  want = ref_dot(a, b)
  np.testing.assert_allclose(out, np.stack([want, want]), **CLOSE)
  np.testing.assert_allclose(mx, np.abs(np.asarray(out)).max(-1), **CLOSE)
  (c,) = plgpu.lower(kernel, a, b, compute_capability=100)
  assert ".index(" in c.source and "gl.max(" in c.source, c.source
  assert all(w in c.ptx for w in ("tcgen05.mma", "tcgen05.ld.sync.aligned.16x32bx2", "tcgen05.commit"))


def test_gluon_compiles_jax_blackwell_matmul_for_sm_100a(blackwell_matmul):
  """JAX's kernel for sm_100a: its TMA warp and MMA warp (``warp_map``) as partitions of one
  warp each beside the epilogue warpgroup, ``dynamic_scheduling_loop`` as a static schedule."""
  a, b = rand(54, (256, 256), jnp.float16), rand(55, (256, 256), jnp.float16)
  cfg = blackwell_matmul.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=3,
                                      collective=False)
  (c,) = plgpu.lower(functools.partial(blackwell_matmul.matmul_kernel, config=cfg), a, b,
                     compute_capability=100)
  assert re.search(r"gl\.warp_specialize\(.*\], \[1, 4\], ", c.source), c.source[-800:]
  assert all(w in c.ptx for w in ("tcgen05.mma", "tcgen05.ld", "tcgen05.commit")), c.ptx[-2000:]
  out = blackwell_matmul.matmul_kernel(a, b, cfg)   # and the interpreter agrees with jnp
  np.testing.assert_allclose(np.asarray(out, F32), np.asarray(ref_dot(a, b).astype(jnp.float16), F32),
                             rtol=1e-3, atol=1e-3)


@pytest.mark.gluon_refuses("in plgpu.warp_map (at")
def test_core_map_over_a_warp_mesh():
  """``pl.core_map(plgpu.WarpMesh(...))`` inside a kernel: the warps as threads (JAX's
  interpreter tests write warp-specialized kernels so)."""
  x = rand(42, (128, 64), F32)

  @plgpu.kernel(out_shape=S((128, 64), F32), scratch_shapes=dict(
      tmem=plgpu.TMEM((128, 64), F32), handoff=mma_barrier()))
  def kernel(x_ref, o_ref, tmem, handoff):
    @pl.core_map(plgpu.WarpMesh(axis_name="w"))
    def _():
      w = lax.axis_index("w")

      @pl.when(w == 3)
      def _():
        plgpu.barrier_wait(handoff)   # warp 3 waits for warp 1
        o_ref[...] = plgpu.async_load_tmem(tmem) * 2

      @pl.when(w == 1)
      def _():
        plgpu.async_store_tmem(tmem, x_ref[...])
        plgpu.commit_tmem()
        plgpu.barrier_arrive(handoff)

  np.testing.assert_array_equal(kernel(x), x * 2)

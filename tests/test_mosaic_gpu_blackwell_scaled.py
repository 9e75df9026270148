"""Block-scaled ``plgpu.tcgen05_mma`` (``a_scale=``, ``b_scale=``): the interpreter against
NumPy (operands dequantized with their scales, then multiplied), and the Gluon backend's
sm_100a code (``blackwell.tcgen05_mma_scaled``, PTX ``tcgen05.mma ... kind::mxf8f6f4
.block_scale`` for float8, ``kind::mxf4`` for float4 held two a byte in SMEM), and what it refuses
by name.

Inputs are chosen so that every product and partial sum is exact in float32 (operands small
integers or halves, scales powers of two in [2^-3, 2^3]), so the interpreter's result must equal
the NumPy reference exactly, whatever the summation order.
"""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import pallax.mosaic_gpu as plgpu

pytestmark = [pytest.mark.interpreter]

S = jax.ShapeDtypeStruct
F32 = jnp.float32
E8M0 = jnp.float8_e8m0fnu
BLOCK = 32   # elements of K per scale (e8m0 scales of float8 operands)


def exact_operand(seed, shape, dtype):
  """Values in {-2, -1.5, ..., 2}: exact in float8 and float4 (e2m1), and in float32 products
  and sums."""
  x = np.random.default_rng(seed).integers(-4, 5, size=shape) / 2
  return jnp.asarray(x.astype(np.float32)).astype(dtype)


def scales(seed, rows, k, block=BLOCK):
  """Powers of two 2^-3 .. 2^3 as e8m0 (biased exponents 124 .. 130), one per ``block`` of K."""
  bits = np.random.default_rng(seed).integers(124, 131, size=(rows, k // block), dtype=np.uint8)
  return jnp.asarray(bits.view(ml_dtypes.float8_e8m0fnu))


def tiles(s):
  """(rows, k) scales in the SMEM tiles the tensor core reads: per 128 rows and 4 scales a
  (32, 16) tile, row r and scale c at [r % 32, (r // 32) * 4 + c % 4]."""
  s = np.asarray(s)
  rows, kk = s.shape
  out = np.zeros((rows // 128, kk // 4, 32, 16), s.dtype)
  for r in range(rows):
    for c in range(kk):
      out[r // 128, c // 4, r % 32, (r % 128) // 32 * 4 + c % 4] = s[r, c]
  return jnp.asarray(out)


def dequantized_product(a, sa, b_nk, sb):
  """(a * sa) @ (b * sb).T in float64, the scales repeated over their blocks of K."""
  f = lambda x: np.asarray(x.astype(F32), np.float64)   # noqa: E731
  wide = lambda s: np.repeat(f(s), a.shape[1] // s.shape[1], axis=1)   # noqa: E731
  return (f(a) * wide(sa)) @ (f(b_nk) * wide(sb)).T


def scaled_kernel(m, n, k, a_dt, b_dt, tiled=True, b_k_major=True, block=BLOCK):
  """One block-scaled MMA: a (m, k), b given (n, k) (K-major, as a transposed view) or (k, n),
  scales (one per ``block`` of K) passed in SMEM (tiled or as (rows, k)) and copied to TMEM."""
  kk = k // block
  sa_smem = (m // 128, kk // 4, 32, 16) if tiled else (m, kk)
  sb_smem = (n // 128, kk // 4, 32, 16) if tiled else (n, kk)

  @plgpu.kernel(out_shape=S((m, n), F32), scratch_shapes=dict(
      a_smem=plgpu.SMEM((m, k), a_dt),
      b_smem=plgpu.SMEM((n, k) if b_k_major else (k, n), b_dt),
      sa_smem=plgpu.SMEM(sa_smem, E8M0), sb_smem=plgpu.SMEM(sb_smem, E8M0),
      acc=plgpu.TMEM((m, n), F32),
      sa_tmem=plgpu.TMEM((m, kk), E8M0, layout=plgpu.TMEMLayout.SCALES_LAYOUT),
      sb_tmem=plgpu.TMEM((n, kk), E8M0, layout=plgpu.TMEMLayout.SCALES_LAYOUT),
      tma=plgpu.Barrier(num_arrivals=4 if tiled else 2),
      done=plgpu.Barrier(orders_tensor_core=True)))
  def kernel(a_ref, b_ref, sa_ref, sb_ref, o_ref, a_smem, b_smem, sa_smem, sb_smem, acc,
             sa_tmem, sb_tmem, tma, done):
    copies = ((a_ref, a_smem), (b_ref, b_smem), (sa_ref, sa_smem), (sb_ref, sb_smem))
    for src, dst in copies if tiled else copies[:2]:
      plgpu.copy_gmem_to_smem(src, dst, tma)
    if not tiled:   # rows of 4 bytes: too narrow for TMA, stored from registers
      sa_smem[...] = sa_ref[...]
      sb_smem[...] = sb_ref[...]
      plgpu.commit_smem()
    plgpu.barrier_wait(tma)
    plgpu.async_copy_scales_to_tmem(sa_smem, sa_tmem)
    plgpu.async_copy_scales_to_tmem(sb_smem, sb_tmem)
    b = plgpu.transpose_ref(b_smem, (1, 0)) if b_k_major else b_smem
    plgpu.tcgen05_mma(acc, a_smem, b, done, a_scale=sa_tmem, b_scale=sb_tmem, accumulate=False)
    plgpu.barrier_wait(done)
    o_ref[...] = plgpu.async_load_tmem(acc)

  return kernel


def operands(m, n, k, a_dt, b_dt, tiled=True, b_k_major=True, block=BLOCK):
  a, b_nk = exact_operand(1, (m, k), a_dt), exact_operand(2, (n, k), b_dt)
  sa, sb = scales(3, m, k, block), scales(4, n, k, block)
  args = (a, b_nk if b_k_major else b_nk.T, tiles(sa) if tiled else sa,
          tiles(sb) if tiled else sb)
  return args, dequantized_product(a, sa, b_nk, sb)


E4M3, E5M2, F4 = jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.float4_e2m1fn
CASES = [
    (128, 128, 128, E4M3, E4M3, True, True),
    (128, 256, 128, E5M2, E5M2, True, True),
    (128, 128, 256, E4M3, E5M2, True, True),
    (128, 128, 128, E5M2, E4M3, False, True),
    (128, 128, 128, E4M3, E4M3, True, False),
    (128, 128, 256, F4, F4, True, True),
    (128, 256, 256, F4, F4, True, True),
]
# Gluon's operand formats, and the PTX MMA kind each pair compiles to
FORMATS = {np.dtype(E4M3): "e4m3", np.dtype(E5M2): "e5m2", np.dtype(F4): "e2m1"}


@pytest.mark.parametrize("m,n,k,a_dt,b_dt,tiled,b_k_major", CASES)
def test_interpreter_matches_dequantized_product(m, n, k, a_dt, b_dt, tiled, b_k_major):
  args, want = operands(m, n, k, a_dt, b_dt, tiled, b_k_major)
  got = scaled_kernel(m, n, k, a_dt, b_dt, tiled, b_k_major)(*args)
  np.testing.assert_array_equal(np.asarray(got, np.float64), want)


def ptx_and_source(m, n, k, a_dt, b_dt, tiled=True, b_k_major=True):
  args, _ = operands(m, n, k, a_dt, b_dt, tiled, b_k_major)
  (c,) = plgpu.lower(scaled_kernel(m, n, k, a_dt, b_dt, tiled, b_k_major), *args,
                     compute_capability=100)
  return c.ptx, c.source


@pytest.mark.parametrize("m,n,k,a_dt,b_dt,tiled,b_k_major", CASES)
def test_lowers_to_block_scaled_tcgen05_mma(m, n, k, a_dt, b_dt, tiled, b_k_major):
  ptx, source = ptx_and_source(m, n, k, a_dt, b_dt, tiled, b_k_major)
  assert (f'"{FORMATS[np.dtype(a_dt)]}", "{FORMATS[np.dtype(b_dt)]}"') in source
  assert "blackwell.TensorMemoryScalesLayout()" in source
  kind = "kind::mxf4.block_scale.scale_vec::2X" if np.dtype(a_dt) == np.dtype(F4) else \
      "kind::mxf8f6f4.block_scale.scale_vec::1X"
  mma = [line for line in ptx.splitlines() if "tcgen05.mma" in line]
  assert mma and all(kind in line for line in mma)
  assert "tcgen05.st" in ptx   # the scales stored into TMEM


def test_float4_operands_are_copied_as_their_bytes():
  """float4 SMEM holds two values a byte, as GMEM does: the buffers are rows of k/2 bytes and
  TMA moves those (a barrier expects each operand's bytes once)."""
  m, n, k = 128, 128, 256
  _, source = ptx_and_source(m, n, k, F4, F4)
  assert source.count(f"gl.allocate_shared_memory(gl.uint8, [{m}, {k // 2}]") == 2
  assert source.count(f"mbarrier.expect(bar2.index(0), {m * k // 2})") == 2


def refusal(kernel, *args):
  with pytest.raises(NotImplementedError) as e:
    plgpu.lower(kernel, *args, compute_capability=100)
  return str(e.value)


def scratch_kernel(n, b_scale_rows, dtype, k=128, b_dtype=None, scaled=True):
  """One block-scaled MMA of SMEM and TMEM scratch (nothing read from GMEM but the result);
  ``scaled=False``: the same MMA without its scales."""
  m, kk = 128, k // BLOCK
  sa_tiles, sb_tiles = (1, kk // 4, 32, 16), (b_scale_rows // 128, kk // 4, 32, 16)

  @plgpu.kernel(out_shape=S((m, n), F32), scratch_shapes=dict(
      a_smem=plgpu.SMEM((m, k), dtype), b_smem=plgpu.SMEM((n, k), b_dtype or dtype),
      sa_smem=plgpu.SMEM(sa_tiles, E8M0), sb_smem=plgpu.SMEM(sb_tiles, E8M0),
      acc=plgpu.TMEM((m, n), F32),
      sa_tmem=plgpu.TMEM((m, kk), E8M0, layout=plgpu.TMEMLayout.SCALES_LAYOUT),
      sb_tmem=plgpu.TMEM((b_scale_rows, kk), E8M0, layout=plgpu.TMEMLayout.SCALES_LAYOUT),
      done=plgpu.Barrier(orders_tensor_core=True)))
  def kernel(o_ref, a_smem, b_smem, sa_smem, sb_smem, acc, sa_tmem, sb_tmem, done):
    plgpu.async_copy_scales_to_tmem(sa_smem, sa_tmem)
    plgpu.async_copy_scales_to_tmem(sb_smem, sb_tmem)
    scales = dict(a_scale=sa_tmem, b_scale=sb_tmem) if scaled else {}
    plgpu.tcgen05_mma(acc, a_smem, plgpu.transpose_ref(b_smem, (1, 0)), done, accumulate=False,
                      **scales)
    plgpu.barrier_wait(done)
    o_ref[...] = plgpu.async_load_tmem(acc)

  return kernel


@pytest.mark.gluon_refuses("one scale per 16 elements of K")
def test_float4_blocks_of_16_run_in_the_interpreter_only():
  """Scales per 16 float4 values run in the interpreter (exactly the dequantized product);
  Gluon 3.6's float4 MMA always reads one scale per 32 (``scale_vec::2X``), so for sm_100a
  that is refused, not miscomputed."""
  args, want = operands(128, 128, 256, F4, F4, block=16)
  kernel = scaled_kernel(128, 128, 256, F4, F4, block=16)
  np.testing.assert_array_equal(np.asarray(kernel(*args), np.float64), want)
  assert "one scale per 16 elements of K" in refusal(kernel, *args)


def test_refuses_float4_beside_float8_and_without_scales():
  assert "float4_e2m1fn x float8_e4m3fn" in refusal(scratch_kernel(128, 128, F4, k=256, b_dtype=E4M3))
  assert "float4_e2m1fn operands without scales" in refusal(scratch_kernel(128, 128, F4, k=256,
                                                                           scaled=False))


def test_refuses_b_scales_with_more_rows_than_n():
  """The interpreter takes a b_scale of 128 rows for N=64 (Mosaic GPU's rule); Gluon 3.6
  scales B by exactly N rows, so that is not written."""
  assert "b_scale of shape [128, 4] for sm_100a" in refusal(scratch_kernel(64, 128, E4M3))


def test_refuses_arithmetic_on_e8m0_values():
  """e8m0 values are held as their bits: a load and a store are exact, a conversion is not
  written (it would convert the bits as an integer)."""
  @plgpu.kernel(out_shape=S((128, 4), F32))
  def kernel(s_ref, o_ref):
    o_ref[...] = s_ref[...].astype(F32)

  assert "float8_e8m0fnu values" in refusal(kernel, scales(5, 128, 128))


def pipelined_kernel(m, n, k, a_dt, b_dt):
  """One block-scaled MMA whose operands and scale tiles come in as the SMEM blocks of a
  one-step ``plgpu.emit_pipeline`` (JAX's own scaled-matmul tests run so): each scale block is a
  slot of a pipeline buffer, stored with its leading dimensions flattened."""
  kk = k // BLOCK
  swizzled = lambda dt: plgpu.BlockSpec(transforms=(   # noqa: E731
      plgpu.TilingTransform((8, 128 // np.dtype(dt).itemsize)), plgpu.SwizzleTransform(128)))

  @plgpu.kernel(out_shape=S((m, n), F32), scratch_shapes=[
      plgpu.Barrier(orders_tensor_core=True), plgpu.TMEM((m, n), F32),
      plgpu.TMEM((m, kk), E8M0, layout=plgpu.TMEMLayout.SCALES_LAYOUT),
      plgpu.TMEM((n, kk), E8M0, layout=plgpu.TMEMLayout.SCALES_LAYOUT)])
  def kernel(a_ref, b_ref, sa_ref, sb_ref, o_ref, done, acc, sa_tmem, sb_tmem):
    def step(_, a_smem, b_smem, sa_smem, sb_smem, o_smem):
      plgpu.async_copy_scales_to_tmem(sa_smem, sa_tmem)
      plgpu.async_copy_scales_to_tmem(sb_smem, sb_tmem)
      plgpu.tcgen05_mma(acc, a_smem, plgpu.transpose_ref(b_smem, (1, 0)), a_scale=sa_tmem,
                        b_scale=sb_tmem, accumulate=False)
      plgpu.tcgen05_commit_arrive(done)
      plgpu.barrier_wait(done)
      o_smem[...] = plgpu.async_load_tmem(acc)

    in_specs = [swizzled(a_dt), swizzled(b_dt), plgpu.BlockSpec(), plgpu.BlockSpec()]
    plgpu.emit_pipeline(step, grid=(), in_specs=in_specs, out_specs=[swizzled(F32)])(
        a_ref, b_ref, sa_ref, sb_ref, o_ref)

  return kernel


PIPELINED = [(128, 128, 256, E4M3, E4M3), (128, 256, 128, E5M2, E4M3)]


@pytest.mark.parametrize("m,n,k,a_dt,b_dt", PIPELINED)
def test_pipelined_scale_tiles_interpreter(m, n, k, a_dt, b_dt):
  args, want = operands(m, n, k, a_dt, b_dt)
  got = pipelined_kernel(m, n, k, a_dt, b_dt)(*args)
  np.testing.assert_array_equal(np.asarray(got, np.float64), want)


@pytest.mark.parametrize("m,n,k,a_dt,b_dt", PIPELINED)
def test_pipelined_scale_tiles_lower_as_rows(m, n, k, a_dt, b_dt):
  """A pipeline slot's scale tiles are read as rows of 16 bytes (the buffer's layout has a lower
  rank than the tiles), then untiled in registers as scratch tiles are."""
  args, _ = operands(m, n, k, a_dt, b_dt)
  (c,) = plgpu.lower(pipelined_kernel(m, n, k, a_dt, b_dt), *args, compute_capability=100)
  for rows in (m // 4 * k // 128, n // 4 * k // 128):   # 32 rows of 16 scales per 128 x 128
    assert f"._reinterpret(gl.uint8, [{rows}, 16], " in c.source
  assert ".permute((0, 3, 2, 1, 4))" in c.source
  mma = [line for line in c.ptx.splitlines() if "tcgen05.mma" in line]
  assert mma and all("kind::mxf8f6f4.block_scale.scale_vec::1X" in line for line in mma)
  assert "tcgen05.st" in c.ptx

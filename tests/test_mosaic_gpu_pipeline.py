"""``plgpu.emit_pipeline`` and ``plgpu.emit_pipeline_warp_specialized`` in the eager interpreter.

1. ``emit_pipeline``: the docs' quickstart matmul (wgmma, ``delay_release=1``, ``wgmma_wait(1)``),
   outputs through SMEM, carries, grids of one and several steps, more slots than steps, partial
   edge blocks, squeezed dimensions, blocks that do not move, GMEM specs, dynamic grids.
2. ``emit_pipeline_warp_specialized``: 2 compute threads + 1 memory thread, matmuls through
   ``compute_context`` carries and through ``manual_consumed_barriers``; outputs; shared
   allocations (``get_allocations``/``allocations=``).
3. Broken pipelines that the interpreter's checks report, and the API's own errors.
4. JAX's Mosaic GPU ops (hopper_matmul_mgpu, attention_mgpu, ragged_dot_mgpu) with their Pallas
   imports switched to pallax (``mgpu_ops.load``).

Inputs are random (jax.random, fixed keys, never zeros). Copies and elementwise results (the same
float32 operations as the reference) are compared exactly; sums with the bound of float32
summation in any order. Matmuls are compared with the float64 product and the error bound
of their arithmetic: float32 accumulation of K products, |err| <= K * 2**-24 * max(|a| @ |b|)
(atol), plus one rounding to the output dtype (rtol = its unit roundoff: 2**-8 bfloat16,
2**-11 float16), plus, with hopper_matmul's C operand, the rounding of the product before the
addition (u * max|a @ b| more in atol).
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import mgpu_ops
import pallax as pl
import pallax.mosaic_gpu as plgpu
from pallax._src.interpret.eager import KernelCheckError
from helpers import rand_seeded as rand

pytestmark = pytest.mark.interpreter

S = jax.ShapeDtypeStruct
UNIT_ROUNDOFF = {jnp.dtype(jnp.float32): 2.0**-24, jnp.dtype(jnp.bfloat16): 2.0**-8,
                 jnp.dtype(jnp.float16): 2.0**-11}


def f64(x):
  return np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64)


def check_matmul(out, a, b, c=None):
  """``out`` against ``a @ b (+ c)`` within the bound of float32 accumulation and rounding to
  ``out``'s dtype (see the module docstring)."""
  a64, b64 = f64(a), f64(b)
  prod = a64 @ b64
  u = UNIT_ROUNDOFF[jnp.dtype(out.dtype)]
  atol = a64.shape[1] * 2.0**-24 * (np.abs(a64) @ np.abs(b64)).max()
  want = prod
  if c is not None:
    atol += u * np.abs(prod).max()    # the product is rounded before C is added
    want = prod + f64(c)
  np.testing.assert_allclose(f64(out), want, rtol=u if u > 2.0**-24 else 0, atol=atol)


def tma_transforms(dtype, minor):
  """The tiling and swizzle of the quickstart for SMEM blocks whose rows hold ``minor`` elements."""
  swizzle = plgpu.find_swizzle(minor * jnp.dtype(dtype).itemsize * 8)
  return (plgpu.TilingTransform((8, swizzle // jnp.dtype(dtype).itemsize)),
          plgpu.SwizzleTransform(swizzle))


# =============================================================================================
# 1. emit_pipeline
# =============================================================================================

def quickstart_matmul(a, b, *, tile_m=64, tile_n=64, tile_k=64, max_concurrent_steps=2,
                      delay_release=1, wait=1):
  """The docs' quickstart matmul: one block per output tile, a pipeline over K whose body leaves
  ``wait`` wgmmas in flight (so the inputs are released ``delay_release`` steps late)."""
  m, k = a.shape
  _, n = b.shape
  transforms = tma_transforms(a.dtype, tile_k)

  def kernel(a_gmem, b_gmem, out_gmem, out_smem, acc_ref):
    m_slice = pl.ds(lax.axis_index("m") * tile_m, tile_m)
    n_slice = pl.ds(lax.axis_index("n") * tile_n, tile_n)

    def body(idxs, a_smem, b_smem):
      plgpu.wgmma(acc_ref, a_smem, b_smem)
      plgpu.wgmma_wait(wait)

    plgpu.emit_pipeline(
        body, grid=(k // tile_k,),
        in_specs=[plgpu.BlockSpec((tile_m, tile_k), lambda kk: (0, kk), transforms=transforms,
                                  delay_release=delay_release),
                  plgpu.BlockSpec((tile_k, tile_n), lambda kk: (kk, 0), transforms=transforms,
                                  delay_release=delay_release)],
        max_concurrent_steps=max_concurrent_steps,
    )(a_gmem.at[m_slice, :], b_gmem.at[:, n_slice])
    out_smem[...] = acc_ref[...]
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(out_smem, out_gmem.at[m_slice, n_slice])
    plgpu.wait_smem_to_gmem(0)

  return plgpu.kernel(
      kernel, out_type=S((m, n), jnp.float32),
      scratch_types=[plgpu.SMEM((tile_m, tile_n), jnp.float32), plgpu.ACC((tile_m, tile_n))],
      grid=(m // tile_m, n // tile_n), grid_names=("m", "n"))(a, b)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("max_concurrent_steps", [2, 3])
def test_quickstart_matmul(dtype, max_concurrent_steps):
  a, b = rand(0, (128, 320), dtype), rand(1, (320, 128), dtype)   # 5 steps over K
  out = quickstart_matmul(a, b, max_concurrent_steps=max_concurrent_steps)
  check_matmul(out, a, b)


def test_quickstart_matmul_of_float32_needs_a_k_major_b():
  # The quickstart reads b as (K, N) tiles: Hopper's tf32 wgmma cannot (Mosaic GPU refuses it
  # too), so the interpreter says so rather than compute what no GPU will.
  a, b = rand(0, (128, 320), jnp.float32), rand(1, (320, 128), jnp.float32)
  with pytest.raises(KernelCheckError, match=r"wgmma of float32 operands: Hopper reads 32-bit "
                     r"and 8-bit operands K-major only: keep b as an \(N, K\) SMEM buffer"):
    quickstart_matmul(a, b, max_concurrent_steps=2)


@pytest.mark.parametrize("k", [64, 128])   # one step; two steps and two slots
def test_quickstart_matmul_with_fewer_steps_than_slots(k):
  a, b = rand(2, (64, k), jnp.bfloat16), rand(3, (k, 64), jnp.bfloat16)
  check_matmul(quickstart_matmul(a, b, max_concurrent_steps=4), a, b)


def add_kernel(shape, block, *, grid, index_map, max_concurrent_steps, dtype=jnp.float32):
  """``x + y`` through SMEM blocks, written back by the pipeline."""
  def kernel(x_gmem, y_gmem, o_gmem):
    def body(idxs, x_smem, y_smem, o_smem):
      o_smem[...] = x_smem[...] + y_smem[...]

    spec = plgpu.BlockSpec(block, index_map)
    plgpu.emit_pipeline(body, grid=grid, in_specs=[spec, spec], out_specs=[spec],
                        max_concurrent_steps=max_concurrent_steps)(x_gmem, y_gmem, o_gmem)

  return plgpu.kernel(kernel, out_type=S(shape, dtype))


@pytest.mark.parametrize("max_concurrent_steps", [1, 2, 3])
def test_out_specs_elementwise_add_over_a_2d_grid(max_concurrent_steps):
  x, y = rand(4, (128, 256)), rand(5, (128, 256))
  f = add_kernel((128, 256), (32, 64), grid=(4, 4), index_map=lambda i, j: (i, j),
                 max_concurrent_steps=max_concurrent_steps)
  np.testing.assert_allclose(f(x, y), x + y, rtol=0, atol=0)


def test_out_specs_with_a_grid_of_one_step_and_more_slots_than_steps():
  x, y = rand(6, (32, 64)), rand(7, (32, 64))
  f = add_kernel((32, 64), (32, 64), grid=(1,), index_map=lambda i: (0, 0),
                 max_concurrent_steps=4)
  np.testing.assert_allclose(f(x, y), x + y, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16])
def test_out_specs_with_blocks_of_24_rows(dtype):
  # Blocks of 24 rows inside 96 (TMA boxes of 16 + 8 into each slot on a GPU), columns whole.
  x, y = rand(20, (96, 64), dtype), rand(21, (96, 64), dtype)
  f = add_kernel((96, 64), (24, 64), grid=(4,), index_map=lambda i: (i, 0),
                 max_concurrent_steps=2, dtype=dtype)
  np.testing.assert_allclose(f(x, y), x + y, rtol=0, atol=0)


def test_out_specs_with_a_transposed_walk_of_the_grid():
  # Grid (j, i) visits blocks column by column: every step still writes a new block.
  x, y = rand(8, (64, 128)), rand(9, (64, 128))
  f = add_kernel((64, 128), (16, 32), grid=(4, 4), index_map=lambda j, i: (i, j),
                 max_concurrent_steps=2)
  np.testing.assert_allclose(f(x, y), x + y, rtol=0, atol=0)


def test_inputs_with_different_delay_release():
  # x's slots are refilled right after each step, y's one step later; both arrive on the barrier
  # of the step they are for.
  x, y = rand(18, (256, 64)), rand(19, (256, 64))

  def kernel(x_gmem, y_gmem, o_gmem):
    def body(idxs, x_smem, y_smem, o_smem):
      o_smem[...] = x_smem[...] - y_smem[...]

    plgpu.emit_pipeline(body, grid=(8,),
                        in_specs=[plgpu.BlockSpec((32, 64), lambda i: (i, 0)),
                                  plgpu.BlockSpec((32, 64), lambda i: (i, 0), delay_release=1)],
                        out_specs=[plgpu.BlockSpec((32, 64), lambda i: (i, 0))],
                        max_concurrent_steps=2)(x_gmem, y_gmem, o_gmem)

  out = plgpu.kernel(kernel, out_type=S((256, 64), jnp.float32))(x, y)
  np.testing.assert_allclose(out, x - y, rtol=0, atol=0)


def test_outputs_only():
  # No inputs (so no barrier): each step writes its grid indices into its block.
  def kernel(o_gmem):
    def body(idxs, o_smem):
      i, j = idxs
      o_smem[...] = jnp.full(o_smem.shape, 100 * i + j, jnp.int32)

    plgpu.emit_pipeline(body, grid=(2, 3),
                        out_specs=[plgpu.BlockSpec((8, 16), lambda i, j: (i, j))],
                        max_concurrent_steps=2)(o_gmem)

  out = plgpu.kernel(kernel, out_type=S((16, 48), jnp.int32))()
  want = np.repeat(np.repeat(100 * np.arange(2)[:, None] + np.arange(3), 8, 0), 16, 1)
  np.testing.assert_array_equal(out, want)


def test_partial_edge_blocks_zero_fill_reads_and_clip_writes():
  # 100 x 200 in 32 x 64 blocks: the last row and column of blocks hang over the edge. Reads
  # past the end are zeros (the sum of all blocks is the array's sum); writes past it are dropped.
  shape, block = (100, 200), (32, 64)
  x, y = rand(10, shape), rand(11, shape)

  def kernel(x_gmem, y_gmem, o_gmem, sum_gmem, sum_smem):
    def body(idxs, x_smem, y_smem, o_smem, carry):
      o_smem[...] = x_smem[...] + y_smem[...]
      return carry + jnp.sum(x_smem[...], axis=0)

    spec = plgpu.BlockSpec(block, lambda i, j: (i, j))
    total = plgpu.emit_pipeline(body, grid=(4, 4), in_specs=[spec, spec], out_specs=[spec],
                                max_concurrent_steps=3,
                                init_carry=jnp.zeros((64,), jnp.float32))(x_gmem, y_gmem, o_gmem)
    sum_smem[...] = total
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(sum_smem, sum_gmem)
    plgpu.wait_smem_to_gmem(0)

  out, col_sums = plgpu.kernel(kernel, out_type=(S(shape, jnp.float32), S((64,), jnp.float32)),
                               scratch_types=[plgpu.SMEM((64,), jnp.float32)])(x, y)
  np.testing.assert_allclose(out, x + y, rtol=0, atol=0)
  # Column c of the carry sums the columns c, c + 64, ... of x (zeros past column 199).
  padded = np.zeros((128, 256), np.float64)
  padded[:100, :200] = f64(x)
  want = padded.reshape(128, 4, 64).sum(axis=(0, 1))
  # float32 sums of 16 steps of 32 rows, in a different order: |err| <= 2 * 512 * u32 * sum|x|.
  np.testing.assert_allclose(f64(col_sums), want, rtol=0,
                             atol=2 * 512 * 2.0**-24 * np.abs(padded).sum(axis=0).max())


def test_init_carry_sees_every_step_in_row_major_order():
  # The carry records the grid indices of each step: 10 * i + j at position 3 * i + j.
  x = rand(12, (64, 96))

  def kernel(x_gmem, o_gmem, o_smem):
    def body(idxs, x_smem, carry):
      i, j = idxs
      step, seen = carry
      return step + 1, seen.at[step].set(10 * i + j)

    spec = plgpu.BlockSpec((32, 32), lambda i, j: (i, j))
    _, seen = plgpu.emit_pipeline(body, grid=(2, 3), in_specs=[spec], max_concurrent_steps=2,
                                  init_carry=(jnp.int32(0), jnp.zeros((8,), jnp.int32)))(x_gmem)
    o_smem[...] = seen
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_smem, o_gmem)
    plgpu.wait_smem_to_gmem(0)

  out = plgpu.kernel(kernel, out_type=S((8,), jnp.int32),
                     scratch_types=[plgpu.SMEM((8,), jnp.int32)])(x)
  np.testing.assert_array_equal(out, [0, 1, 2, 10, 11, 12, 0, 0])


def test_output_block_that_never_moves_is_written_after_the_last_step():
  # A row sum over K: the output's index map ignores the grid, so the pipeline writes it once,
  # from the last step's slot, where the body left the whole sum.
  x = rand(13, (64, 256))

  def kernel(x_gmem, o_gmem):
    def body(idxs, x_smem, o_smem, acc):
      acc = acc + x_smem[...]
      o_smem[...] = acc
      return acc

    plgpu.emit_pipeline(body, grid=(4,), in_specs=[plgpu.BlockSpec((64, 64), lambda k: (0, k))],
                        out_specs=[plgpu.BlockSpec((64, 64), lambda k: (0, 0))],
                        max_concurrent_steps=2,
                        init_carry=jnp.zeros((64, 64), jnp.float32))(x_gmem, o_gmem)

  out = plgpu.kernel(kernel, out_type=S((64, 64), jnp.float32))(x)
  want = f64(x).reshape(64, 4, 64).sum(axis=1)
  np.testing.assert_allclose(f64(out), want, rtol=0,
                             atol=4 * 2.0**-24 * np.abs(f64(x)).reshape(64, 4, 64).sum(1).max())


@pytest.mark.parametrize("squeeze", [None, pl.squeezed])
def test_squeezed_block_dimensions(squeeze):
  # Blocks of one row of a (4, 8, 128) array, the leading dimensions squeezed: SMEM holds (128,).
  x, y = rand(14, (4, 8, 128)), rand(15, (4, 8, 128))

  def kernel(x_gmem, y_gmem, o_gmem):
    def body(idxs, x_smem, y_smem, o_smem):
      assert x_smem.shape == (128,)
      o_smem[...] = x_smem[...] * y_smem[...]

    spec = plgpu.BlockSpec((squeeze, squeeze, 128), lambda b, r: (b, r, 0))
    plgpu.emit_pipeline(body, grid=(4, 8), in_specs=[spec, spec], out_specs=[spec],
                        max_concurrent_steps=3)(x_gmem, y_gmem, o_gmem)

  out = plgpu.kernel(kernel, out_type=S((4, 8, 128), jnp.float32))(x, y)
  np.testing.assert_allclose(out, x * y, rtol=0, atol=0)


def test_plain_pl_blockspec_and_gmem_specs():
  # A pl.BlockSpec stages blocks in SMEM; a GMEM spec hands the body the whole GMEM Ref.
  x = rand(16, (64, 128))

  def kernel(x_gmem, o_gmem):
    def body(idxs, x_smem, out_gmem):
      (i,) = idxs
      plgpu.copy_smem_to_gmem(x_smem, out_gmem.at[pl.ds((1 - i) * 32, 32)])
      plgpu.wait_smem_to_gmem(0)

    plgpu.emit_pipeline(body, grid=(2,), in_specs=[pl.BlockSpec((32, 128), lambda i: (i, 0))],
                        out_specs=[plgpu.BlockSpec(memory_space=plgpu.GMEM)],
                        max_concurrent_steps=2)(x_gmem, o_gmem)

  out = plgpu.kernel(kernel, out_type=S((64, 128), jnp.float32))(x)
  np.testing.assert_array_equal(out, np.concatenate([x[32:], x[:32]]))


def test_dynamic_grid():
  # Block b runs b + 2 steps (a grid known only when the kernel runs) over rows of x.
  x = rand(17, (4, 128))

  def kernel(x_gmem, o_gmem, o_smem):
    b = lax.axis_index("b")
    total = plgpu.emit_pipeline(
        lambda idxs, x_smem, carry: carry + x_smem[...], grid=(b + 2,),
        in_specs=[plgpu.BlockSpec((pl.squeezed, 128), lambda r: (r, 0))],
        max_concurrent_steps=2, init_carry=jnp.zeros((128,), jnp.float32))(x_gmem)
    o_smem[...] = total
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[b])
    plgpu.wait_smem_to_gmem(0)

  out = plgpu.kernel(kernel, out_type=S((2, 128), jnp.float32), grid=(2,), grid_names=("b",),
                     scratch_types=[plgpu.SMEM((128,), jnp.float32)])(x)
  # float32 sums of up to 3 rows: two roundings, each within 2**-24 of a partial sum.
  np.testing.assert_allclose(f64(out), [f64(x)[:2].sum(0), f64(x)[:3].sum(0)], rtol=0,
                             atol=2 * 2.0**-24 * np.abs(f64(x)[:3]).sum(0).max())


# =============================================================================================
# 2. emit_pipeline_warp_specialized
# =============================================================================================

def ws_matmul(a, b, *, mode, tile_m=64, tile_n=64, tile_k=64, max_concurrent_steps=2):
  """A matmul by 2 compute threads (each one half of a (tile_m, 2 tile_n) block's columns) and a
  memory thread. ``mode``: "carry" (compute_context with a register accumulator, as in
  attention_mgpu), "manual" (manual_consumed_barriers, an ACC Ref, the epilogue after the
  pipeline) or "delayed" (automatic barriers, an ACC Ref, ``delay_release=1`` and
  ``wgmma_wait(1)`` as in hopper_matmul_mgpu's collective use)."""
  m, k = a.shape
  _, n = b.shape
  transforms = tma_transforms(a.dtype, tile_k)
  delay = 1 if mode == "delayed" else 0
  in_specs = [plgpu.BlockSpec((tile_m, tile_k), lambda kk: (0, kk), transforms=transforms,
                              delay_release=delay),
              plgpu.BlockSpec((tile_k, 2 * tile_n), lambda kk: (kk, 0), transforms=transforms,
                              delay_release=delay)]

  def kernel(a_gmem, b_gmem, out_gmem, out_smem):
    wg = lax.axis_index("wg")
    m_slice = pl.ds(lax.axis_index("m") * tile_m, tile_m)
    n_block = lax.axis_index("n") * 2 * tile_n
    my_cols = pl.ds(wg * tile_n, tile_n)

    def store(acc):
      out_smem[wg] = acc.astype(out_smem.dtype)
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(out_smem.at[wg], out_gmem.at[m_slice, pl.ds(n_block + wg * tile_n,
                                                                           tile_n)])
      plgpu.wait_smem_to_gmem(0)

    gmem = (a_gmem.at[m_slice, :], b_gmem.at[:, pl.ds(n_block, 2 * tile_n)])
    common = dict(grid=(k // tile_k,), memory_registers=40, in_specs=in_specs, wg_axis="wg",
                  num_compute_wgs=2, max_concurrent_steps=max_concurrent_steps)
    if mode == "carry":
      def body(idxs, a_smem, b_smem, acc):
        def mma(acc_ref):
          plgpu.wgmma(acc_ref, a_smem, b_smem.at[:, my_cols])
        return pl.run_state(mma)(plgpu.ACC.init(acc))

      def compute_context(pipeline):
        store(pipeline(jnp.zeros((tile_m, tile_n), jnp.float32)))

      plgpu.emit_pipeline_warp_specialized(body, compute_context=compute_context, **common)(*gmem)
    elif mode == "manual":
      def scope(acc_ref):
        def body(idxs, a_smem, b_smem, a_consumed, b_consumed):
          plgpu.wgmma(acc_ref, a_smem, b_smem.at[:, my_cols])
          plgpu.wgmma_wait(0)
          plgpu.barrier_arrive(a_consumed)
          plgpu.barrier_arrive(b_consumed)

        plgpu.emit_pipeline_warp_specialized(body, manual_consumed_barriers=True, **common)(*gmem)
        pl.when(wg < 2)(lambda: store(acc_ref[...]))

      pl.run_scoped(scope, plgpu.ACC((tile_m, tile_n)))
    else:
      def scope(acc_ref):
        def body(idxs, a_smem, b_smem):
          plgpu.wgmma(acc_ref, a_smem, b_smem.at[:, my_cols])
          plgpu.wgmma_wait(1)    # this step's wgmma stays in flight: its slots are released later

        plgpu.emit_pipeline_warp_specialized(body, **common)(*gmem)
        pl.when(wg < 2)(lambda: store(acc_ref[...]))

      pl.run_scoped(scope, plgpu.ACC((tile_m, tile_n)))

  return plgpu.kernel(
      kernel, out_type=S((m, n), jnp.float32),
      scratch_types=[plgpu.SMEM((2, tile_m, tile_n), jnp.float32)],
      grid=(m // tile_m, n // (2 * tile_n)), grid_names=("m", "n"), num_threads=3,
      thread_name="wg")(a, b)


@pytest.mark.parametrize("mode", ["carry", "manual", "delayed"])
@pytest.mark.parametrize("max_concurrent_steps", [2, 3])
def test_warp_specialized_matmul(mode, max_concurrent_steps):
  a, b = rand(20, (128, 320), jnp.bfloat16), rand(21, (320, 128), jnp.bfloat16)   # 5 steps
  out = ws_matmul(a, b, mode=mode, max_concurrent_steps=max_concurrent_steps)
  check_matmul(out, a, b)


def test_warp_specialized_with_more_slots_than_steps():
  a, b = rand(22, (64, 64), jnp.float16), rand(23, (64, 128), jnp.float16)
  check_matmul(ws_matmul(a, b, mode="carry", max_concurrent_steps=4), a, b)


def ws_add(x, y, *, block, grid, index_map, out_index_map=None, allocations_twice=False,
           max_concurrent_steps=2):
  """``x + y`` by one compute thread and a memory thread (outputs need one compute thread)."""
  spec = plgpu.BlockSpec(block, index_map)
  out_spec = plgpu.BlockSpec(block, out_index_map or index_map)

  def kernel(x_gmem, y_gmem, o_gmem):
    def body(idxs, x_smem, y_smem, o_smem):
      o_smem[...] = x_smem[...] + y_smem[...]

    pipeline = plgpu.emit_pipeline_warp_specialized(
        body, grid=grid, memory_registers=40, in_specs=[spec, spec], out_specs=[out_spec],
        wg_axis="wg", num_compute_wgs=1, max_concurrent_steps=max_concurrent_steps)
    if not allocations_twice:
      pipeline(x_gmem, y_gmem, o_gmem)
      return
    # One allocation for two pipelines, over each half of the rows.
    half = x_gmem.shape[0] // 2

    def scope(allocs):
      for h in range(2):
        rows = pl.ds(h * half, half)
        pipeline(x_gmem.at[rows], y_gmem.at[rows], o_gmem.at[rows], allocations=allocs)

    pl.run_scoped(scope, pipeline.get_allocations(x_gmem, y_gmem, o_gmem), collective_axes="wg")

  return plgpu.kernel(kernel, out_type=S(x.shape, x.dtype), num_threads=2, thread_name="wg")(x, y)


@pytest.mark.parametrize("max_concurrent_steps", [2, 3])
def test_warp_specialized_out_specs(max_concurrent_steps):
  x, y = rand(24, (128, 128)), rand(25, (128, 128))
  out = ws_add(x, y, block=(32, 64), grid=(4, 2), index_map=lambda i, j: (i, j),
               max_concurrent_steps=max_concurrent_steps)
  np.testing.assert_allclose(out, x + y, rtol=0, atol=0)


def test_warp_specialized_shared_allocations_over_two_pipelines():
  x, y = rand(26, (128, 64)), rand(27, (128, 64))
  out = ws_add(x, y, block=(16, 64), grid=(4,), index_map=lambda i: (i, 0), allocations_twice=True)
  np.testing.assert_allclose(out, x + y, rtol=0, atol=0)


def test_warp_specialized_pytree_specs_and_manual_produced_barriers():
  # in_specs (x, [y, z]): the body gets x, (y, z), the output, then the produced barriers in the
  # same structure, and waits on them itself.
  x, y, z = rand(34, (128, 64)), rand(35, (128, 64)), rand(36, (128, 64))
  spec = plgpu.BlockSpec((32, 64), lambda i: (i, 0))

  def kernel(x_gmem, y_gmem, z_gmem, o_gmem):
    def body(idxs, x_smem, yz_smem, o_smem, x_ready, yz_ready):
      for barrier in (x_ready, *yz_ready):
        plgpu.barrier_wait(barrier)
      y_smem, z_smem = yz_smem
      o_smem[...] = x_smem[...] + y_smem[...] - z_smem[...]

    plgpu.emit_pipeline_warp_specialized(
        body, grid=(4,), memory_registers=40, in_specs=[spec, [spec, spec]], out_specs=[spec],
        wg_axis="wg", num_compute_wgs=1, max_concurrent_steps=2,
        manual_produced_barriers=True)(x_gmem, [y_gmem, z_gmem], o_gmem)

  out = plgpu.kernel(kernel, out_type=S((128, 64), jnp.float32), num_threads=2,
                     thread_name="wg")(x, y, z)
  np.testing.assert_allclose(out, x + y - z, rtol=0, atol=0)


def test_warp_specialized_collective_axes_over_a_cluster_of_one_block():
  # Collective copies over a cluster of one block are ordinary copies.
  x, y = rand(37, (128, 64)), rand(38, (128, 64))
  spec = plgpu.BlockSpec((32, 64), lambda i: (i, 0), collective_axes=("cluster",))

  def kernel(x_gmem, y_gmem, o_gmem):
    def body(idxs, x_smem, y_smem, o_smem):
      o_smem[...] = x_smem[...] * y_smem[...]

    plgpu.emit_pipeline_warp_specialized(
        body, grid=(4,), memory_registers=40, in_specs=[spec, spec],
        out_specs=[plgpu.BlockSpec((32, 64), lambda i: (i, 0))], wg_axis="wg",
        num_compute_wgs=1, max_concurrent_steps=3)(x_gmem, y_gmem, o_gmem)

  out = plgpu.kernel(kernel, out_type=S((128, 64), jnp.float32), cluster=(1,),
                     cluster_names=("cluster",), num_threads=2, thread_name="wg")(x, y)
  np.testing.assert_allclose(out, x * y, rtol=0, atol=0)


def test_warp_specialized_output_block_that_never_moves():
  # The output is written once, after the last step: here the last step's block of x + y.
  x, y = rand(28, (128, 64)), rand(29, (128, 64))
  out = ws_add(x, y, block=(32, 64), grid=(4,), index_map=lambda i: (i, 0),
               out_index_map=lambda i: (0, 0))
  np.testing.assert_allclose(out[:32], (x + y)[96:], rtol=0, atol=0)


# =============================================================================================
# 3. broken pipelines and API errors
# =============================================================================================

def test_no_delay_release_while_wgmma_still_reads_is_reported():
  # wgmma_wait(1) leaves the step's wgmma in flight, but without delay_release its slot is refilled
  # right after the step: the interpreter sees the TMA copy overwrite SMEM the wgmma still reads.
  a, b = rand(30, (64, 256), jnp.bfloat16), rand(31, (256, 64), jnp.bfloat16)
  with pytest.raises(KernelCheckError, match=r"copy_gmem_to_smem overwrites .* while a wgmma "
                                             r"issued by .* may still read it"):
    quickstart_matmul(a, b, delay_release=0, wait=1)


def test_delay_release_without_extra_slots_is_refused():
  with pytest.raises(ValueError, match="max_concurrent_steps must be greater than all "
                                       "delay_release values"):
    plgpu.emit_pipeline(lambda *_: None, grid=(4,),
                        in_specs=[plgpu.BlockSpec((8, 128), lambda i: (i, 0), delay_release=1)],
                        max_concurrent_steps=1)
  with pytest.raises(ValueError, match="max_concurrent_steps must be greater than delay_release"):
    plgpu.emit_pipeline_warp_specialized(
        lambda *_: None, grid=(4,), memory_registers=40, wg_axis="wg", num_compute_wgs=1,
        in_specs=[plgpu.BlockSpec((8, 128), lambda i: (i, 0), delay_release=2)],
        max_concurrent_steps=2)


def test_manual_consumed_barriers_never_arrived_on_is_a_deadlock():
  x = rand(32, (128, 64))

  def kernel(x_gmem, o_gmem):
    plgpu.emit_pipeline_warp_specialized(
        lambda idxs, x_smem, consumed: None, grid=(4,), memory_registers=40, wg_axis="wg",
        num_compute_wgs=1, manual_consumed_barriers=True, max_concurrent_steps=2,
        in_specs=[plgpu.BlockSpec((32, 64), lambda i: (i, 0))])(x_gmem)

  with pytest.raises(KernelCheckError, match="deadlock"):
    plgpu.kernel(kernel, out_type=S((8,), jnp.float32), num_threads=2, thread_name="wg")(x)


def ws_error(**kw):
  x = rand(33, (128, 64))
  spec = plgpu.BlockSpec((32, 64), lambda i: (i, 0))
  args = dict(grid=(4,), memory_registers=40, wg_axis="wg", num_compute_wgs=1,
              in_specs=[spec], max_concurrent_steps=2)
  args.update(kw)
  num_threads = args["num_compute_wgs"] + 1

  def kernel(x_gmem, o_gmem):
    refs = (x_gmem, o_gmem) if args.get("out_specs") else (x_gmem,)
    plgpu.emit_pipeline_warp_specialized(lambda *a: a[-1] if args.get("compute_context") else None,
                                         **args)(*refs)

  plgpu.kernel(kernel, out_type=S((128, 64), jnp.float32), num_threads=num_threads,
               thread_name="wg")(x)


@pytest.mark.parametrize("kw, exc, message", [
    (dict(out_specs=[plgpu.BlockSpec((32, 64), lambda i: (i, 0))], num_compute_wgs=2),
     NotImplementedError, "SMEM outputs are not supported with multiple compute warpgroups"),
    (dict(in_specs=[plgpu.BlockSpec((32, 64), lambda i: (0, 0))]),
     NotImplementedError, "Only inputs with a dependency on the grid are supported"),
    (dict(compute_context=lambda pipeline: None),
     ValueError, "Pipeline was not called in `compute_context`"),
    (dict(compute_context=lambda pipeline: (pipeline(1), pipeline(1))),
     ValueError, "Cannot call pipeline more than once"),
    (dict(pipeline_state=0, grid=(3,)), NotImplementedError,
     "A pipeline of pipelines is only allowed when the number of steps"),
    (dict(memory_thread_idx=0), NotImplementedError, "Memory thread must be the last thread"),
])
def test_warp_specialized_api_errors(kw, exc, message):
  with pytest.raises(exc, match=message):
    ws_error(**kw)


def test_emit_pipeline_refuses_collective_axes():
  with pytest.raises(NotImplementedError, match="collective_axes"):
    plgpu.emit_pipeline(lambda *_: None, grid=(2,),
                        in_specs=[plgpu.BlockSpec((8, 128), lambda i: (i, 0),
                                                  collective_axes=("cluster",))])


def test_emit_pipeline_refuses_empty_grid_dimensions():
  with pytest.raises(ValueError, match="strictly positive"):
    plgpu.emit_pipeline(lambda *_: None, grid=(2, 0))


# =============================================================================================
# 4. JAX's Mosaic GPU ops on pallax
# =============================================================================================

@functools.cache
def jax_op(name):
  return mgpu_ops.load(name, num_sms=2)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("with_c", [False, True])
@pytest.mark.parametrize("config", ["wg_n", "wg_m_epi_32"])
def test_jax_hopper_matmul(dtype, with_c, config):
  # 256 x 256 @ 256 x 128 on 2 SMs: each SM runs the pipeline for two output tiles, with the
  # allocations of get_allocations shared between them.
  hm = jax_op("hopper_matmul_mgpu")
  cfg = dict(
      wg_n=hm.TuningConfig(tile_m=64, tile_n=64, tile_k=64, max_concurrent_steps=2,
                           epi_tile_n=None, epi_tile_m=None),
      wg_m_epi_32=hm.TuningConfig(tile_m=64, tile_n=64, tile_k=64, max_concurrent_steps=3,
                                  epi_tile_n=32, epi_tile_m=32,
                                  wg_dimension=hm.MatmulDimension.M,
                                  grid_minor_dim=hm.MatmulDimension.M, grid_tile_width=2))[config]
  a, b, c = rand(40, (256, 256), dtype), rand(41, (256, 128), dtype), rand(42, (256, 128), dtype)
  out = hm.matmul(a, b, c if with_c else None, cfg)
  assert out.dtype == dtype
  check_matmul(out, a, b, c if with_c else None)


def test_jax_attention_with_pipeline_emitter():
  am = jax_op("attention_mgpu")
  q, k, v = (rand(43 + i, (1, 256, 1, 64), jnp.float16) for i in range(3))
  cfg = am.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2)
  out = am.attention_with_pipeline_emitter(q, k, v, cfg)
  ref = am.attention_reference(q, k, v)
  # Two float16 roundings: of the output (rtol) and of p in p @ v (u * max|v| in atol).
  np.testing.assert_allclose(f64(out), f64(ref), rtol=2.0**-11,
                             atol=2.0**-11 * np.abs(f64(v)).max())


@pytest.mark.parametrize("compute_wgs", [1, 2])
def test_jax_attention_backward(compute_wgs):
  am = jax_op("attention_mgpu")
  q, k, v, do = (rand(50 + i, (1, 256, 1, 64), jnp.float16) for i in range(4))
  cfg = am.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2, block_q_dkv=64,
                        block_kv_dkv=64, block_q_dq=64, block_kv_dq=64, compute_wgs_bwd=compute_wgs)
  _, vjp = jax.vjp(lambda q, k, v: am.attention(q, k, v, cfg), q, k, v)
  as32 = lambda t: t.astype(jnp.float32)
  _, vjp_ref = jax.vjp(lambda q, k, v: am.attention_reference(q, k, v), as32(q), as32(k), as32(v))
  for got, want in zip(vjp(do), vjp_ref(as32(do))):
    # Two float16 roundings (of the gradient, and of the p/ds operands of its matmul), each
    # within 2**-11 of the largest gradient.
    np.testing.assert_allclose(f64(got), f64(want), rtol=0,
                               atol=2.0**-11 * 2 * np.abs(f64(want)).max())


def ragged_dot(k):
  rd = jax_op("ragged_dot_mgpu")
  lhs, rhs = rand(60, (128, k), jnp.float16), rand(61, (2, k, 128), jnp.float16)
  sizes = jnp.array([40, 88], jnp.int32)
  out = rd.ragged_dot(lhs, rhs, group_sizes=sizes, block_m=64, block_n=64, block_k=64,
                      max_concurrent_steps=2, grid_block_n=1)
  return out, lhs, rhs, sizes


def test_jax_ragged_dot_without_slot_reuse():
  # Two steps over K in two slots: no slot is refilled.
  out, lhs, rhs, sizes = ragged_dot(128)
  assert out.dtype == jnp.float16
  check_matmul(out[:40], lhs[:40], rhs[0])    # group 0: rows 0..39
  check_matmul(out[40:], lhs[40:], rhs[1])    # group 1: rows 40..127


def test_jax_ragged_dot_refilling_a_slot_a_wgmma_reads_is_reported():
  # ragged_dot's body issues wgmmas without ever waiting (delay_release=1 but no
  # wgmma_wait(1)): a slot is refilled while the previous step's wgmma may still read it, which
  # PTX leaves undefined. With 4 steps over K in 2 slots the interpreter reports it.
  with pytest.raises(KernelCheckError, match="while a wgmma .* may still read it"):
    ragged_dot(256)

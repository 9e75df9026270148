"""Mosaic GPU kernels that JAX's own tests run and that the Gluon backend once could not lower.
Each runs in the interpreter against a NumPy reference; on a machine without a GPU the suite's
conftest also lowers it to sm_90a PTX through the Gluon backend (``gluon_check.py``), on a GPU
runs it there against the interpreter."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu


def _random(shape, dtype=jnp.float32, seed=0):
  x = np.random.default_rng(seed).standard_normal(shape)
  return jnp.asarray(x, dtype)


def test_store_of_run_time_rows_into_a_3d_gmem_view():
  """SMEM rows from a start known only at run time, stored to a GMEM view that indexes the
  leading dimension of a 3-D array with an integer (JAX's multicast tests do this)."""
  batch, rows, cols = 3, 32, 64

  def body(x_ref, o_ref, smem, bar):
    b = lax.axis_index("b")
    plgpu.copy_gmem_to_smem(x_ref.at[b], smem, bar)
    plgpu.barrier_wait(bar)
    plgpu.commit_smem()

    @pl.loop(0, rows // 8)
    def _(j):
      part = pl.ds(j * 8, 8)
      plgpu.copy_smem_to_gmem(smem.at[part], o_ref.at[b, part, :])
    plgpu.wait_smem_to_gmem(0)

  x = _random((batch, rows, cols))
  f = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(batch,),
                   grid_names=("b",), scratch_types=[plgpu.SMEM((rows, cols), x.dtype), plgpu.Barrier()])
  np.testing.assert_array_equal(f(x), x)


def _column_sums(scratch_bytes):
  def body(x_ref, o_ref):
    x = plgpu.load(x_ref, layout=plgpu.Layout.WGMMA)
    o_ref[...] = jnp.sum(x, axis=0)
  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                      compiler_params=plgpu.CompilerParams(reduction_scratch_bytes=scratch_bytes))


def test_a_cross_warp_reduction_needs_its_scratch():
  """Summing a WGMMA-layout tile along its rows combines the 4 warps' partial results in SMEM:
  4 warps x 32 lanes x 2 floats = 1024 bytes. With less, JAX's compiler refuses the kernel, and
  so does pallax, in both executors (the check is made when the kernel is traced)."""
  x = _random((128, 128))
  with pytest.raises(ValueError, match=r"Required reduction scratch size \(1024 bytes\) is larger "
                     r"than the available scratch size \(512 bytes\)"):
    _column_sums(512)(x)
  np.testing.assert_allclose(_column_sums(1024)(x), np.sum(np.asarray(x), axis=0), rtol=1e-5, atol=1e-5)


def test_a_loop_carry_cast_to_two_layouts_is_refused():
  def body(o_ref):
    def step(i, carry):
      o_ref[...] = carry + i
      return plgpu.layout_cast(carry, plgpu.Layout.WGMMA.reduce(1))
    start = plgpu.layout_cast(jnp.zeros((128,), jnp.float32), plgpu.Layout.WG_STRIDED((128,), vec_size=1))
    lax.fori_loop(0, 2, step, start)
  f = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128,), jnp.float32))
  with pytest.raises(ValueError, match="Failed to infer a possible set of layouts"):
    f()


def test_reshapes_of_register_values():
  """A scalar made a (1, 1, 1) tile and stored to a 3-D GMEM array; a (1,) value made a scalar;
  a (4, 32) tile made (128,) and (2, 2, 32)."""
  def body(x_ref, y_ref, o_ref, t_ref, v_ref):
    x = x_ref[...]
    o_ref[...] = (jnp.sum(x) * 2).reshape((1, 1, 1))
    t_ref[...] = x.reshape((2, 2, 32)) + 1
    v_ref[...] = x.reshape((128,)) * 3 + y_ref[...].reshape(())
  x, y = _random((4, 32)), _random((1,), seed=1)
  f = plgpu.kernel(body, out_type=(jax.ShapeDtypeStruct((1, 1, 1), jnp.float32),
                                   jax.ShapeDtypeStruct((2, 2, 32), jnp.float32),
                                   jax.ShapeDtypeStruct((128,), jnp.float32)))
  o, t, v = f(x, y)
  xn = np.asarray(x)
  np.testing.assert_allclose(o, (xn.sum() * 2).reshape(1, 1, 1), rtol=1e-5)
  np.testing.assert_array_equal(t, xn.reshape(2, 2, 32) + 1)
  np.testing.assert_allclose(v, xn.reshape(128) * 3 + float(y[0]), rtol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.uint32, jnp.int64])
def test_bit_counts(dtype):
  """lax.clz and lax.population_count on every bit pattern class: zero, ones, the sign bit."""
  def body(x_ref, c_ref, p_ref):
    x = x_ref[...]
    c_ref[...] = lax.clz(x)
    p_ref[...] = lax.population_count(x)
  bits = np.dtype(dtype).itemsize * 8
  rng = np.random.default_rng(3)
  raw = rng.integers(0, 2 ** 62, 256, dtype=np.int64) >> rng.integers(0, 62, 256)
  if bits == 32:
    raw = raw & 0xFFFFFFFF
  raw[:3] = [0, 1, -1 if bits == 64 else 0xFFFFFFFF]
  with jax.enable_x64(bits == 64):
    x = jnp.asarray(raw.astype(np.uint64).astype(np.dtype(dtype)))
    shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
    c, p = plgpu.kernel(body, out_type=(shape, shape))(x)
    np.testing.assert_array_equal(c, lax.clz(x))
    np.testing.assert_array_equal(p, lax.population_count(x))


def test_register_load_of_a_transposed_gmem_view():
  """``b_ref.T`` read into registers (JAX's test_mma: B given as (N, K)), then plgpu.mma; and a
  transposed view stored to."""
  m = k = 128
  n = 16

  def body(a_ref, b_ref, o_ref, t_ref):
    acc = plgpu.layout_cast(jnp.zeros((m, n), jnp.float32), plgpu.Layout.MMA_ACC(jnp.float16))
    a = plgpu.load(a_ref, layout=plgpu.Layout.MMA_LHS(jnp.float16))
    b = plgpu.load(b_ref.T, layout=plgpu.Layout.MMA_RHS(jnp.float16))
    o_ref[...] = plgpu.mma(acc, a, b)
    t_ref.T[...] = b.astype(jnp.float32) * 2

  a, b = _random((m, k), jnp.float16), _random((n, k), jnp.float16, seed=1)
  f = plgpu.kernel(body, out_type=(jax.ShapeDtypeStruct((m, n), jnp.float32),
                                   jax.ShapeDtypeStruct((n, k), jnp.float32)))
  out, t = f(a, b)
  a32, b32 = np.asarray(a, np.float32), np.asarray(b, np.float32)
  np.testing.assert_allclose(out, a32 @ b32.T, atol=1e-2, rtol=1e-2)
  np.testing.assert_array_equal(t, b32 * 2)


def test_a_single_slot_buffer_seen_whole_and_by_rows():
  """A pipeline of one step has buffers of one slot, (1, rows, cols): TMA fills the slot (a 2-D
  view), the body reads and writes it row by row (1-D views, one of them at a run-time row), as
  JAX's test_fori_loop_indexed_store does."""
  rows, cols = 4, 128

  def step(_, x_ref, y_ref, o_ref):
    def row(i, carry):
      o_ref[i] = x_ref[i] + y_ref[i] * 2
      return carry
    lax.fori_loop(0, rows, row, None)

  def body(x_gmem, y_gmem, o_gmem):
    plgpu.emit_pipeline(step, grid=(), in_specs=[pl.BlockSpec(), pl.BlockSpec()],
                        out_specs=[pl.BlockSpec()])(x_gmem, y_gmem, o_gmem)

  x, y = _random((rows, cols)), _random((rows, cols), seed=1)
  f = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype))
  np.testing.assert_allclose(f(x, y), np.asarray(x) + np.asarray(y) * 2, rtol=1e-6)

  def scratch_body(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem.at[0], bar)
    plgpu.barrier_wait(bar)
    for i in range(rows):
      smem[0, i] = smem[0, i] * (i + 1)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem.at[0], o_ref)
    plgpu.wait_smem_to_gmem(0)
  g = plgpu.kernel(scratch_body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
                   scratch_types=[plgpu.SMEM((1, rows, cols), x.dtype), plgpu.Barrier()])
  np.testing.assert_allclose(g(x), np.asarray(x) * np.arange(1, rows + 1)[:, None], rtol=1e-6)


@pytest.mark.parametrize("op", ["add", "max", "min", "xor"])
def test_gmem_atomics(op):
  """plgpu.atomic_* on a GMEM view: every block of a grid updates the same (8, 128) rows."""
  blocks = 4

  def body(x_ref, o_ref):
    b = lax.axis_index("b")
    getattr(plgpu, f"atomic_{op}")(o_ref.at[pl.ds(0, 8)], x_ref[b])

  x = jnp.asarray(np.random.default_rng(5).integers(-1000, 1000, (blocks, 8, 128)), jnp.int32)
  init = jnp.asarray(np.random.default_rng(6).integers(-1000, 1000, (16, 128)), jnp.int32)
  # (the output is the aliased input, which every block updates)
  f = jax.jit(lambda x, init: pl.pallas_call(
      lambda x_ref, i_ref, o_ref: body(x_ref, o_ref), out_shape=jax.ShapeDtypeStruct(init.shape, init.dtype),
      grid=(blocks,), in_specs=[pl.BlockSpec(memory_space=plgpu.GMEM)] * 2,
      out_specs=pl.BlockSpec(memory_space=plgpu.GMEM), input_output_aliases={1: 0},
      compiler_params=plgpu.CompilerParams(), _grid_names=("b",))(x, init))
  got = np.asarray(f(x, init))
  reduce = {"add": np.add, "max": np.maximum, "min": np.minimum, "xor": np.bitwise_xor}[op]
  want = np.asarray(init).copy()
  for b in range(blocks):
    want[:8] = reduce(want[:8], np.asarray(x)[b])
  np.testing.assert_array_equal(got, want)


def test_semaphores_order_blocks():
  """Block 0 writes its rows, then signals a pl.get_global semaphore twice; block 1 waits for
  both signals (taking them off), then reads block 0's rows."""
  def body(x_ref, o_ref):
    sem = pl.get_global(plgpu.SemaphoreType.REGULAR)
    b = lax.axis_index("b")

    @pl.when(b == 0)
    def _():
      o_ref[0] = x_ref[...] * 2
      pl.semaphore_signal(sem)
      plgpu.semaphore_signal(sem, 1, memory_scope="sys")

    @pl.when(b == 1)
    def _():
      plgpu.semaphore_wait(sem, 2)
      o_ref[1] = o_ref[0] + 1
      plgpu.semaphore_wait(sem, 0, decrement=False)

  x = _random((128,))
  f = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((2, 128), jnp.float32), grid=(2,),
                   grid_names=("b",))
  out = np.asarray(f(x))
  np.testing.assert_allclose(out[0], np.asarray(x) * 2)
  np.testing.assert_allclose(out[1], np.asarray(x) * 2 + 1)


def test_smem_atomics_say_what_to_do():
  def body(x_ref, o_ref, smem):
    smem[...] = jnp.zeros(smem.shape, smem.dtype)
    plgpu.atomic_add(smem, x_ref[...])
    o_ref[...] = smem[...]
  f = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128,), jnp.int32),
                   scratch_types=[plgpu.SMEM((128,), jnp.int32)])
  with pytest.raises(NotImplementedError, match="atomic_add on SMEM.*no shared-memory atomics"):
    plgpu.lower(f, jax.ShapeDtypeStruct((128,), jnp.int32))


def test_a_buffer_written_row_by_row_then_copied_whole_and_by_rows():
  """Rows of a (16, 128) buffer stored one at a time (views of rank 1: the buffer is not
  swizzled), then copied to GMEM whole by TMA, and row by row from a run-time row in a loop
  of one warp (JAX's test_single_warp_loop)."""
  rows, cols = 16, 128

  def body(x_ref, whole_ref, by_rows_ref, smem):
    for i in range(rows):
      smem[i, :] = x_ref[i] * (i + 1)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, whole_ref)

    @plgpu.warp_map
    def _(warp):
      @pl.when(warp == 0)
      def _():
        def row(i, carry):
          plgpu.copy_smem_to_gmem(smem.at[pl.ds(i, 1)], by_rows_ref.at[pl.ds(i, 1)])
          return carry
        lax.fori_loop(0, rows, row, None)
    plgpu.wait_smem_to_gmem(0)

  x = jnp.asarray(np.random.default_rng(7).integers(-99, 99, (rows, cols)), jnp.int32)
  shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
  whole, by_rows = plgpu.kernel(body, out_type=(shape, shape),
                                scratch_types=[plgpu.SMEM((rows, cols), jnp.int32)])(x)
  want = np.asarray(x) * np.arange(1, rows + 1)[:, None]
  np.testing.assert_array_equal(whole, want)
  np.testing.assert_array_equal(by_rows, want)


def test_static_slices_of_an_accumulator_read():
  """acc_ref[:, :64] and acc_ref[:, 64:] read halves of a (64, 128) wgmma accumulator."""
  def body(a_ref, b_ref, o_ref, a_smem, b_smem, bar):
    plgpu.copy_gmem_to_smem(a_ref, a_smem, bar)
    plgpu.copy_gmem_to_smem(b_ref, b_smem, bar)
    plgpu.barrier_wait(bar)

    def scope(acc_ref):
      plgpu.wgmma(acc_ref, a_smem, b_smem)
      return acc_ref[:, :64], acc_ref[:, 64:]
    left, right = pl.run_scoped(scope, plgpu.ACC((64, 128), jnp.float32))
    o_ref[:, :64] = left * 2
    o_ref[:, 64:] = right

  a, b = _random((64, 128), jnp.float16), _random((128, 128), jnp.float16, seed=1)
  f = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((64, 128), jnp.float32),
                   scratch_types=[plgpu.SMEM((64, 128), jnp.float16), plgpu.SMEM((128, 128), jnp.float16),
                                  plgpu.Barrier(num_arrivals=2)])
  want = np.asarray(a, np.float32) @ np.asarray(b, np.float32)
  want[:, :64] *= 2
  np.testing.assert_allclose(f(a, b), want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("indexers", [
    (slice(32, 96), slice(0, 32)),                    # [32:64], which Gluon can slice
    (slice(64, 192), slice(32, 96), slice(0, 32)),    # [96:128]
])
def test_tma_into_nested_static_slices_of_smem(indexers):
  n = 256

  def body(x_ref, o_ref, smem, bar):
    smem[...] = jnp.zeros(smem.shape, smem.dtype)
    plgpu.commit_smem()
    src, dst = x_ref, smem
    for idx in indexers:
      src, dst = src.at[idx], dst.at[idx]
    plgpu.copy_gmem_to_smem(src, dst, bar)
    plgpu.barrier_wait(bar)
    o_ref[...] = smem[...] + 1

  x = _random((n,))
  f = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((n,), jnp.float32),
                   scratch_types=[plgpu.SMEM((n,), jnp.float32), plgpu.Barrier()])
  want, window = np.ones(n, np.float32), np.arange(n)
  for idx in indexers:
    window = window[idx]
  want[window] += np.asarray(x)[window]
  np.testing.assert_allclose(f(x), want, rtol=1e-6)


def test_tma_into_a_row_at_a_run_time_index():
  def body(x_ref, o_ref, smem, bar):
    smem[...] = jnp.zeros(smem.shape, smem.dtype)
    plgpu.commit_smem()
    row = lax.axis_index("x") + 4
    plgpu.copy_gmem_to_smem(x_ref.at[row], smem.at[row], bar)
    plgpu.barrier_wait(bar)
    o_ref[...] = smem[...] + 1

  x = _random((64, 64))
  f = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((64, 64), jnp.float32), grid=(1,),
                   grid_names=("x",), scratch_types=[plgpu.SMEM((64, 64), jnp.float32), plgpu.Barrier()])
  want = np.ones((64, 64), np.float32)
  want[4] += np.asarray(x)[4]
  np.testing.assert_allclose(f(x), want, rtol=1e-6)


def _reshaped_read(tiling):
  def body(o_ref, smem):
    smem[...] = jnp.ones(smem.shape, smem.dtype)
    o_ref[...] = smem.reshape(128, 128)[...]
  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128, 128), jnp.float16), scratch_types=[
      plgpu.SMEM((128, 4, 32), jnp.float16,
                 transforms=(plgpu.TilingTransform(tiling), plgpu.SwizzleTransform(32)))])


@pytest.mark.interpreter   # reshaped SMEM views run in the interpreter only (on a GPU machine too)
@pytest.mark.gluon_refuses("ReshapeTransform")
def test_collapsing_tiled_smem_dimensions_is_refused_as_jax_does():
  """(128, 4, 32) tiled (2, 16) seen as (128, 128): the collapsed dimension of 4 is tiled by 2,
  which no view of the tiles gives (JAX's compiler refuses it). Tiled (1, 16) it is fine."""
  with pytest.raises(ValueError, match="any of the dimensions being collapsed other than the "
                     "minormost one has non-unit tiling"):
    _reshaped_read((2, 16))()
  np.testing.assert_array_equal(_reshaped_read((1, 16))(), np.ones((128, 128), np.float16))


def test_semaphores_between_warps():
  """Warp 1 waits for warp 0's signals (JAX's test_global_semaphore_with_multiple_warps): the
  Gluon backend writes the warps' bodies one after another, the signalling warp's first."""
  def body(o_ref):
    sem = pl.get_global(plgpu.SemaphoreType.REGULAR)

    @plgpu.warp_map
    def _(warp):
      @pl.when(warp == 1)
      def _():
        plgpu.semaphore_wait(sem, 2, memory_scope="sys")

      @pl.when(warp == 0)
      def _():
        plgpu.semaphore_signal(sem, 2)
    o_ref[0] = pl.semaphore_read(sem)

  f = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((1,), jnp.int32))
  np.testing.assert_array_equal(f(), [0])


def test_pipeline_of_3d_blocks():
  """emit_pipeline over a 2-D grid of (32, 16, 8) blocks with two slots: buffers (2, 32, 16, 8)
  whose views index the slot only (3-D views; JAX's test_emit_with_2d_grid)."""
  steps1, steps2 = 3, 2

  def step(_, x_smem, o_smem):
    o_smem[...] = x_smem[...] * 2 + 1

  def body(x_gmem, o_gmem):
    spec = pl.BlockSpec((32, 16, 8), lambda i, j: (0, i, j))
    plgpu.emit_pipeline(step, in_specs=[spec], out_specs=[spec], grid=(steps1, steps2),
                        max_concurrent_steps=2)(x_gmem, o_gmem)

  x = _random((32, steps1 * 16, steps2 * 8))
  f = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype))
  np.testing.assert_allclose(f(x), np.asarray(x) * 2 + 1, rtol=1e-6)


def test_smem_pieces_from_a_run_time_start():
  """TMA copies into and out of SMEM pieces that start at a run-time multiple of their size
  (JAX's test_copy_gmem_to_smem_predicate), 1-D and rows of a swizzled matrix, and a register
  load of such a piece."""
  def body(x_ref, y_ref, o_ref, p_ref, vec, mat, bar):
    b = lax.axis_index("b")
    vec[...] = jnp.zeros(vec.shape, vec.dtype)
    plgpu.commit_smem()
    part = pl.ds(b * 128, 128)
    plgpu.copy_gmem_to_smem(x_ref.at[part], vec.at[part], bar, predicate=b == 0)
    plgpu.barrier_wait(bar)
    rows = pl.ds(b * 16, 16)
    plgpu.copy_gmem_to_smem(y_ref.at[rows], mat.at[rows], bar)
    plgpu.barrier_wait(bar)
    p_ref[b] = mat[rows, :] * 2
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(vec.at[part], o_ref.at[part])
    plgpu.wait_smem_to_gmem(0)

  x, y = _random((256,)), _random((32, 64), seed=1)
  f = plgpu.kernel(body, out_type=(jax.ShapeDtypeStruct((256,), jnp.float32),
                                   jax.ShapeDtypeStruct((2, 16, 64), jnp.float32)),
                   grid=(2,), grid_names=("b",),
                   scratch_types=[plgpu.SMEM((256,), jnp.float32), plgpu.SMEM((32, 64), jnp.float32),
                                  plgpu.Barrier()])
  o, p = f(x, y)
  want = np.zeros(256, np.float32)
  want[:128] = np.asarray(x)[:128]
  np.testing.assert_array_equal(o, want)
  np.testing.assert_allclose(p, np.asarray(y).reshape(2, 16, 64) * 2, rtol=1e-6)


@pytest.mark.interpreter   # Gluon's lowering of it gave wrong products on an H200: now refused
@pytest.mark.gluon_refuses("then indexes it again")
def test_wgmma_of_a_slot_of_3d_blocks_indexed_again():
  """A pipeline step's (2, 64, 128) and (2, 128, 192) blocks, of which wgmma takes a_ref.at[0]
  and b_ref.at[0] (JAX's test_wgmma_sliced_ref): the interpreter's product. The Gluon backend
  compiled it once (the slot and the block index merged into one index of the flattened
  buffer) but the products on an H200 were wrong, so it refuses it by name."""
  def step(_, a_ref, b_ref, o_ref):
    def scope(acc_ref):
      plgpu.wgmma(acc_ref, a_ref.at[0], b_ref.at[0])
      return acc_ref[...]
    o_ref[...] = pl.run_scoped(scope, plgpu.ACC((64, 192), jnp.float32))

  def body(a_gmem, b_gmem, o_gmem):
    plgpu.emit_pipeline(step, grid=(), in_specs=[pl.BlockSpec(), pl.BlockSpec()],
                        out_specs=[pl.BlockSpec()])(a_gmem, b_gmem, o_gmem)

  a, b = _random((2, 64, 128), jnp.float16), _random((2, 128, 192), jnp.float16, seed=1)
  f = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((64, 192), jnp.float32))
  want = np.asarray(a[0], np.float32) @ np.asarray(b[0], np.float32)
  np.testing.assert_allclose(f(a, b), want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.uint32])
def test_logical_right_shift(dtype):
  def body(x_ref, s_ref, o_ref):
    o_ref[...] = lax.shift_right_logical(x_ref[...], s_ref[...])
  rng = np.random.default_rng(9)
  x = jnp.asarray(rng.integers(-2 ** 31, 2 ** 31, 256).astype(np.int64).astype(np.dtype(dtype)))
  s = jnp.asarray(rng.integers(0, 40, 256).astype(np.dtype(dtype)))   # 32 and more: 0
  f = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype))
  np.testing.assert_array_equal(f(x, s), lax.shift_right_logical(x, s))


@pytest.mark.interpreter   # the interpreter runs it; on a GPU machine Gluon refuses the kernel
@pytest.mark.gluon_refuses("other than a float32 or float16 plgpu.ACC")
def test_wgmma_into_a_bfloat16_accumulator_is_refused_clearly():
  """wgmma accumulates in float32 or float16 (tests/test_gluon_f16_accumulator.py), not bfloat16."""
  def body(a_ref, b_ref, i_ref, o_ref, a_smem, b_smem, bar):
    plgpu.copy_gmem_to_smem(a_ref, a_smem, bar)
    plgpu.copy_gmem_to_smem(b_ref, b_smem, bar)
    plgpu.barrier_wait(bar)

    def scope(acc_ref):
      plgpu.wgmma(acc_ref, a_smem, b_smem)
    o_ref[...] = pl.run_state(scope)(plgpu.ACC.init(i_ref[...]))

  a, b = _random((64, 128), jnp.bfloat16), _random((128, 64), jnp.bfloat16, seed=1)
  i = _random((64, 64), jnp.bfloat16, seed=2)
  f = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((64, 64), jnp.bfloat16),
                   scratch_types=[plgpu.SMEM((64, 128), jnp.bfloat16), plgpu.SMEM((128, 64), jnp.bfloat16),
                                  plgpu.Barrier(num_arrivals=2)])
  want = np.asarray(i, np.float32) + np.asarray(a, np.float32) @ np.asarray(b, np.float32)
  np.testing.assert_allclose(np.asarray(f(a, b, i), np.float32), want, rtol=2e-2, atol=2e-1)
  with pytest.raises(NotImplementedError, match="wgmma into an accumulator other than a float32 or float16"):
    plgpu.lower(f, a, b, i)

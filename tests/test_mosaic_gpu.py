"""``pallax.mosaic_gpu`` (spec 003) in the eager interpreter, against NumPy/JAX references.

1. The public names of spec 003 (and JAX 0.11.2's spellings of ``plgpu.kernel``); the names pallax
   does not run yet raise NotImplementedError saying what works instead.
2. Kernels in the style of JAX's plgpu quickstart: fills, iotas over named grids, TMA round trips
   through SMEM with barriers and commits, views, partial boxes at array ends, wgmma, nd_loop,
   planar_snake, find_swizzle, copy groups and predicates, jax.jit, producer/consumer threads.
3. Every interpreter check: a kernel that breaks the rule, the error it raises and that the
   message names the kernel's source line in this file.

Inputs are random (helpers.rand_seeded, fixed seeds); copies are compared exactly (rtol=0, atol=0), float32
products of bfloat16/float32 inputs with rtol=1e-5, atol=1e-5 (the interpreter accumulates in
float32 like the reference; only the summation order may differ).
"""
import functools
import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu
from pallax._src.gluon import events as ev
from pallax._src.interpret.eager import KernelCheckError
import helpers

pytestmark = pytest.mark.interpreter

S = jax.ShapeDtypeStruct
EXACT = dict(rtol=0, atol=0)
F32_DOT = dict(rtol=1e-5, atol=1e-5)

# random normal values shifted to around 3 (never zero), as NumPy arrays
rand = functools.partial(helpers.rand_seeded, offset=3.0)


def line_of(fn, needle):
  """'file:line' of the line of ``fn``'s source containing ``needle``."""
  lines, start = inspect.getsourcelines(fn)
  hits = [k for k, l in enumerate(lines) if needle in l]
  assert len(hits) == 1, (needle, hits)
  return f"{inspect.getsourcefile(fn)}:{start + hits[0]}"


def at_line(fn, needle):
  """A regex matching ``fn``'s source line containing ``needle`` as pallax names it:
  'file:line (function)'."""
  return re.escape(line_of(fn, needle)) + r" \([\w.<>]+\)"


# =============================================================================================
# 1. names
# =============================================================================================

SPEC_003_NAMES = [
    # classes
    "Barrier", "BlockSpec", "CompilerParams", "MemorySpace", "Layout", "SemaphoreType",
    "SwizzleTransform", "TilingTransform", "TransposeTransform", "WGMMAAccumulatorRef",
    # functions
    "as_torch_kernel", "kernel", "layout_cast", "set_max_registers", "planar_snake",
    # loop-like functions
    "emit_pipeline", "emit_pipeline_warp_specialized", "nd_loop", "dynamic_scheduling_loop",
    # synchronization
    "barrier_arrive", "barrier_wait", "semaphore_signal_parallel", "SemaphoreSignal",
    # asynchronous copies
    "commit_smem", "copy_gmem_to_smem", "copy_smem_to_gmem", "wait_smem_to_gmem",
    # Hopper
    "wgmma", "wgmma_wait",
    # Blackwell
    "tcgen05_mma", "tcgen05_commit_arrive", "async_load_tmem", "async_store_tmem",
    "wait_load_tmem", "commit_tmem", "try_cluster_cancel", "query_cluster_cancel",
    # multimem
    "multimem_store", "multimem_load_reduce",
    # aliases
    "ACC", "GMEM", "SMEM",
]

@pytest.mark.parametrize("name", SPEC_003_NAMES)
def test_spec_003_name_exists(name):
  assert hasattr(plgpu, name), f"pallax.mosaic_gpu has no {name}"


def test_aliases_and_enums():
  assert plgpu.ACC is plgpu.WGMMAAccumulatorRef
  assert plgpu.GMEM is plgpu.MemorySpace.GMEM and plgpu.SMEM is plgpu.MemorySpace.SMEM
  assert {"GMEM", "SMEM"} <= {m.name for m in plgpu.MemorySpace}
  assert "WGMMA" in plgpu.Layout.__members__
  assert plgpu.SwizzleTransform(128).swizzle == 128
  assert plgpu.TilingTransform((8, 64)).tiling == (8, 64)
  assert plgpu.TransposeTransform((1, 0)).permutation == (1, 0)
  assert plgpu.Barrier(num_arrivals=3).num_arrivals == 3
  params = plgpu.CompilerParams(approx_math=True, max_concurrent_steps=2)
  assert params.approx_math and params.max_concurrent_steps == 2
  with pytest.raises(ValueError):
    plgpu.SwizzleTransform(48)
  with pytest.raises(ValueError):
    plgpu.Barrier(num_arrivals=0)


def test_kernel_signature_has_jax_0_11_2_spellings():
  params = inspect.signature(plgpu.kernel).parameters
  for name in ("out_type", "scratch_types", "grid", "grid_names", "num_threads", "thread_name",
               "cluster", "cluster_names", "compiler_params", "out_shape", "scratch_shapes"):
    assert name in params, name


def _copy_twice_kernel(x_ref, o_ref, smem, bar):
  i, t = lax.axis_index("b"), lax.axis_index("t")

  @pl.when(t == 0)
  def _():
    plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(i * 16, 16)], smem, bar)

  plgpu.barrier_wait(bar)   # both threads wait for the one copy
  o_ref[pl.ds(i * 16 + t * 8, 8)] = smem[pl.ds(t * 8, 8)] * 2.0


@pytest.mark.parametrize("spelling", ["0.11.2", "spec"])
def test_kernel_keywords_out_type_and_out_shape(spelling):
  x = rand(1, (48, 4 * 3 + 4))   # 16 columns of float32: 64-byte rows
  common = dict(grid=(3,), grid_names=("b",), num_threads=2, thread_name="t", cluster=(1,),
                cluster_names=("c",), compiler_params=plgpu.CompilerParams())
  scratch = [plgpu.SMEM((16, 16), jnp.float32), plgpu.Barrier()]
  if spelling == "0.11.2":
    f = plgpu.kernel(_copy_twice_kernel, out_type=S(x.shape, x.dtype), scratch_types=scratch,
                     **common)
  else:
    f = plgpu.kernel(_copy_twice_kernel, out_shape=S(x.shape, x.dtype), scratch_shapes=scratch,
                     **common)
  np.testing.assert_allclose(f(x), x * 2.0, **EXACT)


def test_kernel_takes_out_shape_positionally_as_in_spec_003():
  def body(o_ref):
    o_ref[...] = jnp.full(o_ref.shape, 3.0, o_ref.dtype)
  np.testing.assert_allclose(plgpu.kernel(body, S((16,), jnp.float32))(),
                             np.full(16, 3.0, np.float32), **EXACT)


def test_kernel_scratch_as_mapping_and_tuple_outputs():
  x = rand(2, (32, 8))

  def body(x_ref, o1_ref, o2_ref, *, buf, bar):
    plgpu.copy_gmem_to_smem(x_ref, buf, bar)
    plgpu.barrier_wait(bar)
    o1_ref[...] = buf[...] + 1.0
    o2_ref[...] = (buf[...] * 3.0).astype(jnp.bfloat16)

  f = plgpu.kernel(body, out_type=(S(x.shape, jnp.float32), S(x.shape, jnp.bfloat16)),
                   scratch_types=dict(buf=plgpu.SMEM(x.shape, jnp.float32), bar=plgpu.Barrier()))
  o1, o2 = f(x)
  np.testing.assert_allclose(o1, x + 1.0, **EXACT)
  np.testing.assert_allclose(np.asarray(o2, np.float32),
                             np.asarray((x * 3.0).astype(jnp.bfloat16), np.float32), **EXACT)


UNSUPPORTED = {   # Blackwell's names: test_mosaic_gpu_blackwell*.py; peer SMEM: test_mosaic_gpu_peer_smem.py
    "multimem_store": "shard_map", "multimem_load_reduce": "shard_map",
    "multicast_ref": "shard_map",
}


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_unsupported_names_raise_with_what_works_instead(name):
  fn = getattr(plgpu, name)
  with pytest.raises(NotImplementedError, match=rf"plgpu\.{name}: .*not supported.*; "
                                                rf".*{re.escape(UNSUPPORTED[name])}"):
    fn(None, None, None)


# =============================================================================================
# 2. kernels
# =============================================================================================

def test_fill_42():
  @plgpu.kernel(out_shape=S((128,), jnp.float32))
  def fill(o_ref):
    o_ref[...] = jnp.full(o_ref.shape, 42.0, o_ref.dtype)
  np.testing.assert_allclose(fill(), np.full(128, 42.0, np.float32), **EXACT)


def test_iota_over_named_grid_with_axis_size():
  n, blocks = 96, 5   # neither a power of two

  @plgpu.kernel(out_shape=S((blocks * n,), jnp.int32), grid=(blocks,), grid_names=("x",))
  def iota(o_ref):
    i = lax.axis_index("x")
    size = lax.axis_size("x")
    o_ref[pl.ds(i * n, n)] = i * n + lax.iota(jnp.int32, n) + 1000 * size

  np.testing.assert_array_equal(iota(), np.arange(blocks * n) + 1000 * blocks)


def test_iota_over_grid_and_threads():
  @plgpu.kernel(out_shape=S((3, 2, 24), jnp.int32), grid=(3,), grid_names=("x",), num_threads=2,
                thread_name="wg")
  def iota(o_ref):
    i, t = lax.axis_index("x"), lax.axis_index("wg")
    o_ref[i, t] = (i * 2 + t) * 24 + lax.iota(jnp.int32, 24) + 10000 * lax.axis_size("wg")

  np.testing.assert_array_equal(iota(), np.arange(3 * 2 * 24).reshape(3, 2, 24) + 20000)


def test_two_dimensional_grid():
  x = rand(3, (3 * 16, 2 * 8))

  @plgpu.kernel(out_shape=S(x.shape, x.dtype), grid=(3, 2), grid_names=("i", "j"),
                scratch_shapes=[plgpu.SMEM((16, 8), jnp.float32), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    i, j = lax.axis_index("i"), lax.axis_index("j")
    view = (pl.ds(i * 16, 16), pl.ds(j * 8, 8))
    plgpu.copy_gmem_to_smem(x_ref.at[view], smem, bar)
    plgpu.barrier_wait(bar)
    smem[...] = smem[...] + (10 * i + j).astype(jnp.float32)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref.at[view])
    plgpu.wait_smem_to_gmem(0)

  add = (10 * np.arange(3)[:, None, None, None] + np.arange(2)[None, None, :, None])
  add = add.astype(np.float32)
  want = (x.reshape(3, 16, 2, 8) + add).reshape(x.shape)
  np.testing.assert_allclose(k(x), want, **EXACT)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int8])
def test_round_trip_gmem_smem_registers_smem_gmem(dtype):
  x = rand(4, (4 * 64, 48), dtype)

  @plgpu.kernel(out_shape=S(x.shape, dtype), grid=(4,), grid_names=("b",),
                scratch_shapes=[plgpu.SMEM((64, 48), dtype), plgpu.SMEM((64, 48), dtype),
                                plgpu.Barrier()])
  def k(x_ref, o_ref, in_smem, out_smem, bar):
    b = lax.axis_index("b")
    plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(b * 64, 64)], in_smem, bar)
    plgpu.barrier_wait(bar)
    out_smem[...] = in_smem[...] * 2 + 1
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(out_smem, o_ref.at[pl.ds(b * 64, 64)])
    plgpu.wait_smem_to_gmem(0)

  want = np.asarray(jnp.asarray(x) * 2 + 1)
  np.testing.assert_allclose(np.asarray(k(x), np.float32), np.asarray(want, np.float32), **EXACT)


def test_copy_of_squeezed_integer_index_view():
  b_, s_, h_, d_ = 3, 40, 5, 8
  x = rand(5, (b_, s_, h_, d_))

  @plgpu.kernel(out_shape=S(x.shape, x.dtype), grid=(b_, h_), grid_names=("b", "h"),
                scratch_shapes=[plgpu.SMEM((s_, d_), jnp.float32), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    b, h = lax.axis_index("b"), lax.axis_index("h")
    plgpu.copy_gmem_to_smem(x_ref.at[b, :, h], smem, bar)
    plgpu.barrier_wait(bar)
    smem[...] = smem[...] * 3.0 - h.astype(jnp.float32)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref.at[b, :, h])
    plgpu.wait_smem_to_gmem(0)

  want = x * 3.0 - np.arange(h_, dtype=np.float32)[None, None, :, None]
  np.testing.assert_allclose(k(x), want, **EXACT)


def test_size_one_dims_and_odd_sizes():
  x = rand(6, (1, 37, 1, 16))

  @plgpu.kernel(out_shape=S(x.shape, x.dtype),
                scratch_shapes=[plgpu.SMEM((1, 37, 1, 16), jnp.float32), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    smem[...] = -smem[...]
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref)
    plgpu.wait_smem_to_gmem(0)

  np.testing.assert_allclose(k(x), -x, **EXACT)


def test_partial_box_zero_fills_smem_and_clips_gmem_store():
  rows, blk = 100, 32   # the last box (rows 96..127) has 4 rows in the array
  x = rand(7, (rows, 24))
  nb = -(-rows // blk)

  @plgpu.kernel(out_shape=(S(x.shape, x.dtype), S((nb * blk, 24), x.dtype)), grid=(nb,),
                grid_names=("b",),
                scratch_shapes=[plgpu.SMEM((blk, 24), jnp.float32), plgpu.Barrier()])
  def k(x_ref, o_ref, seen_ref, smem, bar):
    b = lax.axis_index("b")
    plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(b * blk, blk)], smem, bar)
    plgpu.barrier_wait(bar)
    seen_ref[pl.ds(b * blk, blk)] = smem[...]
    smem[...] = smem[...] + 1.0
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref.at[pl.ds(b * blk, blk)])
    plgpu.wait_smem_to_gmem(0)

  out, seen = k(x)
  np.testing.assert_allclose(out, x + 1.0, **EXACT)
  np.testing.assert_allclose(seen[:rows], x, **EXACT)
  np.testing.assert_allclose(seen[rows:], np.zeros((nb * blk - rows, 24), np.float32), **EXACT)


def test_partial_box_in_both_dims_of_a_2d_array():
  x = rand(8, (50, 20))   # boxes of 32 x 16: both dims end in partial boxes

  @plgpu.kernel(out_shape=(S(x.shape, x.dtype), S((64, 32), x.dtype)), grid=(2, 2),
                grid_names=("i", "j"),
                scratch_shapes=[plgpu.SMEM((32, 16), jnp.float32), plgpu.Barrier()])
  def k(x_ref, o_ref, seen_ref, smem, bar):
    i, j = lax.axis_index("i"), lax.axis_index("j")
    box = (pl.ds(i * 32, 32), pl.ds(j * 16, 16))
    plgpu.copy_gmem_to_smem(x_ref.at[box], smem, bar)
    plgpu.barrier_wait(bar)
    seen_ref[box] = smem[...]
    plgpu.copy_smem_to_gmem(smem, o_ref.at[box])
    plgpu.wait_smem_to_gmem(0)

  out, seen = k(x)
  np.testing.assert_allclose(out, x, **EXACT)
  want = np.zeros((64, 32), np.float32)
  want[:50, :20] = x
  np.testing.assert_allclose(seen, want, **EXACT)


# --- wgmma -----------------------------------------------------------------------------------

M, K, N = 64, 48, 72   # K and N: no powers of two


def _mm_inputs(dtype=jnp.bfloat16):
  a, b = rand(10, (M, K), dtype), rand(11, (K, N), dtype)
  want = np.asarray(a, np.float32) @ np.asarray(b, np.float32)
  return a, b, want


@pytest.mark.parametrize("a_in", ["smem", "registers"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])   # float32 operands: see below
def test_wgmma_with_smem_operands_in_run_scoped_acc(a_in, dtype):
  a, b, want = _mm_inputs(dtype)

  @plgpu.kernel(out_shape=S((M, N), jnp.float32),
                scratch_shapes=[plgpu.SMEM((M, K), dtype), plgpu.SMEM((K, N), dtype),
                                plgpu.SMEM((M, N), jnp.float32), plgpu.Barrier(num_arrivals=2)])
  def mm(a_ref, b_ref, o_ref, a_smem, b_smem, o_smem, bar):
    plgpu.copy_gmem_to_smem(a_ref, a_smem, bar)
    plgpu.copy_gmem_to_smem(b_ref, b_smem, bar)
    plgpu.barrier_wait(bar)

    def compute(acc_ref):
      plgpu.wgmma(acc_ref, a_smem if a_in == "smem" else a_smem[...], b_smem)
      plgpu.wgmma_wait(0)
      return acc_ref[...]

    o_smem[...] = pl.run_scoped(compute, plgpu.ACC((M, N), jnp.float32))
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_smem, o_ref)
    plgpu.wait_smem_to_gmem(0)

  np.testing.assert_allclose(mm(a, b), want, **F32_DOT)


# Not tested: float32 operands. Hopper's wgmma reads them as tf32 (Mosaic GPU's wgmma.py uses
# FloatTF32Type for f32 inputs) while the interpreter multiplies them in full float32; which of
# the two pallax means is not settled, so no test pins either.


def test_wgmma_transposed_b_view_accumulating_over_k():
  a, b, want = _mm_inputs()
  bt = np.ascontiguousarray(b.T)    # (N, K) in GMEM, used as b_smem.transpose((1, 0))
  kt = 16

  @plgpu.kernel(out_shape=S((M, N), jnp.float32),
                scratch_shapes=[plgpu.SMEM((M, K), jnp.bfloat16), plgpu.SMEM((N, K), jnp.bfloat16),
                                plgpu.Barrier(num_arrivals=2)])
  def mm(a_ref, bt_ref, o_ref, a_smem, bt_smem, bar):
    plgpu.copy_gmem_to_smem(a_ref, a_smem, bar)
    plgpu.copy_gmem_to_smem(bt_ref, bt_smem, bar)
    plgpu.barrier_wait(bar)

    def compute(acc_ref):
      for k0 in range(0, K, kt):     # three wgmmas into one accumulator
        plgpu.wgmma(acc_ref, a_smem.at[:, pl.ds(k0, kt)],
                    bt_smem.at[:, pl.ds(k0, kt)].transpose((1, 0)))
      plgpu.wgmma_wait(0)
      return acc_ref[...]

    o_ref[...] = pl.run_scoped(compute, plgpu.ACC((M, N)))

  np.testing.assert_allclose(mm(a, bt), want, **F32_DOT)


def test_run_state_with_acc_init_closing_over_values():
  c, d = rand(12, (M, N)), rand(13, (M, N))

  @plgpu.kernel(out_shape=S((M, N), jnp.float32))
  def k(c_ref, d_ref, o_ref):
    d = d_ref[...]

    def body(acc_ref):
      acc_ref[...] = acc_ref[...] * 2.0 + d

    o_ref[...] = pl.run_state(body)(plgpu.ACC.init(c_ref[...]))

  np.testing.assert_allclose(k(c, d), c * 2.0 + d, rtol=1e-6, atol=1e-6)


def test_run_state_with_acc_init_and_wgmma():
  a, b, want = _mm_inputs()
  c = rand(14, (M, N))

  @plgpu.kernel(out_shape=S((M, N), jnp.float32),
                scratch_shapes=[plgpu.SMEM((M, K), jnp.bfloat16), plgpu.SMEM((K, N), jnp.bfloat16),
                                plgpu.Barrier(num_arrivals=2)])
  def mm(a_ref, b_ref, c_ref, o_ref, a_smem, b_smem, bar):
    plgpu.copy_gmem_to_smem(a_ref, a_smem, bar)
    plgpu.copy_gmem_to_smem(b_ref, b_smem, bar)
    plgpu.barrier_wait(bar)

    def body(acc_ref):
      plgpu.wgmma(acc_ref, a_smem, b_smem)
      plgpu.wgmma_wait(0)

    o_ref[...] = pl.run_state(body)(plgpu.ACC.init(c_ref[...]))

  np.testing.assert_allclose(mm(a, b, c), want + c, **F32_DOT)


def test_run_state_body_writing_a_closed_over_ref():
  c = rand(15, (8, 16))

  @plgpu.kernel(out_shape=S((8, 16), jnp.float32))
  def k(c_ref, o_ref):
    def body(acc_ref):
      o_ref[...] = acc_ref[...] + 1.0

    pl.run_state(body)(plgpu.ACC.init(c_ref[...]))

  np.testing.assert_allclose(k(c), c + 1.0, **EXACT)


# --- layouts ---------------------------------------------------------------------------------

def test_layout_cast_iota_and_load_with_layout_preserve_values():
  x = rand(16, (64, 32))

  @plgpu.kernel(out_shape=(S((64, 32), jnp.float32), S((64, 32), jnp.int32), S((16, 32), jnp.float32),
                           S((64,), jnp.float32)),
                scratch_shapes=[plgpu.SMEM((64, 32), jnp.float32), plgpu.Barrier()])
  def k(x_ref, o1, o2, o3, o4, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    v = plgpu.load(smem, (), layout=plgpu.Layout.WGMMA)
    o1[...] = plgpu.layout_cast(v, plgpu.Layout.WG_STRIDED((64, 32), vec_size=2))
    o2[...] = plgpu.broadcasted_iota(jnp.int32, (64, 32), 1, layout=plgpu.Layout.WGMMA) + \
        plgpu.broadcasted_iota(jnp.int32, (64, 32), 0, layout=plgpu.Layout.WGMMA) * 100
    o3[...] = plgpu.load(smem, (pl.ds(8, 16),), layout=plgpu.Layout.WGMMA)
    o4[...] = plgpu.layout_cast(v.sum(axis=1), plgpu.Layout.WGMMA.reduce(1))

  o1, o2, o3, o4 = k(x)
  np.testing.assert_allclose(o1, x, **EXACT)
  np.testing.assert_array_equal(o2, np.arange(32)[None, :] + 100 * np.arange(64)[:, None])
  np.testing.assert_allclose(o3, x[8:24], **EXACT)
  np.testing.assert_allclose(o4, x.sum(axis=1), rtol=1e-6, atol=1e-5)


# --- nd_loop, planar_snake, find_swizzle -----------------------------------------------------

def test_nd_loop_order_matches_jax_docstring_table():
  # JAX's nd_loop docstring: collective axis "x" of size 4, grid (2, 3).
  table = {0: ((0, 0), 0), 1: ((0, 1), 1), 2: ((0, 2), 2), 3: ((1, 0), 3), 4: ((1, 1), 0),
           5: ((1, 2), 1)}

  @plgpu.kernel(out_shape=(S((2, 3), jnp.int32), S((2, 3), jnp.int32), S((4,), jnp.int32)),
                grid=(4,), grid_names=("x",))
  def k(axis_ref, local_ref, steps_ref):
    x = lax.axis_index("x")

    @plgpu.nd_loop((2, 3), collective_axes="x")
    def body(info):
      i, j = info.index
      axis_ref[i, j] = x
      local_ref[i, j] = info.local_index
      steps_ref[x] = info.num_local_steps

  axis, local, steps = k()
  for step, ((i, j), ax) in table.items():
    assert axis[i, j] == ax, (step, axis)
    assert local[i, j] == step // 4, (step, local)
  np.testing.assert_array_equal(steps, [2, 2, 1, 1])   # the docstring's second table


def test_nd_loop_over_threads_with_carry():
  @plgpu.kernel(out_shape=(S((5, 3), jnp.int32), S((2,), jnp.int32)), num_threads=2,
                thread_name="wg")
  def k(who_ref, sum_ref):
    t = lax.axis_index("wg")

    @plgpu.nd_loop((5, 3), collective_axes="wg", init_carry=jnp.int32(0))
    def total(info, carry):
      i, j = info.index
      who_ref[i, j] = t
      return carry + i * 3 + j

    sum_ref[t] = total

  who, sums = k()
  flat = np.arange(15)
  np.testing.assert_array_equal(who.reshape(-1), flat % 2)
  np.testing.assert_array_equal(sums, [flat[flat % 2 == 0].sum(), flat[flat % 2 == 1].sum()])


@pytest.mark.parametrize("grid,tiling,size", [((2, 3), None, 4), ((6, 4), (3, 2), 5),
                                              ((4, 6, 2), (2, 3, 1), 3), ((7,), None, 2)])
def test_nd_loop_matches_jax_nd_loop(grid, tiling, size):
  from jax.experimental.pallas import mosaic_gpu as jax_plgpu
  total = int(np.prod(grid))

  def visit(nd_loop):
    def per_program(_):
      @nd_loop(grid, collective_axes="x", tiling=tiling,
               init_carry=jnp.full((total, 2), -1, jnp.int32))
      def order(info, carry):
        flat = jnp.ravel_multi_index(info.index, grid, mode="clip")
        return carry.at[flat].set(jnp.stack([info.local_index, info.num_local_steps]))
      return order
    return np.asarray(jax.vmap(per_program, axis_name="x")(jnp.arange(size)))

  np.testing.assert_array_equal(visit(plgpu.nd_loop), visit(jax_plgpu.nd_loop))


PLANAR_SNAKE_8x8 = np.array([
    [0, 2, 4, 6, 8, 10, 12, 14],
    [1, 3, 5, 7, 9, 11, 13, 15],
    [30, 28, 26, 24, 22, 20, 18, 16],
    [31, 29, 27, 25, 23, 21, 19, 17],
    [32, 34, 36, 38, 40, 42, 44, 46],
    [33, 35, 37, 39, 41, 43, 45, 47],
    [62, 60, 58, 56, 54, 52, 50, 48],
    [63, 61, 59, 57, 55, 53, 51, 49]])


def _snake_table(fn, shape, minor_dim, tile_width):
  lin = jnp.arange(shape[0] * shape[1], dtype=jnp.int32)
  r, c = jax.vmap(lambda i: fn(i, shape, minor_dim, tile_width))(lin)
  table = np.full(shape, -1)
  table[np.asarray(r), np.asarray(c)] = np.asarray(lin)
  return table


def test_planar_snake_matches_jax_docstring_table():
  np.testing.assert_array_equal(_snake_table(plgpu.planar_snake, (8, 8), 0, 2), PLANAR_SNAKE_8x8)


@pytest.mark.parametrize("shape,minor_dim,tile_width", [
    ((8, 8), 1, 2), ((7, 5), 0, 2), ((7, 5), 1, 3), ((6, 10), 1, 4), ((12, 9), 0, 5),
    ((1, 9), 1, 4), ((9, 1), 0, 2), ((5, 5), 0, 8)])
def test_planar_snake_matches_jax(shape, minor_dim, tile_width):
  from jax.experimental.pallas import mosaic_gpu as jax_plgpu
  mine = _snake_table(plgpu.planar_snake, shape, minor_dim, tile_width)
  theirs = _snake_table(jax_plgpu.planar_snake, shape, minor_dim, tile_width)
  np.testing.assert_array_equal(mine, theirs)
  assert sorted(mine.reshape(-1)) == list(range(shape[0] * shape[1]))   # a permutation


def test_planar_snake_inside_a_kernel():
  @plgpu.kernel(out_shape=S((8, 8), jnp.int32), grid=(64,), grid_names=("x",))
  def k(o_ref):
    lin = lax.axis_index("x")
    r, c = plgpu.planar_snake(lin, (8, 8), 0, 2)
    o_ref[r, c] = lin

  np.testing.assert_array_equal(k(), PLANAR_SNAKE_8x8)


def test_find_swizzle_matches_jax():
  from jax.experimental.pallas import mosaic_gpu as jax_plgpu
  for bits in [128, 256, 384, 512, 640, 768, 1024, 1536, 2048, 3072, 8192, 16 * 8 * 9]:
    assert plgpu.find_swizzle(bits) == jax_plgpu.find_swizzle(bits), bits
  for bits in [8, 64, 96, 200]:
    with pytest.raises(ValueError, match=rf"No valid out swizzle for lhs: minor dimension has "
                                         rf"{bits} bits, which is not a multiple of 128"):
      plgpu.find_swizzle(bits, "lhs")


# --- copy groups, predicates, jit --------------------------------------------------------------

def test_commit_group_false_then_commit_smem_to_gmem_group():
  x = rand(17, (2, 32, 16))

  @plgpu.kernel(out_shape=S((2, 32, 16), jnp.float32),
                scratch_shapes=[plgpu.SMEM((2, 32, 16), jnp.float32), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    for i in range(2):
      plgpu.copy_smem_to_gmem(smem.at[i], o_ref.at[i], commit_group=False)
    plgpu.commit_smem_to_gmem_group()
    plgpu.wait_smem_to_gmem(0)
    smem[...] = jnp.zeros(smem.shape, smem.dtype)   # allowed: the group was awaited

  np.testing.assert_allclose(k(x), x, **EXACT)


def test_whole_rank3_smem_in_registers_beside_copies_of_its_slots():
  # Slots are copied one by one (views of rank 2) while registers read and write the whole
  # buffer (rank 3): on a GPU those see the buffer through a layout of their own rank.
  x = rand(19, (2, 32, 16))

  @plgpu.kernel(out_shape=(S(x.shape, x.dtype), S(x.shape, x.dtype)),
                scratch_shapes=[plgpu.SMEM(x.shape, jnp.float32), plgpu.SMEM(x.shape, jnp.float32),
                                plgpu.Barrier(num_arrivals=2)])
  def k(x_ref, o_ref, p_ref, smem, p_smem, bar):
    for i in range(2):
      plgpu.copy_gmem_to_smem(x_ref.at[i], smem.at[i], bar)
    plgpu.barrier_wait(bar)
    p_smem[...] = smem[...] * 2
    smem[...] = smem[...] + 1
    plgpu.commit_smem()
    for i in range(2):
      plgpu.copy_smem_to_gmem(smem.at[i], o_ref.at[i])
    plgpu.copy_smem_to_gmem(p_smem, p_ref)
    plgpu.wait_smem_to_gmem(0)

  o, p = k(x)
  np.testing.assert_allclose(o, x + 1, **EXACT)
  np.testing.assert_allclose(p, x * 2, **EXACT)


def test_wait_smem_to_gmem_n_leaves_the_newest_groups_in_flight():
  x = rand(18, (2, 16, 16))

  @plgpu.kernel(out_shape=S((2, 16, 16), jnp.float32),
                scratch_shapes=[plgpu.SMEM((16, 16), jnp.float32),
                                plgpu.SMEM((16, 16), jnp.float32), plgpu.Barrier(num_arrivals=2)])
  def k(x_ref, o_ref, s0, s1, bar):
    plgpu.copy_gmem_to_smem(x_ref.at[0], s0, bar)
    plgpu.copy_gmem_to_smem(x_ref.at[1], s1, bar)
    plgpu.barrier_wait(bar)
    plgpu.copy_smem_to_gmem(s0, o_ref.at[0])
    plgpu.copy_smem_to_gmem(s1, o_ref.at[1])
    plgpu.wait_smem_to_gmem(1)        # the copy from s0 is done, the one from s1 may not be
    s0[...] = jnp.zeros(s0.shape, s0.dtype)

  np.testing.assert_allclose(k(x), x, **EXACT)


def test_copy_predicates():
  x = rand(19, (4, 16, 8))

  @plgpu.kernel(out_shape=S((4, 16, 8), jnp.float32), grid=(4,), grid_names=("b",),
                scratch_shapes=[plgpu.SMEM((16, 8), jnp.float32), plgpu.SMEM((16, 8), jnp.float32),
                                plgpu.Barrier()])
  def k(x_ref, o_ref, smem, fill, bar):
    b = lax.axis_index("b")
    even = b % 2 == 0
    fill[...] = jnp.full(fill.shape, -7.0, fill.dtype)
    plgpu.commit_smem()
    plgpu.copy_gmem_to_smem(x_ref.at[b], smem, bar, predicate=even)

    @pl.when(even)
    def _():
      plgpu.barrier_wait(bar)

    plgpu.copy_smem_to_gmem(smem, o_ref.at[b], predicate=even)
    plgpu.copy_smem_to_gmem(fill, o_ref.at[b], predicate=jnp.logical_not(even))
    plgpu.wait_smem_to_gmem(0)

  want = x.copy()
  want[1::2] = -7.0
  np.testing.assert_allclose(k(x), want, **EXACT)


def test_barrier_arrive_predicate():
  @plgpu.kernel(out_shape=S((2, 8), jnp.float32), num_threads=2, thread_name="wg",
                scratch_shapes=[plgpu.Barrier(num_arrivals=1)])
  def k(o_ref, bar):
    t = lax.axis_index("wg")
    plgpu.barrier_arrive(bar, predicate=t == 1)   # only thread 1 arrives
    plgpu.barrier_wait(bar)
    o_ref[t] = jnp.full((8,), 1.0, jnp.float32) + t.astype(jnp.float32)

  np.testing.assert_allclose(k(), np.array([[1.0] * 8, [2.0] * 8], np.float32), **EXACT)


def test_jax_jit_around_a_kernel():
  x = rand(20, (70, 16))

  @plgpu.kernel(out_shape=S(x.shape, x.dtype), grid=(3,), grid_names=("b",),
                scratch_shapes=[plgpu.SMEM((32, 16), jnp.float32), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    b = lax.axis_index("b")
    plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(b * 32, 32)], smem, bar)
    plgpu.barrier_wait(bar)
    smem[...] = jnp.exp(smem[...] * 0.1)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref.at[pl.ds(b * 32, 32)])
    plgpu.wait_smem_to_gmem(0)

  out = jax.jit(lambda v: k(v * 2.0) + 1.0)(x)
  np.testing.assert_allclose(out, np.exp(x * 2.0 * 0.1) + 1.0, rtol=1e-6, atol=0)


# --- threads -----------------------------------------------------------------------------------

def test_producer_consumer_threads_with_double_buffering():
  steps, rows = 5, 16
  x = rand(21, (steps, rows, 8))

  @plgpu.kernel(out_shape=S(x.shape, x.dtype), num_threads=2, thread_name="wg",
                scratch_shapes=[plgpu.SMEM((2, rows, 8), jnp.float32),
                                plgpu.Barrier(num_arrivals=1, num_barriers=2),
                                plgpu.Barrier(num_arrivals=1, num_barriers=2)])
  def k(x_ref, o_ref, smem, full, empty):
    t = lax.axis_index("wg")

    @pl.when(t == 0)
    def _producer():
      @pl.loop(0, steps)
      def _(s):
        slot = s % 2

        @pl.when(s >= 2)
        def _():
          plgpu.barrier_wait(empty.at[slot])

        plgpu.copy_gmem_to_smem(x_ref.at[s], smem.at[slot], full.at[slot])

    @pl.when(t == 1)
    def _consumer():
      @pl.loop(0, steps)
      def _(s):
        slot = s % 2
        plgpu.barrier_wait(full.at[slot])
        o_ref[s] = smem[slot] * 2.0 + s.astype(jnp.float32)
        plgpu.barrier_arrive(empty.at[slot])

  want = x * 2.0 + np.arange(steps, dtype=np.float32)[:, None, None]
  np.testing.assert_allclose(k(x), want, **EXACT)


def test_one_producer_two_consumers_with_num_arrivals_2():
  x = rand(22, (3, 32, 8))

  @plgpu.kernel(out_shape=S(x.shape, x.dtype), num_threads=3, thread_name="wg",
                scratch_shapes=[plgpu.SMEM((32, 8), jnp.float32), plgpu.Barrier(),
                                plgpu.Barrier(num_arrivals=2)])
  def k(x_ref, o_ref, smem, full, consumed):
    t = lax.axis_index("wg")

    @pl.when(t == 0)
    def _producer():
      for s in range(3):
        if s:
          plgpu.barrier_wait(consumed)    # both consumers are done with the previous step
        plgpu.copy_gmem_to_smem(x_ref.at[s], smem, full)

    @pl.when(t > 0)
    def _consumers():
      half = t - 1
      for s in range(3):
        plgpu.barrier_wait(full)
        o_ref[s, pl.ds(half * 16, 16)] = smem[pl.ds(half * 16, 16)] - 1.0
        plgpu.barrier_arrive(consumed)

  np.testing.assert_allclose(k(x), x - 1.0, **EXACT)


def test_threads_share_scratch_and_wgmma_consumer():
  a, b, want = _mm_inputs()

  @plgpu.kernel(out_shape=S((M, N), jnp.float32), num_threads=2, thread_name="wg",
                scratch_shapes=[plgpu.SMEM((M, K), jnp.bfloat16), plgpu.SMEM((K, N), jnp.bfloat16),
                                plgpu.SMEM((M, N), jnp.float32), plgpu.Barrier(num_arrivals=2)])
  def mm(a_ref, b_ref, o_ref, a_smem, b_smem, o_smem, bar):
    t = lax.axis_index("wg")

    @pl.when(t == 0)
    def _():
      plgpu.copy_gmem_to_smem(a_ref, a_smem, bar)
      plgpu.copy_gmem_to_smem(b_ref, b_smem, bar)

    @pl.when(t == 1)
    def _():
      plgpu.barrier_wait(bar)

      def compute(acc_ref):
        plgpu.wgmma(acc_ref, a_smem, b_smem)
        plgpu.wgmma_wait(0)
        return acc_ref[...]

      o_smem[...] = pl.run_scoped(compute, plgpu.ACC((M, N)))
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(o_smem, o_ref)
      plgpu.wait_smem_to_gmem(0)

  np.testing.assert_allclose(mm(a, b), want, **F32_DOT)


# =============================================================================================
# 3. the interpreter's checks
# =============================================================================================

def _run(body, out_shape=S((16, 16), jnp.float32), args=(), **kw):
  return plgpu.kernel(body, out_shape=out_shape, **kw)(*args)


def test_deadlock_one_thread_waits_on_a_barrier_nobody_arrives_on():
  def k(o_ref, bar):
    plgpu.barrier_wait(bar)   # <- waits forever
    o_ref[...] = jnp.ones(o_ref.shape, o_ref.dtype)

  with pytest.raises(KernelCheckError, match=r"deadlock in block \(0\): every thread waits.*"
                     r"the kernel waits for barrier .*\(phase 0, 0/1 arrivals\) at "
                     + at_line(k, "<- waits forever")):
    _run(k, scratch_shapes=[plgpu.Barrier()])


def test_deadlock_of_two_threads_names_each_wait():
  def k(o_ref, bar_a, bar_b):
    t = lax.axis_index("wg")

    @pl.when(t == 0)
    def _():
      plgpu.barrier_wait(bar_a)     # <- thread 0 waits
      plgpu.barrier_arrive(bar_b)

    @pl.when(t == 1)
    def _():
      plgpu.barrier_wait(bar_b)     # <- thread 1 waits
      plgpu.barrier_arrive(bar_a)

  with pytest.raises(KernelCheckError) as info:
    _run(k, num_threads=2, thread_name="wg", scratch_shapes=[plgpu.Barrier(), plgpu.Barrier()])
  msg = str(info.value)
  assert "deadlock" in msg, msg
  assert re.search(r"thread wg=0 waits for barrier .* at " + at_line(k, "<- thread 0 waits"), msg), msg
  assert re.search(r"thread wg=1 waits for barrier .* at " + at_line(k, "<- thread 1 waits"), msg), msg


def test_deadlock_when_a_barrier_gets_too_few_arrivals():
  x = rand(23, (16, 16))

  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)    # <- 1 of 2 arrivals
    o_ref[...] = smem[...]

  with pytest.raises(KernelCheckError, match=r"deadlock.*\(phase 0, 1/2 arrivals\) at "
                     + at_line(k, "<- 1 of 2 arrivals")):
    _run(k, args=(x,), scratch_shapes=[plgpu.SMEM((16, 16), jnp.float32),
                                       plgpu.Barrier(num_arrivals=2)])


def test_barrier_completing_twice_before_a_waiting_thread_saw_it():
  def k(o_ref, go, bar):
    t = lax.axis_index("wg")

    @pl.when(t == 0)
    def _():
      plgpu.barrier_wait(go)
      plgpu.barrier_arrive(bar)
      plgpu.barrier_arrive(bar)    # <- second completion

    @pl.when(t == 1)
    def _():
      plgpu.barrier_arrive(go)
      plgpu.barrier_wait(bar)

  with pytest.raises(KernelCheckError, match=r"thread wg=0 .* at " + at_line(k, "<- second completion")
                     + r".*barrier_arrive completes barrier .* a second time before thread wg=1 "
                     r"waited for its previous completion"):
    _run(k, num_threads=2, thread_name="wg", scratch_shapes=[plgpu.Barrier(), plgpu.Barrier()])


def test_barrier_completed_twice_since_the_last_wait():
  x = rand(24, (2, 16, 16))

  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref.at[0], smem.at[0], bar)
    plgpu.copy_gmem_to_smem(x_ref.at[1], smem.at[1], bar)
    plgpu.barrier_wait(bar)    # <- sees two completions
    o_ref[...] = smem[0]

  with pytest.raises(KernelCheckError, match=at_line(k, "<- sees two completions")
                     + r".*barrier_wait on .*: the barrier completed 2 times since this thread last "
                     r"waited on it"):
    _run(k, args=(x,), scratch_shapes=[plgpu.SMEM((2, 16, 16), jnp.float32), plgpu.Barrier()])


def test_copy_smem_to_gmem_without_commit_smem():
  def k(o_ref, smem):
    smem[...] = jnp.ones(smem.shape, smem.dtype)      # <- register write
    plgpu.copy_smem_to_gmem(smem, o_ref)              # <- TMA read
    plgpu.wait_smem_to_gmem(0)

  with pytest.raises(KernelCheckError, match=at_line(k, "<- TMA read") + r".*copy_smem_to_gmem "
                     r"reads SMEM .*written from registers by the kernel at "
                     + at_line(k, "<- register write") + r".*without plgpu.commit_smem\(\)"):
    _run(k, scratch_shapes=[plgpu.SMEM((16, 16), jnp.float32)])


def test_wgmma_reading_uncommitted_smem():
  a, b, _ = _mm_inputs()

  def k(a_ref, b_ref, o_ref, a_smem, b_smem, bar):
    plgpu.copy_gmem_to_smem(b_ref, b_smem, bar)
    plgpu.barrier_wait(bar)
    a_smem[...] = a_ref[...]       # <- a from registers

    def compute(acc_ref):
      plgpu.wgmma(acc_ref, a_smem, b_smem)    # <- uncommitted
      plgpu.wgmma_wait(0)
      return acc_ref[...]

    o_ref[...] = pl.run_scoped(compute, plgpu.ACC((M, N)))

  with pytest.raises(KernelCheckError, match=at_line(k, "<- uncommitted") + r".*wgmma reads SMEM "
                     r".*written from registers by the kernel at " + at_line(k, "<- a from registers")):
    _run(k, out_shape=S((M, N), jnp.float32), args=(a, b),
         scratch_shapes=[plgpu.SMEM((M, K), jnp.bfloat16), plgpu.SMEM((K, N), jnp.bfloat16),
                         plgpu.Barrier()])


def test_commit_smem_of_another_thread_does_not_count():
  def k(o_ref, smem, bar):
    t = lax.axis_index("wg")

    @pl.when(t == 0)
    def _():
      smem[...] = jnp.ones(smem.shape, smem.dtype)   # <- written by thread 0
      plgpu.barrier_arrive(bar)

    @pl.when(t == 1)
    def _():
      plgpu.commit_smem()
      plgpu.barrier_wait(bar)
      plgpu.copy_smem_to_gmem(smem, o_ref)   # <- copied by thread 1
      plgpu.wait_smem_to_gmem(0)

  with pytest.raises(KernelCheckError, match=r"thread wg=1 .*" + at_line(k, "<- copied by thread 1")
                     + r".*written from registers by thread wg=0 at "
                     + at_line(k, "<- written by thread 0")):
    _run(k, num_threads=2, thread_name="wg",
         scratch_shapes=[plgpu.SMEM((16, 16), jnp.float32), plgpu.Barrier()])


def test_smem_overwritten_while_copy_smem_to_gmem_reads_it():
  def k(o_ref, smem):
    smem[...] = jnp.ones(smem.shape, smem.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref)              # <- store issued
    smem[...] = jnp.zeros(smem.shape, smem.dtype)     # <- overwrite
    plgpu.wait_smem_to_gmem(0)

  with pytest.raises(KernelCheckError, match=at_line(k, "<- overwrite") + r".*a store overwrites "
                     r"SMEM .* while a copy_smem_to_gmem issued by the kernel at "
                     + at_line(k, "<- store issued") + r" may still read it; call "
                     r"plgpu.wait_smem_to_gmem"):
    _run(k, scratch_shapes=[plgpu.SMEM((16, 16), jnp.float32)])


def test_smem_overwritten_by_a_copy_while_copy_smem_to_gmem_reads_it():
  x = rand(25, (16, 16))

  def k(x_ref, o_ref, smem, bar):
    smem[...] = jnp.ones(smem.shape, smem.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref)              # <- store issued
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)         # <- TMA overwrite
    plgpu.barrier_wait(bar)
    plgpu.wait_smem_to_gmem(0)

  with pytest.raises(KernelCheckError, match=at_line(k, "<- TMA overwrite") + r".*copy_gmem_to_smem "
                     r"overwrites SMEM .* while a copy_smem_to_gmem issued by the kernel at "
                     + at_line(k, "<- store issued")):
    _run(k, args=(x,), scratch_shapes=[plgpu.SMEM((16, 16), jnp.float32), plgpu.Barrier()])


def test_wait_smem_to_gmem_does_not_wait_for_an_uncommitted_group():
  def k(o_ref, smem):
    smem[...] = jnp.ones(smem.shape, smem.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref, commit_group=False)   # <- not in a group
    plgpu.wait_smem_to_gmem(0)
    smem[...] = jnp.zeros(smem.shape, smem.dtype)              # <- overwrite

  with pytest.raises(KernelCheckError, match=at_line(k, "<- overwrite") + r".*copy_smem_to_gmem "
                     r"issued by the kernel at " + at_line(k, "<- not in a group")):
    _run(k, scratch_shapes=[plgpu.SMEM((16, 16), jnp.float32)])


def test_wait_smem_to_gmem_1_keeps_the_newest_group_in_flight():
  def k(o_ref, s0, s1):
    s0[...] = jnp.ones(s0.shape, s0.dtype)
    s1[...] = jnp.ones(s1.shape, s1.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(s0, o_ref.at[0])
    plgpu.copy_smem_to_gmem(s1, o_ref.at[1])    # <- newest group
    plgpu.wait_smem_to_gmem(1)
    s1[...] = jnp.zeros(s1.shape, s1.dtype)     # <- overwrite

  with pytest.raises(KernelCheckError, match=at_line(k, "<- overwrite") + r".*issued by the kernel "
                     r"at " + at_line(k, "<- newest group")):
    _run(k, out_shape=S((2, 16, 16), jnp.float32),
         scratch_shapes=[plgpu.SMEM((16, 16), jnp.float32), plgpu.SMEM((16, 16), jnp.float32)])


def test_smem_overwritten_while_wgmma_reads_it():
  a, b, _ = _mm_inputs()

  def k(a_ref, b_ref, o_ref, a_smem, b_smem, bar):
    plgpu.copy_gmem_to_smem(a_ref, a_smem, bar)
    plgpu.copy_gmem_to_smem(b_ref, b_smem, bar)
    plgpu.barrier_wait(bar)

    def compute(acc_ref):
      plgpu.wgmma(acc_ref, a_smem, b_smem)              # <- wgmma issued
      b_smem[...] = jnp.zeros(b_smem.shape, b_smem.dtype)  # <- overwrite
      plgpu.wgmma_wait(0)
      return acc_ref[...]

    o_ref[...] = pl.run_scoped(compute, plgpu.ACC((M, N)))

  with pytest.raises(KernelCheckError, match=at_line(k, "<- overwrite") + r".*a store overwrites "
                     r"SMEM .* while a wgmma issued by the kernel at " + at_line(k, "<- wgmma issued")
                     + r" may still read it; call plgpu.wgmma_wait"):
    _run(k, out_shape=S((M, N), jnp.float32), args=(a, b),
         scratch_shapes=[plgpu.SMEM((M, K), jnp.bfloat16), plgpu.SMEM((K, N), jnp.bfloat16),
                         plgpu.Barrier(num_arrivals=2)])


def test_smem_overwritten_after_wgmma_wait_is_fine():
  a, b, want = _mm_inputs()

  def k(a_ref, b_ref, o_ref, a_smem, b_smem, bar):
    plgpu.copy_gmem_to_smem(a_ref, a_smem, bar)
    plgpu.copy_gmem_to_smem(b_ref, b_smem, bar)
    plgpu.barrier_wait(bar)

    def compute(acc_ref):
      plgpu.wgmma(acc_ref, a_smem, b_smem)
      plgpu.wgmma_wait(0)
      b_smem[...] = jnp.zeros(b_smem.shape, b_smem.dtype)
      return acc_ref[...]

    o_ref[...] = pl.run_scoped(compute, plgpu.ACC((M, N)))

  out = _run(k, out_shape=S((M, N), jnp.float32), args=(a, b),
             scratch_shapes=[plgpu.SMEM((M, K), jnp.bfloat16), plgpu.SMEM((K, N), jnp.bfloat16),
                             plgpu.Barrier(num_arrivals=2)])
  np.testing.assert_allclose(out, want, **F32_DOT)


def test_reading_smem_before_waiting_on_the_copy_barrier():
  x = rand(26, (16, 16))

  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)        # <- copy issued
    o_ref[...] = smem[...]                          # <- early read
    plgpu.barrier_wait(bar)

  with pytest.raises(KernelCheckError, match=at_line(k, "<- early read") + r".*a load reads SMEM .* "
                     r"before waiting on the barrier of the copy_gmem_to_smem into it \(issued at "
                     + at_line(k, "<- copy issued") + r"\); call plgpu.barrier_wait first"):
    _run(k, args=(x,), scratch_shapes=[plgpu.SMEM((16, 16), jnp.float32), plgpu.Barrier()])


def test_other_thread_reading_smem_before_waiting_on_the_copy_barrier():
  x = rand(27, (16, 16))

  def k(x_ref, o_ref, smem, bar):
    t = lax.axis_index("wg")

    @pl.when(t == 0)
    def _():
      plgpu.copy_gmem_to_smem(x_ref, smem, bar)
      plgpu.barrier_wait(bar)

    @pl.when(t == 1)
    def _():
      o_ref[...] = smem[...]      # <- thread 1 never waited

  with pytest.raises(KernelCheckError, match=r"thread wg=1 .*" + at_line(k, "<- thread 1 never waited")
                     + r".*before waiting on the barrier"):
    _run(k, args=(x,), num_threads=2, thread_name="wg",
         scratch_shapes=[plgpu.SMEM((16, 16), jnp.float32), plgpu.Barrier()])


def test_tma_box_over_256_elements():
  x = rand(28, (512, 16))

  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)     # <- 512 rows
    plgpu.barrier_wait(bar)
    o_ref[...] = smem[...]

  with pytest.raises(KernelCheckError, match=at_line(k, "<- 512 rows") + r".*copy_gmem_to_smem: TMA "
                     r"copies at most 256 elements along each dimension, but the box of SMEM .* is "
                     r"\(512, 16\)"):
    _run(k, out_shape=S(x.shape, x.dtype), args=(x,),
         scratch_shapes=[plgpu.SMEM((512, 16), jnp.float32), plgpu.Barrier()])


def test_tma_box_over_256_elements_is_fine_when_tiled():
  x = rand(29, (512, 16))

  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    o_ref[...] = smem[...]

  out = _run(k, out_shape=S(x.shape, x.dtype), args=(x,),
             scratch_shapes=[plgpu.SMEM((512, 16), jnp.float32,
                                        transforms=(plgpu.TilingTransform((8, 16)),)),
                             plgpu.Barrier()])
  np.testing.assert_allclose(out, x, **EXACT)


@pytest.mark.parametrize("rows", [512, 600])   # 600: the last boxes lie past the array's end
def test_tma_boxes_over_256_rows_load_and_store_in_parts(rows):
  x = rand(31, (rows, 64), jnp.float16)
  swizzled = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))

  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    smem[...] = smem[...] * 2
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref)
    plgpu.wait_smem_to_gmem(0)

  f = plgpu.kernel(k, out_shape=S(x.shape, x.dtype),
                   scratch_shapes=[plgpu.SMEM(x.shape, x.dtype, transforms=swizzled), plgpu.Barrier()])
  np.testing.assert_array_equal(f(x), np.asarray(x) * 2)
  (c,) = plgpu.lower(f, S(x.shape, x.dtype))
  copies = [e for e in c.generated.partitions[0].events if isinstance(e, ev.Copy)]
  # Boxes of 256 rows over the buffer padded to a power of two (the hardware drops rows past the
  # array's end), in and out.
  pieces = [("slice", 256 * k, 256, 0) for k in range((1 << (rows - 1).bit_length()) // 256)]
  for direction in ("in", "out"):
    assert [(e.box, e.smem.steps) for e in copies if e.direction == direction] == [
        ((256, 64), (p,)) for p in pieces]
  expects = [e for e in c.generated.partitions[0].events if isinstance(e, ev.BarrierOp) and e.kind == "expect"]
  assert [e.nbytes for e in expects] == [len(pieces) * 256 * 64 * 2]   # one arrival for all the boxes


@pytest.mark.parametrize("blk, cols, dtype", [(24, 64, jnp.float16), (24, 16, jnp.float32),
                                              (40, 32, jnp.bfloat16)])
def test_tma_boxes_of_blocks_that_are_not_powers_of_two(blk, cols, dtype):
  # Blocks of 24 (40) rows inside the array: on a GPU each copy is two boxes of powers of two,
  # 16 + 8 (32 + 8), since a box padded to 32 (64) rows would reach into the next block.
  nb = 4
  x = rand(32, (nb * blk, cols), dtype)

  def k(x_ref, o_ref, smem, bar):
    rows = pl.ds(lax.axis_index("b") * blk, blk)
    plgpu.copy_gmem_to_smem(x_ref.at[rows], smem, bar)
    plgpu.barrier_wait(bar)
    smem[...] = smem[...] * 2 + 1
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref.at[rows])
    plgpu.wait_smem_to_gmem(0)

  f = plgpu.kernel(k, out_shape=S(x.shape, x.dtype), grid=(nb,), grid_names=("b",),
                   scratch_shapes=[plgpu.SMEM((blk, cols), x.dtype), plgpu.Barrier()])
  np.testing.assert_array_equal(f(x), (np.asarray(x) * 2 + 1).astype(x.dtype))
  (c,) = plgpu.lower(f, S(x.shape, x.dtype))
  boxes = [e.box[0] for e in c.generated.partitions[0].events if isinstance(e, ev.Copy) and e.direction == "in"]
  assert boxes == [1 << k for k in reversed(range(blk.bit_length())) if blk >> k & 1]   # 16 + 8


def _scoped_in_a_loop(x, wait_each_copy=True):
  """A loop whose body allocates an SMEM buffer and a barrier (on a GPU: allocated once and
  reused by every iteration, as in Mosaic GPU)."""
  rows = 16

  def k(x_ref, o_ref):
    def step(i, _):
      def scope(smem, bar):
        plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(i * rows, rows)], smem, bar)   # <- the copy
        if wait_each_copy:
          plgpu.barrier_wait(bar)
          o_ref[pl.ds(i * rows, rows)] = smem[...] * 2
      pl.run_scoped(scope, plgpu.SMEM((rows, x.shape[1]), x.dtype), plgpu.Barrier())
    lax.fori_loop(0, x.shape[0] // rows, step, None)

  return plgpu.kernel(k, out_shape=S(x.shape, x.dtype))(x)


def test_scratch_allocated_inside_a_loop():
  x = rand(33, (48, 32))
  out = _scoped_in_a_loop(x)
  np.testing.assert_allclose(out, x * 2, **EXACT)


def test_a_scope_entered_again_while_its_copy_is_not_awaited():
  x = rand(34, (48, 32))
  with pytest.raises(KernelCheckError, match=r"entering its scope again \(which the GPU does with "
                     r"the same SMEM\) writes SMEM smem while the copy_gmem_to_smem into "
                     r"it \(issued at " + at_line(_scoped_in_a_loop, "<- the copy") + r"\) has not "
                     r"been awaited"):
    _scoped_in_a_loop(x, wait_each_copy=False)


def test_a_scope_entered_again_while_its_barrier_has_a_completion_nobody_awaited():
  def k(o_ref):
    def step(i, _):
      pl.run_scoped(plgpu.barrier_arrive, plgpu.Barrier())   # completes; nobody waits
    lax.fori_loop(0, 2, step, None)
    o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)

  with pytest.raises(KernelCheckError, match=r"the scope of barrier is entered again, and its "
                     r"last entry left 1 completion\(s\) nobody waited for: on the GPU the new "
                     r"entry gets the same barrier"):
    _run(k)


def test_register_tiles_updated_one_row_at_a_time():
  # x.at[i].add(row) and .set(row) with i from a loop; i = 9 is past the end: dropped
  # (FILL_OR_DROP), as lax does.
  x = rand(35, (8, 16))

  @plgpu.kernel(out_shape=S(x.shape, x.dtype),
                scratch_shapes=[plgpu.SMEM(x.shape, x.dtype), plgpu.Barrier()])
  def k(x_ref, o_ref, x_smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, x_smem, bar)
    plgpu.barrier_wait(bar)

    def step(j, acc):
      row = lax.broadcasted_iota(jnp.float32, (16,), 0) + j.astype(jnp.float32) * 100
      acc = acc.at[2 * j].add(row)
      return acc.at[(2 * j + 9) % 11].set(row * 10)   # rows 9 (dropped), 0, 2
    o_ref[...] = lax.fori_loop(0, 3, step, x_smem[...])

  want = np.array(x)
  for j in range(3):
    row = np.arange(16, dtype=np.float32) + j * 100
    want[2 * j] += row
    if (2 * j + 9) % 11 < 8:
      want[(2 * j + 9) % 11] = row * 10
  np.testing.assert_allclose(k(x), want, rtol=1e-6)


@pytest.mark.parametrize("rows", [3, 4])
def test_a_buffer_copied_whole_and_read_row_by_row(rows):
  # One TMA box fills the buffer (a view of rank 2); registers read rows (views of rank 1): on a
  # GPU the buffer's layout has rank 1, and the copy sees it through one of rank 2.
  x = rand(37, (rows, 64))

  @plgpu.kernel(out_shape=S((64,), x.dtype),
                scratch_shapes=[plgpu.SMEM(x.shape, x.dtype), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    o_ref[...] = lax.fori_loop(0, rows, lambda i, acc: acc + smem[i] * (i + 1.0),
                               jnp.zeros((64,), jnp.float32))

  want = sum(x[i] * (i + 1) for i in range(rows))
  np.testing.assert_allclose(k(x), want, rtol=1e-6)


@pytest.mark.parametrize("start, size", [(8, 16), (8, 32), (24, 32), (16, 16)])
def test_register_loads_of_smem_rows_at_any_multiple_of_8(start, size):
  # Gluon slices SMEM only at multiples of a slice's size: [8:40] is read as four 8-row pieces
  # joined in registers.
  x = rand(38, (64, 32))

  @plgpu.kernel(out_shape=S((size, 32), x.dtype),
                scratch_shapes=[plgpu.SMEM(x.shape, x.dtype), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    o_ref[...] = smem[pl.ds(start, size)] + 1

  np.testing.assert_allclose(k(x), x[start:start + size] + 1, **EXACT)


def test_gmem_stored_by_tma_is_read_back_after_a_full_wait():
  # wait_smem_to_gmem(0) (not read-only) waits for the store's writes: then GMEM may be read by
  # registers and by TMA.
  x = rand(39, (32, 16))

  @plgpu.kernel(out_shape=(S(x.shape, x.dtype), S(x.shape, x.dtype), S(x.shape, x.dtype)),
                scratch_shapes=[plgpu.SMEM(x.shape, x.dtype), plgpu.SMEM(x.shape, x.dtype),
                                plgpu.Barrier()])
  def k(x_ref, o_ref, p_ref, q_ref, smem, back, bar):
    smem[...] = x_ref[...] + 1
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref)
    plgpu.wait_smem_to_gmem(0)
    p_ref[...] = o_ref[...] * 2                      # registers read what TMA wrote
    plgpu.copy_gmem_to_smem(o_ref, back, bar)        # TMA reads it back too
    plgpu.barrier_wait(bar)
    q_ref[...] = back[...] * 3

  o, p, q = k(x)
  np.testing.assert_allclose(o, x + 1, **EXACT)
  np.testing.assert_allclose(p, (x + 1) * 2, **EXACT)
  np.testing.assert_allclose(q, (x + 1) * 3, **EXACT)


def test_tma_rows_not_a_multiple_of_16_bytes():
  x = rand(30, (16, 8))

  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref.at[:, pl.ds(0, 3)], smem, bar)   # <- 12-byte rows
    plgpu.barrier_wait(bar)
    o_ref[...] = smem[...]

  with pytest.raises(KernelCheckError, match=at_line(k, "<- 12-byte rows") + r".*a TMA box's rows "
                     r"must be multiples of 16 bytes, but SMEM .*'s are 3 x 4 bytes"):
    _run(k, out_shape=S((16, 3), jnp.float32), args=(x,),
         scratch_shapes=[plgpu.SMEM((16, 3), jnp.float32), plgpu.Barrier()])


def test_tma_store_rows_not_a_multiple_of_16_bytes():
  def k(o_ref, smem):
    smem[...] = jnp.ones(smem.shape, smem.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref)    # <- 10-byte rows
    plgpu.wait_smem_to_gmem(0)

  with pytest.raises(KernelCheckError, match=at_line(k, "<- 10-byte rows") + r".*copy_smem_to_gmem: "
                     r"a TMA box's rows must be multiples of 16 bytes, but .* 5 x 2 bytes"):
    _run(k, out_shape=S((8, 5), jnp.bfloat16), scratch_shapes=[plgpu.SMEM((8, 5), jnp.bfloat16)])


def test_copy_gmem_to_smem_without_a_barrier():
  x = rand(31, (16, 16))

  def k(x_ref, o_ref, smem):
    plgpu.copy_gmem_to_smem(x_ref, smem)     # <- no barrier
    o_ref[...] = smem[...]

  with pytest.raises(KernelCheckError, match=at_line(k, "<- no barrier") + r".*copy_gmem_to_smem "
                     r"needs a barrier on Hopper GPUs \(TMA\): pass plgpu.Barrier scratch"):
    _run(k, args=(x,), scratch_shapes=[plgpu.SMEM((16, 16), jnp.float32)])


def test_barrier_wait_on_a_buffer_that_is_not_a_barrier():
  def k(o_ref, smem):
    plgpu.barrier_wait(smem.at[0, 0])     # <- not a barrier

  with pytest.raises(KernelCheckError, match=at_line(k, "<- not a barrier") + r".*barrier_wait takes "
                     r"a barrier \(plgpu.Barrier\), but SMEM .* is a buffer"):
    _run(k, scratch_shapes=[plgpu.SMEM((16, 16), jnp.float32)])


def test_barrier_wait_on_a_barrier_array_without_an_index():
  def k(o_ref, bars):
    plgpu.barrier_wait(bars)     # <- whole array

  with pytest.raises(KernelCheckError, match=at_line(k, "<- whole array") + r".*barrier_wait takes "
                     r"one barrier; index the barrier array"):
    _run(k, scratch_shapes=[plgpu.Barrier(num_barriers=3)])


def test_out_of_bounds_register_load():
  x = rand(32, (100, 16))

  def k(x_ref, o_ref):
    b = lax.axis_index("b")
    o_ref[pl.ds(b * 64, 64)] = x_ref[pl.ds(b * 60, 64)]   # <- oob

  with pytest.raises(IndexError, match=r"block \(b=1\) at " + at_line(k, "<- oob")
                     + r".*out-of-bounds read from args\[0\] \(shape \(100, 16\)\)"):
    _run(k, out_shape=S((128, 16), jnp.float32), args=(x,), grid=(2,), grid_names=("b",))


def test_out_of_bounds_register_store():
  def k(o_ref):
    b = lax.axis_index("b")
    o_ref[pl.ds(b * 64, 64)] = jnp.ones((64, 16), jnp.float32)   # <- oob store

  with pytest.raises(IndexError, match=r"block \(b=1\) at " + at_line(k, "<- oob store")
                     + r".*out-of-bounds write to out\[0\] \(shape \(100, 16\)\)"):
    _run(k, out_shape=S((100, 16), jnp.float32), grid=(2,), grid_names=("b",))


def test_mosaic_gpu_check_errors_are_the_public_kernel_check_error():
  def k(o_ref, bar):
    plgpu.barrier_wait(bar)

  with pytest.raises(pl.KernelCheckError):
    _run(k, scratch_shapes=[plgpu.Barrier()])


# --- more of the model's rules -----------------------------------------------------------------

def test_box_entirely_past_the_array_end_reads_zeros_and_stores_nothing():
  x = rand(33, (40, 16))   # 3 boxes of 16 rows; the 4th box (rows 48..63) is wholly outside

  @plgpu.kernel(out_shape=(S(x.shape, x.dtype), S((64, 16), x.dtype)), grid=(4,),
                grid_names=("b",),
                scratch_shapes=[plgpu.SMEM((16, 16), jnp.float32), plgpu.Barrier()])
  def k(x_ref, o_ref, seen_ref, smem, bar):
    b = lax.axis_index("b")
    plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(b * 16, 16)], smem, bar)
    plgpu.barrier_wait(bar)
    seen_ref[pl.ds(b * 16, 16)] = smem[...]
    plgpu.copy_smem_to_gmem(smem, o_ref.at[pl.ds(b * 16, 16)])
    plgpu.wait_smem_to_gmem(0)

  out, seen = k(x)
  np.testing.assert_allclose(out, x, **EXACT)
  np.testing.assert_allclose(seen[:40], x, **EXACT)
  np.testing.assert_allclose(seen[40:], np.zeros((24, 16), np.float32), **EXACT)


def test_smem_starts_as_nan():
  @plgpu.kernel(out_shape=S((8, 16), jnp.float32),
                scratch_shapes=[plgpu.SMEM((8, 16), jnp.float32)])
  def k(o_ref, smem):
    o_ref[...] = smem[...]

  assert np.isnan(np.asarray(k())).all()


def test_copy_smem_to_gmem_with_reduction_add():
  x = rand(34, (24, 16))

  @plgpu.kernel(out_shape=S(x.shape, x.dtype),
                scratch_shapes=[plgpu.SMEM(x.shape, jnp.float32), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    plgpu.copy_smem_to_gmem(smem, o_ref)
    plgpu.wait_smem_to_gmem(0)
    plgpu.copy_smem_to_gmem(smem, o_ref, reduction_op="add")
    plgpu.wait_smem_to_gmem(0)

  np.testing.assert_allclose(k(x), x + x, **EXACT)


def test_barrier_shared_by_a_copy_and_an_arrive():
  x = rand(35, (16, 16))

  @plgpu.kernel(out_shape=S(x.shape, x.dtype), num_threads=2, thread_name="wg",
                scratch_shapes=[plgpu.SMEM(x.shape, jnp.float32), plgpu.Barrier(num_arrivals=2)])
  def k(x_ref, o_ref, smem, bar):
    t = lax.axis_index("wg")

    @pl.when(t == 0)
    def _():
      plgpu.copy_gmem_to_smem(x_ref, smem, bar)     # one arrival

    @pl.when(t == 1)
    def _():
      plgpu.barrier_arrive(bar)                     # the other
      plgpu.barrier_wait(bar)
      o_ref[...] = smem[...] * 0.5

  np.testing.assert_allclose(k(x), x * 0.5, **EXACT)


def test_predicated_off_copy_arrives_without_data():
  """Mosaic GPU arrives on the barrier with no bytes when the predicate is off (JAX's
  test_copy_gmem_to_smem_predicate waits on it): the wait returns, SMEM keeps what it held."""
  x = rand(36, (16, 16))

  def k(x_ref, o_ref, smem, bar):
    smem[...] = jnp.full(smem.shape, 3.0, smem.dtype)
    plgpu.commit_smem()
    plgpu.copy_gmem_to_smem(x_ref, smem, bar, predicate=False)
    plgpu.barrier_wait(bar)
    o_ref[...] = smem[...]

  out = _run(k, args=(x,), scratch_shapes=[plgpu.SMEM((16, 16), jnp.float32), plgpu.Barrier()])
  np.testing.assert_array_equal(out, np.full((16, 16), 3.0, np.float32))


def test_copy_smem_to_gmem_before_waiting_on_the_load():
  x = rand(37, (16, 16))

  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)    # <- load
    plgpu.copy_smem_to_gmem(smem, o_ref)         # <- store too early
    plgpu.barrier_wait(bar)
    plgpu.wait_smem_to_gmem(0)

  with pytest.raises(KernelCheckError, match=at_line(k, "<- store too early") + r".*copy_smem_to_gmem "
                     r"reads SMEM .* before waiting on the barrier of the copy_gmem_to_smem into it "
                     r"\(issued at " + at_line(k, "<- load")):
    _run(k, args=(x,), scratch_shapes=[plgpu.SMEM((16, 16), jnp.float32), plgpu.Barrier()])


def test_wgmma_before_waiting_on_the_load():
  a, b, _ = _mm_inputs()

  def k(a_ref, b_ref, o_ref, a_smem, b_smem, bar):
    plgpu.copy_gmem_to_smem(a_ref, a_smem, bar)
    plgpu.copy_gmem_to_smem(b_ref, b_smem, bar)   # <- b load

    def compute(acc_ref):
      plgpu.wgmma(acc_ref, a_smem, b_smem)        # <- too early
      plgpu.wgmma_wait(0)
      return acc_ref[...]

    o_ref[...] = pl.run_scoped(compute, plgpu.ACC((M, N)))
    plgpu.barrier_wait(bar)

  with pytest.raises(KernelCheckError, match=at_line(k, "<- too early") + r".*wgmma reads SMEM .* "
                     r"before waiting on the barrier of the copy_gmem_to_smem into it"):
    _run(k, out_shape=S((M, N), jnp.float32), args=(a, b),
         scratch_shapes=[plgpu.SMEM((M, K), jnp.bfloat16), plgpu.SMEM((K, N), jnp.bfloat16),
                         plgpu.Barrier(num_arrivals=2)])


def test_register_store_into_smem_while_a_load_into_it_is_in_flight():
  x = rand(38, (16, 16))

  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)               # <- load
    smem[...] = jnp.ones(smem.shape, smem.dtype)           # <- store
    plgpu.barrier_wait(bar)

  with pytest.raises(KernelCheckError, match=at_line(k, "<- store") + r".*a store writes SMEM .* "
                     r"while the copy_gmem_to_smem into it \(issued at " + at_line(k, "<- load")
                     + r"\) has not been awaited"):
    _run(k, args=(x,), scratch_shapes=[plgpu.SMEM((16, 16), jnp.float32), plgpu.Barrier()])


def test_gmem_strides_not_a_multiple_of_16_bytes():
  x = rand(39, (16, 6))   # 24-byte GMEM rows; the box's rows (4 floats) are 16 bytes

  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref.at[:, pl.ds(0, 4)], smem, bar)   # <- strided
    plgpu.barrier_wait(bar)
    o_ref[...] = smem[...]

  with pytest.raises(KernelCheckError, match=at_line(k, "<- strided") + r".*TMA needs GMEM strides "
                     r"that are multiples of 16 bytes, but args\[0\] of shape \(16, 6\) has a stride "
                     r"of 24 bytes"):
    _run(k, out_shape=S((16, 4), jnp.float32), args=(x,),
         scratch_shapes=[plgpu.SMEM((16, 4), jnp.float32), plgpu.Barrier()])


def test_copy_between_the_wrong_memory_spaces():
  def k(o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(smem, smem, bar)   # <- SMEM source

  with pytest.raises(KernelCheckError, match=at_line(k, "<- SMEM source") + r".*copy_gmem_to_smem: "
                     r"the source must be in GMEM, but SMEM .* is in SMEM"):
    _run(k, scratch_shapes=[plgpu.SMEM((16, 16), jnp.float32), plgpu.Barrier()])


def test_copy_with_mismatched_dtype_or_shape_is_a_trace_time_error():
  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)

  with pytest.raises(ValueError, match=r"copy_gmem_to_smem: Expected dtypes to match .* the source "
                     r"is float32\[16, 16\] but the destination is int32\[16, 16\]"):
    _run(k, args=(rand(40, (16, 16)),),
         scratch_shapes=[plgpu.SMEM((16, 16), jnp.int32), plgpu.Barrier()])
  with pytest.raises(ValueError, match=r"Expected source shape to be \(8, 16\), but got \(16, 16\)"
                     r".* the source is float32\[16, 16\] but the destination is float32\[8, 16\]"):
    _run(k, args=(rand(40, (16, 16)),),
         scratch_shapes=[plgpu.SMEM((8, 16), jnp.float32), plgpu.Barrier()])


def test_wgmma_shape_mismatch_is_a_trace_time_error():
  def k(o_ref, a_smem, b_smem):
    def compute(acc_ref):
      plgpu.wgmma(acc_ref, a_smem, b_smem)
      return acc_ref[...]
    o_ref[...] = pl.run_scoped(compute, plgpu.ACC((M, N)))

  with pytest.raises(ValueError, match=r"wgmma: acc\[64, 72\] \+= a\[64, 48\] @ b\[32, 72\] does not "
                     r"match"):
    _run(k, out_shape=S((M, N), jnp.float32),
         scratch_shapes=[plgpu.SMEM((M, K), jnp.bfloat16), plgpu.SMEM((32, N), jnp.bfloat16)])


def test_loads_and_stores_of_barriers():
  def store(o_ref, bar):
    bar[...] = jnp.int32(1)     # <- store

  def load(o_ref, bar):
    o_ref[...] = jnp.full(o_ref.shape, bar[...].astype(jnp.float32))   # <- load

  with pytest.raises(KernelCheckError, match=at_line(store, "<- store") + r".*is a barrier: use "
                     r"barrier_arrive, not a store"):
    _run(store, scratch_shapes=[plgpu.Barrier()])
  with pytest.raises(KernelCheckError, match=at_line(load, "<- load") + r".*is a barrier: use "
                     r"barrier_wait/barrier_arrive, not a load"):
    _run(load, scratch_shapes=[plgpu.Barrier()])


def test_set_max_registers_checks_its_count():
  @plgpu.kernel(out_shape=S((8,), jnp.float32), num_threads=2, thread_name="wg")
  def k(o_ref):
    plgpu.set_max_registers(232, action="increase")
    o_ref[...] = jnp.full((8,), 5.0, jnp.float32)

  np.testing.assert_allclose(k(), np.full(8, 5.0, np.float32), **EXACT)
  with pytest.raises(ValueError, match="multiple of 8 in \\[24, 256\\]"):
    plgpu.set_max_registers(100 + 1, action="increase")
  with pytest.raises(ValueError, match="'increase' or 'decrease'"):
    plgpu.set_max_registers(64, action="grow")


# --- missing checks and messages (bugs) ----------------------------------------------------------

def test_two_loads_in_flight_into_the_same_smem():
  x = rand(41, (2, 16, 16))

  def k(x_ref, o_ref, smem, b0, b1):
    plgpu.copy_gmem_to_smem(x_ref.at[0], smem, b0)
    plgpu.copy_gmem_to_smem(x_ref.at[1], smem, b1)   # <- second load, first not awaited
    plgpu.barrier_wait(b0)
    plgpu.barrier_wait(b1)
    o_ref[...] = smem[...]

  with pytest.raises(KernelCheckError, match=at_line(k, "<- second load") + ".*copy_gmem_to_smem"):
    _run(k, args=(x,), scratch_shapes=[plgpu.SMEM((16, 16), jnp.float32), plgpu.Barrier(),
                                       plgpu.Barrier()])


def test_reading_gmem_that_an_unawaited_tma_store_writes():
  def k(o_ref, smem):
    smem[...] = jnp.ones(smem.shape, smem.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref)
    y = o_ref[...]                          # <- read of an in-flight store's destination
    plgpu.wait_smem_to_gmem(0)
    o_ref[...] = y + 1.0

  with pytest.raises(KernelCheckError, match=at_line(k, "<- read of an in-flight")):
    _run(k, scratch_shapes=[plgpu.SMEM((16, 16), jnp.float32)])


def test_barrier_index_out_of_bounds():
  def k(o_ref, bars):
    bar = bars.at[lax.axis_index("b") + 2]   # block 1 uses bars[3]
    plgpu.barrier_arrive(bar)
    plgpu.barrier_wait(bar)

  with pytest.raises((IndexError, KernelCheckError)) as info:
    _run(k, grid=(2,), grid_names=("b",), scratch_shapes=[plgpu.Barrier(num_barriers=3)])
  assert re.search(r"block \(b=1\).*out-of-bounds", str(info.value)), str(info.value)

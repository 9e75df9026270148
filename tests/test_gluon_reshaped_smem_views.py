"""Register loads and stores through ``ref.reshape(...)`` on the Gluon backend: the view before
the reshape is read into registers and the value reshaped row-major (a store: the value reshaped
to the view before the reshape, then written). Each kernel runs in the interpreter on random
values and is compared exactly with NumPy (only moves, or doubling, which is exact); on a CPU its
Gluon lowering must compile, and on a GPU it also runs as Gluon against the interpreter
(conftest.py, gluon_check.py). What the Gluon backend does not take through a reshaped view is
refused by name: a TMA copy into one, an index after the reshape, a reshape of shapes that are
not powers of two.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax.mosaic_gpu as plgpu
from pallax._src.gluon import compile as gluon_compile

pytestmark = pytest.mark.interpreter

S = jax.ShapeDtypeStruct


def _random(shape, dtype, seed):
  return jnp.asarray(np.random.default_rng(seed).uniform(-8, 8, shape), dtype)


def _source(kernel, *args) -> str:
  (compiled,) = gluon_compile.lower(kernel, *args)
  return compiled.source


def _flat_read_as_three_dims(memory: str):
  """A vector of 128 floats read as (2, 16, 4): from SMEM filled by TMA, or from GMEM."""
  if memory == "gmem":
    @plgpu.kernel(out_shape=S((2, 16, 4), jnp.float32))
    def kernel(x_ref, o_ref):
      o_ref[...] = x_ref.reshape((2, 16, 4))[...]
    return kernel

  @plgpu.kernel(out_shape=S((2, 16, 4), jnp.float32),
                scratch_shapes=[plgpu.SMEM((128,), jnp.float32), plgpu.Barrier()])
  def kernel(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    o_ref[...] = smem.reshape((2, 16, 4))[...]
  return kernel


@pytest.mark.parametrize("memory", ["smem", "gmem"])
def test_a_vector_read_through_a_three_dimensional_view(memory):
  kernel = _flat_read_as_three_dims(memory)
  x = _random((128,), jnp.float32, seed=11)
  np.testing.assert_array_equal(kernel(x), np.asarray(x).reshape(2, 16, 4))
  source = _source(kernel, x)
  assert ".reshape([2, 16, 4])" in source   # the vector loaded, then reshaped in registers


def _slot_of_tiled_buffer_as_matrix():
  """Slot 1 of a (2, 64, 2, 64) float16 buffer (leading dimension stored flattened) tiled and
  swizzled as JAX's Mosaic GPU kernels give them, read as a (64, 128) matrix."""
  shape = (2, 64, 2, 64)

  @plgpu.kernel(out_shape=S((64, 128), jnp.float16),
                scratch_shapes=[plgpu.SMEM(shape, jnp.float16,
                                           transforms=(plgpu.TilingTransform((8, 1, 64)),
                                                       plgpu.SwizzleTransform(128))),
                                plgpu.Barrier()])
  def kernel(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    o_ref[...] = smem.at[1].reshape((64, 128))[...]
  return kernel, shape


def test_one_slot_of_a_rank_four_buffer_read_as_a_matrix():
  kernel, shape = _slot_of_tiled_buffer_as_matrix()
  x = _random(shape, jnp.float16, seed=12)
  np.testing.assert_array_equal(np.asarray(kernel(x), np.float32),
                                np.asarray(x, np.float32)[1].reshape(64, 128))
  source = _source(kernel, x)
  assert ".index(1).load(" in source and ".reshape([64, 128])" in source


def test_a_rank_four_buffer_read_whole_and_written_by_slot_through_reshapes():
  """The whole (2, 64, 2, 64) buffer read as (128, 128), then slot 0 written through
  ``smem.at[0].reshape((64, 128))`` and the buffer copied out by TMA."""
  shape = (2, 64, 2, 64)

  @plgpu.kernel(out_shape=(S((128, 128), jnp.float16), S(shape, jnp.float16)),
                scratch_shapes=[plgpu.SMEM(shape, jnp.float16), plgpu.Barrier()])
  def kernel(x_ref, y_ref, whole_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    whole_ref[...] = smem.reshape((128, 128))[...]
    smem.at[0].reshape((64, 128))[...] = y_ref[...]
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref)
    plgpu.wait_smem_to_gmem(0)

  x = _random(shape, jnp.float16, seed=19)
  y = _random((64, 128), jnp.float16, seed=20)
  whole, out = kernel(x, y)
  want = np.asarray(x, np.float32).copy()
  want[0] = np.asarray(y, np.float32).reshape(64, 2, 64)
  np.testing.assert_array_equal(np.asarray(whole, np.float32),
                                np.asarray(x, np.float32).reshape(128, 128))
  np.testing.assert_array_equal(np.asarray(out, np.float32), want)
  source = _source(kernel, x, y)
  assert ".reshape([128, 128])" in source and ".reshape([64, 2, 64])" in source


def test_stores_through_a_reshaped_view_land_row_major():
  """A (64, 128) value stored into a (64, 2, 64) buffer through ``reshape((64, 128))``, copied out
  by TMA as the buffer is, and read back through another reshape, (128, 64)."""
  @plgpu.kernel(out_shape=(S((64, 2, 64), jnp.float32), S((128, 64), jnp.float32)),
                scratch_shapes=[plgpu.SMEM((64, 2, 64), jnp.float32)])
  def kernel(x_ref, o_ref, back_ref, smem):
    smem.reshape((64, 128))[...] = x_ref[...] * 2
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref)
    back_ref[...] = smem.reshape((128, 64))[...]
    plgpu.wait_smem_to_gmem(0)

  x = _random((64, 128), jnp.float32, seed=13)
  out, back = kernel(x)
  doubled = np.asarray(x) * 2
  np.testing.assert_array_equal(out, doubled.reshape(64, 2, 64))
  np.testing.assert_array_equal(back, doubled.reshape(128, 64))
  source = _source(kernel, x)
  assert ".reshape([64, 2, 64])" in source and ".reshape([128, 64])" in source


def test_a_gmem_store_through_a_reshaped_view():
  @plgpu.kernel(out_shape=S((32, 4), jnp.float32))
  def kernel(x_ref, o_ref):
    o_ref.reshape((8, 16))[...] = x_ref[...] + 1

  x = _random((8, 16), jnp.float32, seed=14)
  np.testing.assert_array_equal(kernel(x), (np.asarray(x) + 1).reshape(32, 4))
  assert ".reshape([32, 4])" in _source(kernel, x)


def test_unit_dimensions_of_a_padded_buffer_dropped_and_added():
  """Three rows (padded to four in SMEM) of a (3, 1, 16) buffer seen as (3, 16): only a unit
  dimension moves, which padding does not disturb."""
  @plgpu.kernel(out_shape=S((3, 16), jnp.float32),
                scratch_shapes=[plgpu.SMEM((3, 1, 16), jnp.float32)])
  def kernel(x_ref, o_ref, smem):
    smem.reshape((3, 16))[...] = x_ref[...]
    o_ref[...] = smem.reshape((3, 16))[...] * 2

  x = _random((3, 16), jnp.float32, seed=15)
  np.testing.assert_array_equal(kernel(x), np.asarray(x) * 2)
  _source(kernel, x)   # lowers


@pytest.mark.gluon_refuses("as the operand of a TMA copy")
def test_a_tma_copy_into_a_reshaped_view_is_refused():
  @plgpu.kernel(out_shape=S((64, 2, 64), jnp.float32),
                scratch_shapes=[plgpu.SMEM((64, 2, 64), jnp.float32), plgpu.Barrier()])
  def kernel(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem.reshape((64, 128)), bar)
    plgpu.barrier_wait(bar)
    o_ref[...] = smem[...]

  x = _random((64, 128), jnp.float32, seed=16)
  np.testing.assert_array_equal(kernel(x), np.asarray(x).reshape(64, 2, 64))
  with pytest.raises(NotImplementedError,
                     match=r"ReshapeTransform\(shape=\(64, 128\)\) as the operand of a TMA copy"):
    _source(kernel, x)


@pytest.mark.gluon_refuses("indexing, transposing or reshaping again a Ref view made by")
def test_an_index_after_the_reshape_is_refused():
  @plgpu.kernel(out_shape=S((16, 4), jnp.float32),
                scratch_shapes=[plgpu.SMEM((128,), jnp.float32), plgpu.Barrier()])
  def kernel(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    o_ref[...] = smem.reshape((2, 16, 4))[1]

  x = _random((128,), jnp.float32, seed=17)
  np.testing.assert_array_equal(kernel(x), np.asarray(x).reshape(2, 16, 4)[1])
  with pytest.raises(NotImplementedError, match="index the Ref before reshaping it"):
    _source(kernel, x)


def test_a_reshape_between_shapes_not_powers_of_two_is_gathered():
  """(48,) is stored padded as (64,), (3, 16) as (4, 16): the rows are gathered
  (tests/test_gluon_padded_reshapes.py)."""
  @plgpu.kernel(out_shape=S((3, 16), jnp.float32),
                scratch_shapes=[plgpu.SMEM((48,), jnp.float32)])
  def kernel(x_ref, o_ref, smem):
    smem[...] = x_ref[...]
    o_ref[...] = smem.reshape((3, 16))[...]

  x = _random((48,), jnp.float32, seed=18)
  np.testing.assert_array_equal(kernel(x), np.asarray(x).reshape(3, 16))
  _source(kernel, x)   # it lowers (and on a GPU, conftest.py compares it with the interpreter)

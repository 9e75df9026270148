"""Register loads and stores through a transposed view (``ref.T``) of a swizzled SMEM buffer,
read in ``Layout.WGMMA_TRANSPOSED`` and written back doubled, then copied out by TMA after
``plgpu.commit_smem``: every element lands where it came from, for 16- and 32-bit elements and
the swizzles a row of the buffer allows. Checked exactly against numpy (doubling is exact), and
on a GPU the Gluon kernel against the interpreter (conftest.py, gluon_check.py).

(JAX's ``test_get_swap_with_swizzle_transform`` writes the same kernel without the
``commit_smem`` between the register store and the TMA copy; pallax's interpreter reports that
race, and on an H200 pallax's Gluon kernel then copied out stale rows.)
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax.mosaic_gpu as plgpu

pytestmark = pytest.mark.interpreter


def doubled_through(view: str, dtype, swizzle):
  rows = swizzle // jnp.dtype(dtype).itemsize
  shape = (rows, rows)
  layout = plgpu.Layout.WGMMA_TRANSPOSED if view == "T" else plgpu.Layout.WGMMA

  def body(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    target = smem.T if view == "T" else smem
    target[...] = plgpu.load(target, layout=layout) * 2
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref)
    plgpu.wait_smem_to_gmem(0)

  kernel = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(shape, dtype), interpret=True,
                        scratch_types=[plgpu.SMEM(shape, dtype,
                                                  transforms=(plgpu.SwizzleTransform(swizzle),)),
                                       plgpu.Barrier()])
  return kernel, shape


@pytest.mark.parametrize("view", ["T", "plain"])
@pytest.mark.parametrize("dtype,swizzle", [(jnp.bfloat16, 128), (jnp.float16, 64),
                                           (jnp.float32, 128)],
                         ids=["bfloat16-128", "float16-64", "float32-128"])
def test_stores_through_a_view_land_where_they_were_read(view, dtype, swizzle):
  kernel, shape = doubled_through(view, dtype, swizzle)
  x = jnp.asarray(np.random.default_rng(swizzle).uniform(-4, 4, shape), dtype)
  np.testing.assert_array_equal(np.asarray(kernel(x), np.float32), np.asarray(x, np.float32) * 2)


def copied_into_transposed_view(perm, shape):
  """A TMA copy of ``x`` into ``transpose_ref(smem, perm)``, the buffer then copied out in its own
  order: the result is ``x`` transposed by the inverse of ``perm``."""
  buf = tuple(shape[p] for p in np.argsort(perm))

  @plgpu.kernel(out_shape=jax.ShapeDtypeStruct(buf, jnp.float32),
                scratch_shapes=[plgpu.SMEM(buf, jnp.float32), plgpu.Barrier()])
  def kernel(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, plgpu.transpose_ref(smem, perm), bar)
    plgpu.barrier_wait(bar)
    plgpu.copy_smem_to_gmem(smem, o_ref)
    plgpu.wait_smem_to_gmem(0)

  return kernel


def _transposed_copy(perm, shape):
  x = jnp.asarray(np.random.default_rng(7).uniform(-1, 1, shape), jnp.float32)
  got = copied_into_transposed_view(perm, shape)(x)
  np.testing.assert_array_equal(got, np.transpose(np.asarray(x), np.argsort(perm)))


@pytest.mark.parametrize("perm,shape", [((1, 0, 2), (2, 32, 128)), ((2, 0, 1, 3), (4, 2, 8, 64))],
                         ids=str)
def test_tma_into_a_view_with_leading_dimensions_reordered(perm, shape):
  """Each element lands where the transposed view has it: on the GPU the copy is issued in the
  buffer's order over the GMEM operand seen with its dimensions reordered (copies.py)."""
  _transposed_copy(perm, shape)


@pytest.mark.gluon_refuses("TMA keeps the innermost dimension innermost")
def test_tma_into_a_transposed_2d_view_runs_in_the_interpreter_only():
  """A transpose that moves the innermost dimension: TMA reads rows of consecutive elements, so
  the Gluon backend refuses the copy by name."""
  _transposed_copy((1, 0), (64, 32))


def test_tma_into_transposed_slots_of_a_buffer_with_two_leading_dimensions():
  """``smem.at[s].at[i]`` of a (2, 2, 32, 2, 128) buffer: the two integer indices of its leading
  dimensions are taken together (one slot of the flattened dimension), and each copy from
  ``x.at[s]`` into the slot's transposed view lands transposed."""
  @plgpu.kernel(out_shape=jax.ShapeDtypeStruct((2, 2, 32, 2, 128), jnp.float32),
                scratch_shapes=[plgpu.SMEM((2, 2, 32, 2, 128), jnp.float32), plgpu.Barrier()])
  def kernel(x_ref, o_ref, smem, bar):
    for s in range(2):
      for i in range(2):
        plgpu.copy_gmem_to_smem(x_ref.at[s], plgpu.transpose_ref(smem.at[s].at[i], (1, 0, 2)), bar)
        plgpu.barrier_wait(bar)
    plgpu.copy_smem_to_gmem(smem, o_ref)
    plgpu.wait_smem_to_gmem(0)

  x = jnp.asarray(np.random.default_rng(8).uniform(-1, 1, (2, 2, 32, 128)), jnp.float32)
  want = np.stack([np.stack([np.asarray(x[s]).transpose(1, 0, 2)] * 2) for s in range(2)])
  np.testing.assert_array_equal(kernel(x), want)

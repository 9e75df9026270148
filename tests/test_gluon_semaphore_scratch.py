"""Semaphore scratch in ``plgpu`` kernels (``scratch_types=[plgpu.SemaphoreType.REGULAR]``,
``pl.run_scoped(..., plgpu.SemaphoreType.REGULAR((n,)))``): each block has its own semaphores,
starting at zero; ``pl.get_global`` ones are shared by every block. In Gluon, a buffer of every
block's slots that the launch zeroes (gluon/allocation.py). Checked exactly in the interpreter,
lowered on the CPU, and on a GPU the Gluon kernel against the interpreter (conftest.py)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu

pytestmark = pytest.mark.interpreter


@pytest.mark.parametrize("blocks", [1, 3, 10])
def test_each_block_counts_on_its_own_semaphores(blocks):
  """Block b signals its semaphore k (of 4) b + k times and reads them all back: no block sees
  another's signals, and each starts from zero."""
  def body(x_ref, o_ref, sems):
    b = lax.axis_index("x")
    for k in range(4):
      pl.semaphore_signal(sems.at[k], b + k + 1)
    for k in range(4):
      o_ref[b, k] = pl.semaphore_read(sems.at[k]) + x_ref[b, k]
    pl.semaphore_wait(sems.at[0], b + 1)   # (back to zero where it was signalled)

  kernel = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((blocks, 4), jnp.int32),
                        scratch_types=[plgpu.SemaphoreType.REGULAR((4,))], grid=(blocks,),
                        grid_names=("x",))
  x = jnp.asarray(np.random.default_rng(blocks).integers(-50, 50, (blocks, 4)), jnp.int32)
  want = np.arange(blocks)[:, None] + np.arange(4)[None, :] + 1 + np.asarray(x)
  np.testing.assert_array_equal(kernel(x), want)


def test_a_scoped_semaphore_beside_a_global_one():
  """Block 0 releases block 1 through a global semaphore; each block also signals and waits on a
  semaphore of its own scope (which would deadlock if the blocks shared it unzeroed)."""
  def body(x_ref, o_ref):
    shared = pl.get_global(plgpu.SemaphoreType.REGULAR)

    @functools.partial(pl.run_scoped, own=plgpu.SemaphoreType.REGULAR)
    def _(own):
      b = lax.axis_index("x")
      pl.semaphore_signal(own)

      @pl.when(b == 0)
      def _():
        pl.semaphore_signal(shared)

      @pl.when(b == 1)
      def _():
        pl.semaphore_wait(shared)
        o_ref[...] = x_ref[...] * 2

      pl.semaphore_wait(own)

  kernel = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((200,), jnp.float32), grid=(6,),
                        grid_names=("x",))
  x = jax.random.normal(jax.random.key(7), (200,), jnp.float32)
  np.testing.assert_array_equal(kernel(x), x * 2)


def test_the_gluon_kernel_takes_one_zeroed_slot_per_block():
  def body(o_ref, sem):
    pl.semaphore_signal(sem)
    o_ref[...] = jnp.full(o_ref.shape, pl.semaphore_read(sem), jnp.int32)
    pl.semaphore_wait(sem)

  kernel = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128,), jnp.int32),
                        scratch_types=[plgpu.SemaphoreType.REGULAR], grid=(5,), grid_names=("x",))
  [compiled] = plgpu.lower(kernel)
  assert compiled.hidden == (((5,), np.dtype(np.int32), True),)
  np.testing.assert_array_equal(kernel(), np.ones(128, np.int32))

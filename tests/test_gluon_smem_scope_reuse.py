"""SMEM of scopes inside loops and branches shares memory with the scopes it is never live with,
as Mosaic GPU's stack of scopes gives it: a loop body of two scopes one after the other needs
the larger of the two, not their sum. (The Gluon backend allocates such a buffer where its scope
begins, and Triton's allocator, which sees the liveness, overlaps them; barriers are still
allocated once at the kernel's top.) Checked in the interpreter against NumPy, the SMEM each
kernel needs read from its sm_90a compile on the CPU, and on a GPU the Gluon kernel against the
interpreter (conftest.py)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu
from helpers import rand_seeded as rand

pytestmark = pytest.mark.interpreter

SM90_SMEM = 232448   # bytes a block of sm_90 may have


def two_scopes_per_step(tiles: int, rows: int):
  """Each step of a loop over ``tiles`` tiles of (rows, 128) float32 copies its tile into one
  scope's buffer by TMA, then, in a second scope, doubles it plus the step through registers
  into another buffer and copies that out. Each buffer is ``rows * 512`` bytes."""
  def body(x_gmem, o_gmem):
    @pl.loop(0, tiles)
    def _(t):
      def load_scope(buf, bar):
        plgpu.copy_gmem_to_smem(x_gmem.at[t], buf, bar)
        plgpu.barrier_wait(bar)
        return buf[...]

      tile = pl.run_scoped(load_scope, plgpu.SMEM((rows, 128), jnp.float32),
                           plgpu.Barrier(num_arrivals=1))

      @functools.partial(pl.run_scoped, out=plgpu.SMEM((rows, 128), jnp.float32))
      def _(out):
        out[...] = tile * 2 + t.astype(jnp.float32)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(out, o_gmem.at[t])
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

  shape = jax.ShapeDtypeStruct((tiles, rows, 128), jnp.float32)
  return plgpu.kernel(body, out_type=shape)


@pytest.mark.parametrize("tiles", [1, 3])
def test_two_scopes_of_a_loop_body_fit_where_their_sum_would_not(tiles):
  # Two buffers of 128 KiB each: 256 KiB together, more than a block of sm_90 has.
  rows = 256
  kernel = two_scopes_per_step(tiles, rows)
  x = rand(1, (tiles, rows, 128))
  want = x * 2 + np.arange(tiles, dtype=np.float32)[:, None, None]
  np.testing.assert_array_equal(kernel(x), want)
  (compiled,) = plgpu.lower(kernel, jax.ShapeDtypeStruct(x.shape, x.dtype))
  assert 2 * rows * 512 > SM90_SMEM   # (the two buffers' sum would not fit)
  assert rows * 512 <= compiled.shared_mem_bytes <= SM90_SMEM


def test_a_scope_in_a_branch_shares_memory_with_the_loop_bodys_other_scope():
  """A step either adds its tile to a running total kept in one scope's buffer (even steps) or
  subtracts it (odd steps), each branch with a buffer of its own; only one is live at a time."""
  rows, tiles = 128, 4

  def body(x_gmem, o_gmem):
    def step(t, total):
      def branch(sign):
        @functools.partial(pl.run_scoped, buf=plgpu.SMEM((rows, 128), jnp.float32),
                           bar=plgpu.Barrier(num_arrivals=1))
        def tile(buf, bar):
          plgpu.copy_gmem_to_smem(x_gmem.at[t], buf, bar)
          plgpu.barrier_wait(bar)
          return buf[...] * sign
        return total + tile
      return lax.cond(t % 2 == 0, lambda: branch(1.0), lambda: branch(-1.0))

    total = lax.fori_loop(0, tiles, step, jnp.zeros((rows, 128), jnp.float32))

    @functools.partial(pl.run_scoped, out=plgpu.SMEM((rows, 128), jnp.float32))
    def _(out):
      out[...] = total
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(out, o_gmem)
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)

  kernel = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((rows, 128), jnp.float32))
  x = rand(2, (tiles, rows, 128))
  want = x[0] - x[1] + x[2] - x[3]   # (the kernel's additions, in its order)
  np.testing.assert_array_equal(kernel(x), want)
  (compiled,) = plgpu.lower(kernel, jax.ShapeDtypeStruct(x.shape, x.dtype))
  assert compiled.shared_mem_bytes < 3 * rows * 512   # the two branches' buffers overlap

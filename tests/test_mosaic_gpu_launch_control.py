"""Cluster launch control (Blackwell) in the interpreter: ``plgpu.try_cluster_cancel`` and
``plgpu.query_cluster_cancel``. A persistent kernel does its own grid position, then cancels the
launch of clusters that have not started and does their work, until none is left: every position
is computed exactly once, as by the static grid. The interpreter starts clusters in grid order, so
the first cluster takes all the work and the others never run (a schedule a small GPU may
give). Also: the threads of a block and the blocks of a cluster get the same answers, reading
the answer before its barrier is reported, and the Gluon backend refuses both names."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu
from helpers import rand_seeded as rand

pytestmark = [pytest.mark.interpreter, pytest.mark.gluon_refuses("try_cluster_cancel")]
S = jax.ShapeDtypeStruct


def persistent(grid, threads=1, cluster=1, wait=True):
  """o[p] = x[p] * 2 + p for each grid position p, each by the block that took it (who[p] =
  its grid and cluster index); ``threads`` threads (each writes its half of the rows), a cluster
  of ``cluster`` blocks (each writes its share of the rows)."""
  rows = 8 * threads * cluster

  def body(x_ref, o_ref, who_ref, result, bar):
    me = lax.axis_index("g")
    part = (lax.axis_index("t") if threads > 1 else 0) * cluster + (
        lax.axis_index("c") if cluster > 1 else 0)
    mine = pl.ds(part * 8, 8)

    def work(p):
      o_ref[p, mine] = x_ref[p, mine] * 2.0 + p.astype(jnp.float32)
      who_ref[p, mine] = jnp.full((8, 128), me * 100 + part, jnp.int32)

    work(me)

    def step(carry):   # two answer slots: a thread's next request may land before another
      _, k = carry     # thread has read the last answer (a third request waits for that read)
      slot = k % 2
      plgpu.try_cluster_cancel(result.at[slot], bar.at[slot])
      if wait:
        plgpu.barrier_wait(bar.at[slot])
      (p,), ok = plgpu.query_cluster_cancel(result.at[slot], grid_names=("g",))
      lax.cond(ok, lambda: work(p), lambda: None)
      return ok, k + 1

    lax.while_loop(lambda c: c[0], step, (True, 0))

  extra = dict(num_threads=threads, thread_name="t") if threads > 1 else {}
  if cluster > 1:
    extra.update(cluster=(cluster,), cluster_names=("c",))
  return plgpu.kernel(body, out_type=(S((grid, rows, 128), jnp.float32), S((grid, rows, 128), jnp.int32)),
                      grid=(grid,), grid_names=("g",),
                      scratch_types=[plgpu.TryClusterCancelResult(2),
                                     plgpu.Barrier(num_arrivals=threads, num_barriers=2)],
                      **extra)


@pytest.mark.parametrize("grid,threads,cluster", [(1, 1, 1), (5, 1, 1), (4, 2, 1), (3, 1, 2)])
def test_every_position_is_computed_once_by_the_cluster_that_took_it(grid, threads, cluster):
  rows = 8 * threads * cluster
  x = rand(grid, (grid, rows, 128))
  out, who = persistent(grid, threads, cluster)(x)
  np.testing.assert_array_equal(out, x * 2 + np.arange(grid, dtype=np.float32)[:, None, None])
  # The first cluster took every other launch; each of its blocks and threads wrote its part.
  parts = np.repeat(np.arange(threads * cluster), 8)[None, :, None]
  np.testing.assert_array_equal(who, np.broadcast_to(parts, who.shape))


def test_reading_the_answer_before_its_barrier_is_reported():
  with pytest.raises(pl.KernelCheckError, match="reads SMEM result before waiting on the barrier"):
    persistent(3, wait=False)(rand(0, (3, 8, 128)))


def test_one_answer_slot_for_two_threads_is_reported():
  """Thread 0's next request lands in the slot thread 1 has not read yet."""
  def body(o_ref, result, bar):
    def step(ok):
      plgpu.try_cluster_cancel(result, bar)
      plgpu.barrier_wait(bar)
      return plgpu.query_cluster_cancel(result, grid_names=("g",))[1]
    lax.while_loop(lambda ok: ok, step, True)

  kernel = plgpu.kernel(body, out_type=S((8, 128), jnp.float32), grid=(3,), grid_names=("g",),
                        num_threads=2, thread_name="t",
                        scratch_types=[plgpu.TryClusterCancelResult(), plgpu.Barrier(num_arrivals=2)])
  with pytest.raises(pl.KernelCheckError, match="reads SMEM result before waiting"):
    kernel()


def test_the_answer_must_be_sixteen_bytes():
  def body(o_ref, result, bar):
    plgpu.try_cluster_cancel(result, bar)

  kernel = plgpu.kernel(body, out_type=S((8, 128), jnp.float32),
                        scratch_types=[plgpu.SMEM((8,), jnp.int8), plgpu.Barrier()])
  with pytest.raises(TypeError, match="must be 128 bits, but is 64 bits"):
    kernel()

"""A cluster peer's SMEM in the interpreter: ``plgpu.cluster_ref`` (reads and writes of another
block's buffer) and ``plgpu.async_store_smem`` (a register value stored into another block's
SMEM, plain or atomic, completing that block's barrier). Random inputs, compared exactly (copies
and integer arithmetic); what the interpreter reports; the Gluon backend's refusal by name (pallax
runs a cluster's blocks as independent blocks on the GPU)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu
from helpers import rand_seeded as rand

pytestmark = [pytest.mark.interpreter]
SHAPE = (2, 64, 32)


def reading_the_peer(axis, cluster, owner_waits=True):
  """Each block copies its slice into SMEM and waits for it (``owner_waits``); after a cluster
  barrier it reads the other block's SMEM into its own output slice."""
  def body(x_ref, o_ref, smem, bar, peers_ready):
    i = lax.axis_index(axis)
    plgpu.copy_gmem_to_smem(x_ref.at[i], smem, bar)
    if owner_waits:
      plgpu.barrier_wait(bar)
    plgpu.barrier_arrive(peers_ready)
    plgpu.barrier_wait(peers_ready)
    o_ref[i] = plgpu.cluster_ref(smem, {axis: 1 - i})[...]

  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(SHAPE, jnp.float32),
                      scratch_types=[plgpu.SMEM(SHAPE[1:], jnp.float32), plgpu.Barrier(),
                                     plgpu.ClusterBarrier(collective_axes=(axis,))],
                      cluster=cluster, cluster_names=("x", "y"))


@pytest.mark.gluon_refuses("cluster_ref")
@pytest.mark.parametrize("axis,cluster", [("x", (2, 1)), ("y", (1, 2))])
def test_each_block_reads_its_peers_smem(axis, cluster):
  x = rand(1, SHAPE)
  np.testing.assert_array_equal(reading_the_peer(axis, cluster)(x), x[::-1])


@pytest.mark.gluon_refuses("cluster_ref")
def test_writing_a_peers_smem_through_cluster_ref():
  def body(x_ref, o_ref, smem, ready, done):
    i = lax.axis_index("c")
    plgpu.barrier_arrive(ready)   # both blocks' SMEM is allocated and unused
    plgpu.barrier_wait(ready)
    plgpu.cluster_ref(smem, {"c": 1 - i})[...] = x_ref[i] + 1.0
    plgpu.barrier_arrive(done)
    plgpu.barrier_wait(done)
    o_ref[i] = smem[...]

  kernel = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(SHAPE, jnp.float32),
                        scratch_types=[plgpu.SMEM(SHAPE[1:], jnp.float32),
                                       plgpu.ClusterBarrier(collective_axes=("c",)),
                                       plgpu.ClusterBarrier(collective_axes=("c",))],
                        cluster=(2,), cluster_names=("c",))
  x = rand(2, SHAPE)
  np.testing.assert_array_equal(kernel(x), x[::-1] + 1.0)


def storing_into_the_peer(atomic=None, wait=True):
  """Each block starts its SMEM from ``init`` and async-stores its slice of ``x`` into the other
  block's (``atomic``: combined with what is there), then reads its own SMEM after waiting."""
  def body(x_ref, init_ref, o_ref, smem, loaded, ready, stored):
    i = lax.axis_index("c")
    plgpu.copy_gmem_to_smem(init_ref.at[i], smem, loaded)
    plgpu.barrier_wait(loaded)
    plgpu.barrier_arrive(ready)   # the peer's SMEM holds its start before the store lands
    plgpu.barrier_wait(ready)
    plgpu.async_store_smem(x_ref[i], smem, stored, cluster_idx=1 - i, cluster_dim="c",
                           atomic=atomic)
    if wait:
      plgpu.barrier_wait(stored)
    o_ref[i] = smem[...]

  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(SHAPE, jnp.int32),
                      scratch_types=[plgpu.SMEM(SHAPE[1:], jnp.int32), plgpu.Barrier(),
                                     plgpu.ClusterBarrier(collective_axes=("c",)), plgpu.Barrier()],
                      cluster=(2,), cluster_names=("c",))


@pytest.mark.gluon_refuses("async_store_smem")
@pytest.mark.parametrize("atomic,combine", [
    (None, lambda old, new: new), ("add", np.add), ("max", np.maximum), ("xor", np.bitwise_xor)])
def test_async_store_into_the_peers_smem(atomic, combine):
  x, init = rand(3, SHAPE, np.int32), rand(4, SHAPE, np.int32)
  got = storing_into_the_peer(atomic)(x, init)
  np.testing.assert_array_equal(got, combine(init, x[::-1]))


@pytest.mark.gluon_refuses("async_store_smem")
def test_reading_an_async_store_before_its_barrier_is_reported():
  x, init = rand(5, SHAPE, np.int32), rand(6, SHAPE, np.int32)
  with pytest.raises(pl.KernelCheckError, match=r"reads SMEM smem before waiting on the barrier .*"
                                                  r"an async_store_smem of block \(c=[01]\)"):
    storing_into_the_peer(wait=False)(x, init)


@pytest.mark.gluon_refuses("cluster_ref")
def test_reading_a_peers_smem_its_block_has_not_awaited_is_reported():
  # (The cluster barrier orders the read after the peer's copy was issued, not after it landed.)
  with pytest.raises(pl.KernelCheckError, match="reads SMEM smem before waiting on the barrier"):
    reading_the_peer("x", (2, 1), owner_waits=False)(rand(7, SHAPE))


@pytest.mark.gluon_refuses("cluster_ref")
def test_a_cluster_index_out_of_range_is_an_error():
  def body(o_ref, smem):
    smem[...] = jnp.zeros(smem.shape, smem.dtype)
    o_ref[...] = plgpu.cluster_ref(smem, {"c": 2})[...]

  kernel = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                        scratch_types=[plgpu.SMEM((8, 128), jnp.float32)], cluster=(2,),
                        cluster_names=("c",))
  with pytest.raises(ValueError, match=r"index 2 along the cluster axis 'c' of size 2"):
    kernel()


def test_async_store_smem_checks_the_value_against_the_ref():
  def body(o_ref, smem, bar):
    plgpu.async_store_smem(jnp.zeros((8, 64), jnp.float32), smem, bar, cluster_idx=0,
                           cluster_dim="c")

  kernel = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                        scratch_types=[plgpu.SMEM((8, 128), jnp.float32), plgpu.Barrier()],
                        cluster=(2,), cluster_names=("c",))
  with pytest.raises(TypeError, match=r"stored value has shape \(8, 64\), but the target"):
    kernel()

"""Clusters of blocks in ``plgpu`` kernels (issue 27, point 2): ``plgpu.kernel(cluster=...,
cluster_names=...)``, ``lax.axis_index``/``lax.axis_size`` of cluster axes, multicast copies
(``copy_gmem_to_smem(..., collective_axes=...)``, ``plgpu.BlockSpec(collective_axes=...)`` in
``emit_pipeline_warp_specialized``), ``plgpu.ClusterBarrier``, and matmuls whose clusters share a
tile (JAX's own ``hopper_matmul_mgpu`` with ``cluster_dimension``).

In the interpreter the blocks of a cluster run together; each check is shown firing on a kernel
that breaks it (a deadlock on a cluster barrier, a multicast into SMEM a peer has not consumed,
blocks of a multicast group issuing different copies). On Hopper, Gluon 3.6 cannot express
clusters: the Gluon backend runs a cluster's blocks as independent blocks (docs/mosaic_gpu.md,
"Clusters"); every kernel here is also compiled for sm_90a (conftest), and on a Hopper GPU each
runs there and is compared with the interpreter (the ``interpreter`` mark, as in the other
Mosaic GPU test files).

Inputs are random (fixed keys); copies and integer results are compared exactly, float16
products with the tolerances of tests/test_mosaic_gpu_pipeline.py.
"""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import mgpu_ops
import pallax as pl
import pallax.mosaic_gpu as plgpu
from pallax import KernelCheckError
from pallax._src.gluon import events as ev
from test_mosaic_gpu_pipeline import check_matmul, rand

pytestmark = pytest.mark.interpreter
S = jax.ShapeDtypeStruct
EXACT = dict(rtol=0, atol=0)
REFUSES_GMEM_EXCHANGE = pytest.mark.gluon_refuses("ClusterBarrier in a kernel that writes and reads")


def _linear(names, sizes):
  """The row-major index of the current block over the axes ``names``."""
  idx = jnp.int32(0)
  for n, s in zip(names, sizes):
    idx = idx * s + lax.axis_index(n)
  return idx


# --- 1. grid and cluster axes ----------------------------------------------------------------

@pytest.mark.parametrize("grid,cluster", [((3,), (2,)), ((2,), (2, 1)), ((2, 3), (1, 2)),
                                          ((2,), (2, 2)), ((), (4,))], ids=str)
def test_grid_counts_clusters_and_axis_index_tells_blocks_apart(grid, cluster):
  gnames = tuple(f"g{i}" for i in range(len(grid)))
  cnames = tuple(f"c{i}" for i in range(len(cluster)))
  x = jax.random.randint(jax.random.key(0), (128,), -1000, 1000, jnp.int32)

  def kernel(x_ref, o_ref):
    at = tuple(lax.axis_index(n) for n in gnames + cnames)
    code = sum(lax.axis_index(n) * 10 ** k for k, n in enumerate(gnames + cnames))
    o_ref[at] = x_ref[...] + code + 1000 * lax.axis_size(cnames)

  out = plgpu.kernel(kernel, out_shape=S((*grid, *cluster, 128), jnp.int32), grid=grid,
                     grid_names=gnames, cluster=cluster, cluster_names=cnames)(x)
  want = np.zeros((*grid, *cluster, 128), np.int32)
  for at in np.ndindex(*grid, *cluster):
    want[at] = np.asarray(x) + sum(i * 10 ** k for k, i in enumerate(at)) + 1000 * math.prod(cluster)
  np.testing.assert_array_equal(out, want)


# --- 2. multicast copies ---------------------------------------------------------------------

def multicast_kernel(cluster, axes, box=(128, 64)):
  cnames = ("x", "y")[:len(cluster)]

  def kernel(x_ref, o_ref, smem, bar):
    me = _linear(cnames, cluster)
    plgpu.copy_gmem_to_smem(x_ref.at[lax.axis_index("g")], smem, bar, collective_axes=axes)
    plgpu.barrier_wait(bar)
    o_ref[lax.axis_index("g"), me] = smem[...] * (me + 1).astype(jnp.float32)

  return plgpu.kernel(kernel, out_shape=S((3, math.prod(cluster), *box), jnp.float32),
                      grid=(3,), grid_names=("g",), cluster=cluster, cluster_names=cnames,
                      scratch_shapes=[plgpu.SMEM(box, jnp.float32), plgpu.Barrier()])


@pytest.mark.parametrize("cluster,axes", [((2,), "x"), ((4,), ("x",)), ((2, 2), ("x",)),
                                          ((2, 2), ("y",)), ((2, 2), ("x", "y"))], ids=str)
def test_multicast_copy_lands_in_every_block_of_the_group(cluster, axes):
  x = rand(1, (3, 128, 64), jnp.float32)
  out = multicast_kernel(cluster, axes)(x)
  want = jnp.stack([jnp.stack([x[g] * (c + 1) for c in range(math.prod(cluster))]) for g in range(3)])
  np.testing.assert_array_equal(out, want)


def test_multicast_lowers_to_a_copy_per_block():
  (k,) = plgpu.lower(multicast_kernel((2,), "x"), S((3, 128, 64), jnp.float32))
  assert k.grid == (6, 1, 1)   # 3 clusters of 2 blocks
  (part,) = k.generated.partitions
  (copy,) = [e for e in part.events if isinstance(e, ev.Copy)]
  assert copy.direction == "in" and math.prod(copy.box) == 128 * 64   # each block: the whole box
  assert [e.nbytes for e in part.events if isinstance(e, ev.BarrierOp) and e.kind == "expect"] == [128 * 64 * 4]
  assert "cp.async.bulk.tensor" in k.ptx


def prefetching_kernel(consumed: bool, steps=4):
  """Each block of a cluster of two sums ``steps`` tiles that both load by multicast into two
  slots, issuing the next tile's copy before it reads the current one. A slot may be refilled
  once both blocks read it: ``consumed`` is a cluster barrier per slot (without it, one block's
  copy overwrites a slot the other has yet to read)."""

  def kernel(x_ref, o_ref, smem, ready, done):
    c = lax.axis_index("c")

    def fetch(s):
      slot = s % 2
      if consumed and s >= 2:
        plgpu.barrier_wait(done.at[slot])   # both blocks have read the slot's previous tile
      plgpu.copy_gmem_to_smem(x_ref.at[s], smem.at[slot], ready.at[slot], collective_axes="c")

    fetch(0)
    acc = jnp.zeros((64, 64), jnp.float32)
    for s in range(steps):
      if s + 1 < steps:
        fetch(s + 1)
      plgpu.barrier_wait(ready.at[s % 2])
      acc = acc + smem[s % 2] * (s + 1.0)
      if consumed:
        plgpu.barrier_arrive(done.at[s % 2])
    o_ref[c] = acc + c.astype(jnp.float32)

  scratch = [plgpu.SMEM((2, 64, 64), jnp.float32), plgpu.Barrier(num_barriers=2)]
  if consumed:
    scratch.append(plgpu.ClusterBarrier(collective_axes=("c",), num_barriers=2))
  else:
    scratch.append(plgpu.Barrier(num_barriers=2))
  return plgpu.kernel(kernel, out_shape=S((2, 64, 64), jnp.float32), cluster=(2,),
                      cluster_names=("c",), scratch_shapes=scratch)


def test_a_multicast_pipeline_refills_a_slot_after_the_cluster_consumed_it():
  x = rand(2, (4, 64, 64), jnp.float32)
  out = prefetching_kernel(consumed=True)(x)
  total = sum(x[s] * (s + 1.0) for s in range(4))
  np.testing.assert_allclose(out, jnp.stack([total, total + 1]), rtol=1e-6)


def test_check_a_multicast_into_smem_a_peer_has_not_consumed():
  x = rand(2, (4, 64, 64), jnp.float32)
  with pytest.raises(KernelCheckError, match=r"block \(c=1\) at .*test_mosaic_gpu_clusters.py:\d+.*"
                     r"multicast.*writes SMEM smem.* of cluster peer block \(c=0\).*not been awaited"):
    prefetching_kernel(consumed=False)(x)


def test_check_blocks_of_a_multicast_group_issue_the_same_copy():
  def kernel(x_ref, o_ref, smem, bar):
    c = lax.axis_index("c")
    plgpu.copy_gmem_to_smem(x_ref.at[c], smem, bar, collective_axes="c")   # a row per block
    plgpu.barrier_wait(bar)
    o_ref[c] = smem[...]

  f = plgpu.kernel(kernel, out_shape=S((2, 64, 64), jnp.float32), cluster=(2,), cluster_names=("c",),
                   scratch_shapes=[plgpu.SMEM((64, 64), jnp.float32), plgpu.Barrier()])
  with pytest.raises(KernelCheckError, match=r"block \(c=1\).*copies args\[0\].*its cluster peer "
                     r"block \(c=0\) issued a different copy at .*test_mosaic_gpu_clusters.py"):
    f(rand(3, (2, 64, 64), jnp.float32))


def test_check_a_multicast_box_must_split_between_the_group():
  def kernel(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar, collective_axes="c")
    plgpu.barrier_wait(bar)
    o_ref[lax.axis_index("c")] = smem[...]

  f = plgpu.kernel(kernel, out_shape=S((4, 6, 64), jnp.float16), cluster=(4,), cluster_names=("c",),
                   scratch_shapes=[plgpu.SMEM((6, 64), jnp.float16,
                                              transforms=(plgpu.SwizzleTransform(128),)),
                                   plgpu.Barrier()])
  with pytest.raises(KernelCheckError, match="is divisible by the collective size 4"):
    f(rand(4, (6, 64), jnp.float16))


def test_check_collective_axes_name_cluster_axes():
  def kernel(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar, collective_axes="g")   # a grid axis
    plgpu.barrier_wait(bar)
    o_ref[...] = smem[...]

  f = plgpu.kernel(kernel, out_shape=S((64, 64), jnp.float32), grid=(1,), grid_names=("g",),
                   cluster=(2,), cluster_names=("c",),
                   scratch_shapes=[plgpu.SMEM((64, 64), jnp.float32), plgpu.Barrier()])
  with pytest.raises(LookupError, match=r"Unknown cluster axis 'g', available axes: \['c'\]"):
    f(rand(5, (64, 64), jnp.float32))


# (Leader-tracked copies run: tests/test_mosaic_gpu_blackwell_compat.py.) A cluster axis may be
# named by any hashable, a tuple too, looked up whole as JAX looks it up.
@pytest.mark.parametrize("size,error,message,name", [
    (127, ValueError, r"Expected source shape to be \(16,\), but got \(127,\). Dim 0 is "
                      r"partitioned over an axis of size 2", "c"),
    (64, ValueError, r"Expected source shape to be \(16,\), but got \(64,\). Dim 0 is "
                     r"partitioned over an axis of size 2", ("c", "d"))])
def test_partitioned_copies_are_checked_as_jax_checks_them(size, error, message, name):
  def kernel(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar, collective_axes=(name,),
                            leader_tracked=plgpu.CopyPartition.PARTITIONED(0))
    plgpu.barrier_wait(bar)
    o_ref[...] = smem[...]

  f = plgpu.kernel(kernel, out_shape=S((8,), jnp.float32), cluster=(2,), cluster_names=(name,),
                   scratch_shapes=[plgpu.SMEM((8,), jnp.float32), plgpu.Barrier()])
  with pytest.raises(error, match=message):
    f(rand(12, (size,), jnp.float32))


# --- 3. cluster barriers ---------------------------------------------------------------------

def exchange_kernel(cluster, axes, arrives=lambda: True):
  """Each block writes its tile of ``2 * x`` to ``o1``, arrives on a cluster barrier and waits,
  then reads its neighbours' tiles along ``axes`` (written before they arrived) into ``o2``."""
  names = ("x", "y")[:len(cluster)]

  def kernel(x_ref, o1_ref, o2_ref, bar):
    me = tuple(lax.axis_index(n) for n in names)
    o1_ref[me] = x_ref[me] * 2
    pl.when(arrives())(lambda: plgpu.barrier_arrive(bar))
    plgpu.barrier_wait(bar)
    total = jnp.zeros(x_ref.shape[len(names):], x_ref.dtype)
    for a in axes:
      k = names.index(a)
      peer = me[:k] + (cluster[k] - 1 - me[k],) + me[k + 1:]
      total = total + o1_ref[peer]
    o2_ref[me] = total

  shape = (*cluster, 8, 128)
  return plgpu.kernel(kernel, out_shape=(S(shape, jnp.int32), S(shape, jnp.int32)),
                      cluster=cluster, cluster_names=names,
                      scratch_shapes=[plgpu.ClusterBarrier(collective_axes=axes)])


@REFUSES_GMEM_EXCHANGE
@pytest.mark.parametrize("cluster,axes", [((2,), ("x",)), ((4,), ("x",)), ((2, 2), ("x", "y")),
                                          ((2, 3), ("y",))], ids=str)
def test_cluster_barrier_orders_gmem_between_the_blocks(cluster, axes):
  x = jax.random.randint(jax.random.key(6), (*cluster, 8, 128), -1000, 1000, jnp.int32)
  o1, o2 = exchange_kernel(cluster, axes)(x)
  np.testing.assert_array_equal(o1, x * 2)
  want = sum(np.flip(np.asarray(x) * 2, axis=("x", "y").index(a)) for a in axes)
  np.testing.assert_array_equal(o2, want)


def test_check_a_block_that_never_arrives_deadlocks_its_cluster_barrier():
  # Block (1, 1) does not arrive. Each barrier counts the arrivals of its block and of the two
  # blocks that differ from it along one axis: (0, 0) completes, the others miss (1, 1)'s.
  f = exchange_kernel((2, 2), ("x", "y"),
                      arrives=lambda: (lax.axis_index("x") + lax.axis_index("y")) < 2)
  x = jax.random.randint(jax.random.key(6), (2, 2, 8, 128), -1000, 1000, jnp.int32)
  with pytest.raises(KernelCheckError, match=r"deadlock in blocks \(x=0, y=1\), \(x=1, y=0\), "
                     r"\(x=1, y=1\):.*the kernel of block \(x=1, y=1\) waits for barrier bar "
                     r"\(phase 0, 2/3 arrivals\) at .*test_mosaic_gpu_clusters.py:\d+"):
    f(x)


def leader_tracked_kernel(cluster, waits=lambda: lax.axis_index("x") == 0):
  """Each block writes its tile of ``2 * x`` and arrives on a leader-tracked cluster barrier;
  the blocks ``waits`` picks wait on it, then sum every block's tile into ``o2``."""
  def kernel(x_ref, o1_ref, o2_ref, bar):
    me = lax.axis_index("x")
    o1_ref[me] = x_ref[me] * 2
    plgpu.barrier_arrive(bar)

    @pl.when(waits())
    def _():
      plgpu.barrier_wait(bar)
      o2_ref[...] = o1_ref[...].sum(axis=0)

  return plgpu.kernel(kernel, out_shape=(S((cluster, 8, 128), jnp.int32), S((8, 128), jnp.int32)),
                      cluster=(cluster,), cluster_names=("x",),
                      scratch_shapes=[plgpu.ClusterBarrier(collective_axes=("x",), leader_tracked=True)])


@REFUSES_GMEM_EXCHANGE
@pytest.mark.parametrize("cluster", [2, 4])
def test_a_leader_tracked_cluster_barrier_completes_once_every_block_arrived(cluster):
  # Every block's arrival goes to the leader's barrier (index 0): it completes once all came.
  x = jax.random.randint(jax.random.key(7), (cluster, 8, 128), -1000, 1000, jnp.int32)
  o1, o2 = leader_tracked_kernel(cluster)(x)
  np.testing.assert_array_equal(o1, x * 2)
  np.testing.assert_array_equal(o2, np.asarray(x * 2).sum(axis=0))


@REFUSES_GMEM_EXCHANGE
def test_check_a_wait_on_a_leader_tracked_barrier_outside_the_leader():
  x = jax.random.randint(jax.random.key(8), (2, 8, 128), -1000, 1000, jnp.int32)
  with pytest.raises(KernelCheckError, match=r"barrier_wait on the leader-tracked barrier bar in block "
                     r"\(x=1\): every block's arrivals go to the leader block \(x=0\)'s barrier"):
    leader_tracked_kernel(2, waits=lambda: True)(x)


def test_cluster_barrier_lowers_to_a_barrier_of_each_block():
  def kernel(x_ref, o_ref, smem, bar, bar2):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar, collective_axes="c")
    plgpu.barrier_wait(bar)
    o_ref[lax.axis_index("c")] = smem[...]
    plgpu.barrier_arrive(bar2)
    plgpu.barrier_wait(bar2)

  f = plgpu.kernel(kernel, out_shape=S((2, 64, 64), jnp.float32), cluster=(2,), cluster_names=("c",),
                   scratch_shapes=[plgpu.SMEM((64, 64), jnp.float32), plgpu.Barrier(),
                                   plgpu.ClusterBarrier(collective_axes=("c",), num_arrivals=1)])
  x = rand(7, (64, 64), jnp.float32)
  np.testing.assert_array_equal(f(x), jnp.stack([x, x]))
  (k,) = plgpu.lower(f, S((64, 64), jnp.float32))
  assert "mbarrier.init(bar2.index(_b), count=1)" in k.source   # this block's own arrival
  with pytest.raises(NotImplementedError, match="ClusterBarrier in a kernel that writes and reads"):
    plgpu.lower(exchange_kernel((2,), ("x",)), S((2, 8, 128), jnp.int32))


# --- 4. matmuls whose clusters share a tile --------------------------------------------------

def cluster_matmul(a, b, cluster):
  """Each block computes a 64-row tile of ``a @ b``; the blocks of a cluster (along its first
  axis) share all of ``b``, loaded once per cluster by multicast."""
  m, kdim = a.shape
  n = b.shape[1]
  names = ("cm", "cn")[:len(cluster)]
  blocks = m // 64

  def kernel(a_ref, b_ref, o_ref, a_smem, b_smem, o_smem, bar):
    row = lax.axis_index("g") * cluster[0] + lax.axis_index("cm")
    rows = pl.ds(row * 64, 64)
    plgpu.copy_gmem_to_smem(a_ref.at[rows], a_smem, bar)
    plgpu.copy_gmem_to_smem(b_ref, b_smem, bar, collective_axes="cm")
    plgpu.barrier_wait(bar)

    def product(acc_ref):
      plgpu.wgmma(acc_ref, a_smem, b_smem)
      plgpu.wgmma_wait(0)
      o_smem[...] = acc_ref[...]

    pl.run_scoped(product, plgpu.ACC((64, n)))
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_smem, o_ref.at[rows])
    plgpu.wait_smem_to_gmem(0)

  return plgpu.kernel(
      kernel, out_shape=S((m, n), jnp.float32), grid=(blocks // cluster[0],), grid_names=("g",),
      cluster=cluster, cluster_names=names,
      scratch_shapes=[plgpu.SMEM((64, kdim), a.dtype), plgpu.SMEM((kdim, n), b.dtype),
                      plgpu.SMEM((64, n), jnp.float32), plgpu.Barrier(num_arrivals=2)])(a, b)


@pytest.mark.parametrize("cluster", [(2,), (2, 1), (4,)], ids=str)
def test_matmul_with_a_multicast_operand(cluster):
  a = rand(8, (256, 64), jnp.float16)
  b = rand(9, (64, 128), jnp.float16)
  check_matmul(cluster_matmul(a, b, cluster), a, b)


@functools.cache
def hopper_matmul(num_sms: int):
  return mgpu_ops.load("hopper_matmul_mgpu", num_sms=num_sms)


@pytest.mark.parametrize("cluster_dim", ["M", "N"])
@pytest.mark.parametrize("wg_dim", [0, 1])
def test_jax_hopper_matmul_with_cluster_dimension(cluster_dim, wg_dim):
  hm = hopper_matmul(4)   # grid of two clusters
  cfg = hm.TuningConfig(tile_m=64, tile_n=64, tile_k=64, max_concurrent_steps=2, epi_tile_m=None,
                        epi_tile_n=None, wg_dimension=hm.MatmulDimension(wg_dim),
                        cluster_dimension=getattr(hm.MatmulDimension, cluster_dim))
  a = rand(10, (256, 192), jnp.float16)
  b = rand(11, (192, 256), jnp.float16)
  check_matmul(hm.matmul(a, b, None, cfg), a, b)


@pytest.mark.parametrize("cluster_dim", ["M", "N"])
def test_jax_hopper_matmul_with_cluster_dimension_lowers(cluster_dim):
  hm = hopper_matmul(132)
  cfg = hm.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2, epi_tile_m=None,
                        epi_tile_n=None, wg_dimension=hm.MatmulDimension.N,
                        cluster_dimension=getattr(hm.MatmulDimension, cluster_dim))
  s = lambda *shape: S(shape, jnp.float16)
  (k,) = plgpu.lower(lambda a, b: hm.matmul(a, b, None, cfg), s(1024, 512), s(512, 1024))
  assert k.grid == (132, 1, 1) and k.num_warps == 12   # 66 clusters of 2 blocks
  assert all(w in k.ptx for w in ("wgmma.mma_async", "cp.async.bulk.tensor", "setmaxnreg"))

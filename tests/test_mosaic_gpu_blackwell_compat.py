"""Blackwell (issue 28) behaviours that JAX's own ``TCGen05`` test classes of
``mosaic_gpu_test.py`` use and the interpreter lacked (found by running them through an import
alias, the GPU faked as sm_100a): each against a jnp reference on random inputs, and each new
check with a kernel that breaks it.

Tolerances: integer products exactly; bfloat16 products accumulated in float32 against jnp's
float32 dot, rtol=atol=1e-5.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu
from pallax import KernelCheckError

import helpers
import mgpu_ops

# Gluon for sm_100a (gluon_check.py) refuses integer products, cluster copies and two-block MMAs.
pytestmark = [pytest.mark.interpreter,
              pytest.mark.gluon_refuses("uint8 operands into an int32 accumulator for sm_100a",
                                        "collective (two-block) MMAs over a cluster for sm_100a",
                                        "leader-tracked cluster copies")]

S = jax.ShapeDtypeStruct


def rand_bytes(key, shape, dtype):
  info = jnp.iinfo(dtype)
  return jax.random.randint(jax.random.key(key), shape, info.min, info.max + 1, jnp.int32).astype(dtype)


def byte_matmul(m, n, k, a_dtype, b_dtype):
  """a (m, k) @ b (k, n) of bytes into an int32 accumulator in TMEM, in one MMA."""
  @plgpu.kernel(out_shape=S((m, n), jnp.int32), scratch_shapes=dict(
      a_smem=plgpu.SMEM((m, k), a_dtype), b_smem=plgpu.SMEM((k, n), b_dtype),
      acc=plgpu.TMEM((m, n), jnp.int32), done=plgpu.Barrier(orders_tensor_core=True)))
  def kernel(a_ref, b_ref, o_ref, a_smem, b_smem, acc, done):
    a_smem[...] = a_ref[...]
    b_smem[...] = b_ref[...]
    plgpu.commit_smem()
    plgpu.tcgen05_mma(acc, a_smem, b_smem, done, accumulate=False)
    plgpu.barrier_wait(done)
    o_ref[...] = plgpu.async_load_tmem(acc)
  return kernel


@pytest.mark.parametrize("m,n", [(128, 64), (64, 32)])
def test_uint8_products_in_int32(m, n):
  """Unsigned bytes (kind::i8 with unsigned operands): every value 0..255, products summed
  exactly in int32 (no wrap to signed bytes)."""
  k = 128
  a, b = rand_bytes(1, (m, k), jnp.uint8), rand_bytes(2, (k, n), jnp.uint8)
  out = byte_matmul(m, n, k, jnp.uint8, jnp.uint8)(a, b)
  np.testing.assert_array_equal(out, np.asarray(a, np.int32) @ np.asarray(b, np.int32))


def test_signed_and_unsigned_bytes_do_not_mix():
  a, b = rand_bytes(3, (128, 128), jnp.int8), rand_bytes(4, (128, 32), jnp.uint8)
  with pytest.raises(ValueError, match="MMA requires A and B to have the same element type"):
    byte_matmul(128, 32, 128, jnp.int8, jnp.uint8)(a, b)


# --- collective (two-block) MMAs over a cluster axis of size 2 -------------------------------------

def collective_matmul(m, n, k, *, wait_in_other=True, acc_collective=True, cluster=(2,),
                      names=("x",), axis="x", n_acc=None, commit_separately=False):
  """``a (m, k) @ b (k, n)`` by a pair of blocks: block i holds rows i*m/2.. of ``a`` and columns
  i*n/2.. of ``b``, and gets rows i*m/2.. of the product in its TMEM (the leader issues the MMA).
  ``wait_in_other=False``: block 1 reads its accumulator without waiting for the MMA."""
  hm, hn = m // 2, n // 2
  dt = jnp.bfloat16

  @plgpu.kernel(out_shape=S((m, n), jnp.float32), cluster=cluster, cluster_names=names,
                scratch_shapes=dict(
      a_smem=plgpu.SMEM((hm, k), dt), b_smem=plgpu.SMEM((k, hn), dt),
      acc=plgpu.TMEM((hm, n_acc or n), jnp.float32, collective=acc_collective),
      done=plgpu.Barrier(orders_tensor_core=True),
      ready=plgpu.ClusterBarrier(collective_axes=(axis,))))
  def kernel(a_ref, b_ref, o_ref, a_smem, b_smem, acc, done, ready):
    i = lax.rem(lax.axis_index(axis), 2)   # (cluster=(4,) only shows the size check)
    rows = pl.ds(i * hm, hm)
    a_smem[...] = a_ref[rows, :]
    b_smem[...] = b_ref[:, pl.ds(i * hn, hn)]
    plgpu.commit_smem()
    plgpu.barrier_arrive(ready)   # both blocks' operands are in place before the leader issues
    plgpu.barrier_wait(ready)
    if commit_separately:
      plgpu.tcgen05_mma(acc, a_smem, b_smem, accumulate=False, collective_axis=axis)
      plgpu.tcgen05_commit_arrive(done, collective_axis=axis)
    else:
      plgpu.tcgen05_mma(acc, a_smem, b_smem, done, accumulate=False, collective_axis=axis)
    if wait_in_other:
      plgpu.barrier_wait(done)
    else:
      @pl.when(i == 0)
      def _():
        plgpu.barrier_wait(done)
    o_ref[rows, :] = plgpu.async_load_tmem(acc)
  return kernel


def rand_bf16(key, shape):
  return jax.random.normal(jax.random.key(key), shape, jnp.float32).astype(jnp.bfloat16)


def ref_dot(a, b):
  return jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32), precision="highest")


@pytest.mark.parametrize("m,n,k,separately", [(256, 128, 64, False), (128, 64, 128, False),
                                              (256, 256, 64, True)])
def test_collective_matmul(m, n, k, separately):
  """Products of 16-bit inputs accumulated in float32 against jnp's float32 dot: rtol=atol=1e-5
  (the same products, summed in another order)."""
  a, b = rand_bf16(5, (m, k)), rand_bf16(6, (k, n))
  out = collective_matmul(m, n, k, commit_separately=separately)(a, b)
  np.testing.assert_allclose(out, ref_dot(a, b), rtol=1e-5, atol=1e-5)


def test_collective_matmul_in_a_2x2_cluster():
  """Cluster (2, 2): the pairs run along the first (minormost) axis, each pair on its own
  copy of the operands (the other axis only replicates the work)."""
  a, b = rand_bf16(7, (256, 64)), rand_bf16(8, (64, 128))
  out = collective_matmul(256, 128, 64, cluster=(2, 2), names=("x", "y"))(a, b)
  np.testing.assert_allclose(out, ref_dot(a, b), rtol=1e-5, atol=1e-5)


def test_other_block_reading_before_the_mma_completed():
  a, b = rand_bf16(9, (256, 64)), rand_bf16(10, (64, 128))
  with pytest.raises(KernelCheckError, match=r"async_load_tmem reads TMEM acc before the "
                     r"tcgen05_mma .*completed: wait on a barrier it arrives on") as e:
    collective_matmul(256, 128, 64, wait_in_other=False)(a, b)
  assert "x=1" in str(e.value), str(e.value)


@pytest.mark.parametrize("kw,pattern,cls", [
    (dict(acc_collective=False), r"Accumulator Ref must be collective if collective_axis is set",
     ValueError),
    (dict(cluster=(2, 2), names=("x", "y"), axis="y"),
     r"Can only perform collective MMA along minormost cluster axis. Got y, expected x",
     ValueError),
    (dict(cluster=(4,)), r"cluster axis 'x' of a collective MMA must have size 2", ValueError),
    (dict(n_acc=64), r"accumulator to have shape \(m, n \* 2\) in collective mode", ValueError),
])
def test_collective_mma_rules(kw, pattern, cls):
  a, b = rand_bf16(11, (256, 64)), rand_bf16(12, (64, 128))
  with pytest.raises(cls, match=pattern):
    collective_matmul(256, 128, 64, **kw)(a, b)


# --- leader-tracked (partitioned, replicated) copies over a pair of blocks ---------------------

def leader_tracked_copy(partition, shape, part_shape, *, follower_waits=False, cluster=(2,)):
  """Each block of the pair copies with ``partition``; the leader waits on its barrier, then
  a cluster barrier lets the other block read its SMEM; each block writes what it got to its
  row of the output."""
  @plgpu.kernel(out_shape=S((2, *part_shape), jnp.float32), cluster=cluster, cluster_names=("c",),
                scratch_shapes=dict(smem=plgpu.SMEM(part_shape, jnp.float32), bar=plgpu.Barrier(),
                                    landed=plgpu.ClusterBarrier(collective_axes=("c",))))
  def kernel(x_ref, o_ref, smem, bar, landed):
    i = lax.axis_index("c")
    plgpu.copy_gmem_to_smem(x_ref, smem, bar, collective_axes="c", leader_tracked=partition)
    if follower_waits:
      plgpu.barrier_wait(bar)   # only the leader's barrier gets the arrival
    else:
      @pl.when(i == 0)
      def _():
        plgpu.barrier_wait(bar)
    plgpu.barrier_arrive(landed)
    plgpu.barrier_wait(landed)
    o_ref[i] = smem[...]
  return kernel


@pytest.mark.parametrize("axis,shape,part", [(0, (128, 64), (64, 64)), (1, (32, 128), (32, 64))])
def test_partitioned_copy_gives_each_block_its_half(axis, shape, part):
  x = jax.random.normal(jax.random.key(13), shape, jnp.float32)
  out = leader_tracked_copy(plgpu.CopyPartition.PARTITIONED(axis), shape, part)(x)
  np.testing.assert_array_equal(out, np.stack(np.split(np.asarray(x), 2, axis=axis)))


def test_replicated_copy_gives_each_block_all_of_it():
  x = jax.random.normal(jax.random.key(14), (64, 64), jnp.float32)
  out = leader_tracked_copy(plgpu.CopyPartition.REPLICATED, (64, 64), (64, 64))(x)
  np.testing.assert_array_equal(out, np.stack([x, x]))


def test_other_block_waiting_on_its_own_barrier_deadlocks():
  """Only the leader's barrier tracks a leader-tracked copy: the other block's never completes."""
  x = jax.random.normal(jax.random.key(15), (128, 64), jnp.float32)
  with pytest.raises(KernelCheckError, match=r"deadlock"):
    leader_tracked_copy(plgpu.CopyPartition.PARTITIONED(0), (128, 64), (64, 64),
                        follower_waits=True)(x)


def test_leader_tracked_copy_needs_a_cluster_of_two():
  x = jax.random.normal(jax.random.key(16), (128, 64), jnp.float32)
  with pytest.raises(NotImplementedError, match="Partitioned loads only supported for clusters "
                                                "of size 2"):
    leader_tracked_copy(plgpu.CopyPartition.REPLICATED, (64, 64), (64, 64), cluster=(4,))(x[:64])


# --- unions (plgpu.RefUnion) of TMEM Refs ------------------------------------------------------

def tmem_union_kernel(read_other=False):
  """Two products through the two groups of a TMEM union (one after the other): a (128, 128)
  accumulator, then a (128, 64) one in the same columns. ``read_other``: read the first
  group's accumulator after the second group's MMA wrote over it."""
  @plgpu.kernel(out_shape=(S((128, 128), jnp.float32), S((128, 64), jnp.float32)),
                scratch_shapes=dict(
      a_smem=plgpu.SMEM((128, 64), jnp.bfloat16), b_smem=plgpu.SMEM((64, 128), jnp.bfloat16),
      done=plgpu.Barrier(orders_tensor_core=True),
      union=plgpu.RefUnion(plgpu.TMEM((128, 128), jnp.float32),
                           plgpu.TMEM((128, 64), jnp.float32))))
  def kernel(a_ref, b_ref, o1_ref, o2_ref, a_smem, b_smem, done, union):
    wide, narrow = union
    a_smem[...] = a_ref[...]
    b_smem[...] = b_ref[...]
    plgpu.commit_smem()
    plgpu.tcgen05_mma(wide, a_smem, b_smem, done, accumulate=False)
    plgpu.barrier_wait(done)
    o1_ref[...] = plgpu.async_load_tmem(wide)
    plgpu.wait_load_tmem()
    plgpu.tcgen05_mma(narrow, a_smem, b_smem.at[:, pl.ds(0, 64)], done, accumulate=False)
    plgpu.barrier_wait(done)
    o2_ref[...] = plgpu.async_load_tmem(wide if read_other else narrow)[:, :64]
  return kernel


def test_tmem_union_groups_used_one_after_the_other():
  a, b = rand_bf16(17, (128, 64)), rand_bf16(18, (64, 128))
  wide, narrow = tmem_union_kernel()(a, b)
  want = ref_dot(a, b)
  np.testing.assert_allclose(wide, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(narrow, want[:, :64], rtol=1e-5, atol=1e-5)


def test_tmem_union_read_after_the_other_group_wrote():
  a, b = rand_bf16(19, (128, 64)), rand_bf16(20, (64, 128))
  with pytest.raises(KernelCheckError, match=r"async_load_tmem reads TMEM scratch #3 .*after a write to "
                     r"TMEM scratch #4 .*another group of their plgpu.RefUnion"):
    tmem_union_kernel(read_other=True)(a, b)


def test_tmem_union_counts_its_widest_group_against_the_budget():
  """A union's groups share columns: 2 x 256 in one union fits the 512 columns beside 256
  more; a group of 2 x 256 beside 256 more does not."""
  def run(groups):
    @plgpu.kernel(out_shape=S((128, 8), jnp.float32), scratch_shapes=dict(
        union=plgpu.RefUnion(*groups), extra=plgpu.TMEM((128, 256), jnp.float32)))
    def kernel(o_ref, union, extra):
      plgpu.async_store_tmem(extra.at[:, pl.ds(0, 8)], jnp.ones((128, 8), jnp.float32))
      plgpu.commit_tmem()
      o_ref[...] = plgpu.async_load_tmem(extra.at[:, pl.ds(0, 8)])
    return kernel()
  t = lambda: plgpu.TMEM((128, 256), jnp.float32)   # noqa: E731
  np.testing.assert_array_equal(run([t(), t()]), np.ones((128, 8)))
  with pytest.raises(Exception, match=r"512"):
    run([[t(), t()]])


# --- JAX's blackwell_ragged_dot_mgpu.py (collective: pairs of blocks) --------------------------------

def test_jax_blackwell_ragged_dot_collective():
  """JAX's kernel, its import lines switched and the SM count (which a CPU lacks) set to 4,
  against lax.ragged_dot on random float16 inputs, groups not aligned to the tiles. The kernel
  rounds its float32 sums to float16: rtol=atol=1e-3 against the float32 reference rounded
  the same way."""
  imports = dict(mgpu_ops.IMPORTS, **{
      "from jax.experimental.pallas.ops.gpu import blackwell_matmul_mgpu":
          "blackwell_matmul_mgpu = _MATMUL",
      "from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu": "ragged_dot_mgpu = _RAGGED",
      "jax.local_devices()[0].core_count": "4"})
  matmul = mgpu_ops.load("blackwell_matmul_mgpu")
  mod = helpers.load_jax_ops_module("blackwell_ragged_dot_mgpu", imports, "pallax_mgpu_",
                                    strict=False, _MATMUL=matmul,
                                    _RAGGED=mgpu_ops.load("ragged_dot_mgpu"))
  a = jax.random.normal(jax.random.key(21), (512, 128), jnp.float16)
  b = jax.random.normal(jax.random.key(22), (3, 128, 256), jnp.float16)
  sizes = jnp.array([100, 300, 112], jnp.int32)
  cfg = mod.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2,
                         collective=True, grid_tile_width=1,
                         grid_minor_dim=matmul.MatmulDimension.M)
  out = mod.ragged_dot_kernel(a, b, sizes, cfg)
  want = lax.ragged_dot(a.astype(jnp.float32), b.astype(jnp.float32), sizes,
                        precision="highest").astype(jnp.float16)
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want, np.float32),
                             rtol=1e-3, atol=1e-3)

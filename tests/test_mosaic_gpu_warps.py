"""Per-warp code inside a warpgroup (``plgpu.warp_map``, ``plgpu.WarpMesh``), issue 27:

1. the warp id, in one warpgroup and in several threads; ``pl.core_map``/``pl.kernel`` over a
   ``WarpMesh``; copies issued by one warp and awaited by another; loops inside a warp, and
   warp_maps inside a loop (a warp's barrier phases persist from one to the next);
2. warps that wait for each other (the interpreter runs them interleaved; the Gluon backend,
   which writes the warps' bodies one after another, refuses them by name);
3. what a warp body may not do, checked with JAX's words, each with a kernel that breaks it;
4. the interpreter's checks across warps: phases the warps disagree on, the warpgroup's
   uncommitted writes read by a warp's TMA, deadlocks inside a warp.

Every plgpu kernel the interpreter runs is also lowered to Gluon for sm_90a here, and on a GPU
run there and compared with the interpreter (tests/gluon_check.py). Inputs are random (fixed
keys, never zeros); copies are compared exactly, products with float32 rtol=1e-6.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu
from pallax import KernelCheckError

S = jax.ShapeDtypeStruct
# Semantics tests: on a GPU machine they run in the interpreter on the host, and each plgpu kernel
# also runs as Gluon on the GPU, compared with the interpreter (conftest.py, gluon_check.py).
pytestmark = pytest.mark.interpreter
REFUSES_WAITING_WARPS = pytest.mark.gluon_refuses("plgpu.warp_map: warp")


def rand(seed, shape, dtype=jnp.float32):
  key = jax.random.key(seed)
  if jnp.issubdtype(dtype, jnp.integer):
    return np.asarray(jax.random.randint(key, shape, 1, 100, jnp.int32).astype(dtype))
  return np.asarray((jax.random.normal(key, shape, jnp.float32) + 3.0).astype(dtype))


# =============================================================================================
# 1. the fork and its warps
# =============================================================================================

@pytest.mark.parametrize("threads", [1, 2, 3])
def test_each_warp_scales_its_element_by_its_id(threads):
  n = 4 * threads
  x = rand(0, (n,))

  @plgpu.kernel(out_type=S((n,), jnp.float32), num_threads=threads, thread_name="wg",
                interpret=True)
  def scale(x_ref, o_ref):
    wg = lax.axis_index("wg")

    @plgpu.warp_map
    def _(warp):
      i = wg * plgpu.WarpMesh._NUM_WARPS_PER_WARPGROUP + warp
      o_ref[i] = x_ref[i] * (warp + 1).astype(jnp.float32) - lax.axis_size("wg")

  want = x * np.tile(np.arange(1, 5, dtype=np.float32), threads) - threads
  np.testing.assert_allclose(scale(x), want, rtol=1e-6)


@pytest.mark.parametrize("how", ["core_map", "kernel"])
def test_warp_mesh_axis_index_picks_the_rows_each_warp_stores(how):
  x = rand(1, (64, 128), jnp.int32)

  @plgpu.kernel(out_type=S((64, 128), jnp.int32), interpret=True,
                scratch_types=[plgpu.SMEM((64, 128), jnp.int32)])
  def rows(x_ref, o_ref, smem):
    smem[...] = x_ref[...] * 3 - 1
    plgpu.commit_smem()

    def per_warp():
      w = lax.axis_index("w")
      # warps 1 and 3 store 32 rows each, the others nothing
      @pl.when(w % 2 == 1)
      def _():
        rows = pl.ds((w - 1) * 16, 32)
        plgpu.copy_smem_to_gmem(smem.at[rows], o_ref.at[rows])

    if how == "core_map":
      pl.core_map(plgpu.WarpMesh(axis_name="w"))(per_warp)
    else:
      pl.kernel(per_warp, mesh=plgpu.WarpMesh(axis_name="w"))()
    plgpu.wait_smem_to_gmem(0)

  np.testing.assert_array_equal(rows(x), x * 3 - 1)


def test_one_warp_loads_another_stores():
  x = rand(2, (64, 32))

  @plgpu.kernel(out_type=S((32, 32), jnp.float32), interpret=True,
                scratch_types=[plgpu.SMEM((32, 32), jnp.float32), plgpu.Barrier()])
  def second_half(x_ref, o_ref, smem, bar):
    @plgpu.warp_map
    def _(warp):
      @pl.when(warp == 2)
      def _():
        plgpu.copy_gmem_to_smem(x_ref.at[32:], smem, bar)

      @pl.when(warp == 3)
      def _():
        plgpu.barrier_wait(bar)
        plgpu.copy_smem_to_gmem(smem, o_ref)
        plgpu.wait_smem_to_gmem(0)

  np.testing.assert_array_equal(second_half(x), x[32:])


def test_a_warp_loops_over_rows_and_the_warpgroup_waits_for_its_stores():
  x = rand(3, (10, 128), jnp.int32)

  @plgpu.kernel(out_type=S((10, 128), jnp.int32), interpret=True,
                scratch_types=[plgpu.SMEM((10, 128), jnp.int32)])
  def rows(x_ref, o_ref, smem):
    smem[...] = x_ref[...] + 7
    plgpu.commit_smem()

    @plgpu.warp_map
    def _(warp):
      @pl.when(warp == 1)
      def _():
        @pl.loop(0, 10)
        def _(i):
          plgpu.copy_smem_to_gmem(smem.at[pl.ds(i, 1)], o_ref.at[pl.ds(i, 1)])
    plgpu.wait_smem_to_gmem(0)   # the warpgroup waits for the warp's stores

  np.testing.assert_array_equal(rows(x), x + 7)


def test_warp_phases_persist_across_warp_maps_in_a_loop():
  """Warp 0 loads a tile per step, warp 1 waits for it and stores it: warp 1's view of the
  barrier's phase advances once per step, in a warp_map of its own each time."""
  steps, x = 4, rand(4, (4 * 16, 64))

  @plgpu.kernel(out_type=S((4 * 16, 64), jnp.float32), interpret=True,
                scratch_types=[plgpu.SMEM((16, 64), jnp.float32), plgpu.Barrier()])
  def tiles(x_ref, o_ref, smem, bar):
    @pl.loop(0, steps)
    def _(step):
      rows = pl.ds(step * 16, 16)

      @plgpu.warp_map
      def _(warp):
        @pl.when(warp == 0)
        def _():
          plgpu.copy_gmem_to_smem(x_ref.at[rows], smem, bar)

        @pl.when(warp == 1)
        def _():
          plgpu.barrier_wait(bar)
          plgpu.copy_smem_to_gmem(smem, o_ref.at[rows])
          plgpu.wait_smem_to_gmem(0)

  np.testing.assert_array_equal(tiles(x), x)


def test_nd_loop_inside_a_warp_over_the_grid():
  x = rand(5, (32,), jnp.int32)

  @plgpu.kernel(out_type=S((3, 32), jnp.int32), interpret=True, grid=(2,), grid_names=("sm",),
                scratch_types=[plgpu.SMEM((32,), jnp.int32), plgpu.Barrier()])
  def spread(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)

    @plgpu.warp_map
    def _(warp):
      @pl.when(warp == 0)
      def _():
        @plgpu.nd_loop(grid=(3,), collective_axes=("sm",))
        def _(info):
          plgpu.copy_smem_to_gmem(smem, o_ref.at[info.index])
          plgpu.wait_smem_to_gmem(0)

  np.testing.assert_array_equal(spread(x), np.stack([x] * 3))


# =============================================================================================
# 2. warps that wait for each other
# =============================================================================================

def test_a_warp_waits_for_a_later_warps_arrival():
  x = rand(6, (16, 64))

  @plgpu.kernel(out_type=S((16, 64), jnp.float32), interpret=True,
                scratch_types=[plgpu.SMEM((16, 64), jnp.float32), plgpu.Barrier(),
                               plgpu.Barrier(num_arrivals=1)])
  def handoff(x_ref, o_ref, smem, loaded, ready):
    @plgpu.warp_map
    def _(warp):
      @pl.when(warp == 0)   # waits for warp 3 (Gluon writes warp 3's body first)
      def _():
        plgpu.barrier_wait(ready)
        plgpu.copy_gmem_to_smem(x_ref, smem, loaded)
        plgpu.barrier_wait(loaded)
        plgpu.copy_smem_to_gmem(smem, o_ref)
        plgpu.wait_smem_to_gmem(0)

      @pl.when(warp == 3)
      def _():
        plgpu.barrier_arrive(ready)

  np.testing.assert_array_equal(handoff(x), x)


@REFUSES_WAITING_WARPS
def test_warps_that_wait_for_each_other():
  """Warp 0 hands warp 1 a turn and waits for it to hand one back: only concurrent warps run
  this (the interpreter interleaves them; Gluon, which writes one warp after the other, refuses)."""
  x = rand(12, (8,))

  @plgpu.kernel(out_type=S((8,), jnp.float32), interpret=True,
                scratch_types=[plgpu.Barrier(), plgpu.Barrier()])
  def ping_pong(x_ref, o_ref, ping, pong):
    @plgpu.warp_map
    def _(warp):
      @pl.when(warp == 0)
      def _():
        o_ref[0] = x_ref[0] + 1.0
        plgpu.barrier_arrive(ping)
        plgpu.barrier_wait(pong)
        o_ref[2] = o_ref[1] * 2.0

      @pl.when(warp == 1)
      def _():
        plgpu.barrier_wait(ping)
        o_ref[1] = o_ref[0] * 3.0
        plgpu.barrier_arrive(pong)

    for i in range(3, 8):
      o_ref[i] = x_ref[i]

  want = x.copy()
  want[0] = x[0] + 1
  want[1] = want[0] * 3
  want[2] = want[1] * 2
  np.testing.assert_allclose(ping_pong(x), want, rtol=1e-6)


def test_gluon_refuses_warps_that_wait_for_each_other_by_name():
  @plgpu.kernel(out_type=S((16, 64), jnp.float32),
                scratch_types=[plgpu.Barrier(), plgpu.Barrier()])
  def handoff(o_ref, ping, pong):
    @plgpu.warp_map
    def _(warp):
      pl.when(warp == 0)(lambda: (plgpu.barrier_arrive(ping), plgpu.barrier_wait(pong)))
      pl.when(warp == 1)(lambda: (plgpu.barrier_wait(ping), plgpu.barrier_arrive(pong)))

  with pytest.raises(NotImplementedError, match=r"warp 0 waits on barrier.1. and warp 1, which "
                                                r"would be written after it, arrives"):
    plgpu.lower(handoff)


def test_gluon_writes_the_warps_bodies_in_order():
  from pallax._src.gluon import events as ev

  @plgpu.kernel(out_type=S((32, 32), jnp.float32),
                scratch_types=[plgpu.SMEM((32, 32), jnp.float32), plgpu.Barrier()])
  def copy(x_ref, o_ref, smem, bar):
    @plgpu.warp_map
    def _(warp):
      pl.when(warp == 0)(lambda: plgpu.copy_gmem_to_smem(x_ref, smem, bar))

      @pl.when(warp == 1)
      def _():
        plgpu.barrier_wait(bar)
        plgpu.copy_smem_to_gmem(smem, o_ref)
    plgpu.wait_smem_to_gmem(0)

  (k,) = plgpu.lower(copy, S((32, 32), jnp.float32))
  ops = [(type(e).__name__, getattr(e, "kind", getattr(e, "direction", None)))
         for e in k.generated.partitions[0].events]
  assert ops == [("BarrierOp", "expect"), ("Copy", "in"), ("BarrierOp", "wait"), ("Copy", "out")]
  assert "# warp 0 of plgpu.warp_map" in k.source and "# warp 2" not in k.source
  assert isinstance(k.generated.partitions[0].events[1], ev.Copy)


# =============================================================================================
# 3. what a warp may not do (JAX's words)
# =============================================================================================

def _warp_kernel(body, x, interpret):
  @plgpu.kernel(out_type=S(x.shape, x.dtype), interpret=interpret,
                scratch_types=[plgpu.SMEM(x.shape, x.dtype)])
  def k(x_ref, o_ref, smem):
    body(x_ref, o_ref, smem)
  return k


def _run_warp_body(body, x=None):
  x = rand(7, (4, 128)) if x is None else x
  return _warp_kernel(body, x, True)(x)


def _lower_warp_body(body, x=None):
  """The Gluon lowering of a kernel with ``body`` (Mosaic GPU's compiler rules apply)."""
  x = rand(7, (4, 128)) if x is None else x
  return plgpu.lower(_warp_kernel(body, x, False), x)


def test_closing_over_an_array_is_refused_by_the_compiler():
  def body(x_ref, o_ref, smem):
    arr = x_ref[...] + 1

    @plgpu.warp_map
    def _(warp):
      smem[...] = arr
  with pytest.raises(NotImplementedError, match="Can only close over scalars and Refs .* with WarpMesh") as e:
    _lower_warp_body(body)
  assert isinstance(e.value, ValueError)   # (JAX's compiler raises a ValueError)


def test_array_loads_and_stores_are_refused_by_the_compiler():
  def load(x_ref, o_ref, smem):
    plgpu.warp_map(lambda w: pl.when(w == 0)(lambda: o_ref.__setitem__(0, x_ref[0])))
  with pytest.raises(NotImplementedError, match="Can only load scalars") as e:
    _lower_warp_body(load)
  assert isinstance(e.value, ValueError)   # (JAX's compiler raises a ValueError)

  def store(x_ref, o_ref, smem):
    plgpu.warp_map(lambda w: o_ref.__setitem__(0, jnp.zeros((128,), jnp.float32) + w))
  with pytest.raises(NotImplementedError, match="Can only store scalars|warp-level code computes") as e:
    _lower_warp_body(store)
  assert isinstance(e.value, ValueError)


@pytest.mark.gluon_refuses("Can only load scalars in warp-level code")
def test_arrays_in_warp_code_run_in_the_interpreter():
  """JAX's interpreter runs array code in warps (its tcgen05 race tests do); so does pallax's.
  Warp 2 alone writes a row: the other rows keep what the warpgroup wrote."""
  x = rand(9, (4, 128))

  def body(x_ref, o_ref, smem):
    o_ref[...] = x_ref[...]

    @plgpu.warp_map
    def _(warp):
      @pl.when(warp == 2)
      def _():
        o_ref[2] = x_ref[2] * 3.0 + 1.0
  out = _run_warp_body(body, x)
  want = np.asarray(x).copy()
  want[2] = want[2] * 3.0 + 1.0
  np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6)


def test_scalar_loads_and_stores_are_fine():
  x = rand(8, (4, 128))

  def body(x_ref, o_ref, smem):
    o_ref[...] = x_ref[...]

    @plgpu.warp_map
    def _(warp):
      o_ref[warp, warp] = x_ref[warp, 127 - warp] * 2.0
  want = x.copy()
  for w in range(4):
    want[w, w] = x[w, 127 - w] * 2
  np.testing.assert_allclose(_run_warp_body(body, x), want, rtol=1e-6)


def test_wgmma_and_nested_warp_maps_are_refused():
  def wgmma(x_ref, o_ref, smem):
    def acc_body(acc):
      plgpu.warp_map(lambda w: plgpu.wgmma(acc, smem.at[0:64, 0:64], smem.at[0:64, 0:64]))
    pl.run_state(acc_body)(plgpu.ACC.init(jnp.zeros((64, 64), jnp.float32)))
  with pytest.raises(ValueError, match="plgpu.wgmma .* inside plgpu.warp_map"):
    _run_warp_body(wgmma, rand(9, (64, 64)))

  def nested(x_ref, o_ref, smem):
    plgpu.warp_map(lambda w: plgpu.warp_map(lambda v: None))
  with pytest.raises(ValueError, match="Cannot nest mpmd_maps"):
    _run_warp_body(nested)


# =============================================================================================
# 4. checks across warps
# =============================================================================================

def test_warpgroup_wait_on_a_barrier_one_warp_waited_on_is_an_error():
  @plgpu.kernel(out_type=S((16, 64), jnp.float32), interpret=True,
                scratch_types=[plgpu.SMEM((16, 64), jnp.float32), plgpu.Barrier()])
  def split(x_ref, o_ref, smem, bar):
    for _ in range(2):
      plgpu.copy_gmem_to_smem(x_ref, smem, bar)

      @plgpu.warp_map
      def _(warp):
        pl.when(warp == 1)(lambda: plgpu.barrier_wait(bar))
    plgpu.barrier_wait(bar)   # warp 1 saw two phases, warps 0, 2, 3 none

  with pytest.raises(KernelCheckError, match=r"warps disagree .* warp\(s\) \[1\] .*\[0, 2, 0, 0\]"):
    split(rand(10, (16, 64)))


@REFUSES_WAITING_WARPS   # four warps waiting on one barrier: one wait each, four in a row
def test_every_warp_waiting_once_agrees_again():
  x = rand(11, (16, 64))

  @plgpu.kernel(out_type=S((16, 64), jnp.float32), interpret=True,
                scratch_types=[plgpu.SMEM((16, 64), jnp.float32), plgpu.Barrier()])
  def agree(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.warp_map(lambda w: plgpu.barrier_wait(bar))
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)   # all four warps saw the first phase: the warpgroup waits the second
    o_ref[...] = smem[...] * 2.0

  np.testing.assert_allclose(agree(x), x * 2, rtol=1e-6)


def test_a_warps_tma_store_of_the_warpgroups_uncommitted_writes_is_an_error():
  """JAX's test_warp_specialized_transpose writes SMEM from registers and has a warp store it
  with TMA without commit_smem: JAX's lowering puts no fence.proxy.async between them (only
  plgpu.commit_smem does), and the PTX memory model needs one for the TMA unit (the async
  proxy) to see the generic proxy's writes. The check stays."""
  def body(x_ref, o_ref, smem):
    smem[...] = x_ref[...]

    @plgpu.warp_map
    def _(warp):
      @pl.when(warp == 0)
      def _():
        plgpu.copy_smem_to_gmem(smem, o_ref)
        plgpu.wait_smem_to_gmem(0)
  with pytest.raises(KernelCheckError, match="without plgpu.commit_smem"):
    _run_warp_body(body)


def test_a_warps_store_in_flight_is_the_warpgroups_to_wait_for():
  def body(x_ref, o_ref, smem):
    smem[...] = x_ref[...]
    plgpu.commit_smem()
    plgpu.warp_map(lambda w: pl.when(w == 2)(lambda: plgpu.copy_smem_to_gmem(smem, o_ref)))
    smem[...] = x_ref[...] * 2   # the store of warp 2 may still read it
  with pytest.raises(KernelCheckError,
                     match="overwrites SMEM smem while a copy_smem_to_gmem .* may still read it"):
    _run_warp_body(body)


def test_a_deadlock_inside_a_warp_names_the_warp():
  def body(x_ref, o_ref, smem):
    def scope(bar):
      plgpu.warp_map(lambda w: pl.when(w == 3)(lambda: plgpu.barrier_wait(bar)))
    pl.run_scoped(scope, plgpu.Barrier())
  with pytest.raises(KernelCheckError, match=r"deadlock.*\(warp 3\) .*barrier"):
    _run_warp_body(body)

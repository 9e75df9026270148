"""Kernels across devices: pallax kernels inside ``jax.shard_map``, and Mosaic GPU kernels that reach
their peers' memory (``plgpu.remote_ref``, semaphore signals with ``device_id``), in the interpreter
with the mesh's devices simulated in one process; the interpreter's checks across devices; JAX's
own ``collective_matmul_mgpu.py`` against ``all_gather`` + ``jnp.dot``.

The rest of the suite runs on one CPU device, and XLA fixes its device count when JAX starts, so
these tests run in a child pytest with ``--xla_force_host_platform_device_count=4``
(``test_on_four_simulated_devices``); in the suite's own process they are skipped. Tests marked
``gpu`` need two GPUs (the lead runs them: see the command in docs/distributed.md).
"""
import functools
import os
import re
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import pallax as pl
import pallax.mosaic_gpu as plgpu
import pallax.triton as pl_triton
from pallax import KernelCheckError

N = 4   # simulated devices
SIMULATED = len(jax.devices("cpu")) >= N and jax.devices()[0].platform == "cpu"
simulated = pytest.mark.skipif(not SIMULATED, reason="runs in the child process with 4 CPU "
                                                     "devices (test_on_four_simulated_devices)")


# Two children, so that pytest-xdist can run them side by side (JAX's matmul is the long one).
@pytest.mark.parametrize("group", ["not collective_matmul", "collective_matmul"])
def test_on_four_simulated_devices(group):
  if SIMULATED:
    pytest.skip("this process is the one with 4 devices")
  # PALLAX_TEST_LOWER=0: the kernels here use what GPU backends refuse by design (mesh
  # coordinates, remote references: the two test_gpu_backends_refuse_* tests).
  env = dict(os.environ, JAX_PLATFORMS="cpu", PALLAX_TEST_LOWER="0",
             XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                        f" --xla_force_host_platform_device_count={N}").strip())
  r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not gpu",
                      "-k", group, __file__], env=env, capture_output=True, text=True,
                     cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), timeout=900)
  assert r.returncode == 0, r.stdout[-12000:] + r.stderr[-4000:]
  assert " passed" in r.stdout, r.stdout[-2000:]


def mesh(*shape, names=("x",)):
  return jax.sharding.Mesh(np.array(jax.devices()[:int(np.prod(shape))]).reshape(shape), names)


def on_mesh(f, m, in_specs, out_specs, check_vma=False):
  return jax.jit(jax.shard_map(f, mesh=m, in_specs=in_specs, out_specs=out_specs,
                               check_vma=check_vma))


def rand(*shape, seed=0, dtype=jnp.float32):
  return jax.random.normal(jax.random.key(seed), shape, dtype)


# --- 1. kernels per shard ----------------------------------------------------------------------

@simulated
def test_pallas_call_per_shard_with_a_grid():
  x, y = rand(4 * 40, 96), rand(4 * 40, 96, seed=1)

  def add(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] * 2 + y_ref[...]

  def f(x, y):   # 40 rows a shard, blocks of 16: the last block is partial
    spec = pl.BlockSpec((16, 96), lambda i: (i, 0))
    return pl.pallas_call(add, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(3,),
                          in_specs=[spec, spec], out_specs=spec, interpret=True)(x, y)

  out = on_mesh(f, mesh(N), (P("x"), P("x")), P("x"))(x, y)
  np.testing.assert_allclose(out, x * 2 + y, rtol=1e-6)


@simulated
@pytest.mark.interpreter
def test_pallas_call_reads_its_device_index():
  x = rand(4 * 8, 128)

  def k(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 100.0 * lax.axis_index("x").astype(jnp.float32) + pl.program_id(0)

  def f(x):
    spec = pl.BlockSpec((4, 128), lambda i: (i, 0))
    return pl.pallas_call(k, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,),
                          in_specs=[spec], out_specs=spec, interpret=True)(x)

  # check_vma: shard_map marks values varying over "x" inside the kernel too (pvary)
  out = on_mesh(f, mesh(N), P("x"), P("x"), check_vma=True)(x)
  dev = np.repeat(np.arange(N), 8)[:, None] * 100.0
  block = np.tile(np.repeat(np.arange(2), 4), N)[:, None]
  np.testing.assert_allclose(out, np.asarray(x) + dev + block, rtol=1e-6)


@simulated
def test_plgpu_kernel_with_threads_on_a_two_axis_mesh():
  """Each device runs its blocks and threads; lax.axis_index of both mesh axes, the grid axis
  and the thread axis inside the kernel; the second mesh axis replicates."""
  x = rand(2 * 16, 64)

  def f(x):
    @plgpu.kernel(out_shape=jax.ShapeDtypeStruct((16, 64), jnp.float32), grid=(2,),
                  grid_names=("b",), num_threads=2, thread_name="t", interpret=True)
    def k(x_ref, o_ref):
      rows = pl.ds(lax.axis_index("b") * 8 + lax.axis_index("t") * 4, 4)
      tag = lax.axis_index("x") * 10 + lax.axis_index("y")
      o_ref[rows] = x_ref[rows] * 2 + tag.astype(jnp.float32)
    return k(x)

  out = on_mesh(f, mesh(2, 2, names=("x", "y")), P("x"), P(("x", "y")))(x)
  want = [np.asarray(x[16 * i:16 * (i + 1)]) * 2 + (10 * i + j) for i in range(2) for j in range(2)]
  np.testing.assert_allclose(out, np.concatenate(want), rtol=1e-6)


# --- 2. remote references and semaphores -------------------------------------------------------

def ring_kernel(xs, *, signal=True, wait_for=2, offset=1):
  """Each device's 2 blocks copy their rows to the device ``offset`` to the right (TMA into the
  peer's ``recv`` output), signal it, wait for the left neighbour's signals, then read ``recv``."""
  rows_per_block = xs.shape[0] // 2

  @plgpu.kernel(out_shape=[jax.ShapeDtypeStruct(xs.shape, xs.dtype)] * 2, grid=(2,),
                grid_names=("b",), interpret=True,
                scratch_shapes=[plgpu.SMEM((rows_per_block, xs.shape[1]), xs.dtype),
                                plgpu.Barrier()])
  def ring(x_ref, o_ref, recv_ref, smem, bar):
    sem = pl.get_global(plgpu.SemaphoreType.REGULAR)
    right = lax.rem(lax.axis_index("x") + offset, N)
    rows = pl.ds(lax.axis_index("b") * rows_per_block, rows_per_block)
    plgpu.copy_gmem_to_smem(x_ref.at[rows], smem, bar)
    plgpu.barrier_wait(bar)
    plgpu.copy_smem_to_gmem(smem, plgpu.remote_ref(recv_ref, right).at[rows])
    plgpu.wait_smem_to_gmem(0)
    if signal:
      pl.semaphore_signal(sem, device_id=right)
      pl.semaphore_wait(sem, wait_for, decrement=False)
    o_ref[rows] = recv_ref[rows] * 2

  return ring(xs)[0]


def shifted(x, by):
  return np.roll(np.asarray(x).reshape(N, -1, x.shape[-1]), by, axis=0).reshape(x.shape)


@simulated
@pytest.mark.interpreter
@pytest.mark.parametrize("offset", [1, 3])
def test_remote_copy_and_signal_around_a_ring(offset):
  x = rand(N * 12, 128)
  out = on_mesh(functools.partial(ring_kernel, offset=offset), mesh(N), P("x"), P("x"))(x)
  np.testing.assert_array_equal(out, shifted(x, offset) * 2)


@simulated
@pytest.mark.interpreter
def test_remote_stores_and_parallel_signals_to_both_neighbours():
  """Stores through remote_ref (not TMA), and semaphore_signal_parallel of SemaphoreSignals
  with device_id; each device sums what its two neighbours sent."""
  x = rand(N * 8, 32)

  def f(xs):
    @plgpu.kernel(out_shape=[jax.ShapeDtypeStruct(xs.shape, xs.dtype),
                             jax.ShapeDtypeStruct((2, *xs.shape), xs.dtype)], interpret=True)
    def k(x_ref, o_ref, inbox):
      sems = pl.get_global(plgpu.SemaphoreType.REGULAR((2,)))
      dev = lax.axis_index("x")
      left, right = lax.rem(dev + N - 1, N), lax.rem(dev + 1, N)
      plgpu.remote_ref(inbox, right)[0] = x_ref[...]          # I am right's left neighbour
      plgpu.remote_ref(inbox.at[1], left)[...] = x_ref[...] * 10
      plgpu.semaphore_signal_parallel(plgpu.SemaphoreSignal(sems.at[0], device_id=right),
                                      plgpu.SemaphoreSignal(sems.at[1], device_id=left))
      pl.semaphore_wait(sems.at[0])
      pl.semaphore_wait(sems.at[1])
      o_ref[...] = inbox[0] + inbox[1]
    return k(xs)[0]

  out = on_mesh(f, mesh(N), P("x"), P("x"))(x)
  np.testing.assert_allclose(out, shifted(x, 1) + 10 * shifted(x, -1), rtol=1e-6)


@simulated
@pytest.mark.interpreter
def test_polling_a_semaphore_that_a_peer_signals():
  """A loop of semaphore_read until the left neighbour's signal arrives: the other devices'
  blocks start while it polls (on GPUs they all run at once)."""
  x = rand(N * 8, 16)

  def f(xs):
    @plgpu.kernel(out_shape=[jax.ShapeDtypeStruct(xs.shape, xs.dtype)] * 2, interpret=True)
    def k(x_ref, o_ref, got):
      sem = pl.get_global(plgpu.SemaphoreType.REGULAR)
      right = lax.rem(lax.axis_index("x") + 1, N)
      plgpu.remote_ref(got, right)[...] = x_ref[...]
      pl.semaphore_signal(sem, device_id=right)
      lax.while_loop(lambda _: pl.semaphore_read(sem) < 1, lambda c: c + 1, 0)
      pl.semaphore_wait(sem)
      o_ref[...] = got[...]
    return k(xs)[0]

  out = on_mesh(f, mesh(N), P("x"), P("x"))(x)
  np.testing.assert_array_equal(out, shifted(x, 1))


@simulated
@pytest.mark.interpreter
def test_atomics_into_device_zero_after_a_handshake():
  """Device 0 zeroes its counter and tells every device (a signal each); each adds its values to
  the counter on device 0 (atomics: no race between them) and signals back; device 0 waits for
  all, then copies the sum out (the others, their zeros)."""
  x = rand(N * 1, 8)

  def f(xs):
    @plgpu.kernel(out_shape=[jax.ShapeDtypeStruct(xs.shape, xs.dtype)] * 2, interpret=True)
    def k(x_ref, o_ref, total):
      ready, done = (pl.get_global(plgpu.SemaphoreType.REGULAR) for _ in range(2))
      dev = lax.axis_index("x")

      total[...] = jnp.zeros(total.shape, total.dtype)   # every device's, device 0's counts

      @pl.when(dev == 0)
      def _():
        for d in range(N):
          pl.semaphore_signal(ready, device_id=d)

      pl.semaphore_wait(ready)
      plgpu.atomic_add(plgpu.remote_ref(total, 0), x_ref[...])
      pl.semaphore_signal(done, device_id=0)

      @pl.when(dev == 0)
      def _():
        pl.semaphore_wait(done, N)
      o_ref[...] = total[...]
    return k(xs)[0]

  out = np.asarray(on_mesh(f, mesh(N), P("x"), P("x"))(x))
  np.testing.assert_allclose(out[0], np.asarray(x).sum(0), rtol=1e-5)
  np.testing.assert_array_equal(out[1:], 0)


@simulated
@pytest.mark.interpreter
def test_semaphore_signal_with_logical_and_mesh_coordinates():
  """On a 2x2 mesh: device_id as a dict of mesh coordinates and as a logical id."""
  x = rand(4 * 4, 16)

  def f(xs):
    @plgpu.kernel(out_shape=[jax.ShapeDtypeStruct(xs.shape, xs.dtype)] * 2, interpret=True)
    def k(x_ref, o_ref, got):
      sem = pl.get_global(plgpu.SemaphoreType.REGULAR)
      i, j = lax.axis_index("x"), lax.axis_index("y")
      peer = {"y": 1 - j}                     # the other device of my row
      plgpu.remote_ref(got, peer)[...] = x_ref[...]
      logical = i * 2 + (1 - j)
      pl.semaphore_signal(sem, device_id=logical, device_id_type=pl.DeviceIdType.LOGICAL)
      pl.semaphore_wait(sem)
      o_ref[...] = got[...]
    return k(xs)[0]

  out = on_mesh(f, mesh(2, 2, names=("x", "y")), P(("x", "y")), P(("x", "y")))(x)
  want = np.asarray(x).reshape(2, 2, 4, 16)[:, ::-1].reshape(x.shape)
  np.testing.assert_array_equal(out, want)


# --- 2. the checks across devices, each with a kernel that breaks it ---------------------------

def _error(f, *args) -> str:
  with pytest.raises(Exception) as e:
    jax.block_until_ready(f(*args))
  return str(e.value)


@simulated
@pytest.mark.interpreter
def test_deadlock_when_every_device_waits():
  f = on_mesh(functools.partial(ring_kernel, wait_for=3), mesh(N), P("x"), P("x"))
  msg = _error(f, rand(N * 12, 128))
  assert "deadlock" in msg and "of device (x=3)" in msg and "of device (x=0)" in msg
  assert "semaphore pl.get_global #0 to reach 3 (it holds 2)" in msg
  assert "test_distributed.py" in msg   # the line of the wait


@simulated
@pytest.mark.interpreter
def test_remote_write_racing_with_the_owners_read(monkeypatch):
  """No semaphore: the peer's copy into recv may land while its owner reads recv. (Where reads
  of unwritten data are checked, PALLAX_TEST_UNINIT=1, that check may see the bug first.)"""
  from pallax._src.interpret import uninit
  monkeypatch.setattr(uninit, "enabled", lambda params: False)
  f = on_mesh(functools.partial(ring_kernel, signal=False), mesh(N), P("x"), P("x"))
  msg = _error(f, rand(N * 12, 128))
  assert "no semaphore between them" in msg
  assert "out[1] of device (x=" in msg and "copy_smem_to_gmem" in msg
  assert msg.count("test_distributed.py") >= 2   # both accesses' lines


@simulated
@pytest.mark.interpreter
def test_semaphore_left_non_zero_at_the_end():
  def f(xs):
    @plgpu.kernel(out_shape=jax.ShapeDtypeStruct(xs.shape, xs.dtype), grid=(2,), grid_names=("b",),
                  scratch_shapes=[plgpu.SemaphoreType.REGULAR], interpret=True)
    def k(x_ref, o_ref, sem):
      pl.semaphore_signal(sem, 2)
      pl.semaphore_wait(sem)          # waits for 1 of the 2
      o_ref[pl.ds(lax.axis_index("b") * 4, 4)] = x_ref[pl.ds(lax.axis_index("b") * 4, 4)]
    return k(xs)

  msg = _error(on_mesh(f, mesh(N), P("x"), P("x")), rand(N * 8, 16))
  assert re.search(r"semaphore sem of block \(b=\d\) of device \(x=\d\) holds 1 when the kernel "
                   r"ends \(last signal: the kernel of block .* at .*test_distributed.py:\d+", msg), msg


@simulated
@pytest.mark.interpreter
def test_remote_ref_of_smem_and_a_device_outside_the_mesh():
  def f(xs, target, smem_peer):
    @plgpu.kernel(out_shape=jax.ShapeDtypeStruct(xs.shape, xs.dtype), interpret=True,
                  scratch_shapes=[plgpu.SMEM(xs.shape, xs.dtype)])
    def k(x_ref, o_ref, smem):
      if smem_peer:
        plgpu.remote_ref(smem, 0)[...] = x_ref[...]
      else:
        plgpu.remote_ref(o_ref, target)[...] = x_ref[...]
    return k(xs)

  x = rand(N * 8, 16)
  msg = _error(on_mesh(functools.partial(f, target=N, smem_peer=False), mesh(N), P("x"), P("x")), x)
  assert "device_id=4 is outside the mesh (4 devices: x=4)" in msg and "of device (x=" in msg
  msg = _error(on_mesh(functools.partial(f, target=0, smem_peer=True), mesh(N), P("x"), P("x")), x)
  assert "remote reference (plgpu.remote_ref, or device_id=) to SMEM smem, in SMEM" in msg, msg


def test_a_pallas_call_with_a_remote_ref_runs_in_the_eager_interpreter():
  """A plain pallas_call (no Mosaic GPU primitive, no lax.axis_index) whose kernel stores
  through remote_ref: the eager interpreter, which has peers, runs it (a mesh of one here)."""
  x = rand(16, 64)

  def k(x_ref, o_ref):
    plgpu.remote_ref(o_ref, 0)[...] = x_ref[...] * 3

  out = pl.pallas_call(k, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=True)(x)
  np.testing.assert_allclose(out, np.asarray(x) * 3, rtol=1e-6)


def test_waiting_on_a_peers_semaphore_is_refused():
  def body(o_ref):
    sem = pl.get_global(plgpu.SemaphoreType.REGULAR)
    pl.semaphore_wait(plgpu.remote_ref(sem, 0))
    o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)

  with pytest.raises(ValueError, match="semaphore_wait takes a semaphore of this device"):
    plgpu.kernel(body, out_shape=jax.ShapeDtypeStruct((8,), jnp.float32), interpret=True)()


@simulated
@pytest.mark.interpreter
def test_a_remote_kernel_called_on_one_device_only(monkeypatch):
  """Under a lax.cond of the device index only device 0 calls the kernel: its peers never come,
  and device 0 says so instead of waiting forever."""
  from pallax._src.interpret import devices
  monkeypatch.setattr(devices, "MEET_TIMEOUT_S", 1.0)

  def f(xs):
    ring = functools.partial(ring_kernel)
    return lax.cond(lax.axis_index("x") == 0, ring, lambda v: v, xs)

  msg = _error(on_mesh(f, mesh(N), P("x"), P("x")), rand(N * 12, 128))
  assert "every device of the mesh {'x': 4} must call it; devices [(1,), (2,), (3,)] did not" in msg


@pytest.mark.interpreter
def test_a_kernel_under_shard_map_inside_an_explicit_mesh():
  """``jax.set_mesh`` of explicit axes around ``jit(shard_map(...))``: the interpreter runs the
  kernel on the host outside any mesh, although the program around it runs under one and the
  kernel was traced under shard_map's manual mesh."""
  m = jax.make_mesh((1, 1), ("x", "y"), axis_types=(jax.sharding.AxisType.Explicit,) * 2,
                    devices=jax.devices()[:1])

  def clipped(v):
    @plgpu.kernel(out_shape=jax.ShapeDtypeStruct(v.shape, v.dtype), interpret=True,
                  scratch_shapes=[plgpu.SMEM(v.shape, v.dtype), plgpu.Barrier()])
    def k(x_ref, o_ref, smem, bar):
      plgpu.copy_gmem_to_smem(x_ref, smem, bar)
      plgpu.barrier_wait(bar)
      smem[...] = jnp.where(smem[...] > 0, smem[...], 0)
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(smem, o_ref)
      plgpu.wait_smem_to_gmem(0)
    return k(v)

  with jax.set_mesh(m):
    x = jax.sharding.reshard(rand(64, 64), P("x", "y"))
    out = jax.jit(jax.shard_map(clipped, in_specs=P("x", "y"), out_specs=P("x", "y")))(x)
    np.testing.assert_array_equal(np.asarray(out), np.maximum(np.asarray(x), 0))


def test_multicast_stays_refused():
  with pytest.raises(NotImplementedError, match="multicast"):
    plgpu.semaphore_signal_multicast(None)
  with pytest.raises(NotImplementedError, match="multicast"):
    plgpu.multimem_store(None, None)


def test_a_remote_kernel_outside_a_mesh_is_a_mesh_of_one():
  """Without shard_map, the kernel's one device is device 0: remote_ref(ref, 0) is the Ref."""
  x = rand(8, 16)

  @plgpu.kernel(out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=True)
  def k(x_ref, o_ref):
    plgpu.remote_ref(o_ref, 0)[...] = x_ref[...] + 1

  np.testing.assert_array_equal(k(x), np.asarray(x) + 1)


def test_the_triton_backend_refuses_remote_references():
  """Lowered for a GPU (no GPU needed to lower): a pallas_call the Triton backend would run
  gets a clear NotImplementedError pointing to the Mosaic GPU API, never a kernel that writes its
  own memory instead of the peer's (Mosaic GPU kernels reach peers: tests/test_peers.py)."""
  x = jax.ShapeDtypeStruct((8, 16), jnp.float32)

  def k(x_ref, o_ref):
    plgpu.remote_ref(o_ref, 0)[...] = x_ref[...]

  f = pl.pallas_call(k, out_shape=x)
  with pytest.raises(NotImplementedError, match="other devices' memory.*triton backend.*mosaic_gpu"):
    jax.jit(f).trace(x).lower(lowering_platforms=("cuda",))


@simulated
def test_mesh_axis_index_in_a_triton_kernel_lowers_for_cuda():
  """The device's coordinates inside a Triton kernel: an operand the lowering adds (gpu/peers.py),
  read once at the kernel's start; lowered ahead of time for CUDA (no GPU needed)."""
  def f(x):
    def k(x_ref, o_ref):
      o_ref[...] = x_ref[...] + lax.axis_index("x")
    return pl.pallas_call(k, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          compiler_params=pl_triton.CompilerParams(compute_capability=90))(x)

  g = on_mesh(f, mesh(N), P("x"), P("x"))
  hlo = g.trace(jax.ShapeDtypeStruct((N * 8, 128), jnp.float32)).lower(
      lowering_platforms=("cuda",)).as_text()
  (call,) = [line for line in hlo.splitlines() if "__gpu$xla.gpu.ptx" in line]
  assert "(tensor<8x128xf32>, tensor<1xi32>," in call   # the operand, then the coordinates


# --- 3. JAX's collective matmul ----------------------------------------------------------------

class _JaxWithSMs(types.ModuleType):
  """``jax`` for a module that reads the SM count from ``jax.devices()[0].core_count``, which a
  CPU device lacks; everything else is jax's own."""

  def __init__(self, num_sms: int):
    super().__init__("jax")
    self.__dict__.update(jax.__dict__)
    self.devices = lambda *a: [types.SimpleNamespace(core_count=num_sms, platform=d.platform,
                                                     id=d.id) for d in jax.devices(*a)]


@functools.cache
def collective_matmul(num_sms: int):
  import helpers
  import mgpu_ops
  hopper = mgpu_ops.load("hopper_matmul_mgpu", num_sms=num_sms)
  imports = {**mgpu_ops.IMPORTS,
             "from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu":
                 "hopper_matmul_mgpu = _HOPPER  # pallax's copy of it",
             "import jax\n": "jax = _JAX  # jax, with an SM count for CPU devices\n"}
  return helpers.load_jax_ops_module("collective_matmul_mgpu", imports, "pallax_mgpu_",
                                     strict=False, _HOPPER=hopper, _JAX=_JaxWithSMs(num_sms)), hopper


@simulated
@pytest.mark.interpreter
@pytest.mark.parametrize("wg", ["N"])   # "M" passes too (10 s more)
def test_jax_collective_matmul_against_all_gather_and_dot(wg):
  cm, hm = collective_matmul(2)
  m_shard, n_shard, k = 64 * (1 + (wg == "M")), 128, 128
  a = rand(N * m_shard, k, dtype=jnp.float16)
  b = rand(k, N * n_shard, seed=1, dtype=jnp.float16)
  cfg = hm.TuningConfig(tile_m=64, tile_n=64, tile_k=64, max_concurrent_steps=2,
                        wg_dimension=hm.MatmulDimension[wg], grid_minor_dim=hm.MatmulDimension.M,
                        grid_tile_width=1)
  m = mesh(N)
  out = on_mesh(lambda x, y: cm.all_gather_lhs_matmul(x, y, "x", config=cfg, dtype=jnp.float16),
                m, (P("x"), P(None, "x")), P(None, "x"))(a, b)
  ref = on_mesh(lambda x, y: jnp.dot(lax.all_gather(x, "x", axis=0, tiled=True), y,
                                     preferred_element_type=jnp.float32).astype(jnp.float16),
                m, (P("x"), P(None, "x")), P(None, "x"))(a, b)
  # float16 results of float32 sums: one rounding apart at most (JAX's test compares likewise)
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32),
                             rtol=2e-3, atol=2e-3)


# --- point 1 on GPUs: each shard runs its own kernel -------------------------------------------

def _two_gpus() -> bool:
  try:
    return len(jax.devices("gpu")) >= 2
  except RuntimeError:
    return False


def double_plus_one_triton(x, interpret=False):
  def k(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2 + 1
  spec = pl.BlockSpec((64, 128), lambda i: (i, 0))
  return pl.pallas_call(k, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0] // 64,),
                        in_specs=[spec], out_specs=spec, interpret=interpret)(x)


def double_plus_one_mosaic(x, interpret=False):
  @plgpu.kernel(out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0] // 128,),
                grid_names=("b",), scratch_shapes=[plgpu.SMEM((128, 128), jnp.float32),
                                                   plgpu.Barrier()], interpret=interpret)
  def k(x_ref, o_ref, smem, bar):
    rows = pl.ds(lax.axis_index("b") * 128, 128)
    plgpu.copy_gmem_to_smem(x_ref.at[rows], smem, bar)
    plgpu.barrier_wait(bar)
    smem[...] = smem[...] * 2 + 1
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref.at[rows])
    plgpu.wait_smem_to_gmem(0)
  return k(x)


@pytest.mark.parametrize("kernel", [double_plus_one_triton, double_plus_one_mosaic])
def test_the_two_gpu_kernels_on_one_shard(kernel):
  """The GPU test's kernels on one shard, in the interpreter; on a CPU the suite also compiles
  them (Triton to PTX, Gluon to sm_90a: conftest.py)."""
  x = rand(256, 128)
  np.testing.assert_allclose(kernel(x, interpret=True), np.asarray(x) * 2 + 1, rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not _two_gpus(), reason="needs 2 GPUs")
@pytest.mark.parametrize("kernel", [double_plus_one_triton, double_plus_one_mosaic])
def test_kernels_per_shard_on_two_gpus(kernel):
  """A Triton pallas_call and a Gluon plgpu kernel on each GPU's shard, under jit(shard_map)
  (no remote access: each shard's kernel is independent), against NumPy."""
  gpus = jax.sharding.Mesh(np.array(jax.devices("gpu")[:2]), ("x",))
  x = rand(2 * 256, 128)
  xs = jax.device_put(x, jax.sharding.NamedSharding(gpus, P("x")))
  out = on_mesh(kernel, gpus, P("x"), P("x"))(xs)
  assert len(out.sharding.device_set) == 2
  np.testing.assert_allclose(np.asarray(out), np.asarray(x) * 2 + 1, rtol=1e-6)

"""Mosaic GPU kernels that reach other GPUs' memory (``plgpu.remote_ref``, semaphore signals with
``device_id=``) and read their mesh coordinates, on GPUs: the run-time exchange of addresses
(``gpu/peers.py``: an address kernel, XLA's all-gather, the kernel given the table) and the Gluon
code that uses it (``gluon/peers.py``).

On a CPU: the address kernel assembles, the exchange's operands are what the kernel expects,
and a remote kernel's Gluon code compiles for sm_90a with system-scope semaphores and its
copies recorded as going to a peer. On two GPUs (tests marked ``gpu``, run by the command in
docs/distributed.md): the kernels against NumPy and against pallax's interpreter, called several
times in a row (every call exchanges its own buffers' addresses), and JAX's collective matmul
against ``all_gather`` + ``jnp.dot``.
"""
import dataclasses
import functools
import os
import shutil
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import pallax as pl
import pallax.mosaic_gpu as plgpu
from pallax._src import jaxpr_util
from pallax._src.call_primitive import pallas_call_p
from pallax._src.gluon import codegen as gluon_codegen
from pallax._src.gluon import compile as gluon_compile
from pallax._src.gluon import events
from pallax._src.gpu import peers


def rand(*shape, seed=0, dtype=jnp.float32):
  return jax.random.normal(jax.random.key(seed), shape, dtype)


# --- the kernels ---------------------------------------------------------------------------------

def send_to_next(x, interpret=False):
  """Each device copies its block into the next device's output (SMEM, then TMA), signals that
  device's semaphore, and waits for its own: out on device d is x of device d - 1."""
  n = lax.axis_size("x")

  @functools.partial(plgpu.kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                     scratch_shapes=[plgpu.SMEM(x.shape, x.dtype), plgpu.Barrier()],
                     interpret=interpret)
  def k(x_ref, o_ref, smem, bar):
    sem = pl.get_global(plgpu.SemaphoreType.REGULAR)
    nxt = lax.rem(lax.axis_index("x") + 1, n)
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    plgpu.copy_smem_to_gmem(smem, plgpu.remote_ref(o_ref, nxt))
    plgpu.wait_smem_to_gmem(0)
    pl.semaphore_signal(sem, device_id=nxt)
    pl.semaphore_wait(sem, 1)
  return k(x)


def store_into_previous(x, interpret=False):
  """Each device stores 2 x + its coordinate into the previous device's output from registers,
  over a grid of two blocks, each signalling once; each block takes one signal (so the kernel
  ends once both halves arrived)."""
  n = lax.axis_size("x")
  rows = x.shape[0] // 2

  @functools.partial(plgpu.kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,),
                     grid_names=("b",), interpret=interpret)
  def k(x_ref, o_ref):
    sem = pl.get_global(plgpu.SemaphoreType.REGULAR)
    me = lax.axis_index("x")
    prev = lax.rem(me + n - 1, n)
    blk = pl.ds(lax.axis_index("b") * rows, rows)
    plgpu.remote_ref(o_ref, prev).at[blk][...] = x_ref[blk] * 2 + me.astype(x.dtype)
    pl.semaphore_signal(sem, device_id=prev)
    pl.semaphore_wait(sem, 1)
  return k(x)


def plus_coordinate(x, interpret=False):
  """Only the mesh coordinate: x + the device's index along "x"."""
  @functools.partial(plgpu.kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                     scratch_shapes=[plgpu.SMEM(x.shape, x.dtype), plgpu.Barrier()],
                     interpret=interpret)
  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    smem[...] = smem[...] + lax.axis_index("x").astype(x.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref)
    plgpu.wait_smem_to_gmem(0)
  return k(x)


def plus_coordinate_triton(x, interpret=False):
  """The same as a pallas_call the Triton backend runs."""
  def k(x_ref, o_ref):
    o_ref[...] = x_ref[...] + lax.axis_index("x").astype(x.dtype)
  return pl.pallas_call(k, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=interpret)(x)


def expected(kernel, x: np.ndarray, n: int) -> np.ndarray:
  shards = np.split(np.asarray(x), n)
  if kernel is send_to_next:
    return np.concatenate([shards[(d - 1) % n] for d in range(n)])
  if kernel is store_into_previous:
    return np.concatenate([shards[(d + 1) % n] * 2 + (d + 1) % n for d in range(n)])
  return np.concatenate([shards[d] + d for d in range(n)])


def on_mesh(f, m, check_vma=False):
  return jax.jit(jax.shard_map(f, mesh=m, in_specs=P("x"), out_specs=P("x"), check_vma=check_vma))


# --- on a CPU ------------------------------------------------------------------------------------

def test_address_kernel_assembles():
  """The address kernel's PTX: element c of the row is parameter sources[c]; Triton's ptxas
  assembles it for sm_90a."""
  ptx = peers.address_ptx(6, [0, 3, 2], 5, 90)
  assert ptx.count("st.global.u64") == 3 and "[%t+16]" in ptx and "[p5]" in ptx
  import triton
  ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
  if not os.path.exists(ptxas):
    ptxas = shutil.which("ptxas")
  if ptxas is None:
    pytest.skip("no ptxas")
  path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"pallax_addresses_{os.getpid()}.ptx")
  with open(path, "w") as f:
    f.write(ptx)
  r = subprocess.run([ptxas, "-arch=sm_90a", path, "-o", path + ".o"], capture_output=True, text=True)
  assert r.returncode == 0, r.stderr


def _one_device_mesh():
  return jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))


def test_the_exchange_gives_the_kernel_its_buffers_table_and_coordinates():
  """Traced on a mesh of one device: the address kernel takes the call's operands and makes its
  fresh output; XLA all-gathers the row; the kernel gets the operands, the fresh buffer, the
  table and the coordinates, the buffer aliased to its output."""
  x = rand(64, 64)
  closed = jax.make_jaxpr(on_mesh(send_to_next, _one_device_mesh()))(x)
  (eqn,) = [e for e in jaxpr_util.equations(closed.jaxpr) if e.primitive is pallas_call_p]
  params = eqn.params["params"]
  seen = {}

  def bind(*operands, params):
    seen["operands"], seen["params"] = [jax.typeof(o) for o in operands], params
    return [jnp.zeros(a.shape, a.dtype) for a in params.out_avals]

  def body(x, sems):
    return tuple(peers.call(x, sems, params=params, bind=bind))

  sems = jnp.zeros(params.out_avals[1].shape, jnp.int32)   # the pl.get_global semaphore
  inner = jax.make_jaxpr(jax.shard_map(body, mesh=_one_device_mesh(), in_specs=(P("x"), P()),
                                       out_specs=(P("x"), P()), check_vma=False))(x, sems)
  names = [e.primitive.name for e in jaxpr_util.equations(inner.jaxpr)]
  assert "pallax_peer_addresses" in names and "all_gather" in names
  ex = seen["params"].peers
  assert ex.axes == (("x", 1),) and (ex.n_in, ex.n_out, ex.fresh) == (2, 2, (0,))
  assert ex.aliases() == {2: 0}
  table, coords = seen["operands"][-2:]
  assert table.shape == (1, 4) and table.dtype == jnp.int64
  assert coords.shape == (1,) and coords.dtype == jnp.int32


def _exchange_params(kernel, x, n):
  closed = jax.make_jaxpr(on_mesh(kernel, _one_device_mesh()))(x)
  (eqn,) = [e for e in jaxpr_util.equations(closed.jaxpr) if e.primitive is pallas_call_p]
  params = eqn.params["params"]
  return dataclasses.replace(params, peers=peers.exchange(params, (("x", n),)))


@pytest.mark.parametrize("kernel", [send_to_next, store_into_previous])
def test_remote_kernels_compile_for_sm90a_with_system_scope_semaphores(kernel):
  """The Gluon code of a kernel with remote references: its accesses to the peer are recorded
  as such (a TMA copy, or register stores), its semaphores are system-scope atomics in the PTX,
  and its parameters hold the exchange's operands after the inputs."""
  x = rand(64, 64)
  params = _exchange_params(kernel, x, 4)
  gs = gluon_codegen.generate(params)
  c = gluon_compile.compile_source(gs, params.name)
  assert list(gs.signature)[2:5] == ["out0_buffer", "peer_table", "mesh_coords"]
  ops = [e for p in gs.partitions for e in p.events]
  to_peer = [e for e in ops if isinstance(e, events.Copy) and e.gmem == "out[0] (of a peer)"] + \
      [e for e in ops if isinstance(e, events.Access) and e.ref == "out[0] (of a peer)"]
  kinds = {(type(e).__name__, getattr(e, "direction", getattr(e, "kind", None))) for e in to_peer}
  assert kinds == ({("Copy", "out")} if kernel is send_to_next else {("Access", "store")}), ops
  assert "atom.global.sys.release.add" in c.ptx.replace("release.sys", "sys.release")
  assert ".sys" in c.ptx and "acquire" in c.ptx


def test_atomics_in_a_kernel_that_reaches_its_peers_are_system_scope():
  """An atomic update of a peer's output (compiled only: adding into an output needs it
  zeroed first, which this kernel does not do) is a system-scope atomic: the peers' updates of
  one element must be atomic with each other."""
  def kernel(x):
    @functools.partial(plgpu.kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))
    def k(x_ref, o_ref):
      nxt = lax.rem(lax.axis_index("x") + 1, 2)
      plgpu.atomic_add(plgpu.remote_ref(o_ref, nxt), x_ref[...])
    return k(x)
  params = _exchange_params(kernel, rand(128), 2)
  ptx = gluon_compile.compile_source(gluon_codegen.generate(params), params.name).ptx
  atomics = [line for line in ptx.splitlines() if "red." in line or "atom." in line]
  assert atomics and all(".sys" in line for line in atomics), atomics


def test_a_remote_tma_copy_to_a_device_computed_in_a_loop_is_refused():
  """A TMA descriptor of a peer is made once, at the kernel's start: a copy to a device the
  kernel computes inside a loop is refused by name (register stores there are fine)."""
  def kernel(x):
    @functools.partial(plgpu.kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                       scratch_shapes=[plgpu.SMEM(x.shape, x.dtype), plgpu.Barrier()])
    def k(x_ref, o_ref, smem, bar):
      plgpu.copy_gmem_to_smem(x_ref, smem, bar)
      plgpu.barrier_wait(bar)

      @pl.loop(0, 2)
      def _(d):
        plgpu.copy_smem_to_gmem(smem, plgpu.remote_ref(o_ref, d))
        plgpu.wait_smem_to_gmem(0)
    return k(x)
  params = _exchange_params(kernel, rand(64, 64), 2)
  with pytest.raises(NotImplementedError, match="TMA copy to or from out.* at the start"):
    gluon_codegen.generate(params)


def test_the_kernels_in_the_interpreter_on_one_device():
  """A mesh of one device: each kernel's peer is itself (the GPU tests compare with these)."""
  x = rand(64, 64)
  for kernel in (send_to_next, store_into_previous, plus_coordinate, plus_coordinate_triton):
    out = on_mesh(functools.partial(kernel, interpret=True), _one_device_mesh())(x)
    np.testing.assert_allclose(np.asarray(out), expected(kernel, x, 1), rtol=1e-6)


# --- on two GPUs ---------------------------------------------------------------------------------

def _two_gpus() -> bool:
  try:
    return len(jax.devices("gpu")) >= 2
  except RuntimeError:
    return False


def _gpu_mesh():
  """Every GPU here (two or more)."""
  return jax.sharding.Mesh(np.array(jax.devices("gpu")), ("x",))


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", [send_to_next, store_into_previous, plus_coordinate,
                                    plus_coordinate_triton])
@pytest.mark.parametrize("check_vma", [False, True])
def test_remote_kernels_on_the_gpus(kernel, check_vma):
  """Each kernel on every GPU here, three calls in a row on fresh inputs, against NumPy and
  against the interpreter (blocks of 64 rows: partial TMA boxes are not the point here)."""
  if not _two_gpus():
    pytest.skip("needs 2 GPUs")
  m = _gpu_mesh()
  n = m.devices.size
  f = on_mesh(kernel, m, check_vma)
  g = on_mesh(functools.partial(kernel, interpret=True), m, check_vma)
  for seed in range(3):
    x = jax.device_put(rand(n * 64, 64, seed=seed), jax.sharding.NamedSharding(m, P("x")))
    out = f(x)
    np.testing.assert_array_equal(np.asarray(out), expected(kernel, x, n))
    np.testing.assert_array_equal(np.asarray(out), np.asarray(g(x)))


@pytest.mark.gpu
@pytest.mark.parametrize("wg", ["N", "M"])
def test_jax_collective_matmul_on_the_gpus(wg):
  """JAX's collective_matmul_mgpu.py (imports switched) on every GPU here against all_gather +
  dot: float16 results of float32 sums, one rounding apart at most (JAX's test compares
  likewise). On more than two GPUs its loop over devices enters the matmul's scope more than
  once (unrolled: gluon/threads.unroll_barrier_scopes)."""
  if not _two_gpus():
    pytest.skip("needs 2 GPUs")
  import test_distributed
  cm, hm = test_distributed.collective_matmul(jax.devices("gpu")[0].core_count)
  m = _gpu_mesh()
  m_shard, n_shard, k = 256 * (1 + (wg == "M")), 512, 512
  cfg = hm.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4,
                        wg_dimension=hm.MatmulDimension[wg], grid_minor_dim=hm.MatmulDimension.M,
                        grid_tile_width=4)
  spec = (P("x"), P(None, "x"))
  run = jax.jit(jax.shard_map(
      lambda a, b: cm.all_gather_lhs_matmul(a, b, "x", config=cfg, dtype=jnp.float16), mesh=m,
      in_specs=spec, out_specs=P(None, "x"), check_vma=False))
  ref = jax.jit(jax.shard_map(
      lambda a, b: jnp.dot(lax.all_gather(a, "x", axis=0, tiled=True), b,
                           preferred_element_type=jnp.float32).astype(jnp.float16),
      mesh=m, in_specs=spec, out_specs=P(None, "x"), check_vma=False))
  n = m.devices.size
  for seed in range(2):
    a = rand(n * m_shard, k, seed=seed, dtype=jnp.float16)
    b = rand(k, n * n_shard, seed=seed + 10, dtype=jnp.float16)
    np.testing.assert_allclose(np.asarray(run(a, b), np.float32), np.asarray(ref(a, b), np.float32),
                               rtol=2e-3, atol=2e-3)

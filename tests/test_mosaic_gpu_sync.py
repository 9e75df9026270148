"""JAX 0.11.2's Mosaic GPU names that pallax lacked, in the eager interpreter (issue 27):

1. the names themselves, against JAX's own ``plgpu`` and ``pl`` modules;
2. ``transpose_ref``, ``async_prefetch``, ``wgmma_accumulator_load``, ``Layout.WGMMA_ACC_32BIT``,
   barrier arrays indexed twice (``bar.at[2:4].at[1]``), ``pl.Buffered``;
3. ``barrier_test``, also polled in a loop while another thread arrives;
4. atomics (``plgpu.atomic_add`` and the others) on SMEM from several threads and on GMEM
   from several blocks, every dtype they take;
5. semaphores in ``plgpu`` kernels: scratch semaphores between threads, ``pl.get_global``
   semaphores between blocks of the grid (an earlier block waiting for a later one), and waits
   that can never end, reported as deadlocks;
6. ``plgpu.RefUnion``: groups used at different times, and reads of memory another group wrote.

The Gluon backend refuses the constructs it does not lower yet (barrier_test, atomics,
semaphores) by their primitive's name: those tests say so with ``gluon_refuses`` (every plgpu
kernel the suite runs is also lowered to Gluon, tests/gluon_check.py).

Inputs are random (jax.random, fixed keys, never zeros); copies and integer results are compared
exactly, float32 sums of a few terms with rtol=1e-6, float32 products of float16 inputs with
rtol=1e-5, atol=1e-5.
"""
import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu
from pallax import KernelCheckError

S = jax.ShapeDtypeStruct
EXACT = dict(rtol=0, atol=0)
# Gluon 3.6 has no atomics on SMEM (GMEM atomics lower: test_gluon_gaps.py).
REFUSES_ATOMICS = pytest.mark.gluon_refuses("'plgpu_atomic'", "no shared-memory atomics")
# Gluon refuses semaphore scratch (pl.get_global semaphores of plgpu kernels are GMEM operands,
# whose semaphore primitives it lowers).
REFUSES_SEMAPHORES = pytest.mark.gluon_refuses("'plgpu_semaphore_", "scratch of type SemaphoreType",
                                               "MemorySpace.SEMAPHORE", "semaphore outside GMEM")
REFUSES_BARRIER_TEST = pytest.mark.gluon_refuses("'plgpu_barrier_test'")


def rand(seed, shape, dtype=jnp.float32):
  """Random values (never zeros): normal + 3 for floats, in [1, 100) for integers."""
  key = jax.random.key(seed)
  if jnp.issubdtype(dtype, jnp.integer):
    return np.asarray(jax.random.randint(key, shape, 1, 100, jnp.int32).astype(dtype))
  return np.asarray((jax.random.normal(key, shape, jnp.float32) + 3.0).astype(dtype))


def at_line(fn, needle):
  """A regex for ``fn``'s source line containing ``needle``, as pallax names it."""
  lines, start = inspect.getsourcelines(fn)
  hits = [k for k, line in enumerate(lines) if needle in line]
  assert len(hits) == 1, (needle, hits)
  return re.escape(f"{inspect.getsourcefile(fn)}:{start + hits[0]}") + r" \([\w.<>]+\)"


# =============================================================================================
# 1. names
# =============================================================================================

# JAX 0.11.2 names pallax leaves out, each for its reason.
NOT_IN_PALLAX = {
    "InterpretGPUParams", "force_gpu_interpret_mode", "set_gpu_interpret_mode",  # JAX's interpreter
    "PeerMemRef",                 # references to other devices' memory
}


def test_every_name_of_jax_plgpu_but_the_listed_ones():
  from jax.experimental.pallas import mosaic_gpu as jax_plgpu
  theirs = {n for n in dir(jax_plgpu) if not n.startswith("_")}
  missing = theirs - set(dir(plgpu))
  assert missing <= NOT_IN_PALLAX, sorted(missing - NOT_IN_PALLAX)


def test_new_names_of_pl_and_layouts():
  assert pl.Buffered(2).buffer_count == 2
  with pytest.raises(ValueError, match="buffer_count"):
    pl.Buffered(0)
  assert jnp.issubdtype(jnp.int32, pl.semaphore) and not jnp.issubdtype(jnp.float32, pl.semaphore)
  assert plgpu.Layout.WGMMA_ACC_32BIT is plgpu.Layout._WGMMA_ACC_32BIT
  assert issubclass(plgpu.TransposeTransform, object) and plgpu.Transform is not None
  assert plgpu.RefType().transforms == ()


# =============================================================================================
# 2. views, hints, accumulator loads
# =============================================================================================

@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_transpose_ref_store_and_copy(dtype):
  x = rand(1, (64, 24), dtype)   # 24 rows of the result: not a power of two

  def body(x_ref, o_ref, smem):
    plgpu.transpose_ref(smem, (1, 0))[...] = x_ref[...]
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref)
    plgpu.wait_smem_to_gmem(0)

  f = plgpu.kernel(body, out_shape=S((24, 64), dtype), scratch_shapes=[plgpu.SMEM((24, 64), dtype)])
  np.testing.assert_array_equal(np.asarray(f(x)), x.T)


@pytest.mark.parametrize("indexer", [slice(None), slice(0, 128), slice(128, 256)])
def test_async_prefetch_is_a_hint(indexer):
  x = rand(2, (256,))

  def body(x_ref, o_ref, smem, bar):
    plgpu.async_prefetch(x_ref.at[indexer])
    plgpu.copy_gmem_to_smem(x_ref.at[indexer], smem.at[indexer], bar)
    plgpu.barrier_wait(bar)
    o_ref[indexer] = smem[indexer] + 1.0

  f = plgpu.kernel(body, out_shape=S((256,), jnp.float32),
                   scratch_shapes=[plgpu.SMEM((256,), jnp.float32), plgpu.Barrier()])
  np.testing.assert_allclose(np.asarray(f(x))[indexer], x[indexer] + 1.0, **EXACT)


@pytest.mark.parametrize("wait_n", [0, 1, None])
def test_wgmma_accumulator_load(wait_n):
  a, b = rand(3, (64, 32), jnp.float16), rand(4, (2, 32, 64), jnp.float16)

  def body(a_ref, b_ref, o_ref, a_smem, b_smem, bar):
    plgpu.copy_gmem_to_smem(a_ref, a_smem, bar)
    plgpu.barrier_wait(bar)
    plgpu.copy_gmem_to_smem(b_ref, b_smem, bar)
    plgpu.barrier_wait(bar)

    def scope(acc0, acc1):
      plgpu.wgmma(acc0, a_smem, b_smem.at[0])
      plgpu.wgmma(acc1, a_smem, b_smem.at[1])
      o_ref[0] = plgpu.wgmma_accumulator_load(acc0, wait_n=wait_n)   # acc1's may still run
      o_ref[1] = plgpu.wgmma_accumulator_load(acc1, wait_n=0)

    pl.run_scoped(scope, plgpu.ACC((64, 64)), plgpu.ACC((64, 64)))

  f = plgpu.kernel(body, out_shape=S((2, 64, 64), jnp.float32),
                   scratch_shapes=[plgpu.SMEM((64, 32), jnp.float16),
                                   plgpu.SMEM((2, 32, 64), jnp.float16), plgpu.Barrier()])
  want = np.einsum("mk,jkn->jmn", a.astype(np.float32), b.astype(np.float32))
  np.testing.assert_allclose(f(a, b), want, rtol=1e-5, atol=1e-5)


def test_wgmma_accumulator_load_refuses_a_negative_wait():
  with pytest.raises(ValueError, match="wait_n must be non-negative"):
    plgpu.wgmma_accumulator_load(None, wait_n=-1)


def test_layout_cast_to_wgmma_acc_32bit_keeps_values():
  x = rand(5, (64, 40))

  def body(x_ref, o_ref):
    o_ref[...] = plgpu.layout_cast(x_ref[...], plgpu.Layout.WGMMA_ACC_32BIT) * 2.0

  np.testing.assert_allclose(plgpu.kernel(body, out_shape=S(x.shape, x.dtype))(x), x * 2.0, **EXACT)


@pytest.mark.parametrize("view", ["at[2:4].at[1:2]", "at[1:4].at[2]", "at[3]"])
def test_barrier_array_indexed_twice(view):
  """Two views of one barrier array are the same barrier: an arrival on ``bar.at[2:4].at[1:2]``
  completes ``bar.at[3]``; a copy's barrier may be such a view too."""
  x = rand(6, (4, 32))
  pick = {"at[2:4].at[1:2]": lambda b: b.at[2:4].at[1:2], "at[1:4].at[2]": lambda b: b.at[1:4].at[2],
          "at[3]": lambda b: b.at[3]}[view]

  def body(x_ref, o_ref, smem, bar):
    plgpu.barrier_arrive(pick(bar))
    plgpu.barrier_wait(bar.at[3])
    plgpu.copy_gmem_to_smem(x_ref, smem, bar.at[0:2].at[1])
    plgpu.barrier_wait(bar.at[1])
    o_ref[...] = smem[...] * 3.0

  f = plgpu.kernel(body, out_shape=S(x.shape, x.dtype),
                   scratch_shapes=[plgpu.SMEM(x.shape, x.dtype), plgpu.Barrier(num_barriers=4)])
  np.testing.assert_allclose(f(x), x * 3.0, **EXACT)


def test_buffered_pipeline_mode_is_refused_by_emit_pipeline():
  x = rand(7, (4 * 128,))

  def body(x_ref, o_ref):
    def step(idx, x_smem, o_smem):
      o_smem[...] = x_smem[...] + 1.0
    spec = pl.BlockSpec((128,), lambda i: (i,), pipeline_mode=pl.Buffered(2))
    plgpu.emit_pipeline(step, grid=(4,), in_specs=[spec],
                        out_specs=[pl.BlockSpec((128,), lambda i: (i,))])(x_ref, o_ref)

  with pytest.raises(NotImplementedError, match="pipeline_mode= is not supported"):
    plgpu.kernel(body, out_shape=S(x.shape, x.dtype))(x)


# =============================================================================================
# 3. barrier_test
# =============================================================================================

@pytest.mark.interpreter
@REFUSES_BARRIER_TEST
def test_barrier_test_sees_phases_without_waiting():
  def body(o_ref, bar):
    o_ref[0] = plgpu.barrier_test(bar.at[0]).astype(jnp.int32)
    o_ref[1] = plgpu.barrier_test(bar.at[1]).astype(jnp.int32)
    plgpu.barrier_arrive(bar.at[0])
    o_ref[2] = plgpu.barrier_test(bar.at[0]).astype(jnp.int32)
    o_ref[3] = plgpu.barrier_test(bar.at[0]).astype(jnp.int32)   # the next phase: not yet
    plgpu.barrier_arrive(bar.at[1])
    o_ref[4] = plgpu.barrier_test(bar.at[1]).astype(jnp.int32)

  got = plgpu.kernel(body, out_shape=S((5,), jnp.int32),
                     scratch_shapes=[plgpu.Barrier(num_barriers=2)])()
  np.testing.assert_array_equal(got, [0, 0, 1, 0, 1])


@pytest.mark.interpreter
@REFUSES_BARRIER_TEST
@pytest.mark.parametrize("rows", [1, 24])
def test_barrier_test_polled_while_another_thread_arrives(rows):
  """Thread 0 polls the barrier in a loop (counting its polls) until thread 1 has written the
  SMEM and arrived; then it reads what thread 1 wrote."""
  x = rand(8, (rows, 32))

  def body(x_ref, o_ref, polls_ref, smem, bar):
    t = lax.axis_index("wg")

    @pl.when(t == 1)
    def _():
      smem[...] = x_ref[...] * 2.0
      plgpu.barrier_arrive(bar)

    @pl.when(t == 0)
    def _():
      polls = lax.while_loop(lambda n: ~plgpu.barrier_test(bar), lambda n: n + 1, 0)
      o_ref[...] = smem[...] + 1.0
      polls_ref[0] = polls

  out, polls = plgpu.kernel(body, out_shape=(S(x.shape, x.dtype), S((1,), jnp.int32)),
                            num_threads=2, thread_name="wg",
                            scratch_shapes=[plgpu.SMEM(x.shape, x.dtype), plgpu.Barrier()])(x)
  np.testing.assert_allclose(out, x * 2.0 + 1.0, **EXACT)
  assert polls[0] >= 1   # thread 0 polled before thread 1 arrived (it runs first)


@pytest.mark.interpreter
@REFUSES_BARRIER_TEST
def test_barrier_polled_forever_is_a_deadlock():
  def body(o_ref, bar):
    lax.while_loop(lambda n: ~plgpu.barrier_test(bar), lambda n: n + 1, 0)   # nobody arrives
    o_ref[...] = jnp.ones(o_ref.shape, o_ref.dtype)

  with pytest.raises(KernelCheckError, match=r"deadlock in block \(0\): every thread waits or "
                                             r"polls.*polls barrier.*with barrier_test.*"
                                             + at_line(body, "lax.while_loop")):
    plgpu.kernel(body, out_shape=S((8,), jnp.float32), scratch_shapes=[plgpu.Barrier()])()


# =============================================================================================
# 4. atomics
# =============================================================================================

ATOMICS = {"add": (plgpu.atomic_add, np.add), "max": (plgpu.atomic_max, np.maximum),
           "min": (plgpu.atomic_min, np.minimum), "and": (plgpu.atomic_and, np.bitwise_and),
           "or": (plgpu.atomic_or, np.bitwise_or), "xor": (plgpu.atomic_xor, np.bitwise_xor)}
ATOMIC_CASES = [(op, dt) for op in ("add", "max", "min") for dt in (jnp.float32, jnp.int32)] + \
               [(op, dt) for op in ("and", "or", "xor") for dt in (jnp.int32, jnp.uint32)]


@pytest.mark.interpreter   # semantics: Gluon refuses atomics (REFUSES_ATOMICS)
@REFUSES_ATOMICS
@pytest.mark.parametrize("op,dtype", ATOMIC_CASES)
def test_atomics_on_smem_from_three_threads(op, dtype):
  """Thread 0 fills SMEM with ``init``; each of 3 threads applies its slice of ``x``."""
  m, n = 24, 40
  x, init = rand(9, (3 * m, n), dtype), rand(10, (m, n), dtype)
  fn, ref = ATOMICS[op]

  def body(x_ref, init_ref, o_ref, smem, bar):
    t = lax.axis_index("wg")

    @pl.when(t == 0)
    def _():
      smem[...] = init_ref[...]

    plgpu.barrier_arrive(bar)
    plgpu.barrier_wait(bar)
    fn(smem, x_ref[pl.ds(t * m, m)])
    plgpu.barrier_arrive(bar)
    plgpu.barrier_wait(bar)

    @pl.when(t == 0)
    def _():
      o_ref[...] = smem[...]

  f = plgpu.kernel(body, out_shape=S((m, n), dtype), num_threads=3, thread_name="wg",
                   scratch_shapes=[plgpu.SMEM((m, n), dtype), plgpu.Barrier(num_arrivals=3)])
  want = ref(ref(ref(init, x[:m]), x[m:2 * m]), x[2 * m:])
  np.testing.assert_allclose(f(x, init), want, rtol=1e-6 if dtype == jnp.float32 else 0, atol=0)


@pytest.mark.interpreter   # semantics: Gluon refuses atomics (REFUSES_ATOMICS)
@REFUSES_ATOMICS
@pytest.mark.parametrize("blocks", [1, 5])
def test_atomic_add_to_gmem_from_blocks_of_the_grid(blocks):
  """Every block adds its row of ``x`` to a GMEM Ref passed in (jax.new_ref)."""
  x, init = rand(11, (blocks, 40)), rand(12, (40,))

  def body(x_ref, acc_ref):
    plgpu.atomic_add(acc_ref, x_ref[lax.axis_index("b")])

  acc = jax.new_ref(jnp.asarray(init))
  plgpu.kernel(body, out_shape=(), grid=(blocks,), grid_names=("b",))(x, acc)
  np.testing.assert_allclose(acc[...], init + x.sum(0), rtol=1e-6, atol=0)


@pytest.mark.interpreter   # semantics: Gluon refuses atomics (REFUSES_ATOMICS)
@REFUSES_ATOMICS
def test_atomic_with_a_python_number_updates_every_element():
  x = rand(13, (16,), jnp.int32)

  def body(x_ref, o_ref, smem):
    smem[...] = x_ref[...]
    plgpu.atomic_max(smem, 50)
    o_ref[...] = smem[...]

  f = plgpu.kernel(body, out_shape=S(x.shape, x.dtype), scratch_shapes=[plgpu.SMEM(x.shape, x.dtype)])
  np.testing.assert_array_equal(f(x), np.maximum(x, 50))


def test_atomic_errors_say_what_to_do():
  def call(update, dtype=jnp.float32):
    def body(o_ref, smem):
      update(smem)
      o_ref[...] = smem[...]
    return plgpu.kernel(body, out_shape=S((8,), dtype), scratch_shapes=[plgpu.SMEM((8,), dtype)])()

  with pytest.raises(ValueError, match=r"atomic_add: Invalid shape.*\[8\].*\[4\]"):
    call(lambda r: plgpu.atomic_add(r, jnp.ones((4,), jnp.float32)))
  with pytest.raises(ValueError, match=r"Expected dtypes to match.*astype"):
    call(lambda r: plgpu.atomic_add(r, jnp.ones((8,), jnp.int32)))
  with pytest.raises(TypeError, match="atomic_xor takes integers"):
    call(lambda r: plgpu.atomic_xor(r, jnp.ones((8,), jnp.float32)))


# =============================================================================================
# 5. semaphores
# =============================================================================================

@pytest.mark.interpreter
@REFUSES_SEMAPHORES
@pytest.mark.parametrize("spelling", ["pl", "plgpu"])
def test_semaphore_between_threads(spelling):
  """Thread 0 waits for 2 of the 3 that thread 1 signals after writing SMEM, then reads what is
  left (1) and what thread 1 wrote."""
  x = rand(14, (32,))
  signal = pl.semaphore_signal if spelling == "pl" else plgpu.semaphore_signal
  wait = pl.semaphore_wait if spelling == "pl" else plgpu.semaphore_wait

  def body(x_ref, o_ref, left_ref, smem, sem):
    assert jnp.issubdtype(sem.dtype, pl.semaphore)
    t = lax.axis_index("wg")

    @pl.when(t == 0)
    def _():
      wait(sem, 2)
      o_ref[...] = smem[...] - 1.0
      left_ref[0] = pl.semaphore_read(sem)

    @pl.when(t == 1)
    def _():
      smem[...] = x_ref[...]
      signal(sem, 3)

  out, left = plgpu.kernel(body, out_shape=(S(x.shape, x.dtype), S((1,), jnp.int32)),
                           num_threads=2, thread_name="wg",
                           scratch_shapes=[plgpu.SMEM(x.shape, x.dtype),
                                           plgpu.SemaphoreType.REGULAR])(x)
  np.testing.assert_allclose(out, x - 1.0, **EXACT)
  np.testing.assert_array_equal(left, [1])


@pytest.mark.interpreter
@REFUSES_SEMAPHORES
@pytest.mark.parametrize("blocks", [2, 5])
def test_global_semaphore_earlier_block_waits_for_a_later_one(blocks):
  """Block 0 waits until the last block has signalled; every other block signals once."""
  x = rand(15, (blocks, 24))

  def body(x_ref, o_ref):
    sem = pl.get_global(plgpu.SemaphoreType.REGULAR)
    b = lax.axis_index("x")

    @pl.when(b == blocks - 1)
    def _():
      pl.semaphore_signal(sem, blocks)

    @pl.when(b == 0)
    def _():
      pl.semaphore_wait(sem, blocks)
      o_ref[0] = x_ref[0] + pl.semaphore_read(sem).astype(jnp.float32)   # 0 after the wait

    @pl.when(b > 0)
    def _():
      o_ref[b] = x_ref[b] * 2.0

  f = plgpu.kernel(body, out_shape=S(x.shape, x.dtype), grid=(blocks,), grid_names=("x",))
  want = np.concatenate([x[:1], x[1:] * 2.0])
  np.testing.assert_allclose(f(x), want, **EXACT)
  np.testing.assert_allclose(jax.jit(f)(x), want, **EXACT)


@pytest.mark.interpreter
@REFUSES_SEMAPHORES
def test_global_semaphores_chain_blocks_in_reverse_order():
  """Block b waits until the count reaches n - 1 - b, records it, then signals: the blocks go
  in reverse grid order, each seeing one more."""
  n = 4

  def body(o_ref):
    sem = pl.get_global(plgpu.SemaphoreType.REGULAR)
    b = lax.axis_index("x")
    pl.semaphore_wait(sem, n - 1 - b, decrement=False)
    o_ref[b] = pl.semaphore_read(sem)
    pl.semaphore_signal(sem)

  got = plgpu.kernel(body, out_shape=S((n,), jnp.int32), grid=(n,), grid_names=("x",))()
  np.testing.assert_array_equal(got, n - 1 - np.arange(n))


@pytest.mark.interpreter
@REFUSES_SEMAPHORES
def test_semaphore_arrays_and_several_globals():
  def body(o_ref, sems):
    g1 = pl.get_global(plgpu.SemaphoreType.REGULAR)
    g2 = pl.get_global(plgpu.SemaphoreType.REGULAR)
    pl.semaphore_signal(sems.at[1], 5)
    pl.semaphore_signal(sems.at[2], 2)
    pl.semaphore_signal(g1, 7)
    pl.semaphore_signal(g2, 11)
    pl.semaphore_wait(sems.at[1], 4, decrement=False)
    pl.semaphore_wait(sems.at[2], 2)
    o_ref[0] = pl.semaphore_read(sems.at[0])
    o_ref[1] = pl.semaphore_read(sems.at[1])
    o_ref[2] = pl.semaphore_read(sems.at[2])
    o_ref[3] = pl.semaphore_read(g1)
    o_ref[4] = pl.semaphore_read(g2)

  got = plgpu.kernel(body, out_shape=S((5,), jnp.int32),
                     scratch_shapes=[plgpu.SemaphoreType.REGULAR((3,))])()
  np.testing.assert_array_equal(got, [0, 5, 0, 7, 11])


@pytest.mark.interpreter
@REFUSES_SEMAPHORES
def test_semaphore_wait_nothing_signals_names_semaphore_block_and_line():
  def body(o_ref):
    sem = pl.get_global(plgpu.SemaphoreType.REGULAR)
    pl.semaphore_signal(sem)
    pl.semaphore_wait(sem, 4)   # 3 blocks signal once each: it never reaches 4
    o_ref[...] = jnp.ones(o_ref.shape, o_ref.dtype)

  with pytest.raises(KernelCheckError, match=r"deadlock in blocks \(x=0\), \(x=1\), \(x=2\): "
                                             r"every thread waits.*the kernel of block \(x=2\) "
                                             r"waits for semaphore pl.get_global #0 to reach 4 "
                                             r"\(it holds 3\) at " + at_line(body, "(sem, 4)")):
    plgpu.kernel(body, out_shape=S((8,), jnp.float32), grid=(3,), grid_names=("x",))()


@pytest.mark.interpreter
@REFUSES_SEMAPHORES
def test_scratch_semaphore_wait_is_a_deadlock_in_its_block():
  def body(o_ref, sem):
    pl.semaphore_wait(sem, 1)
    o_ref[...] = jnp.ones(o_ref.shape, o_ref.dtype)

  with pytest.raises(KernelCheckError, match=r"deadlock in block \(x=0\): every thread waits.*"
                                             r"semaphore sem to reach 1 \(it holds 0\) at "
                                             + at_line(body, "semaphore_wait")):
    plgpu.kernel(body, out_shape=S((8,), jnp.float32), grid=(2,), grid_names=("x",),
                 scratch_shapes=[plgpu.SemaphoreType.REGULAR])()


@pytest.mark.interpreter   # the interpreter's errors (Gluon refuses semaphores by name)
def test_semaphore_errors_say_what_to_do():
  def call(op):
    def body(o_ref, sems):
      op(sems)
      o_ref[...] = jnp.ones(o_ref.shape, o_ref.dtype)
    return plgpu.kernel(body, out_shape=S((8,), jnp.float32),
                        scratch_shapes=[plgpu.SemaphoreType.REGULAR((2,))])()

  with pytest.raises(ValueError, match=r"takes one semaphore.*sems.at\[i\]"):
    call(lambda s: pl.semaphore_signal(s))
  with pytest.raises(ValueError, match="memory_scope must be 'gpu' or 'sys'"):
    call(lambda s: plgpu.semaphore_wait(s.at[0], memory_scope="cta"))
  with pytest.raises(ValueError, match="device_id=.* to sems, in SEMAPHORE: only the kernel's GMEM "
                                       "operands, outputs and pl.get_global semaphores"):
    call(lambda s: pl.semaphore_signal(s.at[0], device_id=0))
  with pytest.raises(NotImplementedError, match="core_index"):
    call(lambda s: pl.semaphore_signal(s.at[0], core_index=1))


# =============================================================================================
# 6. RefUnion
# =============================================================================================

def test_ref_union_groups_used_one_after_the_other():
  """Group 0 (a float32 buffer) doubles ``x``; then group 1 (a pair of bfloat16 buffers, in a
  nested list) adds ``y``s; each result leaves through TMA."""
  x, y = rand(16, (64, 32)), rand(17, (2, 128), jnp.bfloat16)

  def body(x_ref, y_ref, ox_ref, oy_ref, union):
    a, [b, [c]] = union
    a[...] = x_ref[...] * 2.0
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(a, ox_ref)
    plgpu.wait_smem_to_gmem(0)
    b[...] = y_ref[0] + y_ref[1]
    c[...] = y_ref[1]
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(b, oy_ref.at[0])
    plgpu.copy_smem_to_gmem(c, oy_ref.at[1])
    plgpu.wait_smem_to_gmem(0)
    assert union[1][1][0] is c and len(union) == 2

  union = plgpu.RefUnion(plgpu.SMEM((64, 32), jnp.float32),
                         [plgpu.SMEM((128,), jnp.bfloat16), [plgpu.SMEM((128,), jnp.bfloat16)]])
  f = plgpu.kernel(body, out_shape=(S(x.shape, x.dtype), S(y.shape, y.dtype)),
                   scratch_shapes=[union])
  ox, oy = f(x, y)
  np.testing.assert_allclose(ox, x * 2.0, **EXACT)
  np.testing.assert_array_equal(np.asarray(oy, np.float32),
                                np.asarray(np.stack([y[0] + y[1], y[1]]), np.float32))


def test_ref_union_in_run_scoped_and_its_errors():
  x = rand(18, (128,))

  def body(x_ref, o_ref):
    def scope(union):
      [smem] = union
      with pytest.raises(ValueError, match="can't be assigned to"):
        union[...] = x_ref[...]
      smem[...] = x_ref[...] + 1.0
      o_ref[...] = smem[...]
    pl.run_scoped(scope, plgpu.RefUnion(plgpu.SMEM((128,), jnp.float32)))

  np.testing.assert_allclose(plgpu.kernel(body, out_shape=S(x.shape, x.dtype))(x), x + 1.0, **EXACT)
  with pytest.raises(TypeError, match="pytrees of plgpu.SMEM"):
    plgpu.RefUnion(jnp.float32)


@pytest.mark.interpreter
def test_reading_a_ref_union_member_another_group_overwrote_is_an_error():
  x = rand(19, (128,))

  def body(x_ref, o_ref, union):
    a, b = union
    a[...] = x_ref[...]
    b[...] = jnp.zeros((64,), jnp.bfloat16)   # b shares a's memory
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(a, o_ref)
    plgpu.wait_smem_to_gmem(0)

  union = plgpu.RefUnion(plgpu.SMEM((128,), jnp.float32), plgpu.SMEM((64,), jnp.bfloat16))
  with pytest.raises(KernelCheckError, match=r"copy_smem_to_gmem reads SMEM .* after a write to "
                                             r"SMEM .* at " + at_line(body, "jnp.zeros((64,)")
                                             + r", which shares its memory.*RefUnion"):
    plgpu.kernel(body, out_shape=S(x.shape, x.dtype), scratch_shapes=[union])(x)


@pytest.mark.interpreter   # semaphores: the interpreter's (Triton refuses them)
def test_pl_kernel_get_global_counts_programs():
  """pl.get_global in pl.kernel (programs one at a time): each of 6 programs adds 2 and reads."""
  def body(o_ref):
    sem = pl.get_global(pl.SemaphoreType.REGULAR)
    pl.semaphore_signal(sem, 2)
    o_ref[pl.program_id(0)] = pl.semaphore_read(sem)

  got = pl.kernel(body, out_type=S((6,), jnp.int32), mesh=pl.Mesh((6,), ("x",)))()
  np.testing.assert_array_equal(got, 2 * np.arange(1, 7))


def test_run_state_body_that_returns_a_value_is_an_error():
  """pl.run_state returns the Refs' final values; a body's own result would be dropped, which
  JAX's test_fori_loop_accumulator expects to be the result (on JAX's GPU lowering only)."""
  x = rand(20, (64, 64), jnp.float16)

  def kernel(i_ref, o_ref):
    def scope(acc_ref):
      return lax.fori_loop(0, 4, lambda _, v: v + acc_ref[...], acc_ref[...])
    o_ref[...] = pl.run_state(scope)(plgpu.ACC.init(i_ref[...].astype(jnp.float32)))

  with pytest.raises(ValueError, match=r"pl.run_state: the function scope returned float32\[64,64\]"
                                       r".*write the result into one of them"):
    plgpu.kernel(kernel, out_shape=S((64, 64), jnp.float32))(x)


def test_run_state_writes_its_refs():
  x = rand(21, (64, 64), jnp.float16)

  def kernel(i_ref, o_ref):
    def scope(acc_ref):
      acc_ref[...] = lax.fori_loop(0, 4, lambda _, v: v + acc_ref[...], acc_ref[...])
    o_ref[...] = pl.run_state(scope)(plgpu.ACC.init(i_ref[...].astype(jnp.float32)))

  got = plgpu.kernel(kernel, out_shape=S((64, 64), jnp.float32))(x)
  np.testing.assert_allclose(got, x.astype(np.float32) * 5, rtol=1e-6, atol=0)


def test_pallas_call_scratch_with_mosaic_primitives_is_refused_clearly():
  """(Not new in issue 27, found with its harness: it was a KeyError.) The same kernel through
  plgpu.kernel runs."""
  x = rand(22, (128,))

  def body(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    o_ref[...] = smem[...] + 1.0

  scratch = [plgpu.SMEM((128,), jnp.float32), plgpu.Barrier()]
  f = pl.pallas_call(body, out_shape=S(x.shape, x.dtype), scratch_shapes=scratch)
  with pytest.raises(NotImplementedError, match=r"scratch_shapes of a pallas_call .* plgpu.kernel"):
    f(x)
  np.testing.assert_allclose(plgpu.kernel(body, out_shape=S(x.shape, x.dtype),
                                          scratch_shapes=scratch)(x), x + 1.0, **EXACT)

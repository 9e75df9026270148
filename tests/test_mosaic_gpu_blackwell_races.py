"""The ordering rules of Blackwell's tensor cores, case by case, as JAX's own interpreter
decides them (the scenarios of JAX's ``gpu_pallas_interpret_tcgen05_race_detection_test.py``,
written again here): each kernel either keeps the rules, and runs, or breaks one, and pallax's
interpreter stops it with a ``KernelCheckError``.

What is ordered (no wait needed): MMAs into one accumulator; an SMEM->TMEM copy then an MMA
reading it; across threads, when the earlier operation was issued before an arrival on an
``orders_tensor_core`` barrier the later thread waited on. What is not: a TMEM store and a read
without ``commit_tmem``; a TMEM load and an overwrite without ``wait_load_tmem`` (in the loading
thread); an MMA or copy and a read of its result, or an overwrite of its operands, without a
wait on a barrier its completion arrives on (``tcgen05_commit_arrive`` covers the calling
thread's operations only; a TMA landing on the same barrier proves nothing).

Every case runs with two threads of a block or, where JAX also does, four warps of one thread
(``pl.core_map(plgpu.WarpMesh(...))``).
"""
import functools
import itertools

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu
from pallax import KernelCheckError

# The Gluon backend compiles these kernels for sm_100a (gluon_check.py), but for GMEM scratch and
# per-warp code that computes with register arrays (core_map over warps).
pytestmark = [pytest.mark.interpreter,
              pytest.mark.gluon_refuses("scratch of type GPUMemoryRef(shape=(128, 128), "
                                        "dtype=dtype('float16'), memory_space=<MemorySpace.GMEM",
                                        "warp-level code computes with scalars only")]

ACC, LHS, RHS = (128, 128), (128, 128), (128, 128)
F32, F16 = jnp.float32, jnp.float16
CASES = []


def case(*params, race):
  """Registers ``make(*params)`` (a kernel of no operands) as a case; ``race``: a function of the
  params saying whether it breaks a rule."""
  def register(make):
    grid = params or [()]
    for p in itertools.product(*grid) if params else [()]:
      CASES.append(pytest.param(make, p, race(*p), id=f"{make.__name__}-{'-'.join(map(str, p))}"))
    return make
  return register


def tmem(shape=ACC, dtype=F32, **kw):
  return plgpu.TMEM(shape, dtype, packed=True if dtype != F32 else None, **kw)


def tc_barrier(**kw):
  return plgpu.Barrier(orders_tensor_core=True, **kw)


def kernel(threads=1, warps=False, **scratch):
  """A kernel writing a float32 ACC-shaped output; ``threads`` > 1 with ``warps``: that many
  warps of one thread instead of threads."""
  kw = {} if threads == 1 or warps else dict(num_threads=threads, thread_name="t")
  make = functools.partial(plgpu.kernel, out_shape=jax.ShapeDtypeStruct(ACC, F32),
                           scratch_shapes=scratch, **kw)

  def decorator(body):
    def run(o_ref, **scratch_refs):
      o_ref[...] = jnp.zeros(ACC, F32)   # the output is written, whatever the case reads
      if warps:
        pl.core_map(plgpu.WarpMesh(axis_name="t"))(lambda: body(o_ref, **scratch_refs))
      else:
        body(o_ref, **scratch_refs)
    run.__name__ = body.__name__
    return make(run)
  return decorator


def fill(*refs):
  for r in refs:
    r[...] = jnp.full(r.shape, 0.5, r.dtype)
  plgpu.commit_smem()


def on(thread):
  return pl.when(lax.axis_index("t") == thread)


# --- one thread --------------------------------------------------------------------------------

@case(["store", "load"], ["none", "commit_tmem", "wait_load_tmem", "commit_arrive"],
      race=lambda first, wait: (first, wait) not in {("store", "commit_tmem"),
                                                    ("load", "wait_load_tmem")})
def store_and_load(first, wait):
  @kernel(t=tmem(), bar=tc_barrier())
  def k(o_ref, t, bar):
    if first == "load":   # something to load
      plgpu.async_store_tmem(t, jnp.ones(ACC, F32))
      plgpu.commit_tmem()
      o_ref[...] = plgpu.async_load_tmem(t)
    else:
      plgpu.async_store_tmem(t, jnp.full(ACC, 42.0, F32))
    if wait == "commit_tmem":
      plgpu.commit_tmem()
    elif wait == "wait_load_tmem":
      plgpu.wait_load_tmem()
    elif wait == "commit_arrive":   # tracks MMAs and copies, not loads and stores
      plgpu.tcgen05_commit_arrive(bar)
      plgpu.barrier_wait(bar)
    if first == "store":
      o_ref[...] = plgpu.async_load_tmem(t)
    else:
      plgpu.async_store_tmem(t, jnp.zeros(ACC, F32))
      plgpu.commit_tmem()
  return k


@case([False, True], ["lhs", "acc"], race=lambda commit, target: not commit)
def store_then_mma(commit, target):
  @kernel(acc=tmem(), lhs=tmem(LHS, F16), b=plgpu.SMEM(RHS, F16), bar=tc_barrier())
  def k(o_ref, acc, lhs, b, bar):
    fill(b)
    plgpu.async_store_tmem(lhs if target == "lhs" else acc,
                           jnp.ones(LHS, F16) if target == "lhs" else jnp.zeros(ACC, F32))
    if target == "acc":
      plgpu.async_store_tmem(lhs, jnp.ones(LHS, F16))
    if commit:
      plgpu.commit_tmem()
    plgpu.tcgen05_mma(acc, lhs, b, bar, accumulate=target == "acc")
    plgpu.barrier_wait(bar)
    o_ref[...] = plgpu.async_load_tmem(acc)
  return k


@case([False, True], ["mma", "copy"], race=lambda wait, writer: not wait)
def load_then_overwrite(wait, writer):
  @kernel(acc=tmem(), a=plgpu.SMEM(LHS, F16), b=plgpu.SMEM(RHS, F16), src=plgpu.SMEM(ACC, F32),
          bar=tc_barrier())
  def k(o_ref, acc, a, b, src, bar):
    fill(a, b, src)
    plgpu.async_store_tmem(acc, jnp.zeros(ACC, F32))
    plgpu.commit_tmem()
    o_ref[...] = plgpu.async_load_tmem(acc)
    if wait:
      plgpu.wait_load_tmem()
    if writer == "mma":
      plgpu.tcgen05_mma(acc, a, b, bar, accumulate=False)
    else:
      plgpu.async_copy_smem_to_tmem(src, acc)
      plgpu.tcgen05_commit_arrive(bar)
    plgpu.barrier_wait(bar)
  return k


@case(["mma_barrier", "commit_arrive", "none"], [False, True],
      race=lambda arrive, wait: arrive == "none" or not wait)
def read_the_accumulator(arrive, wait):
  @kernel(acc=tmem(), a=plgpu.SMEM(LHS, F16), b=plgpu.SMEM(RHS, F16), bar=tc_barrier())
  def k(o_ref, acc, a, b, bar):
    fill(a, b)
    plgpu.tcgen05_mma(acc, a, b, bar if arrive == "mma_barrier" else None, accumulate=False)
    if arrive == "commit_arrive":
      plgpu.tcgen05_commit_arrive(bar)
    if wait and arrive != "none":
      plgpu.barrier_wait(bar)
    o_ref[...] = plgpu.async_load_tmem(acc)
  return k


@case([True, False], race=lambda first: not first)
def commit_covers_earlier_mmas_only(first):
  @kernel(acc1=tmem(), acc2=tmem(), a=plgpu.SMEM(LHS, F16), b=plgpu.SMEM(RHS, F16),
          bar1=tc_barrier(), bar2=tc_barrier())
  def k(o_ref, acc1, acc2, a, b, bar1, bar2):
    fill(a, b)
    plgpu.tcgen05_mma(acc1, a, b, accumulate=False)
    plgpu.tcgen05_commit_arrive(bar1)
    plgpu.tcgen05_mma(acc2, a, b, accumulate=False)
    plgpu.barrier_wait(bar1)
    o_ref[...] = plgpu.async_load_tmem(acc1 if first else acc2)
    plgpu.tcgen05_commit_arrive(bar2)
    plgpu.barrier_wait(bar2)
  return k


@case([False, True], ["store", "tma", "commit_smem"], race=lambda wait, writer: not wait)
def smem_operand(wait, writer):
  @kernel(acc=tmem(), a=plgpu.SMEM(LHS, F16), b=plgpu.SMEM(RHS, F16), g=plgpu.GMEM(RHS, F16),
          bar=tc_barrier(), tma=plgpu.Barrier())
  def k(o_ref, acc, a, b, g, bar, tma):
    if writer == "commit_smem":   # written from registers: commit_smem first (wait: it is)
      a[...] = jnp.ones(LHS, F16)
      b[...] = jnp.ones(RHS, F16)
      if wait:
        plgpu.commit_smem()
      plgpu.tcgen05_mma(acc, a, b, bar, accumulate=False)
      plgpu.barrier_wait(bar)
      return
    fill(a, b)
    g[...] = jnp.ones(RHS, F16)
    plgpu.tcgen05_mma(acc, a, b, bar, accumulate=False)
    if wait:
      plgpu.barrier_wait(bar)
    if writer == "store":
      b[...] = jnp.zeros(RHS, F16)
    else:
      plgpu.copy_gmem_to_smem(g, b, tma)
      plgpu.barrier_wait(tma)
    if not wait:
      plgpu.barrier_wait(bar)
  return k


@case([False, True], race=lambda wait: not wait)
def tmem_operand_overwritten(wait):
  @kernel(acc=tmem(), lhs=tmem(LHS, F16), b=plgpu.SMEM(RHS, F16), bar=tc_barrier())
  def k(o_ref, acc, lhs, b, bar):
    fill(b)
    plgpu.async_store_tmem(lhs, jnp.ones(LHS, F16))
    plgpu.commit_tmem()
    plgpu.tcgen05_mma(acc, lhs, b, bar, accumulate=False)
    if wait:
      plgpu.barrier_wait(bar)
    plgpu.async_store_tmem(lhs, jnp.zeros(LHS, F16))
    plgpu.commit_tmem()
    if not wait:
      plgpu.barrier_wait(bar)
  return k


@case([False, True], ["overwrite_source", "load_result"], race=lambda wait, what: not wait)
def copy_to_tmem(wait, what):
  @kernel(t=tmem(), src=plgpu.SMEM(ACC, F32), bar=tc_barrier())
  def k(o_ref, t, src, bar):
    fill(src)
    plgpu.async_copy_smem_to_tmem(src, t)
    if wait:
      plgpu.tcgen05_commit_arrive(bar)
      plgpu.barrier_wait(bar)
    if what == "overwrite_source":
      src[...] = jnp.zeros(ACC, F32)
    else:
      o_ref[...] = plgpu.async_load_tmem(t)
    if not wait:
      plgpu.tcgen05_commit_arrive(bar)
      plgpu.barrier_wait(bar)
  return k


@case(["store", "copy", "mma"], race=lambda second: second != "mma")
def after_a_copy(second):
  """A copy then an MMA reading it is a pipelined pair; a copy then a store or a copy to the
  same TMEM is not."""
  @kernel(acc=tmem(), lhs=tmem(LHS, F16), a=plgpu.SMEM(LHS, F16), b=plgpu.SMEM(RHS, F16),
          bar=tc_barrier())
  def k(o_ref, acc, lhs, a, b, bar):
    fill(a, b)
    plgpu.async_copy_smem_to_tmem(a, lhs)
    if second == "mma":
      plgpu.tcgen05_mma(acc, lhs, b, bar, accumulate=False)
      plgpu.barrier_wait(bar)
      o_ref[...] = plgpu.async_load_tmem(acc)
      return
    if second == "store":
      plgpu.async_store_tmem(lhs, jnp.zeros(LHS, F16))
      plgpu.commit_tmem()
    else:
      plgpu.async_copy_smem_to_tmem(a, lhs)
    plgpu.tcgen05_commit_arrive(bar)
    plgpu.barrier_wait(bar)
  return k


@case([False, True], race=lambda wait: not wait)
def copy_into_an_accumulator_in_flight(wait):
  @kernel(acc=tmem(), a=plgpu.SMEM(LHS, F16), b=plgpu.SMEM(RHS, F16), src=plgpu.SMEM(ACC, F32),
          bar1=tc_barrier(), bar2=tc_barrier())
  def k(o_ref, acc, a, b, src, bar1, bar2):
    fill(a, b, src)
    plgpu.tcgen05_mma(acc, a, b, accumulate=False)
    if wait:
      plgpu.tcgen05_commit_arrive(bar1)
      plgpu.barrier_wait(bar1)
    plgpu.async_copy_smem_to_tmem(src, acc)   # mma -> copy: not a pipelined pair
    plgpu.tcgen05_commit_arrive(bar2)
    plgpu.barrier_wait(bar2)
  return k


@case([0, 1, 2], race=lambda which: False)
def one_mma_many_barriers(which):
  @kernel(acc=tmem(), a=plgpu.SMEM(LHS, F16), b=plgpu.SMEM(RHS, F16), bar=tc_barrier(num_barriers=3))
  def k(o_ref, acc, a, b, bar):
    fill(a, b)
    plgpu.tcgen05_mma(acc, a, b, bar.at[0], accumulate=False)
    plgpu.tcgen05_commit_arrive(bar.at[1])
    plgpu.tcgen05_commit_arrive(bar.at[2])
    plgpu.barrier_wait(bar.at[which])
    o_ref[...] = plgpu.async_load_tmem(acc)
    for i in {0, 1, 2} - {which}:
      plgpu.barrier_wait(bar.at[i])
  return k


@case(race=lambda: True)
def tma_landing_on_the_mma_barrier():
  @kernel(acc=tmem(), a=plgpu.SMEM(LHS, F16), b=plgpu.SMEM(RHS, F16), d=plgpu.SMEM(RHS, F16),
          g=plgpu.GMEM(RHS, F16), bar=tc_barrier())
  def k(o_ref, acc, a, b, d, g, bar):
    fill(a, b)
    g[...] = jnp.ones(RHS, F16)
    plgpu.copy_gmem_to_smem(g, d, bar)
    plgpu.tcgen05_mma(acc, a, b, bar, accumulate=False)
    plgpu.barrier_wait(bar)   # the copy's completion, or the MMA's?
    o_ref[...] = plgpu.async_load_tmem(acc)
    plgpu.barrier_wait(bar)
  return k


# --- threads and warps ---------------------------------------------------------------------------

@case([False, True], [False, True], race=lambda warps, mma_barrier: False)
def mmas_of_two_threads_in_order(warps, mma_barrier):
  @kernel(threads=2, warps=warps, acc=tmem(), a=plgpu.SMEM(LHS, F16), b=plgpu.SMEM(RHS, F16),
          done=tc_barrier(), turn=tc_barrier())
  def k(o_ref, acc, a, b, done, turn):
    @on(0)
    def _():
      fill(a, b)
      if mma_barrier:
        plgpu.tcgen05_mma(acc, a, b, turn, accumulate=False)
      else:
        plgpu.tcgen05_mma(acc, a, b, accumulate=False)
        plgpu.barrier_arrive(turn)

    @on(1)
    def _():
      plgpu.barrier_wait(turn)
      plgpu.tcgen05_mma(acc, a, b, done)
      plgpu.barrier_wait(done)
      o_ref[...] = plgpu.async_load_tmem(acc)
  return k


@case([False, True], race=lambda warps: True)
def mmas_of_two_threads_unordered(warps):
  """Thread 0's second MMA is issued after the arrival thread 1 waits for: the two MMAs into
  one accumulator are not ordered."""
  @kernel(threads=2, warps=warps, acc=tmem(), a=plgpu.SMEM(LHS, F16), b=plgpu.SMEM(RHS, F16),
          bar0=tc_barrier(), bar1=tc_barrier(), turn=tc_barrier())
  def k(o_ref, acc, a, b, bar0, bar1, turn):
    @on(0)
    def _():
      fill(a, b)
      plgpu.tcgen05_mma(acc, a, b, accumulate=False)
      plgpu.barrier_arrive(turn)
      plgpu.tcgen05_mma(acc, a, b, bar0)
      plgpu.barrier_wait(bar0)

    @on(1)
    def _():
      plgpu.barrier_wait(turn)
      plgpu.tcgen05_mma(acc, a, b, bar1)
      plgpu.barrier_wait(bar1)
  return k


@case(["store", "load"], [False, True], [False, True],
      race=lambda op, producer_waits, consumer_waits: not producer_waits)
def handoff_between_threads(op, producer_waits, consumer_waits):
  """The thread that stored or loaded must commit or wait before it arrives; the receiving
  thread's own commit or wait covers only its own accesses."""
  @kernel(threads=2, warps=consumer_waits, t=tmem(), turn=tc_barrier())   # (warps or threads)
  def k(o_ref, t, turn):
    @on(0)
    def _():
      plgpu.async_store_tmem(t, jnp.ones(ACC, F32))
      if op == "load":
        plgpu.commit_tmem()
        o_ref[...] = plgpu.async_load_tmem(t)
      if producer_waits:
        plgpu.commit_tmem() if op == "store" else plgpu.wait_load_tmem()
      plgpu.barrier_arrive(turn)

    @on(1)
    def _():
      plgpu.barrier_wait(turn)
      if consumer_waits:
        plgpu.commit_tmem() if op == "store" else plgpu.wait_load_tmem()
      if op == "store":
        o_ref[...] = plgpu.async_load_tmem(t)
      else:
        plgpu.async_store_tmem(t, jnp.full(ACC, 2.0, F32))
        plgpu.commit_tmem()
  return k


@case([False, True], race=lambda warps: True)
def commit_arrive_of_another_thread(warps):
  @kernel(threads=2, warps=warps, acc=tmem(), a=plgpu.SMEM(LHS, F16), b=plgpu.SMEM(RHS, F16),
          turn=tc_barrier(), mine=tc_barrier(), theirs=tc_barrier())
  def k(o_ref, acc, a, b, turn, mine, theirs):
    @on(0)
    def _():
      fill(a, b)
      plgpu.tcgen05_mma(acc, a, b, accumulate=False)
      plgpu.barrier_arrive(turn)
      plgpu.tcgen05_commit_arrive(mine)
      plgpu.barrier_wait(mine)

    @on(1)
    def _():
      plgpu.barrier_wait(turn)
      plgpu.tcgen05_commit_arrive(theirs)   # thread 1 issued nothing: an empty commit
      plgpu.barrier_wait(theirs)
      o_ref[...] = plgpu.async_load_tmem(acc)
  return k


@case([False, True], race=lambda warps: False)
def copies_of_two_threads_then_an_mma(warps):
  @kernel(threads=3, warps=warps, acc_smem=plgpu.SMEM(ACC, F32), acc=tmem(), lhs=tmem(LHS, F16),
          a=plgpu.SMEM(LHS, F16), b=plgpu.SMEM(RHS, F16), ready=tc_barrier(num_arrivals=2),
          done=tc_barrier())
  def k(o_ref, acc_smem, acc, lhs, a, b, ready, done):
    @on(0)
    def _():
      fill(a)
      plgpu.async_copy_smem_to_tmem(a, lhs)
      plgpu.barrier_arrive(ready)

    @on(1)
    def _():
      fill(acc_smem)
      plgpu.async_copy_smem_to_tmem(acc_smem, acc)
      plgpu.barrier_arrive(ready)

    @on(2)
    def _():
      plgpu.barrier_wait(ready)
      fill(b)
      plgpu.tcgen05_mma(acc, lhs, b, done)
      plgpu.barrier_wait(done)
      o_ref[...] = plgpu.async_load_tmem(acc)
  return k


@pytest.mark.parametrize("make,params,race", CASES)
def test_race_rules(make, params, race):
  k = make(*params)
  if race:
    with pytest.raises(KernelCheckError) as e:
      k()
    print(e.value)
    assert "deadlock" not in str(e.value)   # a broken rule, named, not a hang
  else:
    k()

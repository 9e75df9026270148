"""What ``plgpu.barrier_test``, the atomics (``plgpu.atomic_add``, ...) and semaphores
(``pl.semaphore_signal``/``wait``/``read`` in Mosaic GPU kernels) mean, as rules of the eager
interpreter.

- ``barrier_test`` is a ``barrier_wait`` that does not wait: it says whether the phase this
  thread waits for next is complete (and if so, the thread moves on to the next phase). A thread
  whose test fails lets the others run before it goes on, so that a loop polling a barrier ends.
- An atomic updates each element of an SMEM or GMEM view in one step; other threads see every
  update (in the interpreter a thread runs until it waits, so no update is lost either way).
- A semaphore is an int32 counter. ``semaphore_wait`` waits until it holds the value, then
  subtracts it. Scratch semaphores belong to one block; ``pl.get_global`` semaphores are the
  call's: a block waiting on one lets the next block of the grid start, as on a GPU where
  blocks run at the same time. A wait nothing can satisfy is reported as a deadlock.
"""
from __future__ import annotations

import numpy as np

from pallax._src.interpret import eager
from pallax._src.interpret.eager import View, fail, flat_indices, rule
from pallax._src.mosaic_gpu import core as mc
from pallax._src.mosaic_gpu import primitives as mp
from pallax._src.mosaic_gpu import semantics as ms


def _view(invals, eqn) -> tuple[View, list]:
  (ref,), rest = mp.split_refs(invals, eqn.params["trees"])
  return ref[0].at(ref[1]), rest


# --- barrier_test ----------------------------------------------------------------------------

@rule(mp.barrier_test_p)
def _barrier_test(th, eqn, invals):
  view, _ = _view(invals, eqn)
  i = ms.barrier_index(th, view, "barrier_test")
  key, done = (view.buf, i), view.buf.state["completions"].reshape(-1)
  view.buf.state["waiters"][i].add(th)
  seen = ms.thread_state(th).observed.get(key, 0)
  if done[i] - seen >= 2:
    fail(th, f"barrier_test on {ms.barrier_name(view.buf, i)}: the barrier completed "
             f"{done[i] - seen} times since this thread last saw it complete; on the GPU the "
             "test would see the wrong phase")
  complete = bool(done[i] > seen)
  if complete:
    ms.thread_state(th).observed[key] = seen + 1
  else:
    n = view.buf.kind.num_arrivals
    arrivals = view.buf.state["arrivals"].reshape(-1)
    yield eager.Wait(lambda: True, f"{ms.barrier_name(view.buf, i)} with barrier_test (phase "
                                   f"{seen}, {arrivals[i]}/{n} arrivals)", poll=True)
  return [np.bool_(complete)]


# --- atomics ---------------------------------------------------------------------------------

_ATOMIC = {"add": np.add, "max": np.maximum, "min": np.minimum, "and": np.bitwise_and,
           "or": np.bitwise_or, "xor": np.bitwise_xor}


@rule(mp.atomic_p)
def _atomic(th, eqn, invals):
  view, (value,) = _view(invals, eqn)
  op = eqn.params["op"]
  what = f"plgpu.atomic_{op}"
  if view.buf.space not in ("smem", "gmem"):
    fail(th, f"{what} updates SMEM or GMEM, but {view.buf.name} is in {view.buf.space.upper()}")
  for hook in eager.ON_READ:
    hook(th, view, "atomic")
  for hook in eager.ON_WRITE:
    hook(th, view, "atomic")
  eager.check_initialized(th, view, what)
  try:
    old = eager.read(view)
    eager.write(view, _ATOMIC[op](old, np.asarray(value)).astype(old.dtype))
  except IndexError as e:
    fail(th, str(e), IndexError)
  yield from ()
  return []


# --- semaphores ------------------------------------------------------------------------------

def _semaphore(th, view: View, what: str) -> tuple[np.ndarray, int, str]:
  """(the counters, flat index, a name) of the one semaphore ``view`` selects."""
  if view.buf.space not in ("semaphore", "gmem") or not np.issubdtype(view.buf.data.dtype,
                                                                      np.integer):
    fail(th, f"{what} takes a semaphore (plgpu.SemaphoreType.REGULAR scratch or "
             f"pl.get_global(...)), but {view.buf.name} is {view.buf.space.upper()} memory")
  idx = flat_indices(view)
  if idx.size != 1:
    fail(th, f"{what}: out-of-bounds semaphore index, past the end of {view.buf.name} "
             f"({view.buf.data.size} semaphores)", IndexError)
  i = int(idx[0])
  name = f"{view.buf.name}[{i}]" if view.buf.data.size > 1 else view.buf.name
  return view.buf.data.reshape(-1), i, name


@rule(mp.semaphore_signal_p)
def _signal(th, eqn, invals):
  view, (inc,) = _view(invals, eqn)
  counts, i, _ = _semaphore(th, view, "semaphore_signal")
  counts[i] += int(inc)
  eager.notify(th)
  yield from ()
  return []


@rule(mp.semaphore_wait_p)
def _wait(th, eqn, invals):
  view, (value,) = _view(invals, eqn)
  counts, i, name = _semaphore(th, view, "semaphore_wait")
  value = int(value)
  if counts[i] < value:
    yield eager.Wait(lambda: counts[i] >= value,
                     lambda: f"semaphore {name} to reach {value} (it holds {counts[i]})",
                     shared=bool(view.buf.state.get("global")))
  if eqn.params["decrement"]:
    counts[i] -= value
    eager.notify(th)
  return []


@rule(mp.semaphore_read_p)
def _read(th, eqn, invals):
  view, _ = _view(invals, eqn)
  counts, i, name = _semaphore(th, view, "semaphore_read")
  value = np.int32(counts[i])
  # The others run before this thread goes on: a loop polling the semaphore then ends.
  yield eager.Wait(lambda: True, f"semaphore {name} with semaphore_read", poll=True,
                   shared=bool(view.buf.state.get("global")))
  return [value]


eager.ALLOCATORS[mc.SemaphoreType] = eager.semaphores

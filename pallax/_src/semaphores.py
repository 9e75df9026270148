"""Semaphores (``pl.semaphore_signal``/``wait``/``read``) and ``pl.get_global``.

In ``pallas_call`` kernels, whose programs the interpreter runs one at a time, a semaphore is an
int32 Ref read and written, and a wait that cannot succeed then is a failed check. A kind of
kernel whose threads and blocks wait on each other (Mosaic GPU kernels) makes them its own
primitives while its body is traced (``semaphores_by``).
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from pallax._src import core as pc


# pallax's semaphores are int32 counters: jnp.issubdtype(sem.dtype, pl.semaphore) holds for them
# (and for any int32 array: pallax has no separate semaphore dtype).
semaphore = np.int32


class SemaphoreOps(NamedTuple):
  """How ``pl.semaphore_*`` work in a kind of kernel whose threads and blocks wait on each
  other (Mosaic GPU kernels: ``mosaic_gpu/primitives.py``)."""
  signal: Callable[..., None]
  wait: Callable[..., None]
  read: Callable[..., jax.Array]


_semaphore_ops = threading.local()


@contextlib.contextmanager
def semaphores_by(ops: SemaphoreOps):
  """While a kernel body is traced: ``pl.semaphore_*`` call ``ops`` (in pallas_call kernels,
  whose programs run one at a time in the interpreter, they are Ref reads and writes)."""
  stack = _semaphore_ops.__dict__.setdefault("stack", [])
  stack.append(ops)
  try:
    yield
  finally:
    stack.pop()


def _ops() -> SemaphoreOps | None:
  stack = getattr(_semaphore_ops, "stack", [])
  return stack[-1] if stack else None


def semaphore_read(sem_or_view) -> jax.Array:
  if _ops() is not None:
    return _ops().read(sem_or_view)
  return sem_or_view[...]


def semaphore_signal(sem_or_view, inc=1, *, device_id=None, device_id_type=None, core_index=None):
  """Adds ``inc`` to a semaphore."""
  if _ops() is not None:
    return _ops().signal(sem_or_view, inc, device_id=device_id, device_id_type=device_id_type,
                         core_index=core_index)
  if device_id is not None or core_index is not None:
    raise NotImplementedError(
        "semaphore_signal to another device or core is not supported in pallas_call kernels, "
        "whose programs run one at a time; signal other devices from a Mosaic GPU kernel "
        "(plgpu.kernel, with pl.get_global semaphores: docs/distributed.md)")
  sem_or_view[...] = sem_or_view[...] + jnp.asarray(inc, sem_or_view.dtype)


def semaphore_wait(sem_or_view, value=1, *, decrement=True):
  """Waits until a semaphore reaches ``value`` (then subtracts it when ``decrement``)."""
  if _ops() is not None:
    return _ops().wait(sem_or_view, value, decrement=decrement)
  cur = sem_or_view[...]
  checkify.check(jnp.all(cur >= value),
                 "semaphore_wait would block forever: the semaphore is below the awaited "
                 "value and no other program can signal it (programs run one at a time here)")
  if decrement:
    sem_or_view[...] = cur - jnp.asarray(value, cur.dtype)


def get_global(what):
  """A scratch Ref shared by all programs of one call, zero-initialized."""
  env = pc.current_grid_env("get_global")
  if env.globals is None:
    raise NotImplementedError("pl.get_global is only available inside pallas_call kernels")
  if not hasattr(what, "shape") and callable(what):   # pl.SemaphoreType.REGULAR: one semaphore
    what = what(())
  return env.globals(what)

"""Mosaic GPU kernels across devices: ``semaphore_signal_parallel``, and the interpreter's checks of
what devices share (the rules of ``sync.py``/``semantics.py`` are wrapped here, not changed).

- **Races on a peer's memory.** Each block keeps a vector clock: a semaphore signal releases the
  block's clock into the semaphore (then starts a new epoch), a completed wait acquires the
  semaphore's clock. Every access to a buffer that exists on every device (GMEM operands,
  outputs, ``pl.get_global``) is stamped (block, epoch) per element. Two accesses from different
  blocks, one of them a write and one of them made from another device than the buffer's owner,
  race unless the earlier happened before the later (the later block acquired a signal released
  after it). Threads of one block share its clock (their barriers are not followed): the check
  misses some races inside a block but reports none that a semaphore orders. Atomics
  (``plgpu.atomic_*``) are left out: they neither race with each other nor order anything here.
- **A semaphore left non-zero.** A semaphore scratch (``plgpu.SemaphoreType``) must hold 0 when
  its kernel ends: on a GPU its memory is reused, and a count left in it lets a later wait pass
  early. ``pl.get_global`` semaphores start at zero at every call, as JAX's kernels expect.
  Checked in kernels run under ``jax.shard_map`` (where other devices' signals arrive).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np

from pallax._src import remote
from pallax._src.errors import KernelCheckError
from pallax._src.interpret import eager
from pallax._src.interpret.eager import View, fail
from pallax._src.mosaic_gpu import primitives as mp
from pallax._src.mosaic_gpu import semantics as ms


@dataclasses.dataclass(frozen=True)
class SemaphoreSignal:
  """One signal of ``semaphore_signal_parallel``: ``inc`` added to ``ref`` on ``device_id``."""
  ref: Any
  device_id: Any = None
  inc: Any = 1


def semaphore_signal_parallel(*signals: SemaphoreSignal) -> None:
  """Signals several semaphores, possibly on other devices, in no guaranteed order (after the
  writes before it, as each signal). One order of arrival is the order given, which is what the
  interpreter runs."""
  for s in signals:
    mp.semaphore_signal(s.ref, jnp.asarray(s.inc, jnp.int32), device_id=s.device_id)


# --- vector clocks -----------------------------------------------------------------------------

def _clock(block) -> dict:
  return block.state.setdefault("clock", {block: 0})


def _join(into: dict, other: dict) -> None:
  for b, e in other.items():
    if into.get(b, -1) < e:
      into[b] = e


def _sem_view(eqn, invals) -> View:
  (ref,), _ = mp.split_refs(invals, eqn.params["trees"])
  return ref[0].at(ref[1])


def _wrap(prim, before=None, after=None):
  inner = eager.RULES[prim]

  def rule(th, eqn, invals):
    view = _sem_view(eqn, invals)
    if before is not None:
      before(th, view)
    outs = yield from inner(th, eqn, invals)
    if after is not None:
      after(th, view)
    return outs

  eager.RULES[prim] = rule


def _release(th, view: View) -> None:
  clock = _clock(th.block)
  _join(view.buf.state.setdefault("clock", {}), clock)
  clock[th.block] += 1
  view.buf.state["last signal"] = f"{th.describe()} of block {_where(th.block)} at {th.line}"


def _acquire(th, view: View) -> None:
  _join(_clock(th.block), view.buf.state.get("clock", {}))


def _where(block) -> str:
  axes = ", ".join(f"{k}={v}" for k, v in block.axes.items()) or "0"
  dev = ", ".join(f"{k}={v}" for k, v in block.device.items())
  return f"({axes})" + (f" of device ({dev})" if dev else "")


_wrap(mp.semaphore_signal_p, before=_release)
_wrap(mp.semaphore_wait_p, after=_acquire)


# --- races on memory every device has ----------------------------------------------------------

@dataclasses.dataclass
class _Access:
  block: Any
  epoch: int
  what: str      # "thread wg=0 of block (b=0) of device (x=1) at file:line (a load)"


def _owner(buf) -> tuple:
  return tuple(buf.state["peers"].coords.items())


def _check(th, view: View, write: bool, how: str) -> None:
  buf = view.buf
  peers = buf.state.get("peers")
  if peers is None or len(peers.buffers) < 2:
    return
  log = buf.state.setdefault("accesses", {"w": np.full(buf.data.shape, -1, np.int64),
                                          "r": np.full(buf.data.shape, -1, np.int64), "all": []})
  mask = ms.view_mask(view).reshape(buf.data.shape)
  block, clock = th.block, _clock(th.block)
  remote_here = tuple(block.device.items()) != _owner(buf)
  for kind in ("w", "r") if write else ("w",):
    for rec_id in np.unique(log[kind][mask]):
      if rec_id < 0:
        continue
      rec = log["all"][rec_id]
      remote_then = tuple(rec.block.device.items()) != _owner(buf)
      if rec.block is block or not (remote_here or remote_then) or clock.get(rec.block, -1) >= rec.epoch:
        continue
      fail(th, f"{how} {'writes' if write else 'reads'} {_buffer_name(buf)} where {rec.what} "
               f"{'wrote' if kind == 'w' else 'read'} it, with no semaphore between them: on the "
               "GPUs either may come first. Signal a semaphore (pl.semaphore_signal(..., "
               "device_id=...)) after the first and wait on it (pl.semaphore_wait) before the second")
  log["all"].append(_Access(block, clock[block], f"{th.describe()} of block {_where(block)} at "
                                                 f"{th.line} ({how})"))
  log["w" if write else "r"][mask] = len(log["all"]) - 1


def _buffer_name(buf) -> str:
  dev = ", ".join(f"{k}={v}" for k, v in buf.state["peers"].coords.items())
  return f"{buf.name} of device ({dev})"


def _on_access(write: bool):
  def hook(th, view, how):
    if how != "atomic":   # atomics of several devices on one element do not race
      _check(th, view, write, f"a {how}")
  return hook


eager.ON_READ.append(_on_access(False))
eager.ON_WRITE.append(_on_access(True))


def _wrap_copy(prim, gmem_side: int, write: bool, what: str):
  inner = eager.RULES[prim]

  def rule(th, eqn, invals):
    refs, rest = mp.split_refs(invals, eqn.params["trees"])
    if not (eqn.params.get("has_predicate") and not bool(rest[0])):
      ref = refs[gmem_side]
      _check(th, ref[0].at(ref[1]), write, what)
    return (yield from inner(th, eqn, invals))

  eager.RULES[prim] = rule


_wrap_copy(mp.copy_gmem_to_smem_p, 0, False, "copy_gmem_to_smem")
_wrap_copy(mp.copy_smem_to_gmem_p, 1, True, "copy_smem_to_gmem")


# --- semaphores left non-zero ------------------------------------------------------------------

def _remember_semaphores(th, bufs) -> None:
  if not th.block.device:   # only kernels under shard_map, for now: single-device kernels of
    return                  # the suite read a count left over (test_semaphore_between_threads)
  for b in bufs:
    if b.space == "semaphore":
      th.block.run.setdefault("semaphores", []).append((b, th.block))


def _check_zero(params, run: dict) -> None:
  for buf, block in run.get("semaphores", ()):
    left = np.flatnonzero(buf.data.reshape(-1))
    if left.size:
      i = int(left[0])
      name = f"{buf.name}[{i}]" if buf.data.size > 1 else buf.name
      raise KernelCheckError(
          f"{params.name}: semaphore {name} of block {_where(block)} holds "
          f"{int(buf.data.reshape(-1)[i])} when the kernel ends (last signal: "
          f"{buf.state.get('last signal', 'none')}): every signal must be waited for, or on "
          "the GPU the count stays in memory that a later kernel reuses and its waits pass early")


eager.ON_ALLOCATE.append(_remember_semaphores)
eager.AFTER_RUN.append(_check_zero)

"""Kernels of the eager interpreter under ``jax.shard_map``: the mesh's devices simulated in one process.

Where a kernel call is lowered inside ``shard_map``, the mesh axes it names (``lax.axis_index``)
become operands of its host callback: each device runs its kernel with its own coordinates.

A kernel that reaches another device's memory (``plgpu.remote_ref``, semaphore signals with
``device_id``) cannot run device by device: XLA calls each device's host callback (on CPU, from
one thread per device), and these meet (``Rendezvous``): the last to arrive runs every device's
blocks in one scheduler (``run_devices``), where a device's block waiting on a semaphore lets
other blocks start, and a wait nothing can satisfy on any device is a deadlock naming them all.
Every callback then returns its own device's outputs. Each device has its own operands, outputs
and ``pl.get_global`` buffers; a remote reference resolves to the same buffer of the peer
(``remote.Peers``).
"""
from __future__ import annotations

import itertools
import math
import threading

import jax
import numpy as np
from jax import lax

from pallax._src import errors
from pallax._src import jax_internals as ji
from pallax._src import remote
from pallax._src.interpret import eager, uninit

# How long a device's callback waits for the others of its mesh before it reports that they
# never came (a kernel called on some devices only, e.g. inside a lax.cond of the device index).
MEET_TIMEOUT_S = 120.0


@eager.rule(*ji.vma_casts)
def _vma_cast(th, eqn, invals):
  """``jax.shard_map`` (check_vma) marks values that vary over mesh axes, in kernels too; a
  device's interpreter holds its own values, so the mark changes nothing."""
  del th, eqn
  yield from ()
  return list(invals)


def run_traced(*args, params):
  """Inside a trace: the kernel runs on the host through a callback, given the coordinates of
  its device in the mesh axes it uses (all of them if it reaches other devices)."""
  names = ji.mesh_axis_sizes()   # all of them: errors name the device
  together = remote.uses_remote(params.jaxpr)
  if not names and not together:
    return eager.run_traced(*args, params=params)
  ids = [lax.axis_index(k) for k in names]
  meet = Rendezvous(params, dict(names)) if together else None
  track, cpu, n = uninit.enabled(params), jax.devices("cpu")[0], len(args)

  def host(*xs):
    vals = [np.asarray(x) for x in xs[:n]]
    coords = dict(zip(names, (int(c) for c in xs[n:])))
    with jax.default_device(cpu):
      if meet is None:
        return eager.run_kernel(params, vals, track, coords)
      return meet.run(coords, vals, track)

  return ji.host_callback(errors.reporting(host), params.out_avals, *args, *ids)


def run_now(*args, params):
  """An eager call outside any mesh: a kernel with remote references runs as a mesh of one."""
  if remote.uses_remote(params.jaxpr):
    outs = run_devices(params, {}, {(): [np.asarray(a) for a in args]}, uninit.enabled(params))
    return [jax.numpy.asarray(o) for o in outs[()]]
  return eager.run_now(*args, params=params)


class Rendezvous:
  """Where the host callbacks of one kernel call on every device of a mesh meet. The k-th call
  on a device meets the k-th call on every other device (each device runs the same program)."""

  def __init__(self, params, axes: dict):
    self.params, self.axes = params, axes
    self.size = math.prod(axes.values())
    self.cv = threading.Condition()
    self.calls: dict = {}       # device coordinates -> calls made
    self.meetings: dict = {}    # call number -> {"args", "outs", "error", "left"}

  def run(self, coords: dict, args, track: bool):
    key = tuple(coords.values())
    with self.cv:
      k = self.calls.get(key, 0)
      self.calls[key] = k + 1
      m = self.meetings.setdefault(k, {"args": {}, "outs": None, "error": None,
                                       "left": self.size})
      m["args"][key] = args
      last = len(m["args"]) == self.size
      if last:
        self.cv.notify_all()
    if last:   # every device is here: run them all, then wake the others
      try:
        outs, error = run_devices(self.params, self.axes, m["args"], track), None
      except Exception as e:  # noqa: BLE001  (every device's callback raises it)
        outs, error = None, e
      with self.cv:
        m["outs"], m["error"] = outs, error
        m["done"] = True
        self.cv.notify_all()
    with self.cv:   # the others came (or not: a timeout), then the run ends (however long)
      if not self.cv.wait_for(lambda: len(m["args"]) == self.size, timeout=MEET_TIMEOUT_S):
        missing = [c for c in itertools.product(*map(range, self.axes.values()))
                   if c not in m["args"]]
        raise RuntimeError(
            f"{self.params.name}: the kernel reaches other devices' memory, so every device of "
            f"the mesh {self.axes} must call it; devices {missing} did not within "
            f"{MEET_TIMEOUT_S:.0f} s. Call it on every device (not under a lax.cond of the "
            "device index)")
      self.cv.wait_for(lambda: m.get("done"))
      m["left"] -= 1
      if m["left"] == 0:
        del self.meetings[k]
    if m["error"] is not None:
      raise m["error"]
    return m["outs"][key]


def run_devices(params, axes: dict, args_by_device: dict, track: bool) -> dict:
  """Runs the kernel on every device of a mesh of ``axes`` at once; ``args_by_device``: device
  coordinates (a tuple in the order of ``axes``) -> its operands. Returns its outputs likewise."""
  coords = list(itertools.product(*map(range, axes.values())))
  mems = [eager.kernel_memory(params, args_by_device[c], track) for c in coords]
  for same in zip(*[ins + outs + glob for ins, outs, glob in mems]):   # one buffer, every device
    for c, buf in zip(coords, same):
      buf.state["peers"] = remote.Peers(dict(axes), list(same), dict(zip(axes, c)))
  run = {"devices": len(coords)}
  streams = [eager.blocks(params, ins + outs, glob, track, dict(zip(axes, c)), run)
             for c, (ins, outs, glob) in zip(coords, mems)]
  eager.run_blocks(_interleaved(streams))
  eager.after_run(params, run)
  return {c: eager.finish(params, outs) for c, (_, outs, _) in zip(coords, mems)}


def _interleaved(streams):
  """Blocks of every device, round-robin: block 0 of each device, then block 1, ... (the
  scheduler starts the next only while those running wait for something another may change)."""
  for group in itertools.zip_longest(*streams):
    yield from (b for b in group if b is not None)

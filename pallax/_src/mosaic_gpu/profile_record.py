"""The interpreter's side of Mosaic GPU's profiler (``profiler.py``): each thread of a profiled
call records the named scopes it enters and leaves, as the equations it runs are traced in them,
with the host's clock, into its units of the call's record (a warp's unit gets the events of its
warpgroup: the interpreter runs a warpgroup's warps as one). The interpreter has no SMs: a
block's number stands for its SM.
"""
from __future__ import annotations

import itertools
import time

from pallax._src.interpret import eager
from pallax._src.mosaic_gpu import profiler


def _now() -> int:
  """The host's clock in nanoseconds, as the int32 the GPU's 32-bit timer would be."""
  return (time.perf_counter_ns() + (1 << 31)) % (1 << 32) - (1 << 31)


class ThreadRecord:
  """What a thread has recorded: the scopes it is in, its events, in its units of the record."""

  def __init__(self, spec: profiler.Spec, names: tuple, data, units: list[int]):
    self.spec, self.names, self.data = spec, names, data
    self.offsets = [u * spec.words for u in units]
    self.open: list = []
    self.scope: tuple = ()   # the scopes of the equation running now (its sub-jaxprs' base)
    self.kept = 0
    for o in self.offsets:
      self.data[o:o + spec.words] = 0
      self.data[o] = _now()

  def at(self, path: tuple) -> None:
    """The thread goes on in the scopes ``path``: the events that take it there."""
    for name, begin in profiler.moves(self.open, path):
      self._record(profiler.tag(self.names, name, begin))
    self.scope = path

  def _record(self, tag: int) -> None:
    if self.kept >= self.spec.room:   # no room: dropped (the trace closes what it leaves open)
      return
    at = profiler.HEADER + 2 * self.kept
    now = _now()
    self.kept += 1
    for o in self.offsets:
      self.data[o + at], self.data[o + at + 1], self.data[o + 2] = tag, now, self.kept


def _start_block(block, threads) -> None:
  """Gives each thread of a block of a profiled call its record."""
  spec = profiler.spec_of(block.params) if block.params is not None else None
  if spec is None:
    return
  record = block.buffers[-1]   # the call's last output (profiler.augment)
  key = ("profile", id(record))
  if key not in block.run:   # (once per call: the blocks' count, the kernel's scope names)
    block.run[key] = (itertools.count(), profiler.names(block.params.jaxpr))
  count, names = block.run[key]
  b = next(count)
  if record.init is not None:   # written here, all of it (what nothing else writes: zeros)
    first = b * spec.threads * spec.units_per_thread * spec.words
    record.init[first:first + spec.threads * spec.units_per_thread * spec.words] = True
  for th in threads:
    first = (b * spec.threads + th.index) * spec.units_per_thread
    units = list(range(first, first + spec.units_per_thread))
    th.state["profile"] = ThreadRecord(spec, names, record.data, units)
    for u in units:
      record.data[u * spec.words + 1] = b   # its "SM"


eager.ON_BLOCK_START.append(_start_block)

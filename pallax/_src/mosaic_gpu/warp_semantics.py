"""What ``plgpu.warp_map`` means in the eager interpreter, and the checks it adds.

The warpgroup thread forks into its 4 warps, which run their bodies interleaved (a warp that
waits lets the others go on; when all of them wait, the warpgroup thread waits for whichever
can go on first), then joins. Each warp is a thread of its own for the rules of
``semantics.py``: its copies, commits and barrier waits are its own.

What the GPU keeps per CUDA thread stays per warp:

- **barrier phases.** Mosaic GPU tracks each barrier's phase in a register of every CUDA thread
  (``BarrierRef.phases``, a per-thread ``alloca``), so a warp that waits on a barrier inside
  ``warp_map`` advances its own phase only. A warp's view persists from one ``warp_map`` to the
  next (a producer warp that waits in every step is fine). Once the warps disagree on a
  barrier, a wait on it by the whole warpgroup would wait for different phases in different
  warps: that wait is an error here.
- **SMEM commits.** ``commit_smem`` (``fence.proxy.async``) orders the writes of the threads
  that run it: a warp's commit covers the warp's own writes, not the warpgroup's writes made
  before ``warp_map`` (commit those before the fork).
- **TMA stores in flight** stay the issuer's until the join, then the warpgroup's: its
  ``wait_smem_to_gmem`` (run by every thread, each waiting for its own bulk groups, then a
  warpgroup barrier) waits for them.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np

from pallax._src.interpret import eager
from pallax._src.interpret.eager import fail, rule
from pallax._src.mosaic_gpu import primitives as mp
from pallax._src.mosaic_gpu import semantics as ms
from pallax._src.mosaic_gpu import sync  # noqa: F401  (its barrier_test rule is wrapped below)
from pallax._src.mosaic_gpu import warps as mw


@dataclasses.dataclass(eq=False)
class WarpThread(eager.Thread):
  """One warp of a warpgroup thread, while it runs per-warp code."""
  parent: Any = None
  warp: int = 0

  def describe(self) -> str:
    return f"warp {self.warp} of {self.parent.describe()}"


@dataclasses.dataclass
class WarpgroupWarps:
  """A warpgroup thread's warps (made at its first ``warp_map``, kept for the next ones) and
  the barrier phases on which they disagree: (barrier buffer, index) -> phase seen per warp."""
  warps: list
  split: dict = dataclasses.field(default_factory=dict)


def _warps_of(th) -> WarpgroupWarps:
  ws = th.state.get("warps")
  if ws is None:
    axes = dict(th.axes)
    ws = WarpgroupWarps([WarpThread(th.block, th.index, th.name, axes, parent=th, warp=w)
                         for w in range(mw.NUM_WARPS)])
    th.state["warps"] = ws
    # The rules' checks look at every thread of the block (another thread's copies in flight).
    th.block.state["threads"] = [*th.block.state.get("threads", [th]), *ws.warps]
  return ws


@rule(mw.warp_map_p)
def _warp_map(th, eqn, invals):
  if isinstance(th, WarpThread):
    fail(th, "Cannot nest mpmd_maps: plgpu.warp_map inside per-warp code", ValueError)
  p = eqn.params
  ws = _warps_of(th)
  for w in ws.warps:
    w.axes = {**th.axes, p["axis_name"]: w.warp}
    _enter(th, w, ws)
  running = [[w, eager.eval_jaxpr(w, p["jaxpr"], [], [*invals, jnp.int32(w.warp)]), None]
             for w in ws.warps]
  while running:
    running = _step(running)
    if running:
      yield _either(running)
  _join(th, ws)
  return []


def _step(running):
  """Each warp that can go on runs to its next wait; returns the warps still running."""
  still = []
  for w, gen, wait in running:
    if wait is None or wait.poll or wait.ready():
      try:
        wait = gen.send(None)
      except StopIteration:
        continue
    still.append([w, gen, wait])
  return still


def _either(running) -> eager.Wait:
  """The warpgroup thread waits until one of its warps can go on (it polls while one polls)."""
  waits = [wait for _, _, wait in running]
  if any(wait.poll for wait in waits):
    return eager.Wait(lambda: True, "", poll=True)

  def what():
    return "; ".join(f"(warp {w.warp}) {wait.what() if callable(wait.what) else wait.what}"
                     for w, _, wait in running)
  return eager.Wait(lambda: any(wait.ready() for wait in waits), what,
                    shared=any(wait.shared for wait in waits))


def _enter(th, w: WarpThread, ws: WarpgroupWarps) -> None:
  """A warp starts from the warpgroup's barrier phases (its own where the warps disagree),
  with no writes, copies or commits of its own."""
  mine, st = ms.thread_state(th), ms.thread_state(w)
  st.observed = dict(mine.observed)
  st.observed.update({key: seen[w.warp] for key, seen in ws.split.items()})
  st.dirty, st.stores, st.uncommitted, st.unwritten, st.wgmmas = {}, [], [], [], []


def _join(th, ws: WarpgroupWarps) -> None:
  """The warpgroup takes over its warps' writes and copies in flight; barrier phases the warps
  agree on become the warpgroup's again."""
  mine = ms.thread_state(th)
  for w in ws.warps:
    st = ms.thread_state(w)
    for buf, (mask, line) in st.dirty.items():
      old = mine.dirty.get(buf, (np.zeros_like(mask), line))[0]
      mine.dirty[buf] = (old | mask, line)
    mine.stores += [g for g in st.stores if g]
    mine.uncommitted += st.uncommitted
    mine.unwritten += st.unwritten
    st.dirty, st.stores, st.uncommitted, st.unwritten = {}, [], [], []
  keys = {k for w in ws.warps for k in ms.thread_state(w).observed}
  for key in keys:
    seen = [ms.thread_state(w).observed.get(key, 0) for w in ws.warps]
    # The furthest warp's view: after the join (a warpgroup barrier) its waits order the
    # data of those phases before the whole warpgroup's later reads.
    mine.observed[key] = max(seen)
    waiters = key[0].state["waiters"][key[1]]
    if len(set(seen)) == 1:
      ws.split.pop(key, None)
      if any(w in waiters for w in ws.warps):
        waiters.difference_update(ws.warps)
        waiters.add(th)
    else:
      ws.split[key] = seen
      waiters.discard(th)   # the warpgroup cannot wait on it now; its warps can


def _check_agreed(th, eqn, invals, what: str) -> None:
  ws = th.state.get("warps") if not isinstance(th, WarpThread) else None
  if ws is None or not ws.split:
    return
  (bar,), _ = mp.split_refs(invals, eqn.params["trees"])
  view = bar[0].at(bar[1])
  key = (view.buf, ms.barrier_index(th, view, what))
  if key in ws.split:
    seen = ws.split[key]
    ahead = [w for w, s in enumerate(seen) if s == max(seen)]
    fail(th, f"{what} on {ms.barrier_name(*key)} by the whole warpgroup, but its warps disagree "
             f"on the barrier's phase: inside plgpu.warp_map, warp(s) {ahead} waited on it "
             f"more often than the others (phases seen per warp: {seen}). Each warp tracks "
             "barrier phases of its own, as each CUDA thread does on the GPU, so this wait would "
             "wait for different phases in different warps. Wait on it inside warp_map only, "
             "or have every warp wait as often")


def _agreeing(prim, what: str):
  inner = eager.RULES[prim]

  def checked(th, eqn, invals):
    _check_agreed(th, eqn, invals, what)
    return (yield from inner(th, eqn, invals))
  eager.RULES[prim] = checked


_agreeing(mp.barrier_wait_p, "barrier_wait")
_agreeing(mp.barrier_test_p, "barrier_test")

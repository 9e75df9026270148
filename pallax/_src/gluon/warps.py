"""``plgpu.warp_map`` (per-warp code) on Gluon: the warps' bodies, one after another.

Gluon writes scalar code, TMA copies and barrier operations for a partition's warps together:
each statement runs once, whichever warp runs it (a copy is issued by one elected thread, a
scalar store writes one value). So a warp's body needs no warp of its own: with its warp id a
literal, the writer folds its ``pl.when(warp_id == k)`` branches, and the bodies of warps 0..3
are written one after another into the warpgroup's code.

That is the meaning of the fork exactly when no warp waits for something a later warp does: a
warp's waits then find every arrival and copy of the earlier warps already issued. So a body
with a ``barrier_wait`` is allowed only in the last warp that has code (the common shape: warp
0 copies, warp 1 waits and stores). Barrier phases: each warp tracks its own on the GPU, and
the writer keeps one phase variable per barrier, so a barrier may be waited on by one warp
(and only that warp, in every ``warp_map`` of the kernel) or by the warpgroup outside them,
not both. What falls outside is refused by name; the interpreter runs it.
"""
from __future__ import annotations

import weakref

import numpy as np

from pallax._src.gluon.assign import layout_rule
from pallax._src.gluon.events import BarrierOp
from pallax._src.gluon.writer import rule
from pallax._src.gpu import expr as ex
from pallax._src.mosaic_gpu import warps as mw

# Per kernel being written: (thread, barrier) -> the warp that waits on it in warp_map bodies.
_WAITER: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _warp_id(w: int) -> ex.Lit:
  return ex.Lit(w, dtype=np.dtype(np.int32))


@rule(mw.warp_map_p)
def _warp_map(ctx, *consts, jaxpr, num_consts, axis_name):
  gen = ctx.gen
  did, waits = [], []   # per warp: whether it does anything, the barriers it waits on
  for w in range(mw.NUM_WARPS):
    start, first = len(gen.events), len(gen.lines)
    gen.lower_jaxpr(jaxpr, [*consts, _warp_id(w)])
    ops = gen.events[start:]
    if all(line.lstrip().startswith("#") for line in gen.lines[first:]):
      del gen.lines[first:]   # a warp with nothing to do (its pl.when branches folded away)
    else:
      gen.lines.insert(first, gen.lines[first][:len(gen.lines[first]) - len(gen.lines[first].lstrip())]
                       + f"# warp {w} of plgpu.warp_map")
    did.append(bool(ops))
    waits.append([e.barrier for e in ops if isinstance(e, BarrierOp) and e.kind == "wait"])
  for w, bars in enumerate(waits):
    later = [k for k in range(w + 1, mw.NUM_WARPS) if did[k]]
    if bars and later:
      _refuse(f"warp {w} waits on {bars[0]} and warp {later[0]} has code after it: the "
              f"bodies written one after another would make warp {later[0]}'s work wait for "
              f"warp {w}'s wait")
    for bar in bars:
      _claim(gen, bar, w)
  return []


def _claim(gen, bar: str, w: int) -> None:
  """One phase variable per barrier: only one warp may wait on a barrier in per-warp code."""
  thread = gen.axes.get(gen.thread_name) if gen.thread_name is not None else None
  thread = getattr(thread, "value", thread)
  waiter = _WAITER.setdefault(gen, {})
  for (t, other), k in waiter.items():
    same = other == bar or ("?" in other + bar and other.split("][")[0] == bar.split("][")[0])
    if t == thread and same and k != w:
      _refuse(f"warps {k} and {w} both wait on {bar} (each warp tracks its own barrier phases; "
              "the Gluon kernel keeps one phase per barrier)")
  waiter[(thread, bar)] = w


def _refuse(why: str):
  raise NotImplementedError(
      f"plgpu.warp_map: {why}. The Gluon backend writes the warps' bodies one after another, "
      "which is the fork's meaning only when no warp waits for a later warp and each barrier "
      "has one waiting warp; other per-warp code is not supported by the Gluon backend yet "
      "(the interpreter runs it: interpret=True)")


@layout_rule(mw.warp_map_p)
def _warp_map_layouts(ctx, *consts, jaxpr, num_consts, axis_name):
  for w in range(mw.NUM_WARPS):   # as the writer lowers it: once per warp, in order
    ctx.lower(jaxpr, [*consts, _warp_id(w)])
  return []

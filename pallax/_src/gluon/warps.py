"""``plgpu.warp_map`` (per-warp code) on Gluon: the warps' bodies, one after another.

Gluon writes scalar code, TMA copies and barrier operations for a partition's warps together:
each statement runs once, whichever warp runs it (a copy is issued by one elected thread, a
scalar store writes one value). So a warp's body needs no warp of its own: with its warp id a
literal, the writer folds its ``pl.when(warp_id == k)`` branches, and the bodies of warps 0..3
are written one after another into the warpgroup's code.

Written one after another, the warps run in one of the orders the fork allows, provided no warp
waits for something a warp written after it does. So the warps that never wait are written
first (they cannot block), then those that wait, in order; a waiting warp followed by one that
arrives on a barrier or starts a copy (what the first may wait for, perhaps through another
thread) is refused. Barrier phases: each warp tracks its own on the GPU, and
the writer keeps one phase variable per barrier, so a barrier may be waited on by one warp
(and only that warp, in every ``warp_map`` of the kernel) or by the warpgroup outside them,
not both. What falls outside is refused by name; the interpreter runs it.
"""
from __future__ import annotations

import dataclasses
import weakref

import numpy as np

from pallax._src.gluon import statements
from pallax._src.gluon.assign import layout_rule
from pallax._src.gluon.events import BarrierOp, Copy
from pallax._src.gluon.writer import rule
from pallax._src.gpu import expr as ex
from pallax._src.gpu import source as src
from pallax._src.mosaic_gpu import warps as mw

# Per kernel being written: (thread, barrier) -> the warp that waits on it in warp_map bodies.
_WAITER: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()



def _is_body(line) -> bool:
  """Whether a statement does something: what a warp whose branches all folded away still
  writes is scalar code (``source.Scalar``: assignments, comments; pure ``statements.Binding``)."""
  return not isinstance(line, (statements.Binding, src.Scalar))


def _warp_id(w: int) -> ex.Lit:
  return ex.Lit(w, dtype=np.dtype(np.int32))


@rule(mw.warp_map_p)
def _warp_map(ctx, *consts, jaxpr, num_consts, axis_name):
  gen = ctx.gen
  try:
    mw.refuse_arrays(jaxpr, num_consts)
  except mw.WarpArrayError as e:   # (named for the kernel here: the generator passes it on as is)
    raise mw.WarpArrayError(f"pallas_call {gen.kernel_name}: {e}") from None
  bodies = [_lower_warp(gen, jaxpr, consts, w) for w in range(mw.NUM_WARPS)]
  if gen.only_warp is not None:   # a partition of one warp (threads.py): its body alone
    gen.warp_mapped = True
    body = bodies[gen.only_warp]
    gen.warp_body = gen.warp_body or bool(body.events) or any(map(_is_body, body.lines))
    gen.lines += body.lines
    gen.events += body.events
    gen.warp_written.update(map(id, body.lines + body.events))
    return []
  # Warps that never wait run first (they cannot block), then those that wait, in order.
  order = sorted(bodies, key=lambda b: (bool(b.waits), b.warp))
  for i, b in enumerate(order):
    later = [v.warp for v in order[i + 1:] if v.signals]
    if b.waits and later:
      _refuse(f"warp {b.warp} waits on {b.waits[0]} and warp {later[0]}, which would be written "
              f"after it, arrives on a barrier or starts a copy that may be what it waits for")
    for bar in b.waits:
      _claim(gen, bar, b.warp)
    gen.lines += b.lines
    gen.events += b.events
  return []


@dataclasses.dataclass
class _Body:
  warp: int
  lines: list       # its statements (none where its pl.when branches folded away)
  events: list      # what it does (events.py)
  waits: list       # the barriers it waits on
  signals: bool     # whether it arrives on a barrier or starts a copy that completes one


def _lower_warp(gen, jaxpr, consts, w: int) -> _Body:
  """Warp ``w``'s body, written and taken out of the kernel's statements (placed by the rule)."""
  start, first = len(gen.events), len(gen.lines)
  gen.lower_jaxpr(jaxpr, [*consts, _warp_id(w)])
  lines, events = gen.lines[first:], gen.events[start:]
  del gen.lines[first:], gen.events[start:]
  if all(line.lstrip().startswith("#") for line in lines):
    lines = []
  else:
    indent = lines[0][:len(lines[0]) - len(lines[0].lstrip())]
    lines.insert(0, src.Scalar(f"{indent}# warp {w} of plgpu.warp_map"))
  waits = [e.barrier for e in events if isinstance(e, BarrierOp) and e.kind == "wait"]
  signals = any((isinstance(e, BarrierOp) and e.kind == "arrive") or
                (isinstance(e, Copy) and e.barrier is not None) for e in events)
  return _Body(w, lines, events, waits, signals)


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
      "which is the fork's meaning only when no warp waits for a warp written after it and "
      "each barrier has one waiting warp; other per-warp code is not supported by the Gluon "
      "backend yet (the interpreter runs it: interpret=True)")


@layout_rule(mw.warp_map_p)
def _warp_map_layouts(ctx, *consts, jaxpr, num_consts, axis_name):
  for w in range(mw.NUM_WARPS):   # as the writer lowers it: once per warp, in order
    ctx.lower(jaxpr, [*consts, _warp_id(w)])
  return []

"""Mosaic GPU's profiler (``mosaic_gpu/profiler.py``) in Gluon: each thread's code records, where
its equations' named scopes change, the events that take it from one scope to the next: the
GPU's global timer (``%globaltimer_lo``) and the scope's tag, stored by lane 0 of the warpgroup
(of each warp, for ``TraceScope.WARP``) into its unit of the record, the call's last output,
while the unit has room. At the thread's end it leaves its open scopes and writes its unit's
header (start time, SM, events kept). Scopes are static in the code: a loop or a branch enters
and leaves the scopes of its body inside it, so the event count is the only state carried.
"""
from __future__ import annotations

import dataclasses

from pallax._src import jax_internals as ji
from pallax._src.gluon import layouts as L
from pallax._src.mosaic_gpu import profiler

LANES = L.WARPS * 32
_LANES_LAYOUT = L.Blocked((1,), (32,), (L.WARPS,), (0,))
_TIMER = '"mov.u32 $0, %globaltimer_lo;"'
_SMID = '"mov.u32 $0, %smid;"'


@dataclasses.dataclass
class Recording:
  """The writer's profiling state: the record, and the thread being written's names and scopes."""
  spec: profiler.Spec
  names: tuple
  ptr: str                                    # the record's pointer parameter
  names_of: dict = dataclasses.field(default_factory=dict)   # role -> variable name
  open: list = dataclasses.field(default_factory=list)
  bases: list = dataclasses.field(default_factory=list)      # scopes of each jaxpr being lowered
  scope: tuple = ()                           # the scopes of the equation being lowered
  active: bool = False


def recording(params, refs, blocks: int) -> Recording | None:
  """What the writer needs to profile ``params``' kernel (None: not profiled); ``refs``: its
  GMEM operands and outputs, the record last; ``blocks``: how many it launches."""
  spec = profiler.spec_of(params)
  if spec is None:
    return None
  if blocks != spec.blocks:
    raise NotImplementedError(f"profiling a kernel launched as {blocks} blocks for a grid of "
                              f"{spec.blocks}")
  return Recording(spec, profiler.names(params.jaxpr), refs[-1].ptr)


def _timer(gen, r: Recording, asm: str) -> str:
  t = gen.fresh("prof_t")
  gen.emit(f"{t} = gl.inline_asm_elementwise({asm}, \"=r,r\", [{r.names_of['lanes']}], "
           "dtype=gl.int32, is_pure=False, pack=1)")
  return t


def start_thread(gen, thread: int) -> None:
  """The start of thread ``thread``'s code: where its unit(s) of the record are, its start."""
  r = gen.profile
  if r is None:
    return
  s, n = r.spec, r.names_of
  for role in ("lanes", "at", "mine", "kept"):
    n[role] = gen.fresh(f"prof_{role}")
  layout = gen.layout(_LANES_LAYOUT)
  first = f"(gl.program_id(0) * {s.threads} + {thread}) * {s.units_per_thread * s.words}"
  # one pointer a lane: its warp's unit, or the warpgroup's
  lane = f"({n['lanes']} // 32) * {s.words}" if s.per_warp else f"gl.zeros_like({n['lanes']})"
  gen.emit(f"{n['lanes']} = gl.arange(0, {LANES}, layout={layout})")
  gen.emit(f"{n['at']} = {r.ptr} + {first} + {lane} + {profiler.HEADER}")
  gen.emit(f"{n['mine']} = {n['lanes']} % 32 == 0" if s.per_warp else f"{n['mine']} = {n['lanes']} == 0")
  gen.emit_scalar(f"{n['kept']} = 0")
  n["start"] = _timer(gen, r, _TIMER)
  r.open, r.bases, r.scope, r.active = [], [], (), True


def enter_jaxpr(gen) -> None:
  r = gen.profile
  if r is not None and r.active:
    r.bases.append(r.scope)


def at_equation(gen, eqn) -> None:
  r = gen.profile
  if r is not None and r.active:
    _move(gen, r, r.bases[-1] + ji.named_scopes(eqn.source_info))


def leave_jaxpr(gen) -> None:
  """The end of a jaxpr's code: the scopes it entered, left."""
  r = gen.profile
  if r is not None and r.active:
    _move(gen, r, r.bases.pop())


def _move(gen, r: Recording, path: tuple) -> None:
  n, room = r.names_of, r.spec.room
  for name, begin in profiler.moves(r.open, path):
    t = _timer(gen, r, _TIMER)
    mask = f"{n['mine']} & ({n['kept']} < {room})"
    at = f"{n['at']} + 2 * {n['kept']}"
    tag = profiler.tag(r.names, name, begin)
    gen.emit(f"gl.store({at}, gl.full([{LANES}], {tag}, gl.int32, layout={gen.layout(_LANES_LAYOUT)}), "
             f"mask={mask})   # {'enters' if begin else 'leaves'} {name!r}")
    gen.emit(f"gl.store({at} + 1, {t}, mask={mask})")
    gen.emit(f"{n['kept']} = {n['kept']} + 1")
  r.scope = path


def end_thread(gen) -> None:
  """The end of a thread's code: its open scopes left, its unit's header written."""
  r = gen.profile
  if r is None or not r.active:
    return
  _move(gen, r, ())
  n, room = r.names_of, r.spec.room
  sm = _timer(gen, r, _SMID)
  kept = f"gl.full([{LANES}], 0, gl.int32, layout={gen.layout(_LANES_LAYOUT)}) + gl.minimum({n['kept']}, {room})"
  gen.emit(f"gl.store({n['at']} - {profiler.HEADER}, {n['start']}, mask={n['mine']})")
  gen.emit(f"gl.store({n['at']} - {profiler.HEADER - 1}, {sm}, mask={n['mine']})")
  gen.emit(f"gl.store({n['at']} - {profiler.HEADER - 2}, {kept}, mask={n['mine']})")
  r.active = False

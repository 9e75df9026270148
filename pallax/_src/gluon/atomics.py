"""Gluon rules of Mosaic GPU's atomics and semaphores on GMEM: ``plgpu.atomic_*`` (relaxed
atomics at GPU scope, as Mosaic GPU's ``red.relaxed.gpu``), and semaphores (``pl.get_global``
ones, which the kernel gets as GMEM scalars): a signal is a release add at the semaphore's
memory scope after a barrier of the signalling threads (their earlier writes are ordered before
it); a wait spins on acquire reads, and takes ``value`` off with a compare-and-swap. Triton
performs an atomic on a scalar pointer once per block and gives every thread its result.

Gluon 3.6 has no atomics on shared memory: those are refused with what to do instead.
"""
from __future__ import annotations

import numpy as np

from pallax._src.gluon import layouts as L
from pallax._src.gluon.assign import Gmem, Val, layout_rule
from pallax._src.gluon.events import Access, BarrierOp
from pallax._src.gluon import peers
from pallax._src.gluon.memory import gmem_pointers, gmem_view_shape
from pallax._src.gluon.values import to_layout
from pallax._src.gluon.writer import GmemRef, rule
from pallax._src.mosaic_gpu import primitives as mp

_OPS = ("add", "max", "min", "and", "or", "xor")


def _ref(ctx, invals):
  refs, rest = mp.split_refs(invals, ctx.eqn.params["trees"])
  return refs[0], rest


@rule(mp.atomic_p)
def _atomic(ctx, *invals, op, **_):
  gen = ctx.gen
  (ref, transforms), (value,) = _ref(ctx, invals)
  if not isinstance(ref, GmemRef):
    gen.unsupported(f"plgpu.atomic_{op} on SMEM (Gluon 3.6 has no shared-memory atomics; update "
                    "a GMEM array atomically, or reduce in registers and store)")
  if op not in _OPS:
    gen.unsupported(f"plgpu.atomic_{op}")
  ref, transforms = peers.resolve(gen, ref, transforms)
  ptrs, shape, layout, mask, offset = gmem_pointers(gen, ref, transforms)
  gen.events.append(Access("atomic", ref.origin, shape, offset))
  if shape:
    value = to_layout(gen, value, layout, shape, ref.dtype)
  masks = "" if mask is None else f", mask={gen.render(mask)}"
  gen.emit(f"gl.atomic_{op}({gen.render(ptrs)}, {gen.render(value)}{masks}, sem=\"relaxed\", "
           f"scope=\"{_scope(gen, 'gpu')}\")")
  return []


def _semaphore(gen, ref, transforms, what: str):
  """The pointer of a GMEM semaphore (a scalar view)."""
  if not isinstance(ref, GmemRef):
    gen.unsupported(f"{what} on a semaphore outside GMEM (use pl.get_global semaphores)")
  ptr, shape, *_ = gmem_pointers(gen, ref, transforms)
  if shape:
    gen.unsupported(f"{what} on an array of semaphores (index one)")
  return gen.render(ptr)


def _scope(gen, memory_scope: str) -> str:
  """The memory scope of an atomic or a semaphore: the system's in a kernel that reaches other
  GPUs (their updates, and the data a signal orders, cross devices), else the one asked for."""
  return "sys" if gen.peers is not None and gen.peers.exchange.remote else memory_scope


@rule(mp.semaphore_signal_p)
def _signal(ctx, *invals, memory_scope, **_):
  gen = ctx.gen
  memory_scope = _scope(gen, memory_scope)
  (ref, transforms), (inc,) = _ref(ctx, invals)
  ptr = _semaphore(gen, ref, transforms, "semaphore_signal")
  # (as an arrival, so that per-warp code is written with the signalling warp first: warps.py)
  gen.events.append(BarrierOp("arrive", f"semaphore {ref.origin}"))
  gen.emit("gl.thread_barrier()")   # every thread's earlier writes come before the release
  gen.emit(f"gl.atomic_add({ptr}, {gen.render(inc)}, sem=\"release\", scope=\"{memory_scope}\")")
  return []


@rule(mp.semaphore_wait_p)
def _wait(ctx, *invals, decrement, memory_scope, **_):
  gen = ctx.gen
  memory_scope = _scope(gen, memory_scope)
  (ref, transforms), (value,) = _ref(ctx, invals)
  ptr = _semaphore(gen, ref, transforms, "semaphore_wait")
  gen.events.append(BarrierOp("wait", f"semaphore {ref.origin}"))
  v = gen.render(value)
  read = f"gl.atomic_add({ptr}, 0, sem=\"acquire\", scope=\"{memory_scope}\")"
  if not decrement:
    seen = gen.fresh("sem_value")
    gen.emit_scalar(f"{seen} = {read}")
    gen.emit(f"while {seen} < {v}:")
    gen.emit(f"    {seen} = {read}")
    return []
  # Take ``value`` off only from a count of at least ``value``: a compare-and-swap from the count
  # read (unchanged while it is smaller); done once a swap that takes it off succeeds.
  done, seen, old = gen.fresh("sem_done"), gen.fresh("sem_value"), gen.fresh("sem_old")
  gen.emit_scalar(f"{done} = 0")
  gen.emit(f"while {done} == 0:")
  gen.emit(f"    {seen} = {read}")
  gen.emit(f"    {old} = gl.atomic_cas({ptr}, {seen}, {seen} - ({seen} >= {v}).to(gl.int32) * {v}, "
           f"sem=\"acquire\", scope=\"{memory_scope}\")")
  gen.emit(f"    {done} = (({old} == {seen}) & ({seen} >= {v})).to(gl.int32)")
  return []


@rule(mp.semaphore_read_p)
def _read(ctx, *invals, **_):
  gen = ctx.gen
  (ref, transforms), _ = _ref(ctx, invals)
  ptr = _semaphore(gen, ref, transforms, "semaphore_read")
  value = gen.fresh_name("sem_value", np.int32, ())
  scope = _scope(gen, "gpu")
  gen.emit_scalar(f"{value.name} = gl.atomic_add({ptr}, 0, sem=\"acquire\", scope=\"{scope}\")")
  return value


# --- layout assignment (assign.py) ------------------------------------------------------------

@layout_rule(mp.atomic_p)
def _atomic_layouts(ctx, *invals, op, **_):
  refs, (value,) = mp.split_refs(invals, ctx.eqn.params["trees"])
  (ref, transforms), = refs
  if isinstance(ref, Gmem):
    shape = gmem_view_shape(ref, transforms)
    if shape and getattr(value, "shape", ()):
      ctx.a.to_layout(value, L.blocked(shape, ref.dtype), shape, ref.dtype)
  return None


@layout_rule(mp.semaphore_signal_p, mp.semaphore_wait_p)
def _semaphore_layouts(ctx, *invals, **_):
  return None


@layout_rule(mp.semaphore_read_p)
def _read_layouts(ctx, *invals, **_):
  return Val((), np.dtype(np.int32), None)

"""Mosaic GPU threads as Gluon warp specialization.

A ``plgpu`` kernel with ``num_threads=n`` runs one body in n warpgroups that branch on
``lax.axis_index(thread_name)``. Gluon runs each role as a partition function of
``gl.warp_specialize``: thread 0 the default partition (the kernel's 4 warps), threads 1..n-1
workers of 4 warps each, or of one warp where the thread holds no register tensors and no SMEM
of its own (a memory thread that only issues TMA copies and waits on barriers: Gluon brackets
each copy and barrier operation with a barrier over the partition's warps, which one warp makes
cheap). The body is lowered once per thread with its index a literal, so the writer's folding
turns the thread's ``pl.when`` branches into straight code. Collective scratch
(``run_scoped(..., collective_axes=thread)``: SMEM, barriers) is allocated once, before the
split, and handed to every partition; each partition tracks its own barrier phases, as each
``plgpu`` thread does. ``set_max_registers`` sets a worker's register budget.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src import primitives as prims
from pallax._src.mosaic_gpu import core as mc
from pallax._src.mosaic_gpu import primitives as mp
from pallax._src.mosaic_gpu import warps as mw
from pallax._src.gluon import profile, statements
from pallax._src.gluon.events import Partition
from pallax._src.gluon.writer import BarrierRef, rule
from pallax._src.gpu import expr as ex
from pallax._src.gpu import source as src

WORKER_WARPS = 4
SCALAR_WORKER_WARPS = 1
DEFAULT_WORKER_REGISTERS = 232


def hoist(jaxpr, thread_name, allocate, hoisted: dict, every: bool = False,
          free: dict | None = None, again: bool = False) -> None:
  """Allocates the collective scratch of the kernel now, with ``allocate(kind, aval)``,
  recording it by equation in ``hoisted``; a thread's own scopes may hold some (a pipeline
  inside the scope of an accumulator). ``every``: all its scratch.

  A scope that begins after another has ended takes that one's SMEM buffers of the same types
  (``free``), as a stack gives it the same memory (JAX's collective matmul runs its matmul's
  scope twice), but barriers of its own: a barrier starts each scope fresh, at phase 0, and one
  a scope left with completions no thread waited for cannot be handed on. So a scope with
  barriers that a loop enters more than once (``again``; ``unroll_barrier_scopes`` writes short
  loops out step by step first) is refused."""
  free = {} if free is None else free
  for eqn in jaxpr.eqns:
    p = eqn.params
    if eqn.primitive is prims.run_scoped_p:
      body = p["jaxpr"]
      mine = []
      if every or thread_name in p.get("collective_axes", ()):
        hoisted[eqn] = []
        for t, v in zip(p["scratch_types"], body.invars[p["num_consts"]:]):
          key = (repr(t), tuple(v.aval.inner_aval.shape), str(v.aval.inner_aval.dtype))
          ref = free[key].pop() if free.get(key) else allocate(t, v.aval.inner_aval)
          if isinstance(ref, BarrierRef) and again:
            raise NotImplementedError(
                f"barriers shared by the threads ({thread_name!r}) in a scope that a loop enters "
                f"more than once (at {ji.user_frame(eqn.source_info)}): the Gluon backend "
                "allocates them once, and cannot start them afresh at each entry yet; allocate "
                "them outside the loop, or run the kernel with interpret=True")
          hoisted[eqn].append(ref)
          if not isinstance(ref, BarrierRef):
            mine.append((key, ref))
      hoist(body, thread_name, allocate, hoisted, every, free, again)
      for key, ref in mine:   # the scope has ended: a later one may take its SMEM
        free.setdefault(key, []).append(ref)
    elif eqn.primitive in ji.CALL_PRIMITIVES:
      hoist(p.get("jaxpr", p.get("call_jaxpr")), thread_name, allocate, hoisted, every, free, again)
    elif thread_name is not None:   # loops and branches of a kernel with threads
      loops = again or _repeats(eqn)
      for sub in jaxpr_util.sub_jaxprs(p):
        hoist(sub, thread_name, allocate, hoisted, every, free, loops)


MAX_UNROLLED_STEPS = 8


def unroll_barrier_scopes(jaxpr, thread_name):
  """``jaxpr`` with each loop of a static number of steps (``lax.fori_loop``/``pl.loop`` of at
  most ``MAX_UNROLLED_STEPS``) that enters a scope holding barriers shared by the threads written
  out step by step: each step's scope then has barriers of its own, starting fresh as the scope
  promises (``hoist``), and its SMEM the steps share. JAX's collective matmul runs its matmul's
  scope once per device after the first."""
  if thread_name is None:
    return jaxpr

  def applies(eqn) -> bool:
    if eqn.primitive is not ji.scan_p:
      return False
    p = eqn.params
    _, ncarry, nxs = (len(x) for x in p["ft_in"].unpack())
    return (1 < p["length"] <= MAX_UNROLLED_STEPS and not nxs and not p["reverse"]
            and len(eqn.outvars) == ncarry and _barrier_scope(p["jaxpr"], thread_name))

  def rule(eqn, invals, params):
    nc = len(params["ft_in"].unpack()[0])
    consts, carry, body = invals[:nc], invals[nc:], params["jaxpr"]
    for _ in range(params["length"]):
      carry = ji.eval_jaxpr(body.jaxpr, body.consts, *consts, *carry)
    return list(carry)
  return jaxpr_util.retrace(jaxpr, rule, applies)


def _barrier_scope(jaxpr, thread_name) -> bool:
  """Whether ``jaxpr`` enters a scope shared by the threads that holds barriers."""
  return any(e.primitive is prims.run_scoped_p and thread_name in e.params.get("collective_axes", ())
             and any(isinstance(t, mc.Barrier) for t in e.params["scratch_types"])
             for e in jaxpr_util.equations(jaxpr))


def _repeats(eqn) -> bool:
  """Whether the equation may run its sub-jaxprs more than once (a loop not of one step)."""
  if eqn.primitive is ji.cond_p:
    return False
  return not (eqn.primitive is ji.scan_p and eqn.params["length"] <= 1)


def partitions(gen, jaxpr, args, info) -> list[Partition]:
  """Each thread's partition: its statements, register budget, warps and operations. For
  sm_100a, a thread whose per-warp code (``plgpu.warp_map``) is all it does besides scalar code
  becomes one partition of one warp per warp that has a body (``_per_warp``)."""
  out = []
  for t in range(info.num_threads):
    # (sm_90a keeps the warps' bodies one after another: what runs on Hopper here so far)
    out += _thread_or_warps(gen, jaxpr, args, info, t, split=gen.target >= 100)
  return out


def _thread_or_warps(gen, jaxpr, args, info, t, split: bool) -> list[Partition]:
  """Thread ``t`` as one partition, or (``split``) as a partition per warp where it may be."""
  start = _state(gen)
  part = _lower_thread(gen, jaxpr, args, info, t, warp=0 if split else None)
  if not gen.warp_mapped:
    return [part]
  if gen.register_tensors or _state(gen)[1:] != start[1:] or _effects_outside_warps(gen, part):
    # the warps' bodies one after another, in the thread's warps
    _rewind(gen, start)
    return [_lower_thread(gen, jaxpr, args, info, t, warp=None)]
  return _per_warp(gen, jaxpr, args, info, t, start, part)


def _effects_outside_warps(gen, part) -> bool:
  """Whether the thread does more outside its warps' bodies than scalar code (which every warp
  partition computes alike): an operation there would be made once per partition."""
  return any(id(e) not in gen.warp_written for e in part.events) or any(
      id(line) not in gen.warp_written and not isinstance(line, (src.Scalar, statements.Binding))
      for line in part.lines)


def warp_partitions(gen, jaxpr, args) -> list[Partition]:
  """A kernel of one thread as ``partitions`` makes a thread: a partition per warp with a
  ``warp_map`` body where it does nothing else, else one partition."""
  return _thread_or_warps(gen, jaxpr, args, None, 0, split=True)


def _per_warp(gen, jaxpr, args, info, t, start, first) -> list[Partition]:
  """Thread ``t`` as a partition per warp with a ``warp_map`` body (each of one warp, running
  the thread's scalar code and its own body): the warps run concurrently, as on the GPU, and
  each tracks its own barrier phases, as each warp does. Gluon cannot nest warp
  specialization, so the warps become partitions of the kernel's split."""
  parts = [first] if gen.warp_body else []
  for w in range(1, mw.NUM_WARPS):
    _rewind(gen, start)
    part = _lower_thread(gen, jaxpr, args, info, t, warp=w)
    if gen.warp_body:
      parts.append(part)
  return [dataclasses.replace(p, warps=SCALAR_WORKER_WARPS) for p in parts] or [first]


def _state(gen) -> tuple:
  """What lowering a thread moves on: the assignment's scopes taken, the conversions made,
  the SMEM buffers, barriers and semaphore scratch allocated."""
  return (gen.assignment.top.taken, len(gen.conversions), gen.allocated, gen.barriers,
          gen.cluster_barriers, len(gen.block_semaphores))


def _rewind(gen, state: tuple) -> None:
  """Back to ``state``: the layout assignment's scopes as if not lowered yet, the conversions
  and allocations of the lowering undone (a thread lowered again, for another warp or whole)."""
  top, start = gen.assignment.top, state[0]

  def reset(scope):
    scope.taken = 0
    for sub in scope.subs:
      reset(sub)
  for sub in top.subs[start:top.taken]:
    reset(sub)
  top.taken = start
  del gen.conversions[state[1]:]
  gen.allocated, gen.barriers, gen.cluster_barriers = state[2:5]
  del gen.block_semaphores[state[5]:]


def _lower_thread(gen, jaxpr, args, info, t, warp) -> Partition:
  """Thread ``t``'s partition; ``warp``: the warp whose ``warp_map`` body it runs (None: every
  warp's, one after another)."""
  gen.lines, gen.registers, gen.events = [], None, []
  gen.used_layouts, gen.pending_layouts = set(), set()
  if info is not None:
    gen.axes[info.thread_name] = ex.Lit(t, dtype=np.dtype(np.int32))
  gen.pending_accs, gen.accs = [], []
  gen.register_tensors = False
  gen.phases_read = set()
  gen.only_warp, gen.warp_mapped, gen.warp_body = warp, False, False
  gen.warp_written = set()
  if warp in (None, 0):   # (a thread split into warps: its first warp's partition records it)
    profile.start_thread(gen, t)
  gen.lower_jaxpr(jaxpr, args)
  profile.end_thread(gen)
  gen.only_warp = None
  # Each thread tracks the phases of the collective barriers it waits on (only those).
  body, gen.lines = gen.lines, []
  for ref in gen.hoisted_barriers():
    if ref.phase in gen.phases_read:
      gen.emit_scalar(f"{ref.phase} = 0")
  gen.lines += body
  gen.claim()
  return Partition(gen.lines, gen.registers,
                   WORKER_WARPS if gen.register_tensors else SCALAR_WORKER_WARPS, gen.events,
                   gen.used_layouts)


def split(name: str, params: list[str], parts: list[Partition]) -> list[str]:
  """The statement that runs the partitions (``gl.warp_specialize``)."""
  args = f"({', '.join(params)},)"
  fns = ", ".join(f"({name}_t{t}, {args})" for t in range(len(parts)))
  warps = [p.warps for p in parts[1:]]
  regs = [p.registers or DEFAULT_WORKER_REGISTERS for p in parts[1:]]
  return [f"    gl.warp_specialize([{fns}], {warps}, {regs})"]



@rule(mp.set_max_registers_p)
def _set_max_registers(ctx, *, n, action):
  ctx.gen.registers = n   # the running thread's partition budget (threads.split)
  return []

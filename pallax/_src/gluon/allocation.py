"""Gluon rules that allocate: scratch scopes (SMEM buffers, barriers, wgmma accumulators),
scopes inside loops allocated once at the kernel's top, and ``pl.run_state`` accumulators.
"""
from __future__ import annotations

import numpy as np

from pallax._src import core as pc
from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src import primitives as prims
from pallax._src.gluon import acc_pieces
from pallax._src.gluon import layouts as L
from pallax._src.gluon.assign import Acc, Buffer, Closed, Opaque, Smem, Val, layout_rule
from pallax._src.gluon.values import to_layout, wait_all
from pallax._src.gluon import blackwell, subbyte
from pallax._src.gluon.writer import AccRef, BarrierRef, GmemRef, SmemRef, ValueRef, rule
from pallax._src.gpu import expr as ex
from pallax._src.gpu.expr import call
from pallax._src.mosaic_gpu import core as mc

@rule(prims.run_scoped_p)
def _run_scoped(ctx, *consts, jaxpr, num_consts, scratch_types=(), **_):
  gen = ctx.gen
  refs = gen.hoisted.get(ctx.eqn)   # collective scratch of a thread: allocated before the split
  if refs is None and gen.thread_name in ctx.eqn.params.get("collective_axes", ()):
    gen.unsupported(f"scratch shared by the threads ({gen.thread_name!r}) allocated inside a loop "
                    "or branch (allocate it in the kernel's straight-line code)")
  types, scratch = scratch_types, jaxpr.invars[num_consts:]
  refs = [r if r is not None else allocate(
              gen, t, v.aval.inner_aval,
              pieces=_pieces(jaxpr, v) if isinstance(t, mc.WGMMAAccumulatorRef) else None)
          for r, t, v in zip(refs or [None] * len(types), types, scratch)]
  return gen.lower_jaxpr(jaxpr, [*consts, *refs])


def _pieces(jaxpr, var) -> tuple:
  """The column pieces of an accumulator ``var`` of ``jaxpr`` (``acc_pieces.for_views``: what
  its wgmmas' column views need, or the default)."""
  shape = tuple(var.aval.inner_aval.shape)
  if len(shape) != 2:
    return ()   # (refused where it is used)
  views = acc_pieces.views_in(jaxpr, var, shape)
  pieces = acc_pieces.for_views(shape[1], views) if views is not None else None
  return acc_pieces.widths(shape[1]) if pieces is None else pieces


def hoist_nested(jaxpr, allocate, hoisted: dict, nested: bool = False, smem: bool = True) -> None:
  """Allocates now (at the kernel's top, with ``allocate(kind, aval)``) the barriers (and, with
  ``smem``, the SMEM buffers) of scopes inside loops and branches, recording them by equation in
  ``hoisted`` (None for what the scope allocates where it begins: accumulators, which are
  registers, and without ``smem`` SMEM buffers). A barrier goes on from the phase its last
  completion left, which the interpreter's checks make its initial one (every completion is
  awaited before the scope ends). A buffer hoisted holds whatever the last entry left (as a fresh
  buffer holds anything); one allocated at its scope shares memory with the scopes it is never
  live with, as Mosaic GPU's stack of scopes gives it (Triton's allocator sees the liveness)."""
  for eqn in jaxpr.eqns:
    p = eqn.params
    if eqn.primitive is prims.run_scoped_p and nested:
      hoisted[eqn] = [None if isinstance(t, mc.WGMMAAccumulatorRef) or (not smem and _is_smem(t))
                      else allocate(t, v.aval.inner_aval)
                      for t, v in zip(p["scratch_types"], p["jaxpr"].invars[p["num_consts"]:])]
    inner = nested or eqn.primitive not in (prims.run_scoped_p, *ji.CALL_PRIMITIVES)
    for sub in jaxpr_util.sub_jaxprs(p):
      hoist_nested(sub, allocate, hoisted, inner, smem)


def _is_smem(kind) -> bool:
  return isinstance(kind, mc.GPUMemoryRef) and kind.memory_space is mc.MemorySpace.SMEM


def stored_shape(shape) -> tuple[tuple, tuple]:
  """(the leading dimensions stored flattened into one, the shape allocated) of an SMEM buffer.
  Rank > 3: the leading dimensions flattened into one, each padded to a power of two so that
  the whole buffer can also be seen unflattened (a reshape). Leading dimensions of one element
  in all (a pipeline's buffers of one slot) are not stored at all: indexing them selects the
  whole buffer, so a view of the slot and views of its rows can share a layout (Gluon's layouts
  describe one leading dimension at most)."""
  if len(shape) > 3 or (len(shape) == 3 and shape[0] == 1):
    n = int(np.prod(L.padded(shape[:-2])))
    return shape[:-2], ((n,) if n > 1 else ()) + shape[-2:]
  return (), shape


def allocate(gen, kind, aval, phases: bool = True, pieces=None):
  shape, dtype = tuple(aval.shape), np.dtype(aval.dtype)
  if isinstance(kind, mc.WGMMAAccumulatorRef):
    return gen.accumulator(shape, dtype, L.wgmma(shape[1], gen.mma_bits), pieces)
  if gen.depth != 1 and not (_is_smem(kind) and gen.thread_name is None):
    gen.unsupported("SMEM or barrier allocations inside loops or branches")
  if isinstance(kind, mc.Barrier):
    name, phase = gen.fresh("bar"), gen.fresh("phase")
    n = int(np.prod(shape)) if shape else 1
    gen.emit_scalar(f"{name} = gl.allocate_shared_memory(gl.int64, [{n}, 1], {L.BARRIER})")
    gen.emit(f"for _b in gl.static_range({n}):")
    gen.emit(f"    mbarrier.init({name}.index(_b), count={kind.num_arrivals})")
    if phases:   # (collective barriers of threads: each thread starts its own, threads.py)
      gen.emit_scalar(f"{phase} = 0")
    gen.barriers += 1
    # A cluster barrier counts this block's own arrivals (clusters run as independent blocks).
    gen.cluster_barriers += isinstance(kind, mc.ClusterBarrier)
    return BarrierRef(name, phase, n, id=gen.barriers - 1)
  if _is_smem(kind):
    shape, dtype, packed = _bytes_of(gen, shape, dtype)
    lead, stored = stored_shape(shape)
    name = gen.fresh("smem")
    layout, buffer = gen.allocate_smem(name, stored, dtype)
    return SmemRef(name, shape, dtype, layout, layout.swizzle and L.swizzle(shape[-2:], dtype),
                   lead=lead, buffer=buffer, whole=True, packed=packed)
  if isinstance(kind, mc.TMEMType) and getattr(gen, "target", 90) >= 100:
    return blackwell.allocate_tmem(gen, kind, aval)
  if kind is mc.SemaphoreType.REGULAR or getattr(kind, "memory_space", None) is pc.MemorySpace.SEMAPHORE:
    return _block_semaphores(gen, shape)
  gen.unsupported(f"scratch of type {kind}")


def _block_semaphores(gen, shape) -> GmemRef:
  """Semaphore scratch: the block's own slot of a GMEM buffer of every block's, which the
  launch zeroes (one more operand of the kernel, after the outputs), as Mosaic GPU makes scratch
  semaphores a buffer scaled by the grid. A scope that a loop enters again gets the same slot."""
  if gen.peers is not None:
    gen.unsupported("semaphore scratch in a kernel that reaches other devices (use pl.get_global)")
  ptr = gen.fresh("sems_ptr")
  whole = (gen.blocks, *shape)
  gen.block_semaphores.append((ptr, whole))
  block = call("gl.program_id", ex.Lit(0, dtype=np.dtype(np.int32)), dtype=np.dtype(np.int32), shape=())
  mine = ji.NDIndexer((block, *[ji.Slice(0, n, 1) for n in shape]), whole, ())
  return GmemRef(ptr, whole, np.dtype(np.int32), f"semaphore scratch #{len(gen.block_semaphores)}",
                 (mine,))


def _bytes_of(gen, shape, dtype) -> tuple[tuple, np.dtype, np.dtype | None]:
  """(shape, dtype, the packed type or None) an SMEM buffer is allocated with: a sub-byte type's
  bytes (subbyte.py)."""
  stored, as_dtype, packed = subbyte.as_bytes(shape, dtype)
  if subbyte.in_bytes(dtype) and packed is None:
    gen.unsupported(f"an SMEM buffer of shape {list(shape)} of {dtype.name}, its rows not a whole "
                    "number of bytes")
  return stored, as_dtype, packed


def _accumulator(x, jaxpr, var) -> bool:
  """Whether the value ``x`` that ``pl.run_state`` gives the body as ``var`` is a wgmma
  accumulator (``plgpu.ACC.init(x)``): of float32 always; of float16 where a wgmma of the body
  accumulates into it (wgmma's float16 accumulation); else a value the body only reads."""
  if np.dtype(x.dtype) == np.float32:
    return True
  return np.dtype(x.dtype) == np.float16 and bool(acc_pieces.wgmmas_into(jaxpr, var))


@rule(ji.run_state_p)
def _run_state(ctx, *invals, jaxpr, is_initialized, **_):
  """``pl.run_state`` over values (``plgpu.ACC.init(x)``): each becomes an accumulator variable
  (``_accumulator``);
  Refs the body closes over pass through."""
  gen, given, refs = ctx.gen, iter(invals), []
  for init, v in zip(is_initialized, jaxpr.invars):
    x = next(given) if init else None
    if x is not None and not isinstance(x, ex.Expr):
      refs.append(x)
      continue
    shape = tuple(v.aval.inner_aval.shape)
    if x is not None and not _accumulator(x, jaxpr, v):   # a value the body closes over: read only
      refs.append(ValueRef(x))
      continue
    if x is None or len(shape) != 2:
      gen.unsupported("pl.run_state over values other than (ACC.init of) 2-D float32 or float16 "
                      "arrays")
    layout = gen.declared(L.wgmma(shape[1], gen.mma_bits))
    ref = AccRef(gen.fresh("acc"), shape, layout, _pieces(jaxpr, v))
    acc_pieces.assign(gen, ref, gen.render(to_layout(gen, x, layout, shape, x.dtype)))
    refs.append(gen.new_acc(ref))
  gen.lower_jaxpr(jaxpr, refs)
  outs = []
  for r, v in zip(refs, ctx.eqn.outvars):
    if isinstance(r, ValueRef):
      outs.append(r.value)
    elif isinstance(r, AccRef):
      wait_all(gen, [r])
      if not gen.is_used(v):   # the final value of an accumulator no one reads
        outs.append(None)
        continue
      value = gen.fresh_name("acc_value", v.aval.dtype, r.shape)
      gen.emit_scalar(f"{value.name} = {acc_pieces.whole(gen, r)}")
      gen.layouts[value.name] = r.layout
      outs.append(value)
    else:
      outs.append(r)
  return outs


# --- layout assignment (assign.py) ------------------------------------------------------------

def allocate_layouts(a, kind, aval):
  """What the assignment knows of a scratch Ref: an accumulator's layout, an SMEM buffer."""
  shape, dtype = tuple(aval.shape), np.dtype(aval.dtype)
  if isinstance(kind, mc.WGMMAAccumulatorRef):
    a.accs.append(Acc(shape, L.wgmma(shape[1], a.gen.mma_bits)))
    return a.accs[-1]
  if _is_smem(kind):
    shape, dtype, packed = subbyte.as_bytes(shape, dtype)   # (rows not of whole bytes: refused)
    lead, stored = stored_shape(shape)
    a.buffers.append(Buffer(stored, dtype, len(shape) if lead else 0))
    return Smem(a.buffers[-1], shape, dtype, L.swizzle(shape[-2:], dtype), lead=lead, packed=packed)
  return Opaque()   # a barrier (or what the writer refuses)


@layout_rule(prims.run_scoped_p)
def _run_scoped_layouts(ctx, *consts, jaxpr, num_consts, scratch_types=(), **_):
  a = ctx.a
  refs = a.hoisted.get(ctx.eqn)
  if refs is None and a.thread_name in ctx.eqn.params.get("collective_axes", ()):
    return None   # the writer refuses it
  avals = [v.aval.inner_aval for v in jaxpr.invars[num_consts:]]
  refs = [r if r is not None else allocate_layouts(a, t, v)
          for r, t, v in zip(refs or [None] * len(avals), scratch_types, avals)]
  return ctx.lower(jaxpr, [*consts, *refs])


@layout_rule(ji.run_state_p)
def _run_state_layouts(ctx, *invals, jaxpr, is_initialized, **_):
  """As ``_run_state``: accumulators (``_accumulator``), and read-only Refs."""
  a, given, refs = ctx.a, iter(invals), []
  for init, v in zip(is_initialized, jaxpr.invars):
    x = next(given) if init else None
    if x is not None and not isinstance(x, (Val, ex.Lit)):
      refs.append(x)
      continue
    shape = tuple(v.aval.inner_aval.shape)
    if x is not None and not _accumulator(x, jaxpr, v):
      refs.append(Closed(x))
      continue
    if x is None or len(shape) != 2:
      return None   # the writer refuses it
    layout = L.wgmma(shape[1], a.gen.mma_bits)
    a.to_layout(x, layout, shape, x.dtype)
    a.accs.append(Acc(shape, layout))
    refs.append(a.accs[-1])
  ctx.lower(jaxpr, refs)
  return [r.value if isinstance(r, Closed) else
          Val(r.shape, np.dtype(v.aval.dtype), r.layout) if isinstance(r, Acc) else r
          for r, v in zip(refs, ctx.eqn.outvars)]

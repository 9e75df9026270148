"""What Blackwell's tensor-core primitives mean, as rules of the eager interpreter, and the
checks of the rules JAX's documentation leaves to the user.

The model, as for Hopper's (semantics.py): an MMA or an SMEM->TMEM copy computes its result
when issued, a TMEM load reads when issued, a TMEM store writes when issued. What the hardware
does later is tracked instead:

- each MMA or copy is an operation in flight (with the SMEM and TMEM it reads and writes) until
  a thread learns it completed: by waiting on a barrier that ``tcgen05_commit_arrive`` (or the
  MMA's own ``barrier``) arrived on after it, or on a barrier (``orders_tensor_core=True``)
  that a thread which knew arrived on. MMAs into the same accumulator, and an MMA after a copy
  into its operand, run in order (PTX's pipelined pairs): the later one's completion implies
  the earlier's;
- ``async_load_tmem`` reads until its thread calls ``wait_load_tmem``; ``async_store_tmem``
  writes are seen once its thread calls ``commit_tmem``.

Errors: TMEM read before the operation writing it completed; TMEM, or SMEM operands,
overwritten while an operation in flight reads them; TMEM overwritten before the loads of it
were awaited; TMEM read before the stores to it were committed; allocations over the 512
columns of a block; products the tensor core cannot run.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from pallax._src import jax_internals as ji
from pallax._src import primitives as prims
from pallax._src.interpret import eager
from pallax._src.interpret.eager import View, fail, rule
from pallax._src.mosaic_gpu import clusters
from pallax._src.mosaic_gpu import core as mc
from pallax._src.mosaic_gpu import primitives as mp
from pallax._src.mosaic_gpu import semantics as ms
from pallax._src.mosaic_gpu import tcgen05 as tc


# --- bookkeeping -------------------------------------------------------------------------------

@dataclasses.dataclass(eq=False)
class Op:
  """An MMA or SMEM->TMEM copy in flight: what it reads and writes ((buffer, mask) pairs)."""
  what: str
  thread: eager.Thread
  line: str | None
  reads: list
  writes: list
  after: list     # earlier operations it completes after (pipelined)


@dataclasses.dataclass
class TcState:
  issued: list = dataclasses.field(default_factory=list)   # this thread's operations
  known: set = dataclasses.field(default_factory=set)      # operations it knows completed
  ordered: set = dataclasses.field(default_factory=set)    # issued before what it observed
  loads: list = dataclasses.field(default_factory=list)    # (buffer, mask, line) not awaited
  stores: list = dataclasses.field(default_factory=list)   # (buffer, mask, line) not committed


def state(th) -> TcState:
  return th.state.setdefault("tcgen05", TcState())


def ops(th) -> list:
  return th.block.state.setdefault("tcgen05_ops", [])


def _threads(th):
  return th.block.state.get("threads", [th])


def _at(line) -> str:
  return line or "a line of library code"


def overlaps(pairs, buf, mask) -> bool:
  return any(b is buf and (m & mask).any() for b, m in pairs)


def learn(th, done) -> None:
  """``th`` knows the operations ``done`` completed, and with them those they complete after."""
  ts, stack = state(th), list(done)
  while stack:
    op = stack.pop()
    if op not in ts.known:
      ts.known.add(op)
      ts.ordered.add(op)
      stack += op.after
  ts.issued = [op for op in ts.issued if op not in ts.known]
  everyone = _threads(th)
  th.block.state["tcgen05_ops"] = [op for op in ops(th)
                                   if not all(op in state(t).known for t in everyone)]


def _in_flight(th):
  """The operations ``th`` does not know to have completed."""
  known = state(th).known
  return [op for op in ops(th) if op not in known]


def _carry(buf, i, phase) -> tuple[set, set]:
  """What the arrivals of phase ``phase`` of barrier ``i`` pass on: (the operations the
  arriving threads knew completed, those they had issued or learned of)."""
  return buf.state.setdefault("tcgen05_carry", {}).setdefault((i, phase), (set(), set()))


def _pass_on(th, buf, i, phase, issued=()) -> None:
  ts = state(th)
  known, ordered = _carry(buf, i, phase)
  known.update(issued, ts.known)
  ordered.update(ts.ordered)


def issue(th, op) -> None:
  """``th`` issues ``op`` (it is in flight until someone learns it completed)."""
  ops(th).append(op)
  state(th).issued.append(op)
  state(th).ordered.add(op)


def check_ordered(th, buf, mask, what: str, role: str) -> None:
  """An MMA of ``th`` after operations of other threads on the same TMEM runs after them only
  if they were issued before a barrier ``th`` waited on (the pipelined pairs of PTX)."""
  ts = state(th)
  for op in _in_flight(th):
    if op.thread is not th and op not in ts.ordered and overlaps(op.writes, buf, mask):
      fail(th, f"{what} {role} {buf.name} while the {op.what} writing it, issued by "
               f"{op.thread.describe()} at {_at(op.line)}, is in flight and not ordered before "
               "it: issue it before an arrival on a barrier (orders_tensor_core=True) that this "
               "thread waits on, or wait for its completion")


def _orders_tensor_core(th, view: View, what: str):
  if not getattr(view.buf.kind, "orders_tensor_core", False):
    fail(th, f"{what}: MMA barrier must have orders_tensor_core set to True. "
             f"({view.buf.name} does not: allocate it as plgpu.Barrier(..., "
             "orders_tensor_core=True))", ValueError)


def commit(th, view: View, what: str) -> None:
  """One arrival on ``view`` once this thread's operations so far completed."""
  _orders_tensor_core(th, view, what)
  i = ms.barrier_index(th, view, what)
  phase = ms.arrive(th, view, what)
  _pass_on(th, view.buf, i, phase, state(th).issued)


# --- views and hazards -------------------------------------------------------------------------

def view_of(th, ref, space: str, what: str, role: str) -> View:
  view = ref[0].at(ref[1])
  if view.buf.space != space:
    fail(th, f"{what}: the {role} must be a {space.upper()} Ref, but {view.buf.name} is in "
             f"{view.buf.space.upper()}", ValueError)
  if space == "tmem" and any(isinstance(t, ji.TransposeRef) for t in view.transforms):
    fail(th, f"{what}: TMEM transpose not allowed ({view.buf.name}); transpose the SMEM "
             "operand instead", ValueError)
  return view


def smem_operand(th, view: View, what: str) -> np.ndarray:
  mask = ms.view_mask(view)
  ms.check_committed(th, view, mask, what)
  ms.check_loaded(th, view, mask, what)
  ms.check_union_read(th, view, mask, what)
  eager.check_initialized(th, view, what)
  return mask


def _pending(th, view: View, mask, kind: str):
  """(thread, line) of each TMEM ``kind`` ("stores" not committed, "loads" not waited for) of
  any thread that overlaps ``view`` where ``mask`` is set."""
  for other in _threads(th):
    for buf, m, line in getattr(state(other), kind):
      if buf is view.buf and (m & mask).any():
        yield other, line


def check_committed_tmem(th, view: View, mask, what: str):
  for other, line in _pending(th, view, mask, "stores"):
    fail(th, f"{what} uses {view.buf.name} while the async_store_tmem into it by "
             f"{other.describe()} at {_at(line)} is not committed: call plgpu.commit_tmem() "
             "in the storing thread after the store (and before any barrier it arrives on)")


def check_loads_done(th, view: View, mask, what: str):
  for other, line in _pending(th, view, mask, "loads"):
    fail(th, f"{what} overwrites {view.buf.name} while the async_load_tmem of it by "
             f"{other.describe()} at {_at(line)} may still be reading: call "
             "plgpu.wait_load_tmem() in the loading thread first")


def _check_completed(th, view: View, mask, what: str):
  """TMEM read by ``th``: every operation writing it must have completed, as far as ``th`` knows."""
  for op in _in_flight(th):
    if overlaps(op.writes, view.buf, mask):
      fail(th, f"{what} reads {view.buf.name} before the {op.what} writing it (issued by "
               f"{op.thread.describe()} at {_at(op.line)}) completed: wait on a barrier it "
               "arrives on first (pass one to tcgen05_mma, or call tcgen05_commit_arrive)")


def _check_unused(th, view: View, mask, what: str):
  """``view`` is about to be overwritten by ``th``: no operation in flight may use it."""
  for op, role in [(op, "read") for op in _in_flight(th) if overlaps(op.reads, view.buf, mask)] + \
                  [(op, "write") for op in _in_flight(th) if overlaps(op.writes, view.buf, mask)]:
    fail(th, f"{what} overwrites {view.buf.name} while the {op.what} issued by "
             f"{op.thread.describe()} at {_at(op.line)} may still {role} it: wait on a "
             "barrier that it arrives on (tcgen05_mma(..., barrier) or "
             "tcgen05_commit_arrive) first")


def _tmem_write(th, view: View, what: str) -> np.ndarray:
  mask = ms.view_mask(view)
  check_loads_done(th, view, mask, what)
  check_committed_tmem(th, view, mask, what)
  return mask


# --- TMEM loads and stores -----------------------------------------------------------------------

_REDUCE = {"max": lambda x: x.max(-1), "min": lambda x: x.min(-1),
           "absmax": lambda x: np.abs(x).max(-1), "absmin": lambda x: np.abs(x).min(-1)}


@rule(tc.async_load_tmem_p)
def _async_load(th, eqn, invals):
  yield from ()
  (src,), _ = mp.split_refs(invals, eqn.params["trees"])
  view = view_of(th, src, "tmem", "async_load_tmem", "source")
  mask = ms.view_mask(view)
  _check_completed(th, view, mask, "async_load_tmem")
  check_committed_tmem(th, view, mask, "async_load_tmem")
  ms.check_union_read(th, view, mask, "async_load_tmem")
  eager.check_initialized(th, view, "async_load_tmem")
  state(th).loads.append((view.buf, mask, th.line))
  x = eager.read(view)
  reduce = eqn.params["reduce"]
  return [jnp.asarray(x)] + ([] if reduce is None else [jnp.asarray(_REDUCE[reduce](x))])


@rule(tc.async_store_tmem_p)
def _async_store(th, eqn, invals):
  yield from ()
  (dst,), (value,) = mp.split_refs(invals, eqn.params["trees"])
  view = view_of(th, dst, "tmem", "async_store_tmem", "destination")
  mask = _tmem_write(th, view, "async_store_tmem")
  _check_unused(th, view, mask, "async_store_tmem")
  eager.write(view, np.asarray(value))
  ms.union_write(th, view, mask)   # (a union's other groups: undefined now)
  state(th).stores.append((view.buf, mask, th.line))
  return []


@rule(tc.wait_load_tmem_p)
def _wait_load(th, eqn, invals):
  state(th).loads.clear()
  yield from ()
  return []


@rule(tc.commit_tmem_p)
def _commit_tmem(th, eqn, invals):
  state(th).stores.clear()
  yield from ()
  return []


@rule(tc.async_copy_smem_to_tmem_p)
def _copy_to_tmem(th, eqn, invals):
  yield from ()
  what = eqn.params["what"]
  (src, dst), _ = mp.split_refs(invals, eqn.params["trees"])
  src = view_of(th, src, "smem", what, "source")
  dst = view_of(th, dst, "tmem", what, "destination")
  axis = eqn.params["collective_axis"]
  other = clusters.pair_partner(th, axis, what) if axis is not None else None
  if axis is not None and other is None:
    return []   # the pair's leader copies this block's SMEM into its TMEM too
  src_mask = smem_operand(th, src, what)
  dst_mask = _tmem_write(th, dst, what)
  _check_unused(th, dst, dst_mask, what)
  pairs = [(src, dst)] + ([(clusters.twin(src, other), clusters.twin(dst, other))] if other else [])
  reads, writes = [], []
  for s_view, d_view in pairs:
    eager.check_initialized(th, s_view, what)
    _copy_tiles(th, s_view, d_view, what)
    ms.union_write(th, d_view, ms.view_mask(d_view))
    reads.append((s_view.buf, ms.view_mask(s_view)))
    writes.append((d_view.buf, ms.view_mask(d_view)))
  op = Op(what + (" (collective)" if other else ""), th, th.line, reads, writes, [])
  issue(th, op)
  if other is not None:   # in flight in the other block too (it writes that block's TMEM)
    other.state.setdefault("tcgen05_ops", []).append(op)
  return []


def _copy_tiles(th, src: View, dst: View, what: str) -> None:
  data, init = eager.read(src), eager.read_init(src)
  if what == "async_copy_sparse_metadata_to_tmem":   # the tiles as they are (the MMA reads them)
    data, init = data.reshape(dst.shape), init.reshape(dst.shape)
  elif data.ndim == 4:   # scales in the tensor core's tiles
    m64 = m64_collective_scales(dst)
    want = (tc.m64_collective_scales_tiles if m64 else tc.scales_tiles)(tuple(dst.shape))
    if tuple(src.shape) != want:
      fail(th, f"{what}: SMEM scale tiles of shape {tuple(src.shape)} do not fill the TMEM "
               f"{dst.buf.name} of shape {tuple(dst.shape)} in its layout {dst.buf.kind.layout} "
               f"(its tiles: {want})", ValueError)
    untile = tc.untile_m64_collective_scales if m64 else tc.untile_scales
    data, init = untile(data), untile(init)
  eager.write(dst, data, init=init)


def m64_collective_scales(view: View) -> bool:
  """Whether a TMEM view holds the B scales of a two-block MMA of M = 64 a block, each half of
  N at 128 rows (``TMEMLayout.SCALES_M64_COLLECTIVE_LAYOUT``)."""
  layout = getattr(view.buf.kind, "layout", None)
  return getattr(layout, "layout_cls", layout) is mc.TMEMLayout.SCALES_M64_COLLECTIVE_LAYOUT


# --- memory the rest of the kernel touches -------------------------------------------------------

def _on_read(th, view: View, how):
  if view.buf.space == "tmem":
    fail(th, f"{view.buf.name}: Loads from TMEM are asynchronous operations and cannot be "
             "performed using the usual syntax. Please use plgpu.async_load_tmem instead.",
         RuntimeError)


def _on_write(th, view: View, how):
  if view.buf.space == "tmem":
    fail(th, f"{view.buf.name}: Stores to TMEM are asynchronous operations and cannot be "
             "performed using the usual syntax. Please use plgpu.async_store_tmem instead.",
         RuntimeError)
  if view.buf.space == "smem" and ops(th):   # (no mask to compute in kernels without MMAs)
    _check_unused(th, view, ms.view_mask(view), "a store")


eager.ON_READ.append(_on_read)
eager.ON_WRITE.append(_on_write)


_AROUND: dict = {}   # primitive -> around(inner rule, thread, eqn, invals): a generator


def _around(p):
  def register(fn):
    _AROUND[p] = fn
    return fn
  return register


def wrap_rules(*_) -> None:
  """Puts this module's checks around the rules of other modules (semantics.py's barriers,
  copies and scopes). Done at import and again as each block starts, in case a module
  imported later registered its own rule for one of them."""
  for p, around in _AROUND.items():
    inner = eager.RULES[p]
    if getattr(inner, "tcgen05", False):
      continue

    def wrapped(th, eqn, invals, inner=inner, around=around):
      return (yield from around(inner, th, eqn, invals))
    wrapped.tcgen05 = True
    wrapped.__name__ = f"tcgen05_{p.name}"
    eager.RULES[p] = wrapped


def _barrier(th, eqn, invals):
  (bar,), rest = mp.split_refs(invals, eqn.params["trees"])
  if eqn.params.get("has_predicate") and not bool(rest[0]):
    return None
  view = bar[0].at(bar[1])
  if view.buf.space != "barrier":
    return None
  i = ms.barrier_index(th, view, eqn.primitive.name)
  return view, i


@_around(mp.barrier_arrive_p)
def _arrive(inner, th, eqn, invals):
  """An arrival on an ``orders_tensor_core`` barrier passes on what the thread knows."""
  got = _barrier(th, eqn, invals)
  if got:
    phase = int(got[0].buf.state["completions"].reshape(-1)[got[1]])
  outs = yield from inner(th, eqn, invals)
  if got and getattr(got[0].buf.kind, "orders_tensor_core", False):
    _pass_on(th, got[0].buf, got[1], phase)
  return outs


@_around(mp.barrier_wait_p)
def _wait(inner, th, eqn, invals):
  """A wait learns what the arrivals of the phase it waited for passed on."""
  got = _barrier(th, eqn, invals)
  if got:
    phase = ms.thread_state(th).observed.get((got[0].buf, got[1]), 0)
  outs = yield from inner(th, eqn, invals)
  if got:
    known, ordered = _carry(got[0].buf, got[1], phase)
    state(th).ordered.update(ordered)
    learn(th, known)
  return outs


@_around(mp.copy_gmem_to_smem_p)
def _tma(inner, th, eqn, invals):
  (_, dst, _), rest = mp.split_refs(invals, eqn.params["trees"])
  view = dst[0].at(dst[1])
  on = not eqn.params.get("has_predicate") or bool(rest[0])
  if on and view.buf.space == "smem" and ops(th):
    _check_unused(th, view, ms.view_mask(view), "copy_gmem_to_smem")
  return (yield from inner(th, eqn, invals))


# --- the TMEM budget -----------------------------------------------------------------------------

def _columns(t) -> int:
  return -(-t.columns // mc.TMEM_COL_ALIGNMENT) * mc.TMEM_COL_ALIGNMENT


def _scope_columns(eqn):
  """(columns, a description) of the TMEM a run_scoped allocates."""
  types = eqn.params.get("scratch_types") or ()
  body = eqn.params["jaxpr"]
  names = getattr(getattr(body, "debug_info", None), "arg_names", None) or ()
  names = tuple(names)[eqn.params["num_consts"]:]
  cols, parts, unions = 0, [], []
  for i, t in enumerate(types):
    if not isinstance(t, mc.TMEMType):
      continue
    n = _columns(t)
    if t.alias is not None:   # a member of a plgpu.RefUnion: (its group, first of the union?)
      if t.alias[1]:
        unions.append({})
      unions[-1][t.alias[0]] = unions[-1].get(t.alias[0], 0) + n
      continue
    cols += n
    name = names[i] if i < len(names) and names[i] else f"TMEM{t.shape}"
    parts.append(f"{name}: {n}")
  for groups in unions:   # a union's groups share columns: its widest group's count
    cols += max(groups.values())
    parts.append(f"a plgpu.RefUnion of TMEM: {max(groups.values())}")
  return cols, parts


@_around(prims.run_scoped_p)
def _scoped_with_budget(inner, th, eqn, invals):
  """The TMEM of the scopes alive at once in a block: at most 512 columns."""
  cols, parts = _scope_columns(eqn)
  if not cols:
    return (yield from inner(th, eqn, invals))
  count = th.scoped.get(id(eqn), 0)
  key = (id(eqn), count) if eqn.params.get("collective_axes") else (id(eqn), id(th), count)
  live = th.block.state.setdefault("tmem_live", {})
  if key not in live:
    total = sum(c for c, _, _ in live.values()) + cols
    if total > mc.TMEM_MAX_COLS:
      held = "; ".join(p for _, ps, _ in live.values() for p in ps)
      fail(th, f"TMEM allocations of {total} columns ({'; '.join(parts)}"
               f"{'; already held: ' + held if held else ''}), exceeding the limit of "
               f"{mc.TMEM_MAX_COLS} columns of a block's tensor memory: allocate less (a "
               "float32 TMEM((128, n)) takes n columns, a packed 16-bit one n/2)", ValueError)
    live[key] = [cols, parts, 0]
  live[key][2] += 1
  try:
    return (yield from inner(th, eqn, invals))
  finally:
    live[key][2] -= 1
    if not live[key][2]:
      del live[key]


wrap_rules()
eager.ON_BLOCK_START.append(wrap_rules)


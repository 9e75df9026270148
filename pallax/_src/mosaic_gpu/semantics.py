"""What Mosaic GPU primitives mean, as rules of the eager interpreter, and the checks of the rules
that the JAX docs leave to the user.

The model: a TMA copy moves its data when issued (GMEM->SMEM zero-fills past the array's end,
SMEM->GMEM drops it) and its landing is one arrival on its barrier; ``wgmma`` accumulates in
float32 when issued. What a GPU does later is tracked instead, so that a program relying on an
order the hardware does not promise is an error:

- a barrier's phases: each thread waits for phase k, then k+1, ...; a barrier completing twice
  before a waiting thread saw the first completion is an error (on the GPU the phase parity
  would lie), and so is a deadlock (every thread waits);
- SMEM filled by a copy may be read by a thread only after it waited on the copy's barrier;
- SMEM written from registers must be committed (``commit_smem``) before TMA or wgmma reads it;
- SMEM may not be overwritten while an un-awaited TMA store or wgmma still reads it.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
from jax import lax

from pallax._src import jax_internals as ji
from pallax._src.interpret import eager
from pallax._src.interpret.eager import Buffer, View, fail, flat_indices, rule
from pallax._src.mosaic_gpu import core as mc
from pallax._src.mosaic_gpu import primitives as mp


# --- per-thread and per-buffer bookkeeping -----------------------------------------------------

@dataclasses.dataclass
class ThreadState:
  observed: dict = dataclasses.field(default_factory=dict)   # (barrier buf, i) -> phases seen
  dirty: dict = dataclasses.field(default_factory=dict)      # smem buf -> (mask, line)
  stores: list = dataclasses.field(default_factory=list)     # groups of Stores, oldest first
  uncommitted: list = dataclasses.field(default_factory=list)
  unwritten: list = dataclasses.field(default_factory=list)  # Stores done reading SMEM only
  wgmmas: list = dataclasses.field(default_factory=list)     # (acc buf, [(buf, mask)], line)


@dataclasses.dataclass
class Store:
  """A copy_smem_to_gmem in flight: it reads ``src`` and writes ``dst`` (masks of elements)."""
  src: Buffer
  src_mask: np.ndarray
  dst: Buffer
  dst_mask: np.ndarray
  line: str | None

  def reads(self, buf, mask) -> bool:
    return self.src is buf and bool((self.src_mask & mask).any())

  def writes(self, buf, mask) -> bool:
    return self.dst is buf and bool((self.dst_mask & mask).any())


def thread_state(th) -> ThreadState:
  return th.state.setdefault("mosaic_gpu", ThreadState())


def _at(line) -> str:
  return line or "a line of library code"


def view_mask(view: View) -> np.ndarray:
  m = np.zeros(view.buf.data.size, bool)
  m[flat_indices(view)] = True
  return m


def _threads(th):
  return th.block.state.get("threads", [th])


# --- allocation ------------------------------------------------------------------------------

def _barrier(kind, aval, name):
  shape = tuple(aval.shape)
  if name.startswith("scratch"):
    name = name.replace("scratch", "barrier")
  elif "barrier" not in name.lower():
    name = f"barrier {name}"   # 'barrier bar', but 'x_barrier', not 'barrier x_barrier'
  buf = Buffer(name, "barrier", np.zeros(shape, np.int32), kind)
  buf.state.update(arrivals=np.zeros(shape, np.int64), completions=np.zeros(shape, np.int64),
                   waiters=[set() for _ in range(max(1, int(np.prod(shape))))])
  return buf


def _memory(kind, aval, name):
  space = {mc.MemorySpace.SMEM: "smem", mc.MemorySpace.GMEM: "gmem", mc.MemorySpace.TMEM: "tmem",
           mc.MemorySpace.REGS: "regs"}[kind.memory_space]
  from pallax._src import primitives as prims
  return Buffer(f"{space.upper()} {name}", space, np.array(prims.poison(aval.shape, aval.dtype)), kind,
                {"loads": []}, init=np.zeros(aval.shape, bool))


def _accumulator(kind, aval, name):
  return Buffer(f"accumulator {name}", "regs", np.zeros(aval.shape, aval.dtype), kind)


eager.ALLOCATORS.update({mc.Barrier: _barrier, mc.GPUMemoryRef: _memory,
                         mc.WGMMAAccumulatorRef: _accumulator})


def _reuse_barrier(th, buf):
  """A scope entered again gets the same barrier on the GPU (barriers are initialized once, as
  in Mosaic GPU): the last entry must have awaited every completion and left no phase half
  arrived, or the new entry's waits would see the wrong phase."""
  arrivals, done = buf.state["arrivals"].reshape(-1), buf.state["completions"].reshape(-1)
  for i in range(done.size):
    seen = thread_state(th).observed.get((buf, i), 0)
    if arrivals[i] or done[i] != seen:
      left = (f"{arrivals[i]} of {buf.kind.num_arrivals} arrivals of a phase" if arrivals[i]
              else f"{done[i] - seen} completion(s) nobody waited for")
      fail(th, f"the scope of {barrier_name(buf, i)} is entered again, and its last entry left "
               f"{left}: on the GPU the new entry gets the same barrier, and its waits would see "
               "the wrong phase. Wait for every completion before the scope ends")


def _reuse_smem(th, buf):
  """A scope entered again gets the same SMEM on the GPU: nothing of its last entry (a copy, a
  wgmma) may still use it."""
  _check_not_in_use(th, View(buf), np.ones(buf.data.size, bool),
                    "entering its scope again (which the GPU does with the same SMEM)")


eager.REUSE_CHECKS.update(barrier=_reuse_barrier, smem=_reuse_smem)


# --- barriers --------------------------------------------------------------------------------

def barrier_index(th, view: View, what: str) -> int:
  if view.buf.space != "barrier":
    fail(th, f"{what} takes a barrier (plgpu.Barrier), but {view.buf.name} is a buffer")
  idx = flat_indices(view)
  if idx.size == 0 or (idx.size == 1 and np.prod(view.shape) == 0):
    fail(th, f"{what}: out-of-bounds barrier index, past the end of {view.buf.name} "
             f"({view.buf.data.size} barriers)", IndexError)
  if idx.size != 1:
    fail(th, f"{what} takes one barrier; index the barrier array ({view.buf.name}[i])")
  return int(idx[0])


def barrier_name(buf, i) -> str:
  return f"{buf.name}[{i}]" if buf.data.size > 1 else buf.name


def arrive(th, view: View, what: str) -> int:
  """One arrival; returns the phase it belongs to."""
  i = barrier_index(th, view, what)
  st, n = view.buf.state, view.buf.kind.num_arrivals
  flat_arr, flat_done = st["arrivals"].reshape(-1), st["completions"].reshape(-1)
  phase = int(flat_done[i])
  flat_arr[i] += 1
  eager.notify(th)
  if flat_arr[i] == n:
    flat_arr[i] = 0
    flat_done[i] += 1
    for waiter in st["waiters"][i]:
      seen = thread_state(waiter).observed.get((view.buf, i), 0)
      if flat_done[i] - seen >= 2:
        fail(th, f"{what} completes {barrier_name(view.buf, i)} (num_arrivals={n}) a second time "
                 f"before {waiter.describe()} waited for its previous completion: on the GPU that "
                 "wait would see the wrong phase. Wait on every completion, or give the barrier "
                 "as many arrivals per phase as its users make")
  return phase


@rule(mp.barrier_arrive_p)
def _barrier_arrive(th, eqn, invals):
  (bar,), rest = mp.split_refs(invals, eqn.params["trees"])
  if not eqn.params["has_predicate"] or bool(rest[0]):
    arrive(th, bar[0].at(bar[1]), "barrier_arrive")
  yield from ()
  return []


@rule(mp.barrier_wait_p)
def _barrier_wait(th, eqn, invals):
  (bar,), _ = mp.split_refs(invals, eqn.params["trees"])
  view = bar[0].at(bar[1])
  i = barrier_index(th, view, "barrier_wait")
  key, done = (view.buf, i), view.buf.state["completions"].reshape(-1)
  view.buf.state["waiters"][i].add(th)
  seen = thread_state(th).observed.get(key, 0)
  if done[i] - seen >= 2:
    fail(th, f"barrier_wait on {barrier_name(view.buf, i)}: the barrier completed {done[i] - seen} times "
             "since this thread last waited on it; on the GPU the wait would see the wrong phase")
  if done[i] <= seen:
    n = view.buf.kind.num_arrivals
    yield eager.Wait(lambda: done[i] > seen,
                     f"{barrier_name(view.buf, i)} (phase {seen}, "
                     f"{view.buf.state['arrivals'].reshape(-1)[i]}/{n} arrivals)")
  thread_state(th).observed[key] = seen + 1
  return []


# --- memory hazards --------------------------------------------------------------------------

def _check_loaded(th, view: View, mask, what: str):
  """SMEM filled by a copy is readable by a thread once it waited on the copy's barrier (a
  cluster peer's SMEM, read through plgpu.cluster_ref: once a thread of its block did)."""
  owner = view.buf.state.get("block")
  readers = owner.state.get("threads", []) if owner is not None and owner is not th.block else [th]
  for m, key, phase, line in view.buf.state.get("loads", ()):
    if (m & mask).any() and all(thread_state(t).observed.get(key, 0) <= phase for t in readers):
      fail(th, f"{what} reads {view.buf.name} before waiting on the barrier of the "
               f"copy_gmem_to_smem into it (issued at {_at(line)}); call plgpu.barrier_wait first")


def _check_committed(th, view: View, mask, what: str):
  for other in _threads(th):
    m, line = thread_state(other).dirty.get(view.buf, (None, None))
    if m is not None and (m & mask).any():
      fail(th, f"{what} reads {view.buf.name}, written from registers by {other.describe()} at "
               f"{_at(line)} without plgpu.commit_smem() in between; TMA and wgmma may not see that "
               "write")


def _check_not_in_use(th, view: View, mask, what: str):
  for other in _threads(th):
    ts = thread_state(other)
    for st in [e for g in ts.stores for e in g] + ts.uncommitted:
      if st.reads(view.buf, mask):
        fail(th, f"{what} overwrites {view.buf.name} while a copy_smem_to_gmem issued by "
                 f"{other.describe()} at {_at(st.line)} may still read it; call "
                 "plgpu.wait_smem_to_gmem(...) first")
    for _, operands, line in ts.wgmmas:
      if any(buf is view.buf and (m & mask).any() for buf, m in operands):
        fail(th, f"{what} overwrites {view.buf.name} while a wgmma issued by {other.describe()} "
                 f"at {_at(line)} may still read it; call plgpu.wgmma_wait(...) first (or raise "
                 "delay_release)")
  for m, _, _, line in view.buf.state.get("loads", ()):
    if (m & mask).any() and what != "copy_gmem_to_smem" and _pending(th, view.buf, m):
      fail(th, f"{what} writes {view.buf.name} while the copy_gmem_to_smem into it (issued at "
               f"{_at(line)}) has not been awaited")


def _pending(th, buf, mask) -> bool:
  return any((m & mask).any() and thread_state(th).observed.get(key, 0) <= phase
             for m, key, phase, _ in buf.state.get("loads", ()))


def _on_read(th, view: View, how):
  if view.buf.space == "barrier":
    fail(th, f"{view.buf.name} is a barrier: use barrier_wait/barrier_arrive, not a load")
  ts = thread_state(th)
  if any(acc is view.buf for acc, _, _ in ts.wgmmas):
    ts.wgmmas.clear()   # reading an accumulator waits for its wgmmas
  if view.buf.space == "smem":
    _check_loaded(th, view, view_mask(view), "a load")
    check_union_read(th, view, view_mask(view), "a load")
  elif view.buf.space == "gmem":
    _check_written(th, view, view_mask(view))


def _check_written(th, view: View, mask):
  """GMEM that a TMA store writes is readable once the store completed (a full wait)."""
  for other in _threads(th):
    ts = thread_state(other)
    for st in [e for g in ts.stores for e in g] + ts.uncommitted + ts.unwritten:
      if st.writes(view.buf, mask):
        fail(th, f"a load reads {view.buf.name} while the copy_smem_to_gmem into it issued by "
                 f"{other.describe()} at {_at(st.line)} may still be writing; call "
                 "plgpu.wait_smem_to_gmem(0) (without wait_read_only) first")


def _on_write(th, view: View, how):
  if view.buf.space == "barrier":
    fail(th, f"{view.buf.name} is a barrier: use barrier_arrive, not a store")
  if view.buf.space != "smem":
    return
  mask = view_mask(view)
  _check_not_in_use(th, view, mask, "a store")
  union_write(th, view, mask)
  old, _ = thread_state(th).dirty.get(view.buf, (np.zeros_like(mask), None))
  thread_state(th).dirty[view.buf] = (old | mask, th.line)


eager.ON_READ.append(_on_read)
eager.ON_WRITE.append(_on_write)


# --- plgpu.RefUnion: SMEM buffers that share memory --------------------------------------------

def _link_unions(th, bufs):
  """The members of a RefUnion (consecutive buffers of one allocation, marked by their type's
  ``alias``: (group, first member?)) learn of each other."""
  union = None
  for b in bufs:
    alias = getattr(b.kind, "alias", None)
    if alias is None:
      continue
    if alias[1]:
      union = []
    union.append((alias[0], b))
    b.state["union"] = union


def union_write(th, view: View, mask):
  """A write through one group of a RefUnion leaves the other groups' buffers undefined."""
  union = view.buf.state.get("union")
  if union is None:
    return
  clobbered = view.buf.state.get("clobbered")
  if clobbered is not None:
    clobbered[0][mask] = False
  group = view.buf.kind.alias[0]
  for g, other in union:
    if g != group:
      other.state["clobbered"] = (np.ones(other.data.size, bool), view.buf.name, th.line)


def check_union_read(th, view: View, mask, what: str):
  clobbered = view.buf.state.get("clobbered")
  if clobbered is not None and (clobbered[0] & mask).any():
    fail(th, f"{what} reads {view.buf.name} after a write to {clobbered[1]} at "
             f"{_at(clobbered[2])}, which shares its memory (another group of their "
             "plgpu.RefUnion): its contents are undefined. Use a union's groups at different "
             "times, and write a Ref before reading it")


eager.ON_ALLOCATE.append(_link_unions)


@rule(mp.commit_smem_p)
def _commit_smem(th, eqn, invals):
  thread_state(th).dirty.clear()
  yield from ()
  return []


# --- TMA copies ------------------------------------------------------------------------------

def _space(th, view: View, space: str, what: str, role: str):
  if view.buf.space != space:
    fail(th, f"{what}: the {role} must be in {space.upper()}, but {view.buf.name} is in "
             f"{view.buf.space.upper()}")


def _bulk(smem: View, gmem: View) -> bool:
  """Whether Mosaic GPU copies this as one bulk copy of contiguous bytes (``cp.async.bulk``,
  of any size) rather than a TMA box: an SMEM buffer without transforms, a contiguous GMEM
  slice, no reduction, and no zero fill past the array's end (stores never fill; loads unless
  ``oob_mode`` is UNDEFINED or PROMISE_IN_BOUNDS). JAX's test_pipeline_oob_mode copies 512
  int8s so, and passes on a GPU; pallax's Gluon backend copies such a box in pieces."""
  if getattr(smem.buf.kind, "transforms", ()):
    return False
  idx = flat_indices(gmem)
  return bool(idx.size) and bool(np.all(np.diff(idx) == 1))


def _check_box(th, smem: View, gmem: View, what: str, may_be_bulk: bool = False):
  """The TMA rules: at most 256 elements a box dimension (after tiling; unless it is a bulk
  copy), 16-byte inner rows, 16-byte-aligned GMEM strides."""
  shape, itemsize = list(smem.shape), smem.buf.data.dtype.itemsize
  tiling = next((t.tiling for t in getattr(smem.buf.kind, "transforms", ())
                 if isinstance(t, mc.TilingTransform)), ())
  if tiling and len(shape) >= len(tiling):
    lead, tail = shape[:-len(tiling)], shape[-len(tiling):]
    shape = lead + [-(-d // t) for d, t in zip(tail, tiling)] + list(tiling)
  if shape and max(shape) > 256 and not (may_be_bulk and _bulk(smem, gmem)):
    fail(th, f"{what}: TMA copies at most 256 elements along each dimension, but the box of "
             f"{smem.buf.name} is {tuple(shape)} (JAX: Async copies only support copying <=256 "
             "elements along each dimension); tile it (plgpu.TilingTransform) or copy in parts")
  if shape and shape[-1] * itemsize % 16:
    fail(th, f"{what}: a TMA box's rows must be multiples of 16 bytes, but {smem.buf.name}'s are "
             f"{shape[-1]} x {itemsize} bytes")
  gshape = gmem.buf.data.shape
  for k in range(len(gshape) - 1):
    if int(np.prod(gshape[k + 1:])) * itemsize % 16:
      fail(th, f"{what}: TMA needs GMEM strides that are multiples of 16 bytes, but {gmem.buf.name} "
               f"of shape {gshape} has a stride of {int(np.prod(gshape[k + 1:])) * itemsize} bytes")


def _copy_views(th, eqn, invals, spaces):
  """(source view, destination view, barrier Ref or None) of a TMA copy, its memory spaces
  checked; None when its predicate is off."""
  (src, dst, bar), rest = mp.split_refs(invals, eqn.params["trees"])
  if eqn.params.get("has_predicate") and not bool(rest[0]):
    return None
  src, dst = src[0].at(src[1]), dst[0].at(dst[1])
  _space(th, src, spaces[0], eqn.primitive.name, "source")
  _space(th, dst, spaces[1], eqn.primitive.name, "destination")
  return src, dst, bar


@rule(mp.copy_gmem_to_smem_p)
def _copy_gmem_to_smem(th, eqn, invals):
  yield from ()
  what = "copy_gmem_to_smem"
  views = _copy_views(th, eqn, invals, ("gmem", "smem"))
  if views is None:   # predicated off: no data, but the barrier still gets its arrival (with
    bar = mp.split_refs(invals, eqn.params["trees"])[0][2]   # no bytes), as in Mosaic GPU
    if bar is not None:
      arrive(th, bar[0].at(bar[1]), what)
    return []
  src, dst, bar = views
  if bar is None:
    fail(th, f"{what} needs a barrier on Hopper GPUs (TMA): pass plgpu.Barrier scratch and "
             "barrier_wait on it before reading the data")
  _check_box(th, dst, src, what, eqn.params.get("oob_mode") not in (None, mc.OOBFillMode.ZEROS))
  mask = view_mask(dst)
  _check_not_in_use(th, dst, mask, what)
  for m, key, phase, line in dst.buf.state["loads"]:
    if (m & mask).any() and all(thread_state(t).observed.get(key, 0) <= phase for t in _threads(th)):
      fail(th, f"{what} into {dst.buf.name} while the copy_gmem_to_smem into it issued at "
               f"{_at(line)} may not have landed (no thread waited on its barrier): on the GPU "
               "either could land last")
  eager.write(dst, eager.read(src, fill=0), init=eager.read_init(src))
  union_write(th, dst, mask)
  landed(th, dst, mask, bar[0].at(bar[1]), what)
  return []


def landed(th, dst: View, mask, bar: View, what: str, line=None) -> None:
  """Data written asynchronously into SMEM ``dst`` (``mask``) arrives on ``bar``: it is readable
  by a thread once that thread waited on the barrier's phase (``_check_loaded``). ``line``:
  where it was issued, as the reports name it."""
  phase = arrive(th, bar, what)
  key = (bar.buf, barrier_index(th, bar, what))
  loads = [e for e in dst.buf.state.get("loads", []) if (e[0] & ~mask).any()]
  dst.buf.state["loads"] = loads + [(mask, key, phase, th.line if line is None else line)]


@rule(mp.copy_smem_to_gmem_p)
def _copy_smem_to_gmem(th, eqn, invals):
  yield from ()
  views = _copy_views(th, eqn, invals, ("smem", "gmem"))
  if views is None:
    return []
  src, dst, _ = views
  what = "copy_smem_to_gmem"
  _check_box(th, src, dst, what, eqn.params["reduction_op"] is None)
  mask = view_mask(src)
  _check_committed(th, src, mask, what)
  _check_loaded(th, src, mask, what)
  check_union_read(th, src, mask, what)
  data, init = eager.read(src), eager.read_init(src)
  if eqn.params["reduction_op"] is not None:
    data = _reduce(th, eqn.params["reduction_op"], eager.read(dst, fill=0), data)
    init = init & eager.read_init(dst)
  eager.write(dst, data, drop_out_of_bounds=True, init=init)
  ts = thread_state(th)
  ts.uncommitted.append(Store(src.buf, mask, dst.buf, view_mask(dst), th.line))
  if eqn.params["commit_group"]:
    ts.stores.append(ts.uncommitted)
    ts.uncommitted = []
  return []


def _reduce(th, op, old, new):
  fns = {"add": np.add, "min": np.minimum, "max": np.maximum, "and": np.bitwise_and,
         "or": np.bitwise_or, "xor": np.bitwise_xor}
  if op not in fns:
    fail(th, f"copy_smem_to_gmem: unknown reduction_op {op!r}; use one of {sorted(fns)}")
  return fns[op](old, new).astype(old.dtype)


@rule(mp.commit_smem_to_gmem_group_p)
def _commit_group(th, eqn, invals):
  ts = thread_state(th)
  ts.stores.append(ts.uncommitted)
  ts.uncommitted = []
  yield from ()
  return []


@rule(mp.wait_smem_to_gmem_p)
def _wait_smem_to_gmem(th, eqn, invals):
  ts, n = thread_state(th), eqn.params["n"]
  done, ts.stores = (ts.stores[:len(ts.stores) - n], ts.stores[len(ts.stores) - n:]) if n else (ts.stores, [])
  if eqn.params["wait_read_only"]:
    ts.unwritten += [st for g in done for st in g]   # their GMEM writes may still be going on
  else:
    ts.unwritten = []
  yield from ()
  return []


@rule(mp.wait_gmem_to_smem_p, mp.set_max_registers_p)
def _nothing(th, eqn, invals):
  yield from ()
  return []


# --- wgmma -----------------------------------------------------------------------------------

@rule(mp.wgmma_p)
def _wgmma(th, eqn, invals):
  (acc, a, b), rest = mp.split_refs(invals, eqn.params["trees"])
  yield from ()
  _check_k_major(th, a, b)
  acc, b = acc[0].at(acc[1]), b[0].at(b[1])
  operands = [b] + ([a[0].at(a[1])] if a is not None else [])
  for v in operands:
    _space(th, v, "smem", "wgmma", "operand Ref")
    m = view_mask(v)
    _check_committed(th, v, m, "wgmma")
    _check_loaded(th, v, m, "wgmma")
    check_union_read(th, v, m, "wgmma")
    eager.check_initialized(th, v, "wgmma")
  a_val = eager.read(operands[1]) if a is not None else np.asarray(rest[0])
  (m, _), (_, n) = a_val.shape, b.shape
  if m % 64 or n % 8 or n > 256:
    fail(th, f"wgmma of an ({m}, {n}) result: Hopper's wgmma needs M a multiple of 64 and N a "
             "multiple of 8 up to 256; split the product")
  prod = lax.dot_general(jnp.asarray(a_val), jnp.asarray(eager.read(b)), (((1,), (0,)), ((), ())),
                         preferred_element_type=jnp.float32)
  total = np.asarray(eager.read(acc), np.float32) + np.asarray(prod)
  eager.write(acc, total.astype(acc.buf.data.dtype))
  thread_state(th).wgmmas.append((acc.buf, [(v.buf, view_mask(v)) for v in operands], th.line))
  return []


def _transposed(transforms) -> bool:
  return sum(isinstance(t, ji.TransposeRef) for t in transforms) % 2 == 1


def _check_k_major(th, a, b):
  """Hopper's wgmma reads 32-bit (tf32) and 8-bit operands from SMEM K-major only: ``a`` as its
  (M, K) buffer, ``b`` as a transposed view of an (N, K) buffer (as Mosaic GPU requires too)."""
  (b_ref, b_transforms) = b
  if np.dtype(b_ref.buf.data.dtype).itemsize == 2:
    return
  if not _transposed(b_transforms) or (a is not None and _transposed(a[1])):
    fail(th, f"wgmma of {np.dtype(b_ref.buf.data.dtype).name} operands: Hopper reads 32-bit and "
             "8-bit operands K-major only: keep b as an (N, K) SMEM buffer and pass "
             "b_smem.transpose((1, 0)), a as (M, K), or use 16-bit operands")


@rule(mp.wgmma_wait_p)
def _wgmma_wait(th, eqn, invals):
  ts, n = thread_state(th), eqn.params["n"]
  ts.wgmmas = ts.wgmmas[len(ts.wgmmas) - n:] if n else []
  yield from ()
  return []


def _remember_threads(block, threads):
  block.state["threads"] = threads


eager.ON_BLOCK_START.append(_remember_threads)


# What clusters.py (multicast copies, cluster barriers) builds on.
copy_views, check_box, check_not_in_use = _copy_views, _check_box, _check_not_in_use
# The checks that Blackwell's rules (tcgen05_semantics.py) share with these.
check_committed = _check_committed
check_loaded = _check_loaded

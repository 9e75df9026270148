"""The eager interpreter: kernels whose threads wait on each other (Mosaic GPU kernels).

A block's threads run one body each, as Python generators over the kernel jaxpr: an equation
that must wait (``barrier_wait`` on a phase not yet complete) yields, and the scheduler runs
another thread. Blocks run one after another, in row-major grid order (the last axis fastest);
the blocks of a cluster (``plgpu.kernel(cluster=...)``: the grid counts clusters) run together.
When every thread of a block waits, that is a deadlock, reported with each thread's wait and
source line.

Memory is NumPy (memory.py): each allocation is a ``Buffer`` written in place; Refs inside the
evaluator are ``View``s (a buffer and the chain of ``.at[...]``/``.transpose`` transforms). Pure
equations are bound eagerly by JAX, so their semantics are lax's own. Control flow that touches
Refs is walked here, equation by equation. Primitives with their own meaning (barriers, copies,
wgmma) register a rule in ``RULES``: ``rule(thread, eqn, invals)`` is a generator returning the outputs.

The entry points run a pallas_call's Params: ``run_now`` eagerly (errors raise here) and
``run_traced`` inside a trace (a host callback).
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Hashable

import jax
import jax.numpy as jnp
import numpy as np

from pallax._src import core as pc
from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src import errors
from pallax._src import primitives as prims
from pallax._src import remote
from pallax._src.errors import KernelCheckError
from pallax._src.interpret import uninit
from pallax._src.interpret.memory import (  # noqa: F401  (re-exported for the rules' modules)
    Buffer, View, flat_indices, in_bounds, oob_message, read, read_init, shapes_of, view_coords,
    write)


# --- uninitialized data (buffers keep init masks, memory.py) -----------------------------------

def check_initialized(th, view: View, what: str, mask=None, coords=None) -> None:
  """Fails if ``view`` (where ``mask``) holds an element nothing wrote."""
  if view.buf.init is None:
    return
  missing = ~read_init(view, coords)
  if mask is not None:
    missing &= np.broadcast_to(np.asarray(mask), missing.shape)
  if missing.any():
    at = tuple(int(i) for i in np.argwhere(missing)[0])
    fail(th, f"{what} reads {view.buf.name} where nothing wrote it (element {at} of a view of "
             f"shape {view.shape}; {int(missing.sum())} such elements): its value is undefined "
             "(poison here, whatever the memory held on a GPU). Write or copy into it first")


# --- threads and blocks ----------------------------------------------------------------------

@dataclasses.dataclass(eq=False)
class Block:
  """One block of the grid: its threads share collective allocations."""
  axes: dict                 # grid and cluster axis name -> index
  kernel: str
  track: bool = False        # check for reads of data nothing wrote (uninit.enabled)
  shared: dict = dataclasses.field(default_factory=dict)
  state: dict = dataclasses.field(default_factory=dict)   # per-block bookkeeping of rules
  run: dict = dataclasses.field(default_factory=dict)     # shared by the call's blocks: "events"
  peers: list = dataclasses.field(default_factory=list)   # the blocks of its cluster, itself included
  device: dict = dataclasses.field(default_factory=dict)  # mesh axis -> index (under shard_map)
  params: object = None      # the call's Params
  buffers: list = dataclasses.field(default_factory=list)  # its GMEM: operands, then outputs


@dataclasses.dataclass(eq=False)
class Thread:
  block: Block
  index: int
  name: Hashable | None
  axes: dict                 # every axis name -> this thread's index
  state: dict = dataclasses.field(default_factory=dict)   # per-thread bookkeeping of rules
  scoped: dict = dataclasses.field(default_factory=dict)  # run_scoped eqn -> times entered
  line: str | None = None    # the source line of the equation running now

  def describe(self) -> str:
    return "the kernel" if self.name is None else f"thread {self.name}={self.index}"


@dataclasses.dataclass
class Wait:
  """Why a thread cannot go on: ``ready()`` tells when it can. ``shared``: it waits for
  something another block may change (a ``pl.get_global`` semaphore), so the scheduler starts
  the next block rather than report a deadlock. ``poll``: not a wait, the thread looked
  (``barrier_test``) and goes on, after the other threads had a turn."""
  ready: Callable[[], bool]
  what: str | Callable[[], str]   # a callable says it as it is when a deadlock is reported
  shared: bool = False
  poll: bool = False


def notify(th) -> None:
  """Counts an event that may let a waiting or polling thread go on (an arrival, a signal)."""
  th.block.run["events"] = th.block.run.get("events", 0) + 1


def fail(th: Thread, msg: str, cls=KernelCheckError):
  where = f" at {th.line}" if th.line else ""
  raise cls(f"{th.block.kernel}: {th.describe()} of block {_block_name(th.block)}{where}: {msg}")


def _block_name(block: Block) -> str:
  name = "(" + ", ".join(f"{k}={v}" for k, v in block.axes.items()) + ")" if block.axes else "(0)"
  if block.device:
    name += " of device (" + ", ".join(f"{k}={v}" for k, v in block.device.items()) + ")"
  return name


# --- evaluation ------------------------------------------------------------------------------

RULES: dict = {}              # primitive -> rule(thread, eqn, invals) generator -> outputs
ALLOCATORS: dict = {}         # scratch type class -> fn(type, name) -> Buffer
REUSE_CHECKS: dict = {}       # buffer space -> fn(thread, buffer): checks that the next entry
                              # to the buffer's scope may get the same memory (a GPU's does)


def rule(*prims_):
  def register(fn):
    for p in prims_:
      RULES[p] = fn
    return fn
  return register


def _has_view(vals) -> bool:
  return any(isinstance(v, View) for v in vals)


def _bind(eqn, invals):
  outs = eqn.primitive.bind(*invals, **eqn.params)
  return list(outs) if eqn.primitive.multiple_results else [outs]


def eval_jaxpr(th: Thread, jaxpr, consts, args):
  """Evaluates ``jaxpr`` for thread ``th`` (a generator; returns the outputs)."""
  env = {}

  def get(v):
    return v.val if isinstance(v, ji.Literal) else env[v]

  for v, x in zip(jaxpr.constvars, consts):
    env[v] = x
  for v, x in zip(jaxpr.invars, args):
    env[v] = x
  profile = th.state.get("profile")   # the thread's profile record (mosaic_gpu/profile_record.py)
  base = profile.scope if profile is not None else ()
  for eqn in jaxpr.eqns:
    invals = [get(v) for v in eqn.invars]
    th.line = ji.user_frame(eqn.source_info) or th.line
    if profile is not None:
      profile.at(base + ji.named_scopes(eqn.source_info))
    fn = RULES.get(eqn.primitive)
    if fn is not None:
      try:
        outs = yield from fn(th, eqn, invals)
      except remote.PeerError as e:   # a remote reference that names no peer buffer
        fail(th, str(e), ValueError)
    elif _has_view(invals) or (eqn.effects and any(True for _ in jaxpr_util.sub_jaxprs(eqn.params))):
      raise NotImplementedError(f"{th.block.kernel}: the interpreter of Mosaic GPU kernels does "
                                f"not support {eqn.primitive} on Refs yet (at {th.line})")
    else:
      outs = _bind(eqn, invals)
    for v, x in zip(eqn.outvars, outs):
      env[v] = x
  if profile is not None:
    profile.at(base)   # the scopes this jaxpr entered, left
  return [get(v) for v in jaxpr.outvars]


def call(th, jaxpr, args):
  return (yield from eval_jaxpr(th, jaxpr, list(getattr(jaxpr, "consts", ()) or ()), args))


def _pure(eqn, invals) -> bool:
  return not _has_view(invals) and not eqn.effects


@rule(ji.scan_p)
def _scan(th, eqn, invals):
  if _pure(eqn, invals):
    return _bind(eqn, invals)
  p = eqn.params
  nc, ncarry, _ = (len(s) for s in p["ft_in"].unpack())
  consts, carry, xs = invals[:nc], invals[nc:nc + ncarry], invals[nc + ncarry:]
  ys = []
  steps = range(p["length"] - 1, -1, -1) if p["reverse"] else range(p["length"])
  for i in steps:
    outs = yield from call(th, p["jaxpr"], [*consts, *carry, *[x[i] for x in xs]])
    carry, y = outs[:ncarry], outs[ncarry:]
    ys.append(y)
  if p["reverse"]:
    ys.reverse()
  stacked = [jnp.stack([y[k] for y in ys]) if ys else jnp.zeros((0, *a.shape), a.dtype)
             for k, a in enumerate(v.aval for v in eqn.outvars[ncarry:])]
  return [*carry, *stacked]


@rule(ji.while_p)
def _while(th, eqn, invals):
  if _pure(eqn, invals):
    return _bind(eqn, invals)
  p = eqn.params
  cc, bc = invals[:p["cond_nconsts"]], invals[p["cond_nconsts"]:p["cond_nconsts"] + p["body_nconsts"]]
  carry = invals[p["cond_nconsts"] + p["body_nconsts"]:]
  while True:
    (go,) = yield from call(th, p["cond_jaxpr"], [*cc, *carry])
    if not bool(go):
      return carry
    carry = yield from call(th, p["body_jaxpr"], [*bc, *carry])


@rule(ji.cond_p)
def _cond(th, eqn, invals):
  if _pure(eqn, invals):
    return _bind(eqn, invals)
  branches = eqn.params["branches"]
  index = int(np.clip(int(np.asarray(invals[0])), 0, len(branches) - 1))
  return (yield from call(th, branches[index], invals[1:]))


@rule(ji.jit_p, ji.closed_call_p, ji.custom_jvp_call_p, ji.custom_vjp_call_p, ji.remat_p)
def _call(th, eqn, invals):
  if _pure(eqn, invals):
    return _bind(eqn, invals)
  p = eqn.params
  body = p.get("jaxpr", p.get("call_jaxpr"))
  return (yield from call(th, body, invals))


@rule(ji.axis_index_p)
def _axis_index(th, eqn, invals):
  name = eqn.params["axis_name"]
  if name not in th.axes:
    fail(th, f"lax.axis_index({name!r}): no such axis; the kernel's axes are {tuple(th.axes)}",
         ValueError)
  yield from ()
  return [jnp.int32(th.axes[name])]


# --- Ref access ------------------------------------------------------------------------------

def access_view(eqn, invals):
  from pallax._src import ref_access
  a = ref_access.split(eqn, invals)
  return a, a.ref.at(a.transforms)


ON_READ: list = []     # hooks(thread, view, how): checks of rules that watch memory
ON_WRITE: list = []


def _checked(hooks, th, view, how):
  for h in hooks:
    h(th, view, how)


@rule(ji.get_p, prims.masked_load_p)
def _get(th, eqn, invals):
  a, view = access_view(eqn, invals)
  _checked(ON_READ, th, view, "load")
  check_initialized(th, view, "a load", a.mask)
  fill = a.other if a.other is not None else (0 if a.mask is not None else None)
  try:
    x = read(view, fill=fill)
  except IndexError as e:
    fail(th, str(e), IndexError)
  if a.mask is not None:
    other = prims.poison(x.shape, x.dtype) if a.other is None else a.other
    x = np.where(np.asarray(a.mask), x, np.asarray(other, x.dtype))
  yield from ()
  return [jnp.asarray(x)]


@rule(ji.swap_p, prims.masked_swap_p, ji.addupdate_p)
def _set(th, eqn, invals):
  a, view = access_view(eqn, invals)
  accumulate = eqn.primitive is ji.addupdate_p
  coords = view_coords(view)
  ok = in_bounds(coords, view.buf.data.shape) if coords else np.ones((), bool)
  if not ok.all() and a.mask is None:
    fail(th, oob_message(view, coords, ok, "write to"), IndexError)
  _checked(ON_WRITE, th, view, "store")
  if accumulate:
    check_initialized(th, view, "an accumulating store (+=)", a.mask, coords)
  try:
    old = read(view, fill=0 if a.mask is not None else None, coords=coords)
    new, init = np.asarray(a.values[0]), True
    if a.mask is not None:   # masked-off lanes keep the Ref's value and return the given one
      mask = np.asarray(a.mask)
      new, old = np.where(mask, new, old), np.where(mask, old, new)
      init = mask | read_init(view, coords)
    write(view, new, accumulate=accumulate, coords=coords, init=init)
  except IndexError as e:
    fail(th, str(e), IndexError)
  yield from ()
  return [] if accumulate else [jnp.asarray(old)]


# --- allocation ------------------------------------------------------------------------------

def allocate(kind, aval, name: str) -> Buffer:
  """A buffer for a scratch type; buffers that start poisoned track their initialization
  (``init``; dropped by the caller when checks are off). Semaphores start at zero."""
  for cls, fn in ALLOCATORS.items():
    if isinstance(kind, cls):
      return fn(kind, aval, name)
  if getattr(kind, "memory_space", None) is pc.MemorySpace.SEMAPHORE:
    return semaphores(kind, aval, name)
  return Buffer(name, "scratch", np.array(prims.poison(aval.shape, aval.dtype)), kind,
                init=np.zeros(aval.shape, bool))


def semaphores(kind, aval, name: str) -> Buffer:
  """Semaphore scratch: counters at zero."""
  label = name if "sem" in name.lower() else f"semaphore {name}"
  return Buffer(label, "semaphore", np.zeros(aval.shape, aval.dtype), kind)


ON_ALLOCATE: list = []   # hooks(thread, buffers) after a run_scoped allocates its buffers
ON_SCOPE: list = []      # hooks(thread, key, buffers, make): make(block) allocates them for another
                         # block (the cluster's blocks share keys: clusters.py)


@rule(prims.run_scoped_p)
def _run_scoped(th, eqn, invals):
  p = eqn.params
  body = p["jaxpr"]
  types = p.get("scratch_types") or (None,) * (len(body.invars) - p["num_consts"])
  collective = bool(p.get("collective_axes"))
  count = th.scoped.get(id(eqn), 0)
  th.scoped[id(eqn)] = count + 1
  # The same key in every block of a cluster: a peer may have allocated this block's buffers.
  key = (id(eqn), count) if collective else (id(eqn), count, th.index)
  bufs = th.block.shared.get(key)
  if bufs is None:
    make = functools.partial(_allocate_scope, th, body, p["num_consts"], types)
    bufs = make(th.block)
    if collective or len(th.block.peers) > 1:   # kept for the block's other threads or its peers
      th.block.shared[key] = bufs
    for hook in ON_SCOPE:
      hook(th, key, bufs, make)
  last = th.state.setdefault("scopes", {})   # run_scoped eqn -> the last entry's buffers
  for b in () if collective else last.get(id(eqn), ()):
    if b.space in REUSE_CHECKS:
      REUSE_CHECKS[b.space](th, b)
  last[id(eqn)] = bufs
  return (yield from eval_jaxpr(th, body, [], [*invals, *[View(b) for b in bufs]]))


def _allocate_scope(th, body, num_consts, types, block) -> list[Buffer]:
  """The buffers of a run_scoped body's scratch, for ``block`` (``th``'s or a cluster peer's)."""
  names = _param_names(body)[num_consts:]
  made = [allocate(t, v.aval.inner_aval, _scratch_name(v, i, names))
          for i, (t, v) in enumerate(zip(types, body.invars[num_consts:]))]
  for b in made:
    if b.init is not None and not block.track:
      b.init = None
  for hook in ON_ALLOCATE:
    hook(th, made)
  return made


def _param_names(body) -> tuple:
  names = getattr(getattr(body, "debug_info", None), "arg_names", None) or ()
  return tuple(names) if len(names) == len(body.invars) else (None,) * len(body.invars)


def _scratch_name(var, i, names) -> str:
  """The kernel's parameter name of a scratch buffer (``pl.run_scoped``/``plgpu.kernel`` pass
  it), or 'scratch #i (type)'."""
  name = names[i] if i < len(names) else None
  if name and name.isidentifier():
    return name
  return f"scratch #{i} ({var.aval.inner_aval.str_short()})"


@rule(ji.run_state_p)
def _run_state(th, eqn, invals):
  body, given = eqn.params["jaxpr"], iter(invals)
  refs = []
  for i, (init, v) in enumerate(zip(eqn.params["is_initialized"], body.invars)):
    x = next(given) if init else None
    if isinstance(x, View):   # a Ref the body closes over (hoisted to an operand): itself
      refs.append(x)
      continue
    aval = v.aval.inner_aval
    data = np.array(np.asarray(x)) if init else np.array(prims.poison(aval.shape, aval.dtype))
    refs.append(View(Buffer(f"run_state Ref #{i}", "regs", data)))
  yield from eval_jaxpr(th, body, list(getattr(body, "consts", ()) or ()), refs)
  owned = [not r.transforms and r.buf.name.startswith("run_state") for r in refs]
  for r, own in zip(refs, owned):
    if own:
      _checked(ON_READ, th, r, "run_state result")   # the final values are read out
  return [jnp.asarray(r.buf.data) if own else r for r in refs]


# --- the scheduler ---------------------------------------------------------------------------

POLL_LIMIT = 1000   # rounds of only polls, with no event anywhere, before that is a deadlock


def run_blocks(blocks) -> None:
  """Runs the threads of ``blocks`` (an iterator of clusters, each a list of (block, threads,
  bodies)) until all finish. Clusters run one after another in grid order, the blocks of one
  together; a cluster whose threads all wait, some of them on a ``pl.get_global`` semaphore,
  lets the next one start (on a GPU blocks run concurrently).
  When nothing can go on, that is a deadlock, reported with each thread's wait and line."""
  live, pending, idle = [], iter(blocks), 0

  def start() -> bool:
    nxt = next(pending, None)
    if nxt is None:
      return False
    for block, threads, bodies in nxt:   # the blocks of a cluster start together
      for hook in ON_BLOCK_START:
        hook(block, threads)
      live.extend((th, gen, None) for th, gen in bodies)
    return True

  while live or start():
    run = live[0][0].block.run
    events = run.get("events", 0)
    live, progressed, polled_only = _round(live)
    idle = idle + 1 if polled_only and run.get("events", 0) == events else 0
    if live and (not progressed or idle >= POLL_LIMIT):
      if any(w is not None and w.shared for _, _, w in live) and start():
        idle = 0
        continue
      raise KernelCheckError(_deadlock_message(live, idle >= POLL_LIMIT))


def _round(live):
  """Each thread that can go on runs to its next wait. Returns (threads still running,
  whether any ran, whether those that ran only polled)."""
  progressed, polled_only, still = False, True, []
  for th, gen, wait in live:
    if wait is not None and not wait.poll and not wait.ready():
      still.append((th, gen, wait))
      continue
    progressed = True
    polled_only &= wait is not None and wait.poll
    try:
      wait = gen.send(None)
    except StopIteration:
      polled_only = False
      continue
    polled_only &= wait is not None and wait.poll
    still.append((th, gen, wait))
  return still, progressed, polled_only


def _deadlock_message(live, polling: bool) -> str:
  blocks = list(dict.fromkeys(th.block for th, _, _ in live))
  where = (f"block {_block_name(blocks[0])}" if len(blocks) == 1
           else "blocks " + ", ".join(_block_name(b) for b in blocks))
  waits = "; ".join(
      f"{th.describe()}{'' if len(blocks) == 1 else f' of block {_block_name(th.block)}'} "
      f"{'polls' if w.poll else 'waits for'} {w.what() if callable(w.what) else w.what} "
      f"at {th.line or 'a line of library code'}"
      for th, _, w in live)
  how = (f"every thread waits or polls ({POLL_LIMIT} rounds without an arrival or a signal)"
         if polling else "every thread waits")
  return f"{blocks[0].kernel}: deadlock in {where}: {how} and nothing can arrive: {waits}"


ON_BLOCK_START: list = []   # hooks(block, threads), before a block runs


def run_kernel(params, args, track: bool = False, device=None) -> list[np.ndarray]:
  """Runs the kernel of ``params`` on NumPy ``args``; returns the outputs. With ``track``,
  reading data nothing wrote is an error, and so are output elements nothing writes.
  ``device``: the mesh coordinates of the device running it (under ``jax.shard_map``)."""
  ins, outs, glob = kernel_memory(params, args, track)
  run = {}
  run_blocks(blocks(params, ins + outs, glob, track, device, run))
  after_run(params, run)
  return finish(params, outs)


def kernel_memory(params, args, track: bool):
  """The GMEM of one call: its operands, outputs and ``pl.get_global`` buffers."""
  gm = params.grid_mapping
  if gm.scratch_avals:   # their types (SMEM, barrier, ...) are not in the GridMapping
    raise NotImplementedError(
        f"pallas_call {params.name}: scratch_shapes of a pallas_call whose kernel uses Mosaic GPU "
        "primitives are not supported by pallax's interpreter yet; pass them to "
        "plgpu.kernel(..., scratch_shapes=...) or allocate them in the kernel with pl.run_scoped")
  ins = [Buffer(f"args[{i}]", "gmem", np.array(a)) for i, a in enumerate(args)]
  outs = [Buffer(f"out[{i}]", "gmem", np.array(prims.poison(bm.array_aval.shape, bm.array_aval.dtype)),
                 init=np.zeros(bm.array_aval.shape, bool) if track else None)
          for i, bm in enumerate(gm.block_mappings_output)]
  for i, o in params.input_output_aliases:   # one buffer: the kernel may write either ref
    outs[o] = ins[i]
  for k, o in enumerate(getattr(params.threads, "global_outputs", ())):   # plgpu kernels'
    outs[o].name, outs[o].state["global"] = f"pl.get_global #{k}", True
  glob = [Buffer(f"pl.get_global #{k}", "gmem", np.zeros(a.shape, a.dtype), None, {"global": True})
          for k, a in enumerate(getattr(params, "globals_avals", ()))]
  return ins, outs, glob


def finish(params, outs) -> list[np.ndarray]:
  """The outputs' data, once the kernel ran; output elements nothing wrote are an error."""
  for o in outs:
    if o.init is not None and not o.init.all():
      raise KernelCheckError(_unwritten_message(params.name, o))
  return [o.data for o in outs]


AFTER_RUN: list = []   # hooks(params, run) once every block (of every device) finished


def after_run(params, run: dict) -> None:
  for hook in AFTER_RUN:
    hook(params, run)


def blocks(params, bufs, glob, track, device=None, run=None):
  """For each point of the grid, in row-major order, its cluster: a list of (block, threads,
  their bodies), one per block of the cluster (the grid counts clusters, as in Mosaic GPU); a
  cluster whose launch a running one cancelled before it started is left out.
  ``device``: the mesh coordinates of the device running the call (``lax.axis_index`` of mesh
  axes); ``run``: the dict shared by the call's blocks (on every device of a mesh, one)."""
  gm, info = params.grid_mapping, getattr(params, "threads", None)
  run, device = ({} if run is None else run), dict(device or {})
  names = tuple(gm.grid_names or ()) or tuple(f"axis{i}" for i in range(len(gm.grid)))
  cluster = dict(info.cluster) if info else {}
  run["cluster"], run["grid"] = cluster, (names, tuple(gm.grid))
  cancelled = run.setdefault("cancelled", set())   # launches cancelled (plgpu.try_cluster_cancel)
  for n, ids in enumerate(itertools.product(*[range(g) for g in gm.grid])):
    if n in cancelled:
      continue
    run["next"] = n + 1   # (the clusters from here on have not started)
    members = [_block(params, bufs, glob, track, run,
                      {**dict(zip(names, ids)), **dict(zip(cluster, c))}, ids, device)
               for c in itertools.product(*[range(n) for n in cluster.values()])]
    for block, _, _ in members:
      block.peers = [b for b, _, _ in members]
    yield members


def _block(params, bufs, glob, track, run, axes, ids, device):
  """A block of the cluster at grid position ``ids`` (``axes``: its grid and cluster indices)
  on the device at mesh coordinates ``device``."""
  gm, info = params.grid_mapping, getattr(params, "threads", None)
  n_threads = info.num_threads if info else 1
  block = Block(axes, params.name, track, run=run, device=device, params=params, buffers=bufs)
  threads = [Thread(block, t, info.thread_name if info else None,
                    {**device, **axes, **({info.thread_name: t} if info and info.thread_name else {})})
             for t in range(n_threads)]
  refs = [_block_view(bm, b, ids, params.name) for bm, b in zip(gm.block_mappings, bufs)]
  refs += [View(g) for g in glob]
  bodies = [(th, eval_jaxpr(th, params.jaxpr, params.jaxpr.consts,
                            [jnp.int32(i) for i in ids] + refs)) for th in threads]
  return block, threads, bodies


def _unwritten_message(kernel: str, out: Buffer) -> str:
  missing = np.argwhere(~out.init)
  region = ", ".join(f"{lo}:{hi + 1}" for lo, hi in zip(missing.min(0), missing.max(0)))
  return (f"{kernel}: nothing wrote {len(missing)} of the {out.init.size} elements of {out.name} "
          f"(shape {out.data.shape}), within [{region}] (the smallest box holding them): they "
          "would come back as poison (on a GPU, whatever the memory held). Check that the "
          "copies to it (plgpu.copy_smem_to_gmem, stores) cover it, and that the grid covers "
          "it: pl.cdiv(size, block) blocks, not size // block")


def _block_view(bm, buf: Buffer, ids, kernel: str) -> View:
  """The block of ``buf`` that the program at grid position ``ids`` sees (a view)."""
  idx = [int(np.asarray(i)) for i in ji.eval_jaxpr(bm.index_map_jaxpr, bm.index_map_jaxpr.consts,
                                             *[jnp.int32(i) for i in ids])]
  if all(isinstance(d, pc.Blocked) and d.block_size == n and i == 0
         for d, n, i in zip(bm.block_shape, buf.data.shape, idx)):
    return View(buf)
  parts = []
  for d, i in zip(bm.block_shape, idx):
    if isinstance(d, pc.Squeezed):
      parts.append(np.int32(i))
    elif isinstance(d, pc.Blocked):
      parts.append(ji.Slice(i * d.block_size, d.block_size))
    else:
      raise NotImplementedError(f"{kernel}: the interpreter of Mosaic GPU kernels does not take "
                                f"{d} block dimensions")
  return View(buf, (ji.NDIndexer(tuple(parts), buf.data.shape, (), validate=False),))


def run_now(*args, params):
  outs = run_kernel(params, [np.asarray(a) for a in args], uninit.enabled(params))
  return [jnp.asarray(o) for o in outs]


def run_traced(*args, params):
  """Inside a trace: the kernel runs on the host, through a callback."""
  cpu = jax.devices("cpu")[0]
  track = uninit.enabled(params)

  def host(*xs):
    with jax.default_device(cpu):
      return run_kernel(params, [np.asarray(x) for x in xs], track)

  return ji.host_callback(errors.reporting(host), params.out_avals, *args)

"""Clusters of blocks (``plgpu.kernel(cluster=..., cluster_names=...)``) in the eager interpreter.

As in Mosaic GPU, the grid counts clusters: each grid position runs ``prod(cluster)`` blocks,
which ``lax.axis_index(<cluster name>)`` tells apart. The blocks of a cluster run together (the
scheduler interleaves their threads), so that one can wait for another. Each block has its own
scratch; a buffer or barrier of one block has a twin in every other block of its cluster (the
same allocation: on the GPU, the same shared-memory address), which is what cluster operations
reach:

- ``ClusterBarrier(collective_axes=axes, num_arrivals=n)``: ``barrier_arrive`` arrives on the
  barrier of every block that differs from the arriving one along at most one of ``axes`` (an
  entry of ``axes`` may be a tuple of names, one composite axis), itself included; a phase
  completes after ``n`` arrivals from each of them. ``barrier_wait`` waits on the block's own.
- ``copy_gmem_to_smem(..., collective_axes=axes)`` (multicast TMA): every block of the group
  that differs only along ``axes`` issues the same copy; each issues a part and sends it to all,
  so every block's SMEM receives the whole box, and each block's barrier gets its arrival once
  every block of the group has issued. The checks: the group's copies must be the same, and a
  peer's part may land before this block issued its own copy: until then this block may not
  read or write that SMEM, and nothing of its own may still use it.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from pallax._src.interpret import eager
from pallax._src.interpret.eager import View, fail, flat_indices, rule
from pallax._src.mosaic_gpu import core as mc
from pallax._src.mosaic_gpu import primitives as mp
from pallax._src.mosaic_gpu import semantics as sem

PENDING = 2 ** 62                               # the phase of an arrival that has not happened yet
PEER = ("a multicast copy from a cluster peer",)  # a loads key that no thread ever observes

_local_arrive = eager.RULES[mp.barrier_arrive_p]
_local_wait = eager.RULES[mp.barrier_wait_p]
_local_copy = eager.RULES[mp.copy_gmem_to_smem_p]


# --- cluster geometry ------------------------------------------------------------------------

def sizes(block) -> dict:
  return block.run.get("cluster", {})


def block_name(block) -> str:
  return "(" + ", ".join(f"{k}={v}" for k, v in block.axes.items()) + ")"


def _dims(th, axes, what: str) -> list[tuple]:
  """``axes`` as a list of dimensions, each a tuple of cluster axis names (a tuple in ``axes``:
  several axes as one dimension, unless it names a cluster axis itself, as JAX looks it up)."""
  cluster = sizes(th.block)
  dims = [tuple(a) if isinstance(a, (tuple, list)) and tuple(a) not in cluster else (a,)
          for a in axes]
  for dim in dims:
    for name in dim:
      if name not in cluster:
        fail(th, f"{what}: Unknown cluster axis {name!r}, available axes: {list(cluster)}. "
                 "Name axes of plgpu.kernel(cluster=..., cluster_names=...)", LookupError)
  return dims


def group(th, axes, what: str) -> list:
  """The blocks of ``th``'s cluster that agree with it on every cluster axis outside ``axes``."""
  names = {n for d in _dims(th, axes, what) for n in d}
  me = th.block.axes
  return [b for b in th.block.peers
          if all(b.axes[n] == me[n] for n in sizes(th.block) if n not in names)]


def cross(th, axes, what: str) -> list:
  """The blocks that a cluster barrier arrival reaches: those that differ from ``th``'s block
  along at most one of the dimensions ``axes`` (and agree on the other cluster axes)."""
  dims = _dims(th, axes, what)
  names = {n for d in dims for n in d}
  me = th.block.axes
  out = []
  for b in th.block.peers:
    if any(b.axes[n] != me[n] for n in sizes(th.block) if n not in names):
      continue
    if sum(any(b.axes[n] != me[n] for n in d) for d in dims) <= 1:
      out.append(b)
  return out


def pair_partner(th, axis, what: str):
  """The other block of ``th``'s pair along ``axis`` (a collective ``tcgen05`` operation) if
  ``th``'s block leads it, else None (the call does nothing there)."""
  cluster = sizes(th.block)
  if axis not in cluster:
    fail(th, f"{what}(collective_axis={axis!r}): Unknown cluster axis {axis!r}, available "
             f"axes: {list(cluster)}. Name axes of plgpu.kernel(cluster=..., cluster_names=...)",
         LookupError)
  if list(cluster)[0] != axis:
    fail(th, f"{what}: Can only perform collective MMA along minormost cluster axis. Got "
             f"{axis}, expected {list(cluster)[0]}.", ValueError)
  if cluster[axis] != 2:
    fail(th, f"{what}: the cluster axis {axis!r} of a collective MMA must have size 2, got "
             f"{cluster[axis]}", ValueError)
  if th.block.axes[axis] != 0:
    return None
  me = th.block.axes
  (other,) = [b for b in th.block.peers
              if b.axes[axis] == 1 and all(b.axes[n] == me[n] for n in cluster if n != axis)]
  return other


def twin(view: View, block) -> View:
  """The view of ``block``'s buffer that is the same allocation as ``view``'s."""
  key, i = view.buf.state["scope"]
  return View(block.shared[key][i], view.transforms)


# --- allocation: every block of a cluster gets its twin of each scratch buffer at once --------

def _scale_barriers(th, block, bufs):
  """A cluster barrier's phase takes ``num_arrivals`` arrivals from each block that reaches it
  (a leader-tracked one's: from each block of its group, all arriving on the leader's)."""
  for b in bufs:
    if isinstance(b.kind, mc.ClusterBarrier):
      cluster = sizes(block)
      dims = _dims(th, b.kind.collective_axes, "plgpu.ClusterBarrier")
      reach = (math.prod(cluster[n] for d in dims for n in d) if b.kind.leader_tracked else
               sum(math.prod(cluster[n] for n in d) for d in dims) - len(dims) + 1)
      b.kind = dataclasses.replace(b.kind, num_arrivals=b.kind.num_arrivals * reach)


def _on_scope(th, key, bufs, make):
  for i, b in enumerate(bufs):
    b.state["scope"], b.state["block"] = (key, i), th.block
  _scale_barriers(th, th.block, bufs)
  for peer in th.block.peers:
    if peer is not th.block and key not in peer.shared:
      made = peer.shared[key] = make(peer)
      for i, b in enumerate(made):
        b.state["scope"], b.state["block"] = (key, i), peer
      _scale_barriers(th, peer, made)


eager.ON_SCOPE.append(_on_scope)


# --- cluster barriers ------------------------------------------------------------------------

@rule(mp.barrier_arrive_p)
def _barrier_arrive(th, eqn, invals):
  (bar,), rest = mp.split_refs(invals, eqn.params["trees"])
  view = bar[0].at(bar[1])
  if not isinstance(view.buf.kind, mc.ClusterBarrier) or len(th.block.peers) <= 1:
    return (yield from _local_arrive(th, eqn, invals))
  if not eqn.params["has_predicate"] or bool(rest[0]):
    sem.barrier_index(th, view, "barrier_arrive")
    axes = view.buf.kind.collective_axes
    reached = ([_leader(th, axes, "barrier_arrive")] if view.buf.kind.leader_tracked
               else cross(th, axes, "barrier_arrive"))
    for b in reached:
      sem.arrive(th, twin(view, b), f"barrier_arrive of block {block_name(th.block)}")
  yield from ()
  return []


def _leader(th, axes, what: str):
  """The block of ``th``'s group along ``axes`` at index 0 on each of them."""
  names = {n for d in _dims(th, axes, what) for n in d}
  return next(b for b in group(th, axes, what) if all(b.axes[n] == 0 for n in names))


@rule(mp.barrier_wait_p)
def _barrier_wait(th, eqn, invals):
  """A leader-tracked cluster barrier completes in the leader block only: a wait elsewhere
  would never return."""
  (bar,), _ = mp.split_refs(invals, eqn.params["trees"])
  kind = bar[0].buf.kind
  if isinstance(kind, mc.ClusterBarrier) and kind.leader_tracked and len(th.block.peers) > 1:
    leader = _leader(th, kind.collective_axes, "barrier_wait")
    if leader is not th.block:
      fail(th, f"barrier_wait on the leader-tracked {bar[0].buf.name} in block "
               f"{block_name(th.block)}: every block's arrivals go to the leader block "
               f"{block_name(leader)}'s barrier, so only the leader waits on it (this wait would "
               "never return)")
  return (yield from _local_wait(th, eqn, invals))


# --- multicast copies ------------------------------------------------------------------------

def _region(mask) -> tuple:
  idx = np.flatnonzero(mask)
  return (int(idx[0]), int(idx[-1]), idx.size) if idx.size else (0, 0, 0)


def _check_divisible(th, dst: View, n: int, what: str):
  """Mosaic GPU splits a multicast box between the group's blocks along a leading dimension
  (the last one too when the SMEM is not swizzled)."""
  swizzled = any(isinstance(t, mc.SwizzleTransform) for t in getattr(dst.buf.kind, "transforms", ()))
  shape, rem = list(dst.shape), n
  for d in shape[:-1] if swizzled else shape:
    if d % rem == 0:
      return
    if rem % d:
      break
    rem //= d
  fail(th, f"{what}: None of the leading dimensions in the slice shape {tuple(shape)} is "
           f"divisible by the collective size {n}: each block of the multicast group copies a "
           "part of the box. Copy a box with a leading dimension that is a multiple of it")


def _peer_lands(th, q, dst: View, mask, what: str):
  """``th``'s part of a multicast lands in block ``q``'s twin of ``dst`` (q has not issued its
  own copy yet): q's own users of that SMEM must be done, and until q issues the copy, q may
  neither read nor write it."""
  view = twin(dst, q)
  threads = q.state.get("threads", ())
  where = f"block {block_name(th.block)} at {th.line or 'a line of library code'}"
  for t in threads:
    ts = sem.thread_state(t)
    users = [("a copy_smem_to_gmem", st.line) for g in ts.stores for st in g if st.reads(view.buf, mask)]
    users += [("a copy_smem_to_gmem", st.line) for st in ts.uncommitted if st.reads(view.buf, mask)]
    users += [("a wgmma", line) for _, ops, line in ts.wgmmas
              if any(b is view.buf and (m & mask).any() for b, m in ops)]
    if users:
      fail(th, f"{what} (multicast) writes {view.buf.name} of cluster peer block {block_name(q)} "
               f"while {users[0][0]} issued there by {t.describe()} at "
               f"{users[0][1] or 'a line of library code'} may still read it: let every block of "
               "the group release the SMEM (a plgpu.ClusterBarrier) before the next multicast")
  own = [e for e in view.buf.state.get("loads", ()) if e[1] is not PEER and (e[0] & mask).any()]
  for m, key, phase, line in own:
    if threads and all(sem.thread_state(t).observed.get(key, 0) <= phase for t in threads):
      fail(th, f"{what} (multicast) writes {view.buf.name} of cluster peer block {block_name(q)} "
               "while the copy into it that block issued before has not been awaited there: "
               "let every block of the group consume the data (a plgpu.ClusterBarrier) before "
               "the next multicast into it")
  view.buf.state.setdefault("loads", []).append(
      (mask, PEER, PENDING, f"{where} (a multicast from a cluster peer; this block has not "
                            "issued its own copy yet)"))


def _copy_views(th, eqn, invals, what):
  """(source, destination, the barrier's view) of a cluster copy; None: nothing to copy."""
  views = sem.copy_views(th, eqn, invals, ("gmem", "smem"))
  if views is None:
    return None
  src, dst, bar = views
  if bar is None:
    fail(th, f"{what} needs a barrier on Hopper GPUs (TMA): pass plgpu.Barrier scratch")
  return src, dst, bar[0].at(bar[1])


@rule(mp.copy_gmem_to_smem_p)
def _copy_gmem_to_smem(th, eqn, invals):
  p = eqn.params
  if not p["collective_axes"]:
    return (yield from _local_copy(th, eqn, invals))
  what = "copy_gmem_to_smem"
  members = group(th, p["collective_axes"], what)
  if p.get("leader_tracked") is not None:
    return (yield from _leader_tracked(th, eqn, invals, members, what))
  if len(members) <= 1:
    return (yield from _local_copy(th, eqn, invals))
  yield from ()
  views = _copy_views(th, eqn, invals, what)
  if views is None:
    return []
  src, dst, bar = views
  sem.check_box(th, dst, src, what)
  _check_divisible(th, dst, len(members), what)
  mask = sem.view_mask(dst)
  slot = (dst.buf.state.get("scope"), _region(mask))
  # This block's own issue supersedes what its peers' parts announced.
  dst.buf.state["loads"] = [e for e in dst.buf.state["loads"]
                            if not (e[1] is PEER and not (e[0] & ~mask).any())]
  sem.check_not_in_use(th, dst, mask, what)
  for m, key, phase, line in dst.buf.state["loads"]:
    if (m & mask).any() and all(sem.thread_state(t).observed.get(key, 0) <= phase
                                for t in th.block.state.get("threads", [th])):
      fail(th, f"{what} into {dst.buf.name} while the copy_gmem_to_smem into it issued at "
               f"{line or 'a line of library code'} may not have landed (no thread waited on "
               "its barrier): on the GPU either could land last")
  eager.write(dst, eager.read(src, fill=0), init=eager.read_init(src))
  sem.union_write(th, dst, mask)
  entry = (mask, (bar.buf, sem.barrier_index(th, bar, what)), PENDING, th.line)
  dst.buf.state["loads"].append(entry)
  _rendezvous(th, members, p["collective_axes"], slot, src, dst, bar, entry, what)
  return []


def _rendezvous(th, members, axes, slot, src: View, dst: View, bar: View, entry, what: str):
  """Records ``th``'s block's part of the ``seq``-th multicast into ``slot``, lands it in the
  peers that have not issued theirs yet, and once every block of the group issued, completes
  the copy on each block's barrier (``entry``: this block's record of the load into ``dst``)."""
  mask = entry[0]
  counts = th.block.state.setdefault("multicasts", {})
  seq = counts[slot] = counts.get(slot, 0) + 1
  book = members[0].state.setdefault("multicast_book", {})
  issued = book.setdefault((tuple(sorted(axes, key=str)), slot, seq), [])
  sig = (src.buf, flat_indices(src).tobytes(), tuple(dst.shape), bar.buf.state.get("scope"),
         flat_indices(bar).tobytes())
  if issued and issued[0][4] != sig:
    other = issued[0][0]
    fail(th, f"{what} with collective_axes={axes}: block {block_name(th.block)} "
             f"copies {src.buf.name} (a view of shape {tuple(src.shape)}) into {dst.buf.name} "
             f"with barrier {bar.buf.name}, but its cluster peer block {block_name(other.block)} "
             f"issued a different copy at {issued[0][3] or 'a line of library code'}: every "
             "block of a multicast group must issue the same copy (its parts land in all of them)")
  issued.append((th, bar, dst.buf, th.line, sig, entry))
  for q in members:
    if q is not th.block and q.state.get("multicasts", {}).get(slot, 0) < seq:
      _peer_lands(th, q, dst, mask, what)
  if len(issued) == len(members):   # every part sent: the box has landed in every block
    for t, b, buf, _, _, e in issued:
      phase = sem.arrive(t, b, what)
      buf.state["loads"] = [(e[0], e[1], phase, e[3]) if x is e else x for x in buf.state["loads"]]


# --- leader-tracked copies: partitioned or replicated over a pair of blocks --------------------

def _leader_tracked(th, eqn, invals, members, what: str):
  """``copy_gmem_to_smem(..., collective_axes=a, leader_tracked=...)`` in a cluster of two
  blocks: each block copies its part of ``src`` (``PARTITIONED(d)``: the half of dimension d
  at its index along ``a``; ``REPLICATED``: all of it) into its own ``dst``, and only the
  leader's barrier (index 0 along ``a``) tracks the copy: one arrival, once both blocks issued
  theirs (on the GPU, once both parts landed). The other block's barrier gets nothing; its
  SMEM counts as landed then (the kernel orders its use with a cluster barrier; not checked)."""
  yield from ()
  p = eqn.params
  if math.prod(sizes(th.block).values()) != 2 or len(members) != 2:
    fail(th, f"{what}: Partitioned loads only supported for clusters of size 2",
         NotImplementedError)
  (axis,) = [n for d in _dims(th, p["collective_axes"], what) for n in d
             if sizes(th.block)[n] == 2] or [None]
  views = _copy_views(th, eqn, invals, what)
  if views is None:
    return []
  src, dst, bar = views
  me = th.block.axes[axis]
  data, init = np.asarray(eager.read(src, fill=0)), np.asarray(eager.read_init(src))
  if p["leader_tracked"][0] == "partitioned":
    d = p["leader_tracked"][1]
    half = data.shape[d] // 2
    part = (slice(None),) * d + (slice(me * half, (me + 1) * half),)
    data, init = data[part], init[part]
  if tuple(data.shape) != tuple(dst.shape):
    fail(th, f"{what}: this block's part of the source has shape {tuple(data.shape)}, but the "
             f"destination {dst.buf.name} has shape {tuple(dst.shape)}", ValueError)
  mask = sem.view_mask(dst)
  sem.check_not_in_use(th, dst, mask, what)
  eager.write(dst, data, init=init)
  sem.union_write(th, dst, mask)
  slot = (dst.buf.state.get("scope"), _region(mask))
  counts = th.block.state.setdefault("leader_tracked", {})
  seq = counts[slot] = counts.get(slot, 0) + 1
  lead = [b for b in members if b.axes[axis] == 0][0]
  issued = lead.state.setdefault("leader_tracked_book", {}).setdefault((slot, seq), [])
  entry = (mask, None, PENDING, th.line)
  if me == 0:
    entry = (mask, (bar.buf, sem.barrier_index(th, bar, what)), PENDING, th.line)
  dst.buf.state.setdefault("loads", []).append(entry)
  issued.append((th, bar, dst.buf, entry))
  if len(issued) == 2:   # both parts sent: one arrival on the leader's barrier
    for t, b, buf, e in issued:
      if e[1] is None:
        buf.state["loads"] = [x for x in buf.state["loads"] if x is not e]
      else:
        phase = sem.arrive(t, b, what)
        buf.state["loads"] = [(e[0], e[1], phase, e[3]) if x is e else x
                              for x in buf.state["loads"]]
  return []

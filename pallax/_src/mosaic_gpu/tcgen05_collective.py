"""Collective (two-block) tcgen05 MMAs in the eager interpreter: ``tcgen05_mma(...,
collective_axis=name)`` and ``tcgen05_commit_arrive(..., collective_axis=name)``.

As Mosaic GPU lowers them: the cluster axis ``name`` must be the first (minormost) cluster axis
and have size 2; only the leader block of the pair (index 0 along it) issues the MMA, which
reads both blocks' operands (their twins of the same allocation, clusters.py) and writes both
blocks' accumulators, and its commit arrives on the barrier of each of the two blocks. The
other block's call does nothing. Each block's ``acc`` rows = its rows of ``a`` times both
blocks' ``b`` side by side (the leader's columns first).

The MMA is an operation in flight in both blocks (tcgen05_semantics.py): the other block's
threads learn that it completed by waiting on their barrier that the commit arrived on, so
reading their accumulator before that is an error, as in one block, also when the leader has
not issued it yet in the interpreter (the other block's own call announces it). What this module does not
check: that the other block's operands were ready when the leader issued (its copies awaited,
its stores committed) beyond that they were written at all; the kernels of JAX's tests order
that with a ``ClusterBarrier`` before the MMA.
"""
from __future__ import annotations

from pallax._src.interpret.eager import View, fail
from pallax._src.mosaic_gpu import clusters
from pallax._src.mosaic_gpu import semantics as ms
from pallax._src.mosaic_gpu import tcgen05_semantics as ts


def partner(th, axis, what: str):
  """The other block of ``th``'s pair along ``axis`` if ``th``'s block leads it, else None (the
  call does nothing there)."""
  return clusters.pair_partner(th, axis, what)


def check_collective(th, view: View, role: str, what: str):
  if view.buf.space == "tmem" and not view.buf.kind.collective:
    fail(th, f"{what}: {role} Ref must be collective if collective_axis is set ({view.buf.name}: "
             "allocate it as plgpu.TMEM(..., collective=True))", ValueError)


def twin(view: View, block) -> View:
  return clusters.twin(view, block)


def _book(lead) -> dict:
  """The pair's count of collective MMAs: called by the other block, issued by the leader, and
  what the other block's calls announced before the leader issued them."""
  return lead.state.setdefault("collective_mmas", {"called": 0, "issued": 0, "pending": {}})


def follower_call(th, axis, views, what: str) -> None:
  """The other block's call: on the GPU the leader's MMA writes this block's accumulator at any
  time from now until its completion is observed (the leader may not have issued it yet in the
  interpreter). Announce it as an operation in flight in this block; the leader's MMA completes
  it (``after``)."""
  me = th.block.axes
  cluster = clusters.sizes(th.block)
  (lead,) = [b for b in th.block.peers
             if b.axes[axis] == 0 and all(b.axes[n] == me[n] for n in cluster if n != axis)]
  book = _book(lead)
  k = book["called"]
  book["called"] += 1
  if k < book["issued"]:
    return   # the leader's MMA came first: it is in flight here already (share)
  acc, a, b = views
  acc_mask = ms.view_mask(acc)
  op = ts.Op(f"{what} (collective, issued by the leader block {clusters.block_name(lead)})", th,
             th.line, [(b.buf, ms.view_mask(b)), (a.buf, ms.view_mask(a)), (acc.buf, acc_mask)],
             [(acc.buf, acc_mask)], [])
  book["pending"][k] = op
  ts.ops(th).append(op)


def share(th, op, other) -> None:
  """The leader's MMA is in flight in the other block too (it writes that block's TMEM); it
  completes what the other block's matching call announced."""
  book = _book(th.block)
  k = book["issued"]
  book["issued"] += 1
  announced = book["pending"].pop(k, None)
  if announced is not None:
    op.after.append(announced)
  other.state.setdefault("tcgen05_ops", []).append(op)


def commit_both(th, view: View, other, what: str) -> None:
  """One arrival on the barrier ``view`` of each block of the pair, once the leader's
  operations so far completed."""
  ts.commit(th, view, what)
  ts.commit(th, twin(view, other), f"{what} of the leader block {clusters.block_name(th.block)}")

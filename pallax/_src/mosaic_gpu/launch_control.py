"""Cluster launch control (Blackwell) in the interpreter: ``plgpu.try_cluster_cancel`` and
``plgpu.query_cluster_cancel``.

``try_cluster_cancel(result, barrier)``, called by every thread of every block of a cluster,
asks to cancel the launch of a cluster that has not started and take its grid position; the
16-byte answer lands in each block's ``result`` (SMEM), and each thread's call is one arrival on
``barrier``, which completes once it landed. ``query_cluster_cancel(result, grid_names)`` decodes
it: (the grid indices along ``grid_names``, whether a launch was cancelled).

The interpreter starts clusters one after another in grid order (interpret/eager.py), so a
request cancels the next cluster in grid order that has not started, if any: a cancelled cluster
never runs, and the requesting one does its work (a schedule a GPU with fewer SMs than clusters
may produce). Each thread's k-th request gets its cluster's k-th answer. Reading the answer before
waiting on the barrier is reported, as for a copy into SMEM. The Gluon backend refuses both by
name (Gluon 3.6 has no cluster launch control).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from pallax._src import backends
from pallax._src import jax_internals as ji
from pallax._src.interpret import eager
from pallax._src.interpret.eager import fail, rule
from pallax._src.mosaic_gpu import primitives as mp
from pallax._src.mosaic_gpu import semantics as sem


def _check_result(shape, dtype, what: str):
  bits = int(np.prod(shape)) * jnp.dtype(dtype).itemsize * 8
  if bits != 128:
    raise TypeError(f"{what}: the cluster cancel response must be 128 bits, but is {bits} bits "
                    "(use plgpu.TryClusterCancelResult())")


def _try_abstract_eval(*avals, trees):
  (res, rdt), (bar, _) = mp.ref_shapes(avals, trees)
  _check_result(res, rdt, "try_cluster_cancel")
  if int(np.prod(bar)) != 1:
    raise TypeError(f"try_cluster_cancel: expected a single barrier, got shape {tuple(bar)}")
  return [], mp.ref_effects(trees, writes=(0,))


def _query_abstract_eval(*avals, trees, grid_names):
  ((res, rdt),) = mp.ref_shapes(avals, trees)
  _check_result(res, rdt, "query_cluster_cancel")
  return ([ji.ShapedArray((), jnp.int32)] * len(grid_names) + [ji.ShapedArray((), jnp.bool_)],
          mp.ref_effects(trees, reads=(0,)))


try_cluster_cancel_p = mp.primitive("try_cluster_cancel", _try_abstract_eval)
query_cluster_cancel_p = mp.primitive("query_cluster_cancel", _query_abstract_eval)
backends.register_kernel_primitives("mosaic_gpu", (try_cluster_cancel_p, query_cluster_cancel_p))


def try_cluster_cancel(result_ref, barrier) -> None:
  """Asks to cancel the launch of a cluster that has not started and take its work; the answer
  lands in ``result_ref`` (``plgpu.TryClusterCancelResult()``) once ``barrier`` completes (each
  thread's call is one arrival). Call it from every thread of the kernel."""
  mp.bind_refs(try_cluster_cancel_p, (result_ref, barrier))


def query_cluster_cancel(result_ref, grid_names) -> tuple[tuple, object]:
  """(the grid indices along ``grid_names`` of the cancelled cluster, whether one was) of a
  ``try_cluster_cancel`` answer."""
  *index, ok = mp.bind_refs(query_cluster_cancel_p, (result_ref,), grid_names=tuple(grid_names))
  return tuple(index), ok


def _cancel_next(run) -> int | None:
  """Cancels the next cluster in grid order that has not started; its linear grid position."""
  _, shape = run["grid"]
  cancelled = run.setdefault("cancelled", set())
  p = next((p for p in range(run["next"], int(np.prod(shape))) if p not in cancelled), None)
  if p is not None:
    cancelled.add(p)
  return p


@rule(try_cluster_cancel_p)
def _try_cluster_cancel(th, eqn, invals):
  yield from ()
  what = "try_cluster_cancel"
  (res, bar), _ = mp.split_refs(invals, eqn.params["trees"])
  res, bar = res[0].at(res[1]), bar[0].at(bar[1])
  if res.buf.space != "smem":
    fail(th, f"{what}: the answer goes to SMEM (plgpu.TryClusterCancelResult()), not "
             f"{res.buf.space.upper()} {res.buf.name}")
  k = th.state["cancel_requests"] = th.state.get("cancel_requests", -1) + 1
  owner = th.block.peers[0] if th.block.peers else th.block
  answers = owner.state.setdefault("cancel_answers", [])
  if k == len(answers):
    answers.append(_cancel_next(th.block.run))
  p = answers[k]
  eager.write(res, np.array([-1 if p is None else p, p is not None, 0, 0], np.int32)
              .view(res.buf.data.dtype).reshape(res.shape))
  sem.landed(th, res, sem.view_mask(res), bar, what, f"{th.line}: a try_cluster_cancel")
  return []


@rule(query_cluster_cancel_p)
def _query_cluster_cancel(th, eqn, invals):
  yield from ()
  (res,), _ = mp.split_refs(invals, eqn.params["trees"])
  res = res[0].at(res[1])
  for hook in eager.ON_READ:   # (read before its barrier completed: reported)
    hook(th, res, "load")
  p, ok = np.asarray(eager.read(res)).reshape(-1).view(np.int32)[:2]
  names, shape = th.block.run["grid"]
  index = dict(zip(names, np.unravel_index(max(int(p), 0), shape)))
  missing = [n for n in eqn.params["grid_names"] if n not in index]
  if missing:
    fail(th, f"query_cluster_cancel: {missing} are not grid axes of the kernel (its axes: "
             f"{tuple(names)})", ValueError)
  return [jnp.int32(index[n]) for n in eqn.params["grid_names"]] + [jnp.bool_(bool(ok))]

"""A cluster peer's SMEM: ``plgpu.cluster_ref`` (reads and writes of another block's buffer) and
``plgpu.async_store_smem`` (a register value stored into another block's SMEM, completing that
block's barrier), in the interpreter.

``cluster_ref(ref, {axis: i})`` is a Ref transform, ``ClusterRef``: the same allocation in the
block of the cluster at index ``i`` along ``axis`` (the other cluster coordinates this block's).
The interpreter resolves it to that block's twin of the buffer. A read of it sees the data once
the owning block's threads waited on the copy that filled it; that the reader is ordered after
them (a ``ClusterBarrier``, as JAX's kernels use) is not checked.

``async_store_smem(x, ref, barrier, cluster_idx=i, cluster_dim=axis, atomic=None)``: ``x`` lands in
the peer block's ``ref`` (combined with what is there under ``atomic``), and the peer's
``barrier`` gets one arrival with it (on the GPU: ``st.async`` with ``complete_tx``); the peer
may read the data once it waited on that barrier, which the interpreter checks.

The Gluon backend refuses both by name (pallax runs a cluster's blocks as independent blocks on
the GPU: there is no peer SMEM to reach).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from pallax._src import backends
from pallax._src import jax_internals as ji
from pallax._src import remote
from pallax._src.interpret import eager
from pallax._src.interpret.eager import fail, rule
from pallax._src.mosaic_gpu import clusters
from pallax._src.mosaic_gpu import primitives as mp
from pallax._src.mosaic_gpu import semantics as sem

ATOMICS = {"add": np.add, "max": np.maximum, "min": np.minimum, "and": np.bitwise_and,
           "or": np.bitwise_or, "xor": np.bitwise_xor}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ClusterRef(ji.Transform):
  """The Ref it follows, in the cluster's block at ``idxs`` along the cluster axes ``dims``."""
  dims: tuple = dataclasses.field(metadata=dict(static=True))
  idxs: tuple[Any, ...] = ()

  def transform_type(self, x):
    return x

  def undo(self, x):
    raise NotImplementedError("a cluster peer's reference has no inverse")

  def commute_ndindexer(self, _, indexer):
    return indexer, self

  def __str__(self):
    return f"plgpu.cluster_ref (a cluster peer's SMEM, along {', '.join(map(str, self.dims))})"

  def peer_buffer(self, buf):
    """``buf``'s twin in the block this transform names (interpret/memory.py's ``View.at``)."""
    block = buf.state.get("block")
    if buf.space != "smem" or block is None:
      raise remote.PeerError(f"plgpu.cluster_ref of {buf.name}: only SMEM scratch of a kernel "
                             "with a cluster has twins in the cluster's other blocks")
    return clusters.twin(eager.View(buf), _peer(block, dict(zip(self.dims, self.idxs)))).buf


def _peer(block, where: dict):
  cluster = clusters.sizes(block)
  target = dict(block.axes)
  for axis, i in where.items():
    if axis not in cluster:
      raise remote.PeerError(f"plgpu.cluster_ref: Unknown cluster axis {axis!r}, available "
                             f"axes: {list(cluster)}")
    i = int(np.asarray(i))
    if not 0 <= i < cluster[axis]:
      raise remote.PeerError(f"plgpu.cluster_ref: index {i} along the cluster axis {axis!r} of "
                             f"size {cluster[axis]}")
    target[axis] = i
  (peer,) = [b for b in block.peers if b.axes == target]
  return peer


def cluster_ref(ref, block_id: dict):
  """``ref`` (SMEM scratch) in the cluster's block at ``block_id`` ({cluster axis: index}):
  reads and writes through it reach that block's buffer."""
  if not isinstance(ref, ji.TransformedRef):
    if not ji.is_ref_aval(jax.typeof(ref)):
      raise TypeError(f"cluster_ref takes a Ref, not {jax.typeof(ref).str_short()}")
    ref = ji.TransformedRef(ref, ())
  return ji.TransformedRef(ref.ref, (*ref.transforms,
                                     ClusterRef(tuple(block_id), tuple(block_id.values()))))


def _store_abstract_eval(*avals, trees, **_):
  (dst, ddt), (bar, _) = mp.ref_shapes(avals, trees)
  _, rest = mp.split_refs(avals, trees)
  src = rest[0]
  if tuple(src.shape) != tuple(dst):
    raise TypeError(f"The stored value has shape {tuple(src.shape)}, but the target reference "
                    f"has shape {tuple(dst)}")
  if src.dtype != ddt:
    raise TypeError(f"The stored value has dtype {src.dtype}, but the target reference has "
                    f"dtype {ddt}")
  if int(np.prod(bar)) != 1:
    raise TypeError(f"Expected a single barrier, got a barrier reference with shape {tuple(bar)}")
  return [], mp.ref_effects(trees, writes=(0,))


async_store_smem_p = mp.primitive("async_store_smem", _store_abstract_eval)
backends.register_kernel_primitives("mosaic_gpu", (async_store_smem_p,))


def async_store_smem(src, ref, barrier, *, cluster_idx, cluster_dim, optimized: bool = True,
                     atomic: str | None = None) -> None:
  """Stores ``src`` into ``ref`` of the cluster's block at ``cluster_idx`` along ``cluster_dim``
  (``atomic``: add, max, min, and, or, xor with what is there), asynchronously: that block's
  ``barrier`` completes once the data landed."""
  del optimized   # (a layout choice of Mosaic GPU's stores)
  if atomic is not None and atomic not in ATOMICS:
    raise ValueError(f"async_store_smem: atomic must be one of {sorted(ATOMICS)}, got {atomic!r}")
  if not np.shape(src):
    raise NotImplementedError("Scalars are not supported in async_store_smem")
  mp.bind_refs(async_store_smem_p, (ref, barrier), extra=(src, cluster_idx),
               cluster_dim=cluster_dim, atomic=atomic)


@rule(async_store_smem_p)
def _async_store_smem(th, eqn, invals):
  yield from ()
  what = "async_store_smem"
  (ref, bar), (value, idx) = mp.split_refs(invals, eqn.params["trees"])
  axis = eqn.params["cluster_dim"]
  try:
    peer = _peer(th.block, {axis: idx})
  except remote.PeerError as e:
    fail(th, f"{what}: {str(e).split(': ', 1)[1]}", ValueError)
  dst = clusters.twin(ref[0].at(ref[1]), peer)
  bar_view = clusters.twin(bar[0].at(bar[1]), peer)
  if dst.buf.space != "smem":
    fail(th, f"{what} stores into SMEM, but {dst.buf.name} is in {dst.buf.space.upper()}")
  value, op = np.asarray(value), eqn.params["atomic"]
  if op is not None:
    eager.check_initialized(th, dst, f"{what}(atomic={op!r})")
    value = ATOMICS[op](np.asarray(eager.read(dst)), value)
  mask = sem.view_mask(dst)
  eager.write(dst, value.astype(dst.buf.data.dtype))
  sem.union_write(th, dst, mask)
  sem.landed(th, dst, mask, bar_view, what,
             f"{th.line}: an async_store_smem of block {clusters.block_name(th.block)}")
  return []

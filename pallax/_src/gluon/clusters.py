"""Clusters (``plgpu.kernel(cluster=...)``) on Hopper through Gluon 3.6: emulated, exactly.

Gluon 3.6 cannot express what a cluster's blocks share: it has no cluster rank, no multicast TMA
and no remote barrier arrival, and its multi-CTA mode (``num_ctas``) is another model (one
program spread over the cluster's CTAs, every layout with a CGA layout). So each block of a
cluster runs as an independent block of the launch, and what the blocks would share becomes
private to each:

- the grid: ``prod(grid) * prod(cluster)`` blocks, the cluster axes fastest (Mosaic GPU's
  order: the blocks of a cluster are neighbours in the launch); ``lax.axis_index`` of a cluster
  axis decodes from the block id;
- a multicast ``copy_gmem_to_smem(..., collective_axes=...)``: each block loads the whole box
  into its own SMEM (the same data every block of the group would receive); it costs one GMEM
  (in practice L2) read of the box per block instead of one per group;
- a ``ClusterBarrier``: a barrier of the block, counting its own ``num_arrivals`` arrivals. What
  it orders across blocks on a GPU, the reuse of SMEM that peers' multicasts write, no longer
  exists: each block's SMEM is written by its own copies only.

What the emulation cannot give is refused (``refuse``): a kernel whose blocks might order each
other's GMEM through a cluster barrier (one that writes a GMEM operand it also reads), and
leader-tracked copies (whose data lands in one block and is awaited in another).
"""
from __future__ import annotations

import math

from pallax._src.gluon import events as ev


def launch_axes(gm, info) -> tuple[tuple, tuple]:
  """(sizes, names) of the launch's axes: the grid's, then the cluster's of more than one block
  (fastest; the others are 0, ``fixed_axes``)."""
  cluster = tuple((n, k) for n, k in info.cluster if k > 1) if info is not None else ()
  names = tuple(gm.grid_names or ()) or tuple(f"axis{i}" for i in range(len(gm.grid)))
  return (tuple(gm.grid) + tuple(n for _, n in cluster),
          names + tuple(name for name, _ in cluster))


def fixed_axes(info) -> tuple:
  """The cluster axes of size one (their index is 0)."""
  return tuple(n for n, k in info.cluster if k == 1) if info is not None else ()


def size(info) -> int:
  return math.prod(n for _, n in info.cluster) if info is not None else 1


def refuse(params, gen, parts) -> None:
  """A cluster barrier in a kernel that writes a GMEM operand it also reads: the blocks may
  communicate through GMEM, ordered by the barrier, which independent blocks cannot honour."""
  if size(params.threads) <= 1 or not gen.cluster_barriers:
    return
  same = {f"out[{o}]": f"args[{i}]" for i, o in params.input_output_aliases}   # one buffer
  reads, writes = set(), set()
  for part in parts:
    for e in part.events:
      if isinstance(e, ev.Copy):
        (reads if e.direction == "in" else writes).add(same.get(e.gmem, e.gmem))
      elif isinstance(e, ev.Access) and isinstance(e.ref, str):
        ref = same.get(e.ref, e.ref)
        if e.kind in ("load", "atomic"):
          reads.add(ref)
        if e.kind in ("store", "atomic"):
          writes.add(ref)
  both = sorted(reads & writes)
  if both:
    raise NotImplementedError(
        f"plgpu kernel {params.name}: a plgpu.ClusterBarrier in a kernel that writes and reads "
        f"GMEM ({', '.join(both)}): pallax runs a cluster's blocks on Hopper as independent "
        "blocks (Gluon 3.6 has no cluster barriers), which cannot order one block's GMEM "
        "writes before another's reads; run it in the interpreter (interpret=True), or "
        "exchange the data between kernels")

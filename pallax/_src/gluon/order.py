"""Equation order for the Gluon backend: Ref reads moved above the barrier arrivals just before them.

Gluon 3.6 arrives on an mbarrier from one thread after a barrier of the whole partition, and its
membar pass puts another barrier before the next shared-memory access (it cannot tell the
mbarrier's memory from the partition's buffers). So an arrive followed by a read of another
buffer costs two partition barriers, and the read placed first costs none of them. JAX's
attention backward reads delta right after releasing dO: reading it first made its dK/dV kernel 3%
faster on an H200.

Reading earlier cannot change the value read in a kernel without races. A write that the arrive
lets another thread make would race with the read in the original order too, and the
interpreter reports such races. The release comes later only by the read itself. Nothing new can
block, as reads never wait. The interpreter runs the kernel in its own order; only the code
generator sees this one.
"""
from __future__ import annotations

from jax import lax

from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src.mosaic_gpu import primitives as mp

# Register-only steps that follow a read (plgpu.load is a get and a layout_cast): they move with it.
_FOLLOWERS = (mp.layout_cast_p, lax.convert_element_type_p)


def hoist_reads(jaxpr: ji.Jaxpr) -> ji.Jaxpr:
  """``jaxpr`` (and its sub-jaxprs) with each Ref read, and the register steps applied to it,
  placed before the run of ``barrier_arrive``s that directly precedes it."""
  eqns, moved = [], set()
  for eqn in jaxpr.eqns:
    eqn = eqn.replace(params=jaxpr_util.map_sub_jaxprs(eqn.params, hoist_reads))
    at = len(eqns)
    if eqn.primitive is ji.get_p or (eqn.primitive in _FOLLOWERS
                                     and any(not isinstance(v, ji.Literal) and v in moved
                                             for v in eqn.invars)):
      while at and eqns[at - 1].primitive is mp.barrier_arrive_p:   # arrives define nothing
        at -= 1
    if at < len(eqns):
      moved.update(eqn.outvars)
    eqns.insert(at, eqn)
  return jaxpr.replace(eqns=eqns)

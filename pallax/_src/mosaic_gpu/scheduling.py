"""``plgpu.dynamic_scheduling_loop``: a block runs its own grid position, then takes over the
work of blocks that have not started (cluster launch control on Blackwell), until none is left.

In the eager interpreter blocks start in grid order, so the first block takes over every
other block's work (a schedule a GPU may produce when the first block is fast): the loop body
runs with ``local_index`` 0, 1, 2, ..., which exercises the reuse of barriers and buffers from
one step to the next (the blocks of a cluster share their claims: each gets the same positions);
the blocks whose work was taken find nothing left and leave the loop at
once. The results are those of the static grid."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from pallax._src import backends
from pallax._src import jax_internals as ji
from pallax._src.interpret.eager import fail, rule
from pallax._src.mosaic_gpu import primitives as mp
from pallax._src.mosaic_gpu.helpers import NDLoopInfo


def _abstract_eval(step, *, grid, grid_names):
  return ([ji.ShapedArray((), jnp.int32)] * len(grid) + [ji.ShapedArray((), jnp.bool_)],
          {mp.mosaic_effect})


claim_work_p = ji.Primitive("claim_work")
claim_work_p.multiple_results = True
claim_work_p.def_effectful_abstract_eval(_abstract_eval)
backends.register_kernel_primitives("mosaic_gpu", (claim_work_p,))


def _claim(step, grid, grid_names):
  *index, ok = claim_work_p.bind(jnp.asarray(step, jnp.int32), grid=grid, grid_names=grid_names)
  return tuple(index), ok


def dynamic_scheduling_loop(grid_names, thread_axis=None, cluster_axes=(), init_carry=None):
  """``@dynamic_scheduling_loop(grid_names)`` over ``body(loop_info)`` (``body(loop_info,
  carry=...)`` returning the next carry, with ``init_carry``): runs the body once per grid
  position this block gets, ``loop_info.index`` the position and ``loop_info.local_index`` the
  step number of this block. The threads of a block get the same positions."""
  del thread_axis   # every thread of a block asks; they share the answers
  grid_names = tuple(grid_names)
  for axes in cluster_axes:
    for a in (axes,) if isinstance(axes, str) else axes:
      if lax.axis_size(a) != 1:
        raise NotImplementedError(
            f"dynamic_scheduling_loop(cluster_axes={tuple(cluster_axes)}): clusters of more than "
            "one block are not supported by pallax yet; use cluster=(1,)")
  grid = tuple(int(lax.axis_size(n)) for n in grid_names)

  def decorator(body):
    def step(carry):
      index, _, k, user = carry
      info = NDLoopInfo(index=index, local_index=k, num_local_steps=None)
      user = body(info) if init_carry is None else body(info, carry=user)
      index, ok = _claim(k + 1, grid, grid_names)
      return index, ok, k + 1, user

    index, ok = _claim(0, grid, grid_names)
    out = lax.while_loop(lambda c: c[1], step, (index, ok, jnp.int32(0), init_carry))
    return None if init_carry is None else out[3]

  return decorator


@rule(claim_work_p)
def _claim_work(th, eqn, invals):
  """Step ``k`` of this block's loop: the same answer for each of its threads, and for each
  block of its cluster (cluster launch control cancels whole clusters: they work together)."""
  yield from ()
  grid, names, k = eqn.params["grid"], eqn.params["grid_names"], int(np.asarray(invals[0]))
  owner = th.block.peers[0] if th.block.peers else th.block
  claims = owner.state.setdefault("claims", [])
  if k < len(claims):
    got = claims[k]
  else:
    taken = th.block.run.setdefault("claimed", set())
    if k == 0:
      missing = [n for n in names if n not in th.block.axes]
      if missing:
        fail(th, f"dynamic_scheduling_loop: {missing} are not grid axes of the kernel "
                 f"(its axes: {tuple(th.block.axes)})", ValueError)
      own = int(np.ravel_multi_index([th.block.axes[n] for n in names], grid))
      got = None if own in taken else own
    else:
      got = next((i for i in range(int(np.prod(grid))) if i not in taken), None)
    if got is not None:
      taken.add(got)
    claims.append(got)
  index = np.unravel_index(got if got is not None else 0, grid)
  return [jnp.int32(i) for i in index] + [jnp.bool_(got is not None)]

"""``plgpu.dynamic_scheduling_loop`` on Gluon: a static schedule, each block its own position.

On Blackwell the loop takes over the work of blocks not yet started through cluster launch
control (``try_cancel``), which Gluon 3.6 cannot write. Cancelling is only ever an attempt: a
block whose attempt fails (every block already running) works on its own grid position and
leaves. That outcome is what this lowering writes: the first claim is the block's own position,
every later claim finds nothing, so the loop body runs once per block, ``local_index`` 0. The
results equal the static grid's, as they do under any schedule; only the load balancing of a
GPU that cancels blocks is lost (the interpreter's schedule, one block taking over the others,
is another of the outcomes).
"""
from __future__ import annotations

import numpy as np

from pallax._src.gluon.assign import layout_rule
from pallax._src.gluon.writer import rule
from pallax._src.gpu import expr as ex
from pallax._src.mosaic_gpu.scheduling import claim_work_p

WRITTEN = (claim_work_p,)


@rule(claim_work_p)
def _claim_work(ctx, step, *, grid, grid_names):
  gen = ctx.gen
  missing = [n for n in grid_names if n not in gen.axes]
  if missing:
    raise NotImplementedError(f"dynamic_scheduling_loop over {missing}, which are not grid axes "
                              "of the kernel")
  bool_ = np.dtype(np.bool_)
  if isinstance(step, ex.Lit):   # the loop's first claim
    return [gen.axes[n] for n in grid_names] + [ex.Lit(step.value == 0, dtype=bool_)]
  first = ex.binary("==", step, ex.Lit(0, dtype=np.dtype(np.int32)), dtype=bool_)
  return [gen.axes[n] for n in grid_names] + [gen.bind(first, "claimed")]


@layout_rule(claim_work_p)
def _claim_work_layouts(ctx, step, *, grid, grid_names):
  return None   # scalars

"""``pipeline_state`` of ``emit_pipeline_warp_specialized``: pipelines run in sequence.

JAX lets a sequence of warp-specialized pipelines (``START``, any number of ``STEADY``, one
``STOP``) skip the drain of one and the prologue of the next, so that the memory thread fetches
the next pipeline's first blocks while the compute threads finish the last one. The results are
those of running each pipeline whole, one after another, which is what pallax does: the state is
checked as JAX checks it, and each pipeline starts and drains (a bubble between pipelines on the
GPU, no difference in what they compute).
"""
from __future__ import annotations

import enum


class PipelinePipeline(enum.IntEnum):
  """Where a pipeline stands in a sequence of pipelines (``pipeline_state=``)."""
  START = 0
  STEADY = 1
  STOP = 2


def check_pipeline_state(pipeline_state, num_steps: int, max_concurrent_steps: int,
                         delay_release: int) -> None:
  """JAX's conditions on a pipeline of pipelines, with its words."""
  if pipeline_state is None:
    return
  if not isinstance(num_steps, int):
    raise NotImplementedError("A pipeline of pipelines is not supported with dynamic grids")
  if num_steps % max_concurrent_steps:
    raise NotImplementedError(
        "A pipeline of pipelines is only allowed when the number of steps (product of grid, "
        f"here {num_steps}) is divisible by {max_concurrent_steps=}")
  if delay_release:
    raise NotImplementedError("A pipeline of pipelines is not supported with delay_release")

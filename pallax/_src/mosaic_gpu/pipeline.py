"""``emit_pipeline`` and ``emit_pipeline_warp_specialized``: pallax's own pipelining library code
over the Mosaic GPU primitives (being written)."""
from __future__ import annotations


def emit_pipeline(body, *, grid, in_specs=(), out_specs=(), max_concurrent_steps=1, init_carry=None):
  raise NotImplementedError("plgpu.emit_pipeline is not written yet")


def emit_pipeline_warp_specialized(body, *, grid, memory_registers, in_specs=(), out_specs=(),
                                   max_concurrent_steps=2, wg_axis, num_compute_wgs,
                                   pipeline_state=None, manual_produced_barriers=False,
                                   manual_consumed_barriers=False, compute_context=None,
                                   memory_thread_idx=None):
  raise NotImplementedError("plgpu.emit_pipeline_warp_specialized is not written yet")

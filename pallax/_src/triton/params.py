"""The Triton backend's compiler parameters, and its entry in the backend registry."""
from __future__ import annotations

import dataclasses

from pallax._src import backends
from pallax._src import core as pc


@dataclasses.dataclass(frozen=True)
class CompilerParams(pc.CompilerParams):
  """Triton compiler parameters; ``None`` picks a default from the block sizes."""
  BACKEND = "triton"
  num_warps: int | None = None
  num_stages: int | None = None
  compute_capability: int | None = None   # a target below the GPU's own (75: Turing)
  # True: float32 exp, exp2, log, log2, sin, cos, tanh and logistic use the GPU's fast
  # approximate instructions (docs/triton.md gives their errors); False: XLA's functions.
  approx_math: bool = False


def _available() -> bool:
  try:
    import triton  # noqa: F401
  except ImportError:
    return False
  return True


def _lowering(ctx, *args, params):
  from pallax._src.triton import launch   # imports triton: only when a kernel is lowered
  return launch.triton_lowering(ctx, *args, params=params)


BACKEND = backends.register(backends.Backend(
    "triton", ("cuda", "gpu"), CompilerParams, _lowering, _available))

"""The GPU the kernels run on."""
from __future__ import annotations

import jax


def device_compute_capability() -> int | None:
  """The first GPU's compute capability (90 for sm_90), or None on a machine without a GPU:
  there a kernel is only lowered for CUDA ahead of time (``jax.export``,
  ``jit(f).trace(x).lower(lowering_platforms=("cuda",))``), for a target the caller names."""
  try:
    dev = jax.devices("gpu")[0]
  except RuntimeError:   # "Unknown backend: 'gpu' requested, but no platforms ... are present"
    return None
  cc = getattr(dev, "compute_capability", None)
  if cc is None:
    raise RuntimeError("cannot read the GPU's compute capability")
  major, minor = str(cc).split(".")[:2]
  return int(major) * 10 + int(minor)

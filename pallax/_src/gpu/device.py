"""The GPU the kernels run on."""
from __future__ import annotations

import jax


def device_compute_capability() -> int:
  dev = jax.devices("gpu")[0]
  cc = getattr(dev, "compute_capability", None)
  if cc is None:
    raise RuntimeError("cannot read the GPU's compute capability")
  major, minor = str(cc).split(".")[:2]
  return int(major) * 10 + int(minor)

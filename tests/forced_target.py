"""The second GPU pass of issue 14 (``PALLAX_TRITON_COMPUTE_CAPABILITY=75 make gpu-test``): kernels
that cannot exist on the forced, older target must be refused with pallax's clear error, which
names that target; those count as skipped, anything else still fails."""
import contextlib
import os

import pytest


def forced_target() -> int | None:
  cc = os.environ.get("PALLAX_TRITON_COMPUTE_CAPABILITY")
  return int(cc) if cc else None


@contextlib.contextmanager
def refused_on_forced_target():
  from pallax._src.gpu.source import Unsupported
  from pallax._src.triton.compile import SharedMemoryError
  try:
    yield
  except (Unsupported, SharedMemoryError) as e:
    cc = forced_target()
    if cc is None or f"sm_{cc}" not in str(e):
      raise
    pytest.skip(f"refused on the forced target sm_{cc}, as it should be: {str(e)[:300]}")

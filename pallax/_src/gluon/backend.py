"""Registers the Gluon backend for Mosaic GPU kernels (Hopper, one warpgroup so far)."""
from __future__ import annotations

import importlib.util

from pallax._src import backends


class _NoParams:
  """The backend is chosen by the kernel (threads, barriers, TMA), never by compiler params."""


def check_compute_capability(cc: int, name: str,
                             instead: str = "plgpu.kernel(..., interpret=True)"):
  if cc < 90:
    major, minor = divmod(cc, 10)
    raise RuntimeError(
        f"plgpu kernel {name}: Mosaic GPU kernels need a Hopper GPU (compute capability 9.0) "
        f"or newer, but this one has {major}.{minor}. Run it in the interpreter instead: "
        f"{instead}.")


def _lowering(ctx, *args, params):
  from pallax._src.gluon import compile as gluon_compile
  from pallax._src.gpu.device import device_compute_capability
  cc = device_compute_capability()
  if cc is not None:   # None: lowered ahead of time on a machine without a GPU, for sm_90a
    check_compute_capability(cc, params.name)
  return gluon_compile.gluon_lowering(ctx, *args, params=params)


def _available() -> bool:
  return importlib.util.find_spec("triton") is not None and \
      importlib.util.find_spec("triton.experimental.gluon") is not None


BACKEND = backends.register(backends.Backend(
    "mosaic_gpu", ("cuda",), _NoParams, _lowering, _available, kind="mosaic_gpu"))

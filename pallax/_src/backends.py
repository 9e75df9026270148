"""Which backend compiles a pallas_call: a registry keyed by backend name and compiler-params type.

As in JAX's pallas_call, the type of ``compiler_params`` (or its key in the dict form
``{"triton": {...}}``, or ``backend=``) names the backend; with none of them, the first
registered backend for the platform that is available. Where none applies, kernels run in
the interpreter. A new GPU backend registers itself here; ``pallas_call.py`` does not change.
"""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Backend:
  name: str
  platforms: tuple[str, ...]          # JAX platforms it compiles for
  params_type: type                   # its CompilerParams class
  lowering: Callable                  # (ctx, *args, params) -> MLIR values
  available: Callable[[], bool]       # whether its compiler can be imported here
  kind: str = "pallas"                # the kernels it compiles: "pallas", or "mosaic_gpu" (threads,
                                      # barriers, TMA): a second registry, chosen by the kernel


_REGISTRY: dict[str, Backend] = {}    # filled at import time, like JAX's lowering tables


def register(backend: Backend) -> Backend:
  _REGISTRY[backend.name] = backend
  return backend


def _requested(params) -> str | None:
  """The backend that ``backend=`` or ``compiler_params`` names (None: any)."""
  cp = params.compiler_params
  if params.backend is not None:
    return params.backend
  for b in _REGISTRY.values():
    if b.kind == "pallas" and isinstance(cp, b.params_type):
      return b.name
  if isinstance(cp, tuple):   # the dict form, frozen into sorted pairs
    names = [k for k, _ in cp if k in _REGISTRY]
    return names[0] if names else None
  return None


def choose(params, platform: str) -> Backend | None:
  """The backend for ``params`` on ``platform``; None: the interpreter."""
  if params.interpret:
    return None
  name = _requested(params)
  if name is not None and name not in _REGISTRY:
    raise ValueError(f"pallas_call {params.name}: unknown backend {name!r}; use one of "
                     f"{sorted(_REGISTRY)} or interpret=True")
  candidates = [_REGISTRY[name]] if name is not None else \
      [b for b in _REGISTRY.values() if b.kind == "pallas"]
  for b in candidates:
    if platform in b.platforms and b.available():
      return b
  _note_interpreter(platform)
  return None


def for_kind(kind: str, platform: str) -> Backend | None:
  """The backend of ``kind`` (e.g. "mosaic_gpu") for ``platform``, if one is available."""
  for b in _REGISTRY.values():
    if b.kind == kind and platform in b.platforms and b.available():
      return b
  return None


_note_shown: list = []   # a one-time note (a cache of one entry)


def _note_interpreter(platform: str):
  if _note_shown:
    return
  _note_shown.append(True)
  print(f"pallax: no GPU backend applies on platform {platform!r}; running kernels in the "
        "interpreter (pass interpret=True to choose it explicitly).", file=sys.stderr)

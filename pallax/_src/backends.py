"""Which executor runs a pallas_call: the one answer everyone asks (dispatch, the torch path,
``plgpu.lower``, the tests).

A kernel is of a kind: "pallas" (blocked kernels), or "mosaic_gpu" (threads, or a primitive
that only Mosaic GPU kernels have: primitives register their kind next to their definitions,
``register_kernel_primitives``). Backends register themselves here with the kind they compile.
As in JAX's pallas_call, the type of ``compiler_params`` (or its key in the dict form
``{"triton": {...}}``, or ``backend=``) names a "pallas" backend; with none of them, the first
registered backend for the platform that is available. Where none applies, kernels run in the
interpreter: the vectorized one, or the eager one (threads that wait on each other, and
``lax.axis_index`` of names that are not grid axes). A new GPU backend registers itself here;
nothing else changes.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from pallax._src import interpreter_note
from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src import remote
from pallax._src import plan as kplan


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
  interpreter_note.show(params, platform)
  return None


_KIND_OF_PRIMITIVE: dict = {}   # primitive -> the kind of kernel it belongs to (filled at import)


def register_kernel_primitives(kind: str, primitives):
  """Kernels that use any of ``primitives`` are of ``kind`` (e.g. "mosaic_gpu")."""
  for p in primitives:
    _KIND_OF_PRIMITIVE[p] = kind


def _kind(params) -> tuple[str, bool]:
  """(the kernel's kind, whether the eager interpreter must run it where no backend does: a
  Mosaic GPU kernel, or one asking for its position by a name that is not a grid axis's, which
  the vectorized interpreter cannot give since grid names became program ids when traced)."""
  mosaic_only = {p for p, kind in _KIND_OF_PRIMITIVE.items() if kind == "mosaic_gpu"}
  mosaic = getattr(params, "threads", None) is not None or jaxpr_util.uses(params.jaxpr, mosaic_only)
  kind = "mosaic_gpu" if mosaic else "pallas"
  return kind, (mosaic or jaxpr_util.uses(params.jaxpr, {ji.axis_index_p})
                or remote.uses_remote(params.jaxpr))   # peers: interpret/devices.py


_kinds = kplan.PerParams()   # computed once per pallas_call: eager calls ask at every call


def kernel_kind(params) -> str:
  """"mosaic_gpu" (threads, barriers, TMA, wgmma) or "pallas"."""
  return _kinds.get(params, _kind)[0]


def is_mosaic_gpu(params) -> bool:
  return kernel_kind(params) == "mosaic_gpu"


def needs_eager_interpreter(params) -> bool:
  """Whether the interpreter that runs ``params``' kernel is the eager one (threads)."""
  return _kinds.get(params, _kind)[1]


def for_kind(kind: str, platform: str) -> Backend | None:
  """The backend of ``kind`` (e.g. "mosaic_gpu") for ``platform``, if one is available."""
  for b in _REGISTRY.values():
    if b.kind == kind and platform in b.platforms and b.available():
      return b
  return None

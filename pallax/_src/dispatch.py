"""Which executor runs a ``pallas_call``: eagerly (checked interpretation raising Python errors),
lowered for a GPU backend, or interpreted inside a trace."""
from __future__ import annotations

import functools

import jax

from pallax._src import backends
from pallax._src.interpret import devices, interpreter
from pallax._src import jax_internals as ji
from pallax._src import remote
from pallax._src.call_primitive import Params, pallas_call_p


def _lowering(ctx, *args, params: Params, platform: str):
  backend = backends.choose(params, platform)
  if backend is None and backends.needs_eager_interpreter(params):
    return ji.mlir.lower_fun(functools.partial(devices.run_traced, params=params),
                             multiple_results=True)(ctx, *args)
  if backend is not None:
    remote.refuse_on_gpu(params, "Gluon" if backends.is_mosaic_gpu(params) else backend.name)
  if backend is not None and backends.is_mosaic_gpu(params):
    return _mosaic_backend(params, platform).lowering(ctx, *args, params=params)
  if backend is not None:
    return backend.lowering(ctx, *args, params=params)
  fn = functools.partial(interpreter.run, params=params, raise_errors="callback")
  return ji.mlir.lower_fun(fn, multiple_results=True)(ctx, *args)


for _platform in ("cpu", "cuda", "rocm", "tpu"):
  ji.mlir.register_lowering(pallas_call_p, functools.partial(_lowering, platform=_platform),
                            platform=_platform)


def _impl(*args, params: Params):
  """Eager calls: checked interpretation raises Python errors directly."""
  platform = jax.devices()[0].platform
  backend = backends.choose(params, platform)
  traced = any(isinstance(a, jax.core.Tracer) for a in args)
  if backends.needs_eager_interpreter(params) and backend is None and not traced:
    return devices.run_now(*args, params=params)
  if backend is not None or traced:
    return ji.dispatch.apply_primitive(pallas_call_p, *args, params=params)
  return interpreter.run_eager(*args, params=params)


def _mosaic_backend(params: Params, platform: str):
  backend = backends.for_kind("mosaic_gpu", platform)
  if backend is None:
    raise NotImplementedError(
        f"pallas_call {params.name}: Mosaic GPU kernels (threads, barriers, TMA copies, wgmma) need "
        f"the Gluon backend, which is not available on platform {platform!r} here; pass "
        "interpret=True to run them in pallax's interpreter")
  return backend


pallas_call_p.def_impl(_impl)

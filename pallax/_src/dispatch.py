"""Which executor runs a ``pallas_call``: eagerly (checked interpretation raising Python errors),
lowered for a GPU backend, or interpreted inside a trace."""
from __future__ import annotations

import functools

import jax

from pallax._src import backends
from pallax._src.interpret import devices, interpreter, symbolic
from pallax._src import jax_internals as ji
from pallax._src import remote
from pallax._src.call_primitive import Params, pallas_call_p
from pallax._src.gpu import peers


def _without_host_callbacks(ctx) -> str | None:
  """Why this lowering cannot hold host callbacks (None where it can): ``jax.export``
  serializes none, and lowering for a platform this machine has no device of (ahead-of-time
  compilation) has no backend to call back from."""
  mc = ctx.module_context
  if mc.lowering_parameters.for_export:
    return "jax.export cannot serialize"
  try:
    if mc.get_backend(optional=True) is not None:
      return None
  except RuntimeError:
    pass
  return f"a lowering for {', '.join(mc.platforms)} without such a device here cannot hold"


def _refuse_callbacks(ctx, params: Params, eager: bool):
  why = _without_host_callbacks(ctx)
  if why is None or not (eager or interpreter.prepare(params).checked):
    return
  instead = ("its Mosaic GPU threads and cross-device semantics run on the host: run it on a "
             "machine with the target device, without jax.export" if eager else
             "pass interpret=pl.InterpretParams(check_bounds=False) to lower the kernel without "
             "its run-time bounds checks (debug checks and race detection must be off too)")
  raise NotImplementedError(
      f"pallas_call {params.name}: pallax's interpreter reports failed run-time checks through "
      f"host callbacks, which {why}; {instead}")


def _lowering(ctx, *args, params: Params, platform: str):
  if symbolic.symbolic(params):
    return _symbolic_lowering(ctx, *args, params=params, platform=platform)
  backend = backends.choose(params, platform)
  if backend is None:
    _refuse_callbacks(ctx, params, backends.needs_eager_interpreter(params))
  if backend is None and backends.needs_eager_interpreter(params):
    return ji.mlir.lower_fun(functools.partial(devices.run_traced, params=params),
                             multiple_results=True)(ctx, *args)
  if backend is not None and not backends.is_mosaic_gpu(params):
    remote.refuse_on_gpu(params, backend.name)
  if backend is not None and params.peers is None and peers.needed(params):
    # (the call again, given its mesh coordinates and its peers' addresses: gpu/peers.py)
    return ji.mlir.lower_fun(functools.partial(peers.call, params=params, bind=pallas_call_p.bind),
                             multiple_results=True)(ctx, *args)
  if backend is not None and backends.is_mosaic_gpu(params):
    return _mosaic_backend(params, platform).lowering(ctx, *args, params=params)
  if backend is not None:
    return backend.lowering(ctx, *args, params=params)
  fn = functools.partial(interpreter.run, params=params, raise_errors="callback")
  return ji.mlir.lower_fun(fn, multiple_results=True)(ctx, *args)


def _symbolic_lowering(ctx, *args, params: Params, platform: str):
  """Symbolic sizes (jax.export): the interpreter's plain path, or JAX's GPU refusal."""
  if platform in ("cuda", "rocm") and not params.interpret:
    symbolic.refuse_on_gpu(params, "Mosaic GPU" if backends.is_mosaic_gpu(params) else "Triton")
  why = _without_host_callbacks(ctx)
  if why is not None and symbolic.checks_requested(params):
    raise NotImplementedError(
        f"pallas_call {params.name}: pallax's interpreter reports failed run-time checks through "
        f"host callbacks, which {why}; pass interpret=pl.InterpretParams(check_bounds=False) to "
        "lower the kernel with symbolic sizes without them (debug checks and race detection must "
        "be off too)")
  return ji.mlir.lower_fun(functools.partial(symbolic.run, params=params),
                           multiple_results=True)(ctx, *args)


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

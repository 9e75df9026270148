"""Every Mosaic GPU kernel that the suite runs in the interpreter is also compiled by the Gluon
backend for sm_90a (on any machine), so that a kernel the interpreter accepts but Gluon cannot
lower shows up in CI, not on a user's GPU. A Blackwell kernel (tcgen05, TMEM), which sm_90a
refuses, is compiled for sm_100a instead, and its PTX must hold the tcgen05 instruction of each
Blackwell operation it uses (``lower_for_blackwell``).

A kernel may be refused only with a clear ``NotImplementedError`` (a construct the Gluon backend
does not express yet, named with its line); its test lists that refusal with
``@pytest.mark.gluon_refuses("words of the message")``. Anything else fails the test.
"""
from __future__ import annotations

import dataclasses
import os
import traceback

import numpy as np

from pallax._src.mosaic_gpu import profiler

_lowered: dict = {}   # Params -> None (it lowers), or (refused, why)


def _memo(cache: dict, params, attempt):
  """``attempt()``'s verdict on ``params``, computed once: None (it lowers, or what ``attempt``
  returns), (True, why) for a clean refusal (NotImplementedError), (False, why) for anything
  else raised."""
  try:
    return cache[params]
  except (KeyError, TypeError):
    pass
  try:
    why = attempt()
  except NotImplementedError as e:
    why = (True, f"{type(e).__name__}: {e}")
  except Exception as e:  # noqa: BLE001
    where = traceback.extract_tb(e.__traceback__)[-1]
    why = (False, f"{type(e).__name__}: {e} (raised at {where.filename}:{where.lineno})")
  try:
    cache[params] = why
  except TypeError:
    pass
  return why


def lower(params):
  """None if ``params``' kernel lowers to sm_90a PTX, else (a clean refusal?, why)."""
  from pallax._src.gluon import compile as gluon_compile

  def attempt():
    gluon_compile.compile_params(with_exchange(params))
  return _memo(_lowered, params, attempt)


def with_exchange(params):
  """``params`` as a GPU lowering under ``jax.shard_map`` gives them to a backend, for a kernel
  that reads mesh coordinates or reaches its peers (gpu/peers.py): the mesh's axes are the names
  its ``lax.axis_index`` takes that are not its own (two devices each, here)."""
  from pallax._src import jax_internals as ji
  from pallax._src import jaxpr_util, remote
  from pallax._src.gpu import peers
  own = set(params.grid_mapping.grid_names or ())
  own |= {n for n, _ in params.threads.axis_env()} if params.threads is not None else set()
  mesh = sorted({e.params["axis_name"] for e in jaxpr_util.equations(params.jaxpr)
                 if e.primitive is ji.axis_index_p and e.params["axis_name"] not in own})
  if not mesh and not remote.uses_remote(params.jaxpr):
    return params
  return dataclasses.replace(params, peers=peers.exchange(params, tuple((a, 2) for a in mesh)))


# The sm_90a refusal of a kernel that uses Blackwell's operations (gluon/codegen.py).
BLACKWELL = "is Blackwell's (sm_100a), and pallax's Gluon backend compiles Mosaic GPU kernels for Hopper"
# Per Blackwell primitive, the instruction its sm_100a PTX must hold.
_INSTRUCTIONS = {"tcgen05_mma": "tcgen05.mma", "tcgen05_commit_arrive": "tcgen05.commit",
                 "async_load_tmem": "tcgen05.ld", "async_store_tmem": "tcgen05.st",
                 "async_copy_smem_to_tmem": "tcgen05.st"}   # (a register round trip)
_lowered_100: dict = {}


def lower_for_blackwell(params):
  """As ``lower``, for sm_100a; a kernel that compiles but whose PTX lacks the tcgen05
  instruction of one of its operations fails too."""
  from pallax._src import jaxpr_util
  from pallax._src.gluon import compile as gluon_compile

  def attempt():
    ptx = gluon_compile.compile_params(params, 100).ptx
    used = {_INSTRUCTIONS[e.primitive.name] for e in jaxpr_util.equations(params.jaxpr)
            if e.primitive.name in _INSTRUCTIONS}
    missing = sorted(w for w in used if w not in ptx)
    return None if ".target sm_100a" in ptx and not missing else (
        False, f"its sm_100a PTX lacks {missing or '.target sm_100a'}")
  return _memo(_lowered_100, params, attempt)


def checking(run_kernel, failures: list, refusals):
  """``eager.run_kernel`` that also lowers each Mosaic GPU kernel it ran (after the interpreter
  accepted it) and records in ``failures`` what did not lower, unless ``refusals`` (substrings)
  names it."""
  def wrapped(params, args, *rest):
    out = run_kernel(params, args, *rest)
    from pallax._src import backends
    if not backends.is_mosaic_gpu(params):
      return out
    why = lower(params)
    if why is not None and BLACKWELL in why[1]:
      why = lower_for_blackwell(params)
    if why is not None:
      clean, text = why
      if not (clean and any(r in text for r in refusals)):
        failures.append(f"plgpu kernel {params.name} does not lower to Gluon: {text}")
    return out
  return wrapped


# --- on a Hopper GPU: the same kernel, the same inputs, the interpreter's outputs ---------------

# Per output dtype: (rtol, atol as a fraction of the output's largest magnitude). Loose enough for
# wgmma's summation order and tf32 (float32 operands), far below what a wrong layout, a missed
# wait or leaking padding produce.
_TOLERANCE = {"float32": (5e-3, 5e-3), "float16": (4e-3, 4e-3), "bfloat16": (2e-2, 2e-2)}


def run_on_gpu(params, args, choose) -> list:
  """The outputs of ``params``' kernel compiled by the Gluon backend and run on the GPU
  (``choose``: the backend chooser, which the test may have replaced)."""
  import jax
  from pallax._src import backends
  from pallax._src import pallas_call as pcall
  gpu = jax.devices("gpu")[0]
  params = dataclasses.replace(params, interpret=False)
  chosen, backends.choose = backends.choose, choose
  try:
    with jax.default_device(gpu):
      outs = jax.jit(lambda *a: pcall.pallas_call_p.bind(*a, params=params))(
          *[jax.device_put(a, gpu) for a in args])
      return [np.asarray(o) for o in outs]
  finally:
    backends.choose = chosen


def compare(name: str, want: list, got: list) -> str | None:
  """Why the GPU's outputs differ from the interpreter's (None: they agree). Elements the
  interpreter left unwritten (its poison: NaN, the smallest integer) are not compared."""
  for k, (w, g) in enumerate(zip(want, got)):
    w, g = np.asarray(w), np.asarray(g)
    if w.dtype.name in _TOLERANCE:
      w32, g32 = w.astype(np.float32), g.astype(np.float32)
      written = ~np.isnan(w32)
      rtol, frac = _TOLERANCE[w.dtype.name]
      scale = float(np.abs(w32[written]).max()) if written.any() else 0.0
      bad = written & ~(np.abs(g32 - w32) <= frac * scale + rtol * np.abs(w32))
    else:
      poison = np.iinfo(w.dtype).min if np.issubdtype(w.dtype, np.integer) else None
      bad = (w != g) & (w != poison) if poison is not None else w != g
    if bad.any():
      i = tuple(int(j) for j in np.argwhere(bad)[0])
      return (f"plgpu kernel {name}: output {k} differs from the interpreter's at {bad.sum()} of "
              f"{bad.size} elements, first at {i}: GPU {g[i]}, interpreter {w[i]}")
  return None


def comparing(run_kernel, failures: list, choose):
  """``eager.run_kernel`` that also runs each Mosaic GPU kernel that the Gluon backend lowers on
  the GPU, and records in ``failures`` where its outputs differ from the interpreter's."""
  def wrapped(params, args, *rest):
    out = run_kernel(params, args, *rest)
    from pallax._src import backends
    if backends.is_mosaic_gpu(params) and lower(params) is None:
      got = run_on_gpu(params, args, choose)
      spec = profiler.spec_of(params)
      if spec is None:
        why = compare(params.name, out, got)
      else:   # a profile record: the same events; its times are the GPU's own
        why = compare(params.name, out[:-1], got[:-1]) or (
            None if profiler.kept_tags(spec, out[-1]) == profiler.kept_tags(spec, got[-1]) else
            f"plgpu kernel {params.name}: the GPU recorded other profile events than the "
            f"interpreter: {profiler.kept_tags(spec, got[-1])} against "
            f"{profiler.kept_tags(spec, out[-1])}")
      if why:
        failures.append(why)
      if os.environ.get("PALLAX_GLUON_LOG"):   # a record of what was compared (one line each)
        with open(os.environ["PALLAX_GLUON_LOG"], "a") as f:
          f.write(f"{params.name}\t{[np.shape(o) for o in out]}\t{why or 'agrees'}\n")
    return out
  return wrapped

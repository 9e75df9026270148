"""How the form of XLA's kernel call changes a small call's back-to-back time: pallax's kernel
given to ``__gpu$xla.gpu.ptx`` as PTX (the default), as PTX without debug lines, as the cubin
Triton's ptxas built, as PTX without Triton's two unused scratch parameters (so no spare
operands), and with a 1-byte constant as the spare operand; against JAX Pallas and plain XLA, in
one process, interleaved. Also prints the size of each side's thunk annotation in a profiler
trace. A research probe for issue 13: it patches pallax's launch module.

    PYTHONPATH=$PWD python3 benchmarks/probes/probe_kernel_call_variants.py [--gpu-time]

With ``--gpu-time``: the kernel time of the PTX and cubin forms of layer_norm and rms_norm at
4x1024x4096 instead.
"""
import dataclasses
import glob
import gzip
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import importlib  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_gpu_ops  # noqa: E402
import triton_vs_pallas as tvp  # noqa: E402
import timing  # noqa: E402
from pallax._src.triton import compile as tcompile  # noqa: E402
from pallax._src.triton import launch  # noqa: E402
from pallax._src.gpu import launch as gpu_launch  # noqa: E402

MODE = {"kind": "ptx"}
SOURCES = {}   # kernel name -> KernelSource, to rebuild its cubin
_compile_kernel = launch.compile_kernel
_kernel_config = gpu_launch.kernel_config


def _remember(ks, cc, name=""):
  c = _compile_kernel(ks, cc, name)
  SOURCES[c.name] = (ks, cc)
  return c


def _config(c, output_indices):
  text = _kernel_config(c, output_indices)
  kind = MODE["kind"]
  if kind == "ptx":
    return text
  ir = launch.ji.ir
  attrs = {a.name: a.attr for a in ir.DictAttr(ir.Attribute.parse(text))}
  if kind == "ptx_small":
    small = "\n".join(ln for ln in c.ptx.splitlines()
                      if not re.match(r"\s*(\.loc|\.file|//)", ln))
    small = re.sub(r"\.section\s+\.debug\w*\s*\{[^}]*\}", "", small)
    attrs["kernel_data"] = ir.StringAttr.get(small)
  elif kind == "cubin":
    ks, cc = SOURCES[c.name]
    cubin = tcompile.launchable_kernel(ks, cc).asm["cubin"]
    attrs["kernel_type"] = ir.StringAttr.get("cubin")
    attrs["kernel_data"] = ir.StringAttr.get(cubin)
  return str(ir.DictAttr.get(attrs))


def _trim(c):
  """``c`` with the trailing kernel parameters its body never loads (Triton's scratch pointers)
  left out of the PTX."""
  head, body = c.ptx.split(")", 1)
  params = re.findall(r"\.param[^,\n]*?(\w+_param_\d+)", head)
  keep = list(params)
  while keep and f"[{keep[-1]}]" not in body:
    keep.pop()
  assert len(keep) == len(params) - 2, (params, keep)
  lines = [ln for ln in head.split("\n") if not any(p in ln for p in params[len(keep):])]
  return dataclasses.replace(c, ptx="\n".join(lines).rstrip().rstrip(",") + "\n)" + body)


def _spare(operands, avals, aliases):
  if MODE["kind"] == "spare_const":
    return launch.ji.mlir.ir_constant(np.zeros(1, np.uint8)), launch.ji.ShapedArray((1,), np.uint8)
  return _spare_operand(operands, avals, aliases)


def _xla_kernel_call(ctx, operands, c, aliases):
  if MODE["kind"] != "trim":
    return _xla_call(ctx, operands, c, aliases)
  # No scratch parameters left: the two spare operands after the call's own are dropped.
  mlir, n = launch.ji.mlir, len(operands)
  real = mlir.custom_call
  def call(name, operands, operand_layouts, **kw):
    drop = lambda xs: [*xs[:n], *xs[n + 2:]]  # noqa: E731
    return real(name, operands=drop(operands), operand_layouts=drop(operand_layouts), **kw)
  mlir.custom_call = call
  try:
    return _xla_call(ctx, operands, dataclasses.replace(_trim(c), global_scratch_size=0), aliases)
  finally:
    mlir.custom_call = real


_xla_call, _spare_operand = gpu_launch.xla_ptx_call, gpu_launch.spare_operand
launch.compile_kernel = _remember
gpu_launch.kernel_config = _config
gpu_launch.spare_operand = _spare
gpu_launch.xla_ptx_call = _xla_kernel_call


def _jit(f, kind, args):
  MODE["kind"] = kind
  g = jax.jit(f)
  jax.block_until_ready(g(*args))
  MODE["kind"] = "ptx"
  return g


def _add_one(x_ref, o_ref):
  o_ref[...] = x_ref[...] + 1


def cases(big=False):
  import pallax
  import pallax.triton as plt_
  from jax.experimental.pallas import triton as jplt
  JP = tvp.jax_pallas()
  S = jax.ShapeDtypeStruct
  x = jax.random.normal(jax.random.key(int(time.time())), (128,), jnp.float32)
  trivial = lambda P, cp: lambda x: P.pallas_call(  # noqa: E731
      _add_one, out_shape=S(x.shape, x.dtype), compiler_params=cp)(x)
  if not big:
    yield "x+1", (x,), trivial(pallax, plt_.CompilerParams()), \
        trivial(JP, jplt.CompilerParams()), lambda x: x + 1
  import jax.experimental.pallas.ops.gpu as gpu_ops
  ks = iter(jax.random.split(jax.random.key(int(time.time()) + 1), 8))
  for op in ("layer_norm", "rms_norm"):
    shape = (4, 1024, 4096) if big else (1, 16, 1024)
    args = tuple(jax.random.normal(next(ks), s) for s in (shape, shape[-1:], shape[-1:]))
    pm, jm = jax_gpu_ops.load(op), importlib.import_module(f"{gpu_ops.__name__}.{op}")
    ref = {"layer_norm": jax_gpu_ops._ln_ref, "rms_norm": jax_gpu_ops._rms_ref}[op]
    yield op, args, (lambda x, w, b, m=pm, o=op: getattr(m, o)(x, w, b)), \
        (lambda x, w, b, m=jm, o=op: getattr(m, o)(x, w, b)), ref


def annotation_sizes(fns, args):
  d = os.path.join("/tmp", f"trace_{time.time_ns()}")
  with jax.profiler.trace(d, create_perfetto_trace=True):
    for f in fns.values():
      jax.block_until_ready(f(*args))
  (p,) = glob.glob(os.path.join(d, "**", "perfetto_trace.json.gz"), recursive=True)
  ev = json.load(gzip.open(p))
  ev = ev["traceEvents"] if isinstance(ev, dict) else ev
  sizes = sorted({(e["name"][:40], len(json.dumps(e.get("args", {})))) for e in ev
                  if e.get("ph") == "X" and "pallas_call" in e["name"]})
  return sizes


def main():
  print(jax.devices()[0].device_kind)
  if "--gpu-time" in sys.argv:
    return gpu_time()
  for label, args, pallax_f, jax_f, xla_f in cases():
    fns = {}
    for kind in ("ptx", "ptx_small", "cubin", "trim", "spare_const"):
      try:
        fns[f"pallax_{kind}"] = _jit(pallax_f, kind, args)
      except Exception as e:  # noqa: BLE001
        print(f"{label} {kind}: {type(e).__name__}: {str(e)[:300]}")
    fns["jax_pallas"], fns["xla"] = jax.jit(jax_f), jax.jit(xla_f)
    want = np.asarray(fns["xla"](*args))
    for k, f in fns.items():
      np.testing.assert_allclose(np.asarray(f(*args)), want, rtol=1e-4, atol=1e-4, err_msg=k)
    print(f"\n=== {label}: annotation sizes {annotation_sizes(fns, args)}")
    for n in (10, 100):
      t = {k: v[0] * 1e6 for k, v in timing.time_calls(fns, args, n=n, rounds=41).items()}
      base = t["jax_pallas"]
      print(f"  n={n:3d} " + "  ".join(f"{k} {v:.1f} ({base / v:.3f}x)" for k, v in t.items()),
            flush=True)


def gpu_time():
  """Kernel time (profiler) of the PTX and cubin forms at bandwidth-bound sizes: does the
  driver's PTX compiler build a slower kernel than Triton's ptxas?"""
  for label, args, pallax_f, jax_f, xla_f in cases(big=True):
    fns = {f"pallax_{k}": _jit(pallax_f, k, args) for k in ("ptx", "cubin")}
    fns["jax_pallas"] = jax.jit(jax_f)
    want = np.asarray(jax.jit(xla_f)(*args))
    for k, f in fns.items():
      np.testing.assert_allclose(np.asarray(f(*args)), want, rtol=1e-4, atol=1e-4, err_msg=k)
    for rep in range(3):
      t = {k: v * 1e6 for k, v in timing.device_times(fns, args, n=10, rounds=9).items()}
      base = t["jax_pallas"]
      print(f"{label} 4x1024x4096 GPU µs: " +
            "  ".join(f"{k} {v:.1f} ({base / v:.3f}x)" for k, v in t.items()), flush=True)


if __name__ == "__main__":
  main()

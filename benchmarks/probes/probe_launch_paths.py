"""Which FFI stages jaxlib registers for its Triton call, and what launching through jaxlib's
legacy custom call (no FFI stages) instead costs on the host, against JAX Pallas. A research
probe: it patches jax.ffi.ffi_lowering.

    PYTHONPATH=$PWD python3 benchmarks/probes/probe_launch_paths.py
"""
import os, sys, time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np
import jax, jax.numpy as jnp
from jax._src.interpreters import mlir
import triton_vs_pallas as tvp
import timing
import pallax, pallax.triton as plt_
from jax.experimental.pallas import triton as jplt
from jaxlib.plugin_support import import_from_plugin
ct = import_from_plugin("cuda", "_triton")
regs = ct.registrations()
print("registrations:", {k: (type(v).__name__, sorted(v) if isinstance(v, dict) else v) for k, v in regs.items()})
# Registering the handler's "execute" stage alone (or with "instantiate") under a new name and
# launching through it aborts the process: "State is not set" (the initialize stage makes it).
JP = tvp.jax_pallas()
mode = {"v": "ffi"}
real = jax.ffi.ffi_lowering
def patched(name, *a, **kw):
  if name == "triton_kernel_call_ffi" and mode["v"] == "legacy":
    def rule(ctx, *args, opaque, **_):
      return mlir.custom_call("triton_kernel_call", result_types=[mlir.aval_to_ir_type(ctx.module_context, a) for a in ctx.avals_out],
                              operands=list(args), backend_config=opaque, api_version=2).results
    return rule
  return real(name, *a, **kw)
jax.ffi.ffi_lowering = patched
for shape in ((8, 8192), (16384, 8192)):
  x = jax.random.normal(jax.random.key(int(time.time())), shape, jnp.float32)
  ref = jax.nn.softmax(x, axis=1)
  fns = {}
  for v in ("ffi", "legacy"):
    mode["v"] = v
    f = jax.jit(lambda a: tvp.softmax(pallax, plt_.CompilerParams, a))
    try:
      err = timing.rel_err(f(x), ref)
    except Exception as e:
      print(v, "FAILED", type(e).__name__, str(e)[:300]); continue
    print(shape, v, f"err {err:.1e}")
    fns[v] = f
  fns["jax_pallas"] = jax.jit(lambda a: tvp.softmax(JP, jplt.CompilerParams, a))
  for f in fns.values():
    for _ in range(5): jax.block_until_ready(f(x))
  n, rounds = (100, 20) if shape[0] == 8 else (10, 15)
  res = {k: {} for k in fns}
  for mode_ in ("async", "sync"):
    ts = {k: [] for k in fns}
    for r in range(rounds):
      for k, f in fns.items():
        t = time.perf_counter()
        for _ in range(n):
          o = f(x)
          if mode_ == "sync": o.block_until_ready()
        jax.block_until_ready(o)
        ts[k].append((time.perf_counter() - t) / n)
    for k in fns:
      res[k][mode_] = np.median(ts[k]) * 1e6
  for k in fns:
    print(f"{shape} {k:11} async {res[k]['async']:8.2f} us/call  sync {res[k]['sync']:8.2f} us/call"
          f"   vs JAX Pallas: {res['jax_pallas']['async']/res[k]['async']:.3f}x / {res['jax_pallas']['sync']/res[k]['sync']:.3f}x")

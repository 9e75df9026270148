"""Host cost of launching a pallax kernel through jaxlib's Triton call, against JAX Pallas.

jaxlib looks each call's kernel up by its whole opaque string (the zlib-compressed proto with the
PTX and the TTIR), hashing it on every launch. This probe times the benchmark's softmax with the
opaque as pallax builds it and with a lean one (no TTIR, which jaxlib never reads on CUDA; PTX
without debug lines), on a tiny input (host-bound) and on the benchmark's input. A research probe:
it patches pallax internals.

    PYTHONPATH=$PWD python3 benchmarks/probes/probe_launch_overhead.py
"""
import dataclasses, os, sys, time, zlib
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jax, jax.numpy as jnp
import triton_vs_pallas as tvp
import timing
import pallax, pallax.triton as plt_
from pallax._src.triton import launch
from jax.experimental.pallas import triton as jplt
JP = tvp.jax_pallas()

mode = {"lean": False}
sizes = {}
real_compile = launch.compile_kernel


def strip_debug(ptx: str) -> str:
  ptx = "\n".join(l for l in ptx.splitlines() if not l.strip().startswith(".loc"))
  return ptx.split("\t.section\t.debug_abbrev")[0]


def patched(ks, cc, name=""):
  c = real_compile(ks, cc, name)
  if mode["lean"]:
    c = dataclasses.replace(c, ttir="", ptx=strip_debug(c.ptx))
  sizes[("lean" if mode["lean"] else "base", c.grid)] = (len(c.ptx), len(c.ttir),
                                                         len(zlib.compress((c.ptx + c.ttir).encode())))
  return c


launch.compile_kernel = patched
key = jax.random.key(int(time.time()))
rows = []
for shape, n, rounds in (((8, 8192), 20, 40), ((16384, 8192), 10, 15)):
  x = jax.random.normal(key, shape, jnp.float32)
  ref = jax.nn.softmax(x, axis=1)
  fns = {}
  for lean in (False, True):
    mode["lean"] = lean
    f = jax.jit(lambda a: tvp.softmax(pallax, plt_.CompilerParams, a))
    jax.block_until_ready(f(x))      # trace and compile now, under this mode
    fns["pallax_lean" if lean else "pallax"] = f
  fns["jax_pallas"] = jax.jit(lambda a: tvp.softmax(JP, jplt.CompilerParams, a))
  for k, f in fns.items():
    err = timing.rel_err(f(x), ref)
    assert err < 1e-5, (k, err)
  t = timing.time_calls(fns, (x,), n=n, rounds=rounds)
  for k, (med, p10, p90) in t.items():
    rows.append((f"{shape[0]}x{shape[1]}", k, med * 1e6, p10 * 1e6, p90 * 1e6,
                 t["jax_pallas"][0] / med))
print("opaque sizes (ptx chars, ttir chars, compressed bytes):", sizes)
print(f"{'input':12} {'impl':12} {'median us':>10} {'p10':>8} {'p90':>8}  JAX Pallas / impl")
for r in rows:
  print(f"{r[0]:12} {r[1]:12} {r[2]:10.2f} {r[3]:8.2f} {r[4]:8.2f}  {r[5]:.3f}x")

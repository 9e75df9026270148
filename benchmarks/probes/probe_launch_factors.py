"""Which property of a small kernel makes pallax's call slower back-to-back than JAX Pallas's:
the same simple kernels on both (one program or 16, one to five operands, a reduction), timed
interleaved (100 calls, then one wait), then the same calls under a light profiler trace (no
Python tracer) for the host time of XLA's thunk and of the launch inside it. A research probe
for issue 13.

    PYTHONPATH=$PWD python3 benchmarks/probes/probe_launch_factors.py
"""
import glob
import gzip
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import triton_vs_pallas as tvp  # noqa: E402
import timing  # noqa: E402

S = jax.ShapeDtypeStruct
N, ROUNDS = 100, 6


def _add_one(x_ref, o_ref):
  o_ref[...] = x_ref[...] + 1


def _center(x_ref, o_ref):
  x = x_ref[...]
  o_ref[...] = x - jnp.mean(x, axis=-1, keepdims=True)


def _sum(*refs):
  acc = refs[0][...]
  for r in refs[1:-1]:
    acc = acc + r[...]
  refs[-1][...] = acc


def kernels(P, cp):
  """label -> (f, number of (16, 1024) float32 operands)."""
  blk = lambda: P.BlockSpec((1, 1024), lambda i: (i, 0))  # noqa: E731
  def rows(body, k):
    return lambda *xs: P.pallas_call(body, out_shape=S((16, 1024), jnp.float32), grid=(16,),
                                     in_specs=[blk()] * k, out_specs=blk(),
                                     compiler_params=cp(num_warps=4))(*xs)
  out = {"x+1, one program": (lambda x: P.pallas_call(
      _add_one, out_shape=S((128,), jnp.float32), compiler_params=cp(num_warps=4))(x[0, :128]), 1),
         "x - mean(x), 16 programs": (rows(_center, 1), 1)}
  for k in range(1, 6):
    out[f"sum of {k}, 16 programs"] = (rows(_sum, k), k)
  return out


def host_times(fns, args):
  """Per side, µs per call: the round, XLA's thunk, and the launch inside it (a light trace)."""
  opts = jax.profiler.ProfileOptions()
  opts.host_tracer_level, opts.python_tracer_level = 1, 0
  d = os.path.join("/tmp", f"factors_{time.time_ns()}")
  with jax.profiler.trace(d, create_perfetto_trace=True, profiler_options=opts):
    for r in range(ROUNDS):
      for k in (list(fns) if r % 2 else list(fns)[::-1]):
        with jax.profiler.TraceAnnotation(f"ROUND {k} {r}"):
          for _ in range(N):
            o = fns[k](*args)
          jax.block_until_ready(o)
  (p,) = glob.glob(os.path.join(d, "**", "perfetto_trace.json.gz"), recursive=True)
  ev = json.load(gzip.open(p))
  X = [e for e in (ev["traceEvents"] if isinstance(ev, dict) else ev) if e.get("ph") == "X"]
  out = {}
  for k in fns:
    rounds = [e for e in X if e["name"].startswith(f"ROUND {k} ")]
    inside = [e for r in rounds for e in X
              if r["ts"] <= e["ts"] <= r["ts"] + r["dur"] and not e["name"].startswith("ROUND")]
    per = lambda pred: sum(e["dur"] for e in inside if pred(e["name"])) / (N * len(rounds))  # noqa: E731
    out[k] = (sorted(e["dur"] / N for e in rounds)[len(rounds) // 2],
              per(lambda n: n.startswith("pallas_call")),
              per(lambda n: n in ("_add_one", "_center", "_sum")))
  return out


def main():
  import pallax
  import pallax.triton as plt_
  from jax.experimental.pallas import triton as jplt
  print(jax.devices()[0].device_kind)
  ours, theirs = kernels(pallax, plt_.CompilerParams), kernels(tvp.jax_pallas(), jplt.CompilerParams)
  keys = jax.random.split(jax.random.key(int(time.time())), 5)
  print("| kernel | pallax µs | JAX Pallas µs | speed | traced: pallax thunk / launch µs | "
        "JAX Pallas thunk / launch µs |\n| --- | --- | --- | --- | --- | --- |")
  for label, (f, k) in ours.items():
    args = tuple(jax.random.normal(keys[i], (16, 1024)) for i in range(k))
    fns = {"pallax": jax.jit(f), "jax_pallas": jax.jit(theirs[label][0])}
    a, b = (np.asarray(g(*args)) for g in fns.values())
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    t = {n: v[0] * 1e6 for n, v in timing.time_calls(fns, args, n=N, rounds=31).items()}
    h = host_times(fns, args)
    print(f"| {label} | {t['pallax']:.1f} | {t['jax_pallas']:.1f} | "
          f"{t['jax_pallas'] / t['pallax']:.3f}x | {h['pallax'][1]:.2f} / {h['pallax'][2]:.2f} | "
          f"{h['jax_pallas'][1]:.2f} / {h['jax_pallas'][2]:.2f} |", flush=True)


if __name__ == "__main__":
  main()

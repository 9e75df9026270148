"""Where the wall time of a call goes, pallax (both launch paths) against JAX Pallas, for the
trivial kernel and some of ``jax_ops.py``'s cases: the host-side trace events per call (XLA's
thunks, the launch) and the device operations per call (count, names, busy time).
Writes each side's optimized HLO to ``$OUT`` (thunks, command buffers, copies). A research probe.

    PYTHONPATH=$PWD python3 benchmarks/probes/probe_launch_breakdown.py [label substrings, ...]
"""
import glob
import gzip
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jax  # noqa: E402
import numpy as np  # noqa: E402

import jax_ops  # noqa: E402
import triton_vs_pallas as tvp  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
N = 50        # calls per round
ROUNDS = 6    # rounds per function, interleaved in a fresh random order each time


def _events(fns, args):
  d = os.path.join("/tmp", f"trace_{time.time_ns()}")
  order, rng = list(fns), np.random.default_rng(0)
  with jax.profiler.trace(d, create_perfetto_trace=True):
    for r in range(ROUNDS):
      rng.shuffle(order)
      for k in order:
        with jax.profiler.TraceAnnotation(f"ROUND {k} {r}"):
          o = None
          for _ in range(N):
            o = fns[k](*args)
          jax.block_until_ready(o)
        time.sleep(0.01)
  (p,) = glob.glob(os.path.join(d, "**", "perfetto_trace.json.gz"), recursive=True)
  ev = json.load(gzip.open(p))
  ev = ev["traceEvents"] if isinstance(ev, dict) else ev
  gpu_pids = {e["pid"] for e in ev if e.get("ph") == "M" and e.get("name") == "process_name"
              and "GPU" in str(e.get("args", {}).get("name", ""))}
  return [e for e in ev if e.get("ph") == "X"], gpu_pids


def breakdown(label, fns, args):
  X, gpu_pids = _events(fns, args)
  print(f"\n=== {label}")
  host = {}
  for k in fns:
    rounds = [e for e in X if e["name"].startswith(f"ROUND {k} ")]
    inside = [e for r in rounds for e in X if r["ts"] <= e["ts"] <= r["ts"] + r["dur"]
              and not e["name"].startswith("ROUND")]
    d = [e for e in inside if e["pid"] in gpu_pids]
    calls = N * len(rounds)
    busy = sum(e["dur"] for e in d) / calls
    names = {}
    for e in d:
      names[e["name"][:60]] = names.get(e["name"][:60], 0) + 1
    wall = sorted(r["dur"] / N for r in rounds)[len(rounds) // 2]
    print(f"{k:11} median round {wall:7.2f} us/call; device: {len(d) / calls:.1f} ops/call, busy "
          f"{busy:.2f} us/call")
    for n, c in sorted(names.items(), key=lambda t: -t[1])[:8]:
      print(f"    {c / calls:4.1f}/call  {n}")
    for e in inside:
      if e["pid"] not in gpu_pids:
        host.setdefault(e["name"][:70], {}).setdefault(k, []).append(e["dur"])
  rows = sorted(host.items(), key=lambda t: -max(sum(v) for v in t[1].values()))
  print(f"{'host event':70} " + " ".join(f"{k + ' us (n)':>18}" for k in fns))
  for nm, per in rows[:25]:
    cells = [f"{sum(per.get(k, [])) / (N * ROUNDS):9.2f} ({len(per.get(k, [])) / (N * ROUNDS):4.1f})"
             for k in fns]
    print(f"{nm:70} " + " ".join(f"{c:>18}" for c in cells))


def main():
  import pallax
  import pallax.triton as plt_
  from jax.experimental.pallas import triton as jplt
  import importlib
  import jax.experimental.pallas.ops.gpu as gpu_ops
  want = sys.argv[1:] or ["one", "three", "softmax 32x", "layer_norm fwd 4x", "decode mqa"]
  x = jax.random.normal(jax.random.key(1), (128,))
  JP = tvp.jax_pallas()
  for tag, make in (("one", jax_ops._trivial), ("three", jax_ops._three)):
    if tag not in want:
      continue
    fns = {"pallax": jax_ops._jit_with_launch(make(pallax, plt_.CompilerParams), "xla", (x,)),
           "pallax_ffi": jax_ops._jit_with_launch(make(pallax, plt_.CompilerParams), "ffi", (x,)),
           "jax_pallas": jax.jit(make(JP, jplt.CompilerParams))}
    for k in ("pallax", "jax_pallas"):   # lower() lowers again: with the default launch path
      open(os.path.join(OUT, f"hlo_{tag}_{k}.txt"), "w").write(fns[k].lower(x).compile().as_text())
    breakdown(f"{tag}: pallas_call of x + 1 on 128 floats", fns, (x,))
  for label, op, make, args, _ in jax_ops.cases(False, jax.random.key(2)):
    if not any(w in label for w in want):
      continue
    jm = importlib.import_module(f"{gpu_ops.__name__}.{op}")
    pm = jax_ops.jax_gpu_ops.load(op)
    fns = {"pallax": jax_ops._jit_with_launch(make(pm), "xla", args),
           "pallax_ffi": jax_ops._jit_with_launch(make(pm), "ffi", args),
           "jax_pallas": jax.jit(make(jm))}
    tag = label.split()[0] + "_" + label.split()[1]
    for k in ("pallax", "jax_pallas"):   # lower() lowers again: with the default launch path
      open(os.path.join(OUT, f"hlo_{tag}_{k}.txt"), "w").write(fns[k].lower(*args).compile().as_text())
    breakdown(label, fns, args)


if __name__ == "__main__":
  main()

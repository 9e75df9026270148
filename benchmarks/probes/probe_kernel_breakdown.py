"""Where the GPU time of JAX's attention_mgpu forward + backward goes, kernel by kernel, on pallax
(Gluon) and on JAX's Mosaic GPU: the device operations of a profiler trace, grouped by name.

On the GPU machine: ``PYTHONPATH=$PWD python3 benchmarks/probes/probe_kernel_breakdown.py``.
"""
from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import sys
import tempfile

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import attention_mgpu as attn_bench  # noqa: E402


def breakdown(fns: dict, args, n=10) -> dict:
  """Per function: {device operation name: µs per call}."""
  d = tempfile.mkdtemp(prefix="pallax_trace_")
  for f in fns.values():
    jax.block_until_ready(f(*args))
  with jax.profiler.trace(d, create_perfetto_trace=True):
    for k, f in fns.items():
      with jax.profiler.TraceAnnotation(f"batch {k}"):
        out = None
        for _ in range(n):
          out = f(*args)
        jax.block_until_ready(out)
  (path,) = glob.glob(os.path.join(d, "**", "perfetto_trace.json.gz"), recursive=True)
  events = json.load(gzip.open(path))
  events = events["traceEvents"] if isinstance(events, dict) else events
  gpu = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
         and "GPU" in str(e.get("args", {}).get("name", ""))}
  device = [e for e in events if e.get("ph") == "X" and e.get("pid") in gpu]
  out = {}
  for e in events:
    if e.get("ph") == "X" and e.get("name", "").startswith("batch "):
      t0, t1 = e["ts"], e["ts"] + e["dur"]
      inside = sorted((x for x in device if t0 <= x["ts"] < t1), key=lambda x: x["ts"])
      count = collections.Counter(x["name"][:60] for x in inside)
      seen, per = collections.Counter(), collections.Counter()
      for x in inside:   # a name launched k times a call is told apart by its place: name#i
        name = x["name"][:60]
        k = count[name] // n
        per[name if k <= 1 else f"{name}#{seen[name] % k}"] += x["dur"] / n
        seen[name] += 1
      out[e["name"].split(" ", 1)[1]] = per
  return out


def main():
  ams = attn_bench.modules()
  ks = jax.random.split(jax.random.key(42), 4)
  q, k, v, do = (jax.random.normal(x, (1, 4096, 16, 128), jnp.float16) for x in ks)
  blocks = dict(block_q_dkv=64, block_kv_dkv=64, block_q_dq=64, block_kv_dq=64)
  fns = {}
  for name, am in zip(("pallax", "jax_mosaic"), ams):
    cfg = am.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2, **blocks)
    fns[name] = jax.jit(attn_bench._with_grads(lambda q, k, v, am=am, cfg=cfg: am.attention(q, k, v, cfg)))
  for name, per in breakdown(fns, (q, k, v, do)).items():
    print(f"{name}: {sum(per.values()):.1f} µs per call")
    for op, us in per.most_common():
      print(f"  {us:8.1f} µs  {op}")


if __name__ == "__main__":
  main()

"""Where the GPU time of JAX's attention_mgpu forward + backward goes, kernel by kernel, on pallax
(Gluon) and on JAX's Mosaic GPU: the device operations of a profiler trace, grouped by name.

On the GPU machine: ``PYTHONPATH=$PWD python3 benchmarks/probes/probe_kernel_breakdown.py``.
"""
from __future__ import annotations

import collections
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import attention_mgpu as attn_bench  # noqa: E402
import timing  # noqa: E402


def breakdown(fns: dict, args, n=10) -> dict:
  """Per function: {device operation name: µs per call}."""
  for f in fns.values():
    jax.block_until_ready(f(*args))
  out = {}
  for label, (ops,) in timing.device_ops(fns, args, n, rounds=1).items():
    inside = sorted(ops, key=lambda x: x["ts"])
    count = collections.Counter(x["name"][:60] for x in inside)
    seen, per = collections.Counter(), collections.Counter()
    for x in inside:   # a name launched k times a call is told apart by its place: name#i
      name = x["name"][:60]
      k = count[name] // n
      per[name if k <= 1 else f"{name}#{seen[name] % k}"] += x["dur"] / n
      seen[name] += 1
    out[label] = per
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

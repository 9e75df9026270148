"""JAX's own warp-specialized flash attention (``jax/experimental/pallas/ops/gpu/attention_mgpu.py``)
on pallax (Gluon) and on JAX's Mosaic GPU, beside cuDNN (``jax.nn.dot_product_attention``): the same
source, its import lines switched (``tests/mgpu_ops.py``). Every output is checked against JAX's
reference first (atol 2e-3, rtol 1e-3, as JAX's own benchmark); kernel time from a profiler trace and
back-to-back wall time per call. Shapes of JAX's benchmark: batch 1, 16 heads, float16.

On the GPU machine: ``PYTHONPATH=$PWD python3 benchmarks/attention_mgpu.py [--small] [--out FILE]``.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import mgpu_ops  # noqa: E402  (the import-switching loader)
import triton_vs_pallas as tvp  # noqa: E402  (timing helpers)


def cudnn(q, k, v, causal):
  # attention_mgpu computes softmax(q k^T) v, without the 1/sqrt(d) scale.
  return jax.nn.dot_product_attention(q, k, v, scale=1.0, is_causal=causal, implementation="cudnn")


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--small", action="store_true")
  ap.add_argument("--out", default=None)
  args = ap.parse_args()
  import jax.experimental.pallas.ops.gpu.attention_mgpu as jax_am
  px_am = mgpu_ops.load("attention_mgpu")
  device = jax.devices()[0].device_kind
  lines = [f"# JAX's attention_mgpu: pallax (Gluon) vs JAX Mosaic GPU vs cuDNN, {device}, "
           f"{datetime.date.today()}", "",
           "| work | block_kv | kernel | max abs err vs reference | kernel time (µs) | TFLOP/s | wall per call (µs) | cuDNN / kernel | JAX / kernel |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  seqs = (1024,) if args.small else (4096,)
  for seq, head_dim, causal in itertools.product(seqs, (64, 128), (False, True)):
    ks = jax.random.split(jax.random.key(42), 3)
    q, k, v = (jax.random.normal(x, (1, seq, 16, head_dim), jnp.float16) for x in ks)
    ref = np.asarray(jax_am.attention_reference(q, k, v, causal=causal), np.float32)
    for block_kv in (64, 128):
      fns = {"cudnn": jax.jit(lambda q, k, v, c=causal: cudnn(q, k, v, c))}
      for kname, am in (("pallax", px_am), ("jax_mosaic", jax_am)):
        cfg = am.TuningConfig(block_q=64, block_kv=block_kv, max_concurrent_steps=2, causal=causal)
        fns[kname] = jax.jit(lambda q, k, v, am=am, cfg=cfg: am.attention(q, k, v, cfg))
      outs = tvp.checked_outputs(fns, (q, k, v), f"seq={seq} d={head_dim} causal={causal} kv={block_kv}")
      err = {name: f"{np.abs(got - ref).max():.1e}"
             + ("" if np.allclose(got, ref, atol=2e-3, rtol=1e-3) else " (outside atol 2e-3, rtol 1e-3)")
             for name, got in outs.items()}
      dev = tvp.device_times(fns, (q, k, v))
      wall = tvp.time_calls(fns, (q, k, v))
      flops = 4 * seq * seq * head_dim * 16 / (2 if causal else 1)
      for name in fns:
        rel = lambda other: f"{dev[other] / dev[name]:.2f}x" if other in dev else "-"
        lines.append(
            f"| seq {seq} d {head_dim} {'causal' if causal else 'full'} | {block_kv} | {name} | "
            f"{err[name]} | {tvp.time_columns(dev[name], wall[name][0], flops)} | "
            f"{rel('cudnn')} | {rel('jax_mosaic')} |")
        print(lines[-1], flush=True)
  lines += ["", "Speed columns: cuDNN time / kernel time and JAX time / kernel time (above 1 is "
            "faster). Kernel time: summed GPU operations per call from a profiler trace (median of "
            "interleaved rounds); wall: back-to-back calls."]
  tvp.write_report(lines, args.out)


if __name__ == "__main__":
  main()

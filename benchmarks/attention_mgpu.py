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
import timing  # noqa: E402  (the timing library)


def cudnn(q, k, v, causal):
  # attention_mgpu computes softmax(q k^T) v, without the 1/sqrt(d) scale.
  return jax.nn.dot_product_attention(q, k, v, scale=1.0, is_causal=causal, implementation="cudnn")


HEADER = ["| work | block_kv | kernel | max abs err vs reference | kernel time (µs) | TFLOP/s | wall per call (µs) | cuDNN / kernel | JAX / kernel |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
NOTE = ("Speed columns: cuDNN time / kernel time and JAX time / kernel time (above 1 is faster). "
        "fwd+bwd: the forward pass and the gradients of q, k, v (JAX's backward kernels, block 64; "
        "JAX has no causal backward), counted as 3.5x the forward's FLOPs.")


def modules():
  """(pallax's, JAX's) attention_mgpu: the same source, its imports switched."""
  import jax.experimental.pallas.ops.gpu.attention_mgpu as jax_am
  return mgpu_ops.load("attention_mgpu"), jax_am


def _with_grads(attn):
  """q, k, v, do -> the output and the gradients of q, k, v, flattened into one array."""
  def f(q, k, v, do):
    out, vjp = jax.vjp(attn, q, k, v)
    return jnp.concatenate([x.astype(jnp.float32).ravel() for x in (out, *vjp(do.astype(out.dtype)))])
  return f


def attention_rows(ams, seq, head_dim, causal, block_kv, backward=False, heads=16) -> list[str]:
  """One table row per kernel: attention of batch 1, ``heads`` heads, float16 (the forward, or
  the forward and backward passes)."""
  jax_am = ams[1]
  ks = jax.random.split(jax.random.key(42), 4)
  q, k, v, do = (jax.random.normal(x, (1, seq, heads, head_dim), jnp.float16) for x in ks)
  attn = {"cudnn": lambda q, k, v: cudnn(q, k, v, causal),
          "reference": lambda q, k, v: jax_am.attention_reference(q, k, v, causal=causal)}
  for kname, am in zip(("pallax", "jax_mosaic"), ams):
    blocks = dict(block_q_dkv=64, block_kv_dkv=64, block_q_dq=64, block_kv_dq=64) if backward else {}
    cfg = am.TuningConfig(block_q=64, block_kv=block_kv, max_concurrent_steps=2, causal=causal, **blocks)
    attn[kname] = lambda q, k, v, am=am, cfg=cfg: am.attention(q, k, v, cfg)
  args = (q, k, v, do) if backward else (q, k, v)
  wrap = _with_grads if backward else (lambda f: lambda q, k, v: f(q, k, v))
  ref = np.asarray(jax.jit(wrap(attn.pop("reference")))(*args), np.float32)
  fns = {name: jax.jit(wrap(f)) for name, f in attn.items()}
  outs = timing.checked_outputs(fns, args, f"seq={seq} d={head_dim} causal={causal} kv={block_kv}")
  atol = 2e-2 if backward else 2e-3
  err = {name: f"{np.abs(got - ref).max():.1e}"
         + ("" if np.allclose(got, ref, atol=atol, rtol=1e-3) else f" (outside atol {atol}, rtol 1e-3)")
         for name, got in outs.items()}
  dev = timing.device_times(fns, args)
  wall = timing.time_calls(fns, args)
  flops = 4 * seq * seq * head_dim * heads / (2 if causal else 1) * (3.5 if backward else 1)
  rows = []
  work = f"seq {seq} d {head_dim} {'causal' if causal else 'full'}{' fwd+bwd' if backward else ''}"
  for name in fns:
    rel = lambda other: f"{dev[other] / dev[name]:.2f}x" if other in dev else "-"
    rows.append(f"| {work} | {block_kv} | {name} | {err[name]} | "
                f"{timing.time_columns(dev[name], wall[name][0], flops)} | {rel('cudnn')} | {rel('jax_mosaic')} |")
    print(rows[-1], flush=True)
  return rows


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--small", action="store_true")
  ap.add_argument("--out", default=None)
  args = ap.parse_args()
  ams = modules()
  device = jax.devices()[0].device_kind
  lines = [f"# JAX's attention_mgpu: pallax (Gluon) vs JAX Mosaic GPU vs cuDNN, {device}, "
           f"{datetime.date.today()}", ""] + HEADER
  seqs = (1024,) if args.small else (4096,)
  for seq, head_dim, causal in itertools.product(seqs, (64, 128), (False, True)):
    for block_kv in (64, 128):
      lines += attention_rows(ams, seq, head_dim, causal, block_kv)
  lines += ["", NOTE + " Kernel time: summed GPU operations per call from a profiler trace (median "
            "of interleaved rounds); wall: back-to-back calls."]
  timing.write_report(lines, args.out)


if __name__ == "__main__":
  main()

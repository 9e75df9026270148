"""Runs JAX's attention_mgpu backward once on pallax (Gluon) and once on JAX's Mosaic GPU, for
Nsight Compute to compare the dq / dkv kernels side by side.

On the GPU machine:
``ncu --clock-control none -k regex:"kernel_d|anonymous" --section WarpStateStats ...
python3 benchmarks/probes/probe_attention_bwd_ncu.py``.
"""
from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import attention_mgpu as attn_bench  # noqa: E402


def main():
  ams = attn_bench.modules()
  ks = jax.random.split(jax.random.key(42), 4)
  q, k, v, do = (jax.random.normal(x, (1, 4096, 16, 128), jnp.float16) for x in ks)
  blocks = dict(block_q_dkv=64, block_kv_dkv=64, block_q_dq=64, block_kv_dq=64)
  for name, am in zip(("pallax", "jax_mosaic"), ams):
    cfg = am.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2, **blocks)
    f = jax.jit(attn_bench._with_grads(lambda q, k, v, am=am, cfg=cfg: am.attention(q, k, v, cfg)))
    jax.block_until_ready(f(q, k, v, do))
    print(name, "done", flush=True)


if __name__ == "__main__":
  main()

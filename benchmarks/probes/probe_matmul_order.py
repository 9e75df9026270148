"""JAX's hopper_matmul_mgpu at bf16 8192³ on pallax (Gluon) and on JAX's Mosaic GPU, the two
128x128x64 s4 w8 configurations, timed in three orders (which kernel runs first in each round):
this power-bound shape moves with the order. With ``--once`` it runs each kernel twice and
stops, for Nsight Compute. A research probe for issue 11.

On the GPU machine: ``PYTHONPATH=$PWD python3 benchmarks/probes/probe_matmul_order.py [--once]``.
"""
from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import hopper_matmul as hmb  # noqa: E402
import timing  # noqa: E402


def main():
  hms = hmb.modules()
  m = k = n = 8192
  ka, kb = jax.random.split(jax.random.key(m + n))
  a = jax.random.normal(ka, (m, k), jnp.bfloat16)
  b = jax.random.normal(kb, (k, n), jnp.bfloat16)
  for cname in ("128x128x64 s4 wgN w8", "128x128x64 s4 wgM w8"):
    fields = hmb.CONFIGS[cname]
    fns = {}
    for kname, hm in zip(("pallax", "jax_mosaic"), hms):
      cfg = hm.TuningConfig(**{**fields, "wg_dimension": hm.MatmulDimension(fields.get("wg_dimension", 1))})
      fns[kname] = jax.jit(lambda x, y, hm=hm, cfg=cfg: hm.matmul(x, y, None, cfg))
    for f in fns.values():
      jax.block_until_ready(f(a, b))
      jax.block_until_ready(f(a, b))
    if "--once" in sys.argv:
      continue
    for order in (("pallax", "jax_mosaic"), ("jax_mosaic", "pallax"), ("pallax", "jax_mosaic")):
      t = timing.device_times({o: fns[o] for o in order}, (a, b))
      print(f"{cname}, {order[0]} first: " + ", ".join(f"{o} {t[o] * 1e6:.1f} µs" for o in order)
            + f"; pallax speed {t['jax_mosaic'] / t['pallax']:.3f}x", flush=True)


if __name__ == "__main__":
  main()

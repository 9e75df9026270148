"""Launches the benchmark's softmax and layer norm on pallax and on JAX Pallas (Triton), three
calls each in a fixed order, for a profiler to compare their kernels:

    ncu --clock-control none --metrics gpu__time_duration.sum,launch__registers_per_thread \
        -k regex:kernel python3 benchmarks/probes/profile_rowwise.py
"""
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import triton_vs_pallas as tvp  # noqa: E402


def main():
  import pallax
  import pallax.triton as plt_
  from jax.experimental.pallas import triton as jplt

  JP = tvp.jax_pallas()
  keys = jax.random.split(jax.random.key(7), 3)
  x = jax.random.normal(keys[0], (16384, 8192), jnp.float32)
  w, b = (jax.random.normal(k, (1, 8192), jnp.float32) for k in keys[1:])
  for kname, k, args in (("softmax", tvp.softmax, (x,)), ("layer_norm", tvp.layer_norm, (x, w, b))):
    for impl, P, TP in (("pallax", pallax, plt_.CompilerParams), ("jax_pallas", JP, jplt.CompilerParams)):
      f = jax.jit(lambda *a, k=k, P=P, TP=TP: k(P, TP, *a))
      print(f"launching: {kname} {impl} x3", flush=True)
      for _ in range(3):
        jax.block_until_ready(f(*args))


if __name__ == "__main__":
  main()

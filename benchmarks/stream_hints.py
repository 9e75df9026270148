"""Experiment: does telling the cache to evict streamed data first speed up row-wise kernels?

pallax marks the loads (and optionally stores) of block operands that each program touches
exactly once with ``eviction_policy="evict_first"`` (``codegen.STREAM_HINTS``). This times the
benchmark's softmax and layer norm with the hints off, on loads, and on loads and stores,
against JAX Pallas (Triton) in one run; ``--ncu`` instead launches each variant four times so
that ``ncu --metrics gpu__time_duration.sum -k regex:kernel`` reads their kernel times.

    PYTHONPATH=$PWD python3 benchmarks/stream_hints.py [--ncu]
"""
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import triton_vs_pallas as tvp  # noqa: E402


def main():
  import pallax
  import pallax.triton as plt_
  from pallax._src.triton import codegen
  from jax.experimental import pallas as jpl
  from jax.experimental.pallas import triton as jplt

  JP = type("JP", (), {"BlockSpec": staticmethod(jpl.BlockSpec)})
  JP.pallas_call = staticmethod(lambda *a, compiler_params=None, **kw: jpl.pallas_call(
      *a, compiler_params=compiler_params or jplt.CompilerParams(), **kw))
  keys = iter(jax.random.split(jax.random.key(7), 8))
  x = jax.random.normal(next(keys), (16384, 8192), jnp.float32)
  w = jax.random.normal(next(keys), (1, 8192), jnp.float32)
  b = jax.random.normal(next(keys), (1, 8192), jnp.float32)
  kernels = {"softmax": (lambda P, TP, a: tvp.softmax(P, TP, a), (x,), jax.nn.softmax(x, axis=1)),
             "layer_norm": (lambda P, TP, a, ww, bb: tvp.layer_norm(P, TP, a, ww, bb), (x, w, b),
                            tvp.ref_layer_norm(x, w, b))}
  variants = {"off": (), "load": ("load",), "load+store": ("load", "store")}
  for kname, (k, args, ref) in kernels.items():
    fns = {}
    for vname, hints in variants.items():
      codegen.STREAM_HINTS = hints
      f = jax.jit(lambda *a, k=k: k(pallax, plt_.CompilerParams, *a))
      assert tvp.rel_err(f(*args), ref) < 1e-5, (kname, vname)   # lowers with these hints now
      fns[f"pallax {vname}"] = f
    fns["jax_pallas"] = jax.jit(lambda *a, k=k: k(JP, jplt.CompilerParams, *a))
    if "--ncu" in sys.argv:
      for name, f in fns.items():
        print(f"ncu order: {kname} {name}", flush=True)
        for _ in range(4):
          jax.block_until_ready(f(*args))
      continue
    for rep in range(2):
      res = tvp.time_calls(fns, args, rounds=25)
      base = res["jax_pallas"][0]
      print(f"{kname} pass {rep}: " + "  ".join(
          f"{n} {m * 1e3:.4f} ms ({base / m:.3f}x)" for n, (m, lo, hi) in res.items()), flush=True)


if __name__ == "__main__":
  main()

"""JAX's ragged dot (``jax/experimental/pallas/ops/gpu/ragged_dot_mgpu.py``, one warpgroup, an
``emit_pipeline`` per output tile and a logarithmic ladder of TMA stores) on pallax (Gluon) and
on JAX's Mosaic GPU, beside XLA's ``lax.ragged_dot``: the same source, its imports switched.
Shapes of JAX's own benchmark: m = n = 16384, k = 2048, 16 groups, float16.

On the GPU machine: ``PYTHONPATH=$PWD python3 benchmarks/ragged_dot.py [--small] [--tiles M,N,K,STEPS ...]
[--previous DIR]`` (block_m, block_n, block_k, max_concurrent_steps; JAX's benchmark's 128,128,64,4
by default; several tile sets run one after the other). ``--previous DIR`` adds the pallax of
``DIR/pallax`` (an earlier commit: ``git archive <commit> pallax | tar -x -C DIR``) in the same
process, as ``pallax_vs_previous.py`` does.
"""
from __future__ import annotations

import argparse
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


def load_previous(directory: str):
  """JAX's ragged dot on the pallax of ``directory/pallax`` (imported as ``pallax_previous``)."""
  import helpers
  import pallax_vs_previous
  pallax_vs_previous.import_previous(directory)
  imports = {k: v.replace("import pallax", "import pallax_previous")
             for k, v in mgpu_ops.IMPORTS.items()}
  return helpers.load_jax_ops_module("ragged_dot_mgpu", imports, "pallax_previous_mgpu_",
                                     strict=False)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--small", action="store_true")
  ap.add_argument("--tiles", nargs="+", default=["128,128,64,4"])
  ap.add_argument("--previous", help="DIR: also time the pallax of DIR/pallax")
  args = ap.parse_args()
  import jax.experimental.pallas.ops.gpu.ragged_dot_mgpu as jax_rd
  kernels = {"pallax": mgpu_ops.load("ragged_dot_mgpu"), "jax_mosaic": jax_rd}
  if args.previous:
    kernels["pallax_previous"] = load_previous(args.previous)
  m, k, n, groups = (1024, 256, 1024, 4) if args.small else (16384, 2048, 16384, 16)
  kx, ky, kz = jax.random.split(jax.random.key(1234), 3)
  lhs = jax.random.normal(kx, (m, k), jnp.float16)
  rhs = jax.random.normal(ky, (groups, k, n), jnp.float16)
  cuts = jnp.sort(jax.random.randint(kz, (groups - 1,), 0, m, jnp.int32))
  sizes = jnp.diff(jnp.concatenate([jnp.zeros(1, jnp.int32), cuts, jnp.full(1, m, jnp.int32)]))
  for tiles in args.tiles:
    bm, bn, bk, steps = (int(t) for t in tiles.split(","))
    cfg = dict(block_m=bm, block_n=bn, block_k=bk, max_concurrent_steps=steps, grid_block_n=2)
    fns = {"xla": jax.jit(lambda a, b, s: jax.lax.ragged_dot(a, b, s))}
    fns.update({name: jax.jit(lambda a, b, s, mod=mod: mod.ragged_dot(a, b, group_sizes=s, **cfg))
                for name, mod in kernels.items()})
    table(fns, (lhs, rhs, sizes), (m, k, n, groups), cfg)


def table(fns, call, sizes, cfg):
  """One markdown table: each function's error against XLA's, kernel and wall time."""
  m, k, n, groups = sizes
  outs = timing.checked_outputs(fns, call, "ragged_dot")
  want = outs["xla"]
  dev = timing.device_times(fns, call, rounds=15)
  wall = timing.time_calls(fns, call)
  flops = 2 * m * k * n
  print(f"# JAX's ragged_dot_mgpu, {jax.devices()[0].device_kind}, m={m} k={k} n={n} "
        f"groups={groups} float16, {cfg}\n")
  print("| kernel | max rel. error vs XLA | kernel time (µs) | TFLOP/s | wall per call (µs) | XLA / kernel |")
  print("| --- | --- | --- | --- | --- | --- |")
  for name in outs:
    err = float(np.max(np.abs(outs[name] - want)) / np.max(np.abs(want)))
    print(f"| {name} | {err:.1e} | {timing.time_columns(dev[name], wall[name][0], flops)} | "
          f"{dev['xla'] / dev[name]:.2f}x |", flush=True)


if __name__ == "__main__":
  main()

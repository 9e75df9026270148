"""Probe (two GPUs): what one call of JAX's collective matmul on pallax runs on each device, and
for how long (a profiler trace of a batch of calls): the address kernel, XLA's all-gather of the
addresses, the kernel; beside JAX's Mosaic GPU and XLA's all_gather + dot.

    PYTHONPATH=$PWD python3 benchmarks/probes/probe_collective_breakdown.py
"""
import collections
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)
import collective_matmul as bench  # noqa: E402
import timing  # noqa: E402


def main():
  from jax.experimental.pallas.ops.gpu import collective_matmul_mgpu as jax_cm
  ours = bench.pallax_module()
  devices = jax.devices()
  mesh = jax.sharding.Mesh(np.array(devices), ("x",))
  d, (m_shard, n_shard, k) = len(devices), (1024, 4096, 4096)
  x = jax.device_put(jax.random.normal(jax.random.key(1), (d * m_shard, k), jnp.bfloat16),
                     jax.NamedSharding(mesh, P("x", None)))
  y = jax.device_put(jax.random.normal(jax.random.key(2), (k, d * n_shard), jnp.bfloat16),
                     jax.NamedSharding(mesh, P(None, "x")))
  cfg = dict(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4, grid_tile_width=8)
  fns = {}
  for name, mod in (("pallax", ours), ("jax", jax_cm)):
    config = mod.TuningConfig(**cfg, grid_minor_dim=mod.MatmulDimension.M,
                              wg_dimension=mod.MatmulDimension.N)
    fns[name] = jax.jit(jax.shard_map(
        functools.partial(mod.all_gather_lhs_matmul, axis_name="x", config=config,
                          dtype=jnp.bfloat16),
        mesh=mesh, in_specs=(P("x", None), P(None, "x")), out_specs=P(None, "x"),
        check_vma=False))
  n = 10
  for name, batches in timing.device_ops(fns, (x, y), n=n, rounds=3).items():
    ops = batches[-1]
    per = collections.defaultdict(lambda: collections.defaultdict(float))
    for o in ops:
      per[o["pid"]][o["name"][:70]] += o["dur"] / n
    print(f"== {name}: per device, µs per call")
    for pid, names in per.items():
      for op, us in sorted(names.items(), key=lambda kv: -kv[1]):
        print(f"  device pid {pid}: {us:8.1f}  {op}")
    starts = sorted(o["ts"] for o in ops)
    print(f"  span of the batch: {(max(o['ts'] + o['dur'] for o in ops) - starts[0]) / n:.1f} µs per call")


if __name__ == "__main__":
  main()

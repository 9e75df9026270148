"""JAX's collective matmul (``jax/experimental/pallas/ops/gpu/collective_matmul_mgpu.py``: each
device multiplies its rhs shard by the all-gathered lhs, sending its lhs shard to the next device
inside the kernel while it computes) on pallax (Gluon, peer memory) and on JAX's Mosaic GPU, the
same source with its import lines switched, beside XLA's ``all_gather`` + ``dot`` (NCCL + cuBLAS).
Every result is checked against XLA's first.

Times per call: kernel time (from a profiler trace: per device the summed device operations of a
batch, the slowest device's, over the batch size) and back-to-back wall time.

On a machine with two GPUs or more:
``PYTHONPATH=$PWD python3 benchmarks/collective_matmul.py [--small] [--out FILE]``.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import timing  # noqa: E402  (the timing library)


def pallax_module():
  import helpers
  import mgpu_ops
  hopper = mgpu_ops.load("hopper_matmul_mgpu", num_sms=jax.devices()[0].core_count)
  imports = {**mgpu_ops.IMPORTS,
             "from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu":
                 "hopper_matmul_mgpu = _HOPPER  # pallax's copy of it"}
  return helpers.load_jax_ops_module("collective_matmul_mgpu", imports, "pallax_bench_",
                                     strict=False, _HOPPER=hopper)


def kernel_times(fns: dict, args, n=10, rounds=5) -> dict:
  """Per function: median over rounds of the slowest device's busy time per call."""
  out = {}
  for k, batches in timing.device_ops(fns, args, n, rounds).items():
    per_round = []
    for ops in batches:
      by_device = {}
      for x in ops:
        by_device[x["pid"]] = by_device.get(x["pid"], 0.0) + x["dur"]
      per_round.append(max(by_device.values(), default=0.0) * 1e-6 / n)
    out[k] = float(np.median(per_round)) if per_round and min(per_round) > 0 else float("nan")
  return out


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--small", action="store_true")
  ap.add_argument("--out")
  a = ap.parse_args()
  from jax.experimental.pallas.ops.gpu import collective_matmul_mgpu as jax_cm  # the competitor
  ours = pallax_module()
  devices = jax.devices()
  d = len(devices)
  m_shard, n_shard, k = (256, 512, 512) if a.small else (1024, 4096, 4096)
  dtype = jnp.bfloat16
  mesh = jax.sharding.Mesh(np.array(devices), ("x",))
  x = jax.random.normal(jax.random.key(1), (d * m_shard, k), dtype)
  y = jax.random.normal(jax.random.key(2), (k, d * n_shard), dtype)
  x = jax.device_put(x, jax.NamedSharding(mesh, P("x", None)))
  y = jax.device_put(y, jax.NamedSharding(mesh, P(None, "x")))

  def sharded(f):
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P("x", None), P(None, "x")),
                                 out_specs=P(None, "x"), check_vma=False))

  cfg = dict(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4, grid_tile_width=8)
  fns = {"xla": sharded(
      lambda p, q: jnp.dot(lax.all_gather(p, "x", axis=0, tiled=True), q,
                           preferred_element_type=jnp.float32).astype(dtype))}
  for name, mod in (("pallax", ours), ("jax", jax_cm)):
    config = mod.TuningConfig(**cfg, grid_minor_dim=mod.MatmulDimension.M,
                              wg_dimension=mod.MatmulDimension.N)
    fns[name] = sharded(functools.partial(mod.all_gather_lhs_matmul, axis_name="x",
                                          config=config, dtype=dtype))
  outs = timing.checked_outputs(fns, (x, y), "collective matmul")
  ref = outs.pop("xla")
  lines = [f"# Collective matmul on {d} x {devices[0].device_kind}, {datetime.date.today()}", "",
           f"Per device: lhs shard {m_shard}x{k}, rhs shard {k}x{n_shard}, bf16, f32 accumulation; "
           f"tuning {cfg}, grid_minor_dim M, wg_dimension N.", "",
           "| kernel | mismatches vs XLA | kernel time (µs) | wall per call (µs) | XLA time / kernel time |",
           "| --- | --- | --- | --- | --- |"]
  mism = {n: int((~np.isclose(o, ref, rtol=2e-2, atol=2e-2)).sum()) for n, o in outs.items()}
  kt = kernel_times(fns, (x, y))
  wt = timing.time_calls(fns, (x, y))
  base = kt["xla"]
  labels = {"xla": "XLA all_gather + dot", "pallax": "pallax (Gluon)", "jax": "JAX Mosaic GPU"}
  for n in fns:
    lines.append(f"| {labels[n]} | {mism.get(n, '-')} | {kt[n] * 1e6:.1f} | {wt[n][0] * 1e6:.1f} | "
                 f"{base / kt[n]:.2f} |")
  lines += ["", "Mismatches: elements outside rtol=atol=2e-2 of XLA's bf16 result (bf16 outputs of "
            "f32 sums in a different order)."]
  timing.write_report(lines, a.out)


if __name__ == "__main__":
  main()

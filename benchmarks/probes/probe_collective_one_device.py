"""Probe: JAX's collective matmul on a mesh of ONE GPU (no sends, one device step) against the
plain Hopper matmul of the same shape, on pallax and on JAX's Mosaic GPU: whether pallax's gap to
JAX on two GPUs comes from the matmul inside or from what reaches the peer.

    PYTHONPATH=$PWD python3 benchmarks/probes/probe_collective_one_device.py
"""
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)
import collective_matmul as bench  # noqa: E402
import timing  # noqa: E402


def main():
  from jax.experimental.pallas.ops.gpu import collective_matmul_mgpu as jax_cm
  from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as jax_hm
  ours = bench.pallax_module()
  our_hm = sys.modules["pallax_mgpu_hopper_matmul_mgpu"]
  dev = jax.devices()[:1]
  mesh = jax.sharding.Mesh(np.array(dev), ("x",))
  m, n, k = 1024, 4096, 4096
  x = jax.random.normal(jax.random.key(1), (m, k), jnp.bfloat16)
  y = jax.random.normal(jax.random.key(2), (k, n), jnp.bfloat16)
  cfg = dict(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4, grid_tile_width=8)
  fns = {}
  for name, mod, hm in (("pallax", ours, our_hm), ("jax", jax_cm, jax_hm)):
    config = mod.TuningConfig(**cfg, grid_minor_dim=mod.MatmulDimension.M,
                              wg_dimension=mod.MatmulDimension.N)
    fns[f"{name}-collective"] = jax.jit(jax.shard_map(
        functools.partial(mod.all_gather_lhs_matmul, axis_name="x", config=config,
                          dtype=jnp.bfloat16),
        mesh=mesh, in_specs=(P("x", None), P(None, "x")), out_specs=P(None, "x"),
        check_vma=False))
    fns[f"{name}-matmul"] = jax.jit(functools.partial(hm.matmul, c=None, config=config))
  outs = timing.checked_outputs(fns, (x, y), "one device")
  ref = np.asarray(jnp.dot(x, y, preferred_element_type=jnp.float32).astype(jnp.bfloat16), np.float32)
  for k_, o in outs.items():
    print(k_, "mismatches", int((~np.isclose(o, ref, rtol=2e-2, atol=2e-2)).sum()))
  for k_, t in timing.device_times(fns, (x, y)).items():
    print(f"{k_:20s} {t * 1e6:8.1f} µs")


if __name__ == "__main__":
  main()

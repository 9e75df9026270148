"""JAX's own warp-specialized Hopper matmul (``jax/experimental/pallas/ops/gpu/hopper_matmul_mgpu.py``)
on pallax (Gluon) and on JAX's Mosaic GPU, beside XLA's dot (cuBLAS): the same source, its two import
lines switched (``tests/mgpu_ops.py``). Every result is checked against XLA's product first; kernel
time from a profiler trace and back-to-back wall time per call.

On the GPU machine: ``PYTHONPATH=$PWD python3 benchmarks/hopper_matmul.py [--small] [--out FILE]``.
"""
from __future__ import annotations

import argparse
import datetime
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

CONFIGS = {   # name -> TuningConfig fields (JAX's test and tuning space, no clusters)
    "128x128x64 s4 wgN w8": dict(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4,
                                 grid_tile_width=8),
    "128x128x64 s4 wgM w8": dict(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4,
                                 grid_tile_width=8, wg_dimension=0),
    "128x128x128 s2 wgN w4": dict(tile_m=128, tile_n=128, tile_k=128, max_concurrent_steps=2,
                                  grid_tile_width=4),
}


# Clusters of two blocks sharing a tile (multicast TMA in JAX; on pallax emulated: each block
# loads its own copy, docs/mosaic_gpu.md), beside the same tiles without clusters.
CLUSTER_CONFIGS = {
    "128x128x64 s4 wgN w8 cluster M": dict(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4,
                                           grid_tile_width=8, cluster_dimension="M"),
    "128x128x64 s4 wgN w8 cluster N": dict(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4,
                                           grid_tile_width=8, cluster_dimension="N"),
}


HEADER = ["| work | config | kernel | mismatches vs XLA | kernel time (µs) | TFLOP/s | wall per call (µs) | kernel time / cuBLAS | / JAX |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
NOTE = ("Speed columns: cuBLAS time / kernel time and JAX time / kernel time (above 1 is faster). "
        "Mismatches: elements that differ from XLA's dot (f16: F16_F16_F32 preset, as JAX's test "
        "compares).")


def modules():
  """(pallax's, JAX's) hopper_matmul_mgpu: the same source, its imports switched."""
  import jax.experimental.pallas.ops.gpu.hopper_matmul_mgpu as jax_hm
  return mgpu_ops.load("hopper_matmul_mgpu", num_sms=jax.devices()[0].core_count), jax_hm


def _fields(hm, fields: dict) -> dict:
  """TuningConfig fields with the dimensions as ``hm``'s own enum (each module has its own)."""
  out = {**fields, "wg_dimension": hm.MatmulDimension(fields.get("wg_dimension", 1))}
  if "cluster_dimension" in fields:
    out["cluster_dimension"] = getattr(hm.MatmulDimension, fields["cluster_dimension"])
  return out


def matmul_rows(hms, dtype, m, k, n, configs: dict) -> list[str]:
  """One table row per (config, kernel) for ``a @ b`` of (m, k) x (k, n) in ``dtype``."""
  ka, kb = jax.random.split(jax.random.key(m + n))
  a = jax.random.normal(ka, (m, k), dtype)
  b = jax.random.normal(kb, (k, n), dtype)
  cublas = jax.jit(lambda x, y: jnp.dot(x, y, precision=jax.lax.DotAlgorithmPreset.F16_F16_F32
                                        if dtype == jnp.float16 else None,
                                        preferred_element_type=jnp.float32).astype(dtype))
  ref = np.asarray(cublas(a, b), np.float32)
  rows = []
  for cname, fields in configs.items():
    fns = {"cublas": cublas}
    for kname, hm in zip(("pallax", "jax_mosaic"), hms):
      cfg = hm.TuningConfig(**_fields(hm, fields))
      fns[kname] = jax.jit(lambda x, y, hm=hm, cfg=cfg: hm.matmul(x, y, None, cfg))
    outs = timing.checked_outputs(fns, (a, b), cname)
    bad = {name: int(np.sum(got != ref)) for name, got in outs.items()}
    dev = timing.device_times(fns, (a, b))
    wall = timing.time_calls(fns, (a, b))
    for name in fns:
      jx = dev[name] / dev["jax_mosaic"] if "jax_mosaic" in dev else float("nan")
      rows.append(
          f"| {jnp.dtype(dtype).name} {m}x{k}x{n} | {cname} | {name} | {bad[name]} | "
          f"{timing.time_columns(dev[name], wall[name][0], 2 * m * n * k)} | "
          f"{dev['cublas'] / dev[name]:.2f}x | {1 / jx:.2f}x |")
      print(rows[-1], flush=True)
  return rows


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--small", action="store_true")
  ap.add_argument("--out", default=None)
  args = ap.parse_args()
  hms = modules()
  device = jax.devices()[0].device_kind
  lines = [f"# JAX's hopper_matmul_mgpu: pallax (Gluon) vs JAX Mosaic GPU vs cuBLAS, {device}, "
           f"{datetime.date.today()}", ""] + HEADER
  sizes = [(1024, 1024, 1024)] if args.small else [(4096, 4096, 4096), (4096, 8192, 4096)]
  configs = dict(list(CONFIGS.items())[:1]) if args.small else {**CONFIGS, **CLUSTER_CONFIGS}
  for dtype in (jnp.float16, jnp.bfloat16):
    for m, k, n in sizes:
      lines += matmul_rows(hms, dtype, m, k, n, configs)
  lines += ["", NOTE + " Kernel time: summed GPU operations per call from a profiler trace (median "
            "of interleaved rounds); wall: back-to-back calls."]
  timing.write_report(lines, args.out)


if __name__ == "__main__":
  main()

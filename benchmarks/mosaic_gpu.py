"""The Mosaic GPU programming model on the GPU, in one run: pallax (Gluon, sm_90a) against the
same source on JAX's Mosaic GPU and against cuBLAS / cuDNN.

1. The docs' one-warpgroup matmul (``plgpu.emit_pipeline`` over K, ``wgmma`` into an accumulator,
   TMA in and out), written once against a ``pl``/``plgpu`` pair.
2. JAX's warp-specialized ``hopper_matmul_mgpu`` (imports switched): bf16 8192^3 and fp16
   4096x8192x4096, the configurations of ``hopper_matmul.py``, with and without clusters of two
   blocks (``cluster_dimension``: emulated on pallax, each block loading its own copy of the
   shared tile).
3. JAX's ``attention_mgpu`` (imports switched): fp16, batch 1, 16 heads, seq 4096, head dim 128,
   causal and not, forward; and forward + backward (JAX has no causal backward).

Kernel time from a profiler trace (the summed device operations of batches of calls, median of
interleaved rounds) and back-to-back wall time per call. Every result is checked first.

On the GPU machine: ``PYTHONPATH=$PWD python3 benchmarks/mosaic_gpu.py [--small] [--out FILE]``.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys

import jax
import jax.numpy as jnp
from jax import lax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import timing  # noqa: E402  (the timing library)


def pipeline_matmul(pl, plgpu, a, b, tile_m=128, tile_n=128, tile_k=64, stages=4):
  """``a @ b`` as the docs' quickstart writes it: a block per output tile."""
  (m, k), (_, n) = a.shape, b.shape
  dtype = a.dtype
  swizzle = plgpu.find_swizzle(tile_k * jnp.dtype(dtype).itemsize * 8)
  transforms = (plgpu.TilingTransform((8, swizzle // jnp.dtype(dtype).itemsize)),
                plgpu.SwizzleTransform(swizzle))
  out_swizzle = plgpu.find_swizzle(tile_n * jnp.dtype(dtype).itemsize * 8)
  out_transforms = (plgpu.TilingTransform((8, out_swizzle // jnp.dtype(dtype).itemsize)),
                    plgpu.SwizzleTransform(out_swizzle))

  def kernel(a_gmem, b_gmem, out_gmem, out_smem, acc_ref):
    m_slice = pl.ds(lax.axis_index("m") * tile_m, tile_m)
    n_slice = pl.ds(lax.axis_index("n") * tile_n, tile_n)

    def body(idxs, a_smem, b_smem):
      plgpu.wgmma(acc_ref, a_smem, b_smem)
      plgpu.wgmma_wait(1)

    plgpu.emit_pipeline(
        body, grid=(k // tile_k,),
        in_specs=[plgpu.BlockSpec((tile_m, tile_k), lambda kk: (0, kk), transforms=transforms,
                                  delay_release=1),
                  plgpu.BlockSpec((tile_k, tile_n), lambda kk: (kk, 0), transforms=transforms,
                                  delay_release=1)],
        max_concurrent_steps=stages)(a_gmem.at[m_slice, :], b_gmem.at[:, n_slice])
    out_smem[...] = acc_ref[...].astype(dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(out_smem, out_gmem.at[m_slice, n_slice])
    plgpu.wait_smem_to_gmem(0)

  return plgpu.kernel(
      kernel, out_type=jax.ShapeDtypeStruct((m, n), dtype), grid=(m // tile_m, n // tile_n),
      grid_names=("m", "n"),
      scratch_types=[plgpu.SMEM((tile_m, tile_n), dtype, transforms=out_transforms),
                     plgpu.ACC((tile_m, tile_n))])(a, b)


PIPELINE_HEADER = ["| work | kernel | rel. error vs XLA | kernel time (µs) | TFLOP/s | wall per call (µs) | kernel time / cuBLAS |",
                   "| --- | --- | --- | --- | --- | --- | --- |"]


def pipeline_rows(pl, plgpu, dtype, m, k, n) -> list[str]:
  import jax.experimental.pallas as jpl
  import jax.experimental.pallas.mosaic_gpu as jplgpu
  ka, kb = jax.random.split(jax.random.key(m + k))
  a = jax.random.normal(ka, (m, k), jnp.float32).astype(dtype)
  b = jax.random.normal(kb, (k, n), jnp.float32).astype(dtype)
  fns = {"cublas": jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32).astype(x.dtype)),
         "pallax": jax.jit(lambda x, y: pipeline_matmul(pl, plgpu, x, y)),
         "jax_mosaic": jax.jit(lambda x, y: pipeline_matmul(jpl, jplgpu, x, y))}
  ref = fns["cublas"](a, b)
  outs = timing.checked_outputs(fns, (a, b), f"{jnp.dtype(dtype).name} {m}x{k}x{n}")
  errs = {name: timing.rel_err(got, ref) for name, got in outs.items()}
  dev = timing.device_times(fns, (a, b))
  wall = timing.time_calls(fns, (a, b))
  rows = []
  for name in fns:
    rows.append(f"| matmul {jnp.dtype(dtype).name} {m}x{k}x{n} | {name} | {errs[name]:.1e} | "
                f"{timing.time_columns(dev[name], wall[name][0], 2 * m * n * k)} | "
                f"{dev[name] / dev['cublas']:.2f}x |")
    print(rows[-1], flush=True)
  return rows


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--small", action="store_true")
  ap.add_argument("--out", default=None)
  ap.add_argument("--only", choices=("pipeline", "matmul", "attention"), default=None)
  args = ap.parse_args()
  import pallax as pl
  import pallax.mosaic_gpu as plgpu
  import attention_mgpu as attn_bench
  import hopper_matmul as mm_bench
  device = jax.devices()[0].device_kind
  shapes = [(jnp.bfloat16, 1024, 1024, 1024)] if args.small else \
      [(jnp.bfloat16, 8192, 8192, 8192), (jnp.float16, 4096, 8192, 4096)]
  lines = [f"# Mosaic GPU kernels: pallax (Gluon) vs JAX Mosaic GPU vs cuBLAS/cuDNN, {device}, "
           f"{datetime.date.today()}", ""]
  if args.only in (None, "pipeline"):
    lines += ["## One-warpgroup pipeline matmul (the docs' quickstart)", ""] + PIPELINE_HEADER
    for dtype, m, k, n in shapes:
      lines += pipeline_rows(pl, plgpu, dtype, m, k, n)
    timing.write_report(lines, args.out)
  if args.only in (None, "matmul"):
    lines += ["", "## JAX's hopper_matmul_mgpu (warp-specialized)", ""] + mm_bench.HEADER
    hms = mm_bench.modules()
    configs = (dict(list(mm_bench.CONFIGS.items())[:1]) if args.small
               else {**mm_bench.CONFIGS, **mm_bench.CLUSTER_CONFIGS})
    for dtype, m, k, n in shapes:
      lines += mm_bench.matmul_rows(hms, dtype, m, k, n, configs)
    lines += ["", mm_bench.NOTE]
    timing.write_report(lines, args.out)
  if args.only in (None, "attention"):
    lines += ["", "## JAX's attention_mgpu (warp-specialized), float16, batch 1, 16 heads", ""]
    lines += attn_bench.HEADER
    ams = attn_bench.modules()
    seq = 1024 if args.small else 4096
    for causal in (False, True):
      for block_kv in (64, 128):
        lines += attn_bench.attention_rows(ams, seq, 128, causal, block_kv)
    lines += attn_bench.attention_rows(ams, seq, 128, False, 64, backward=True)
    lines += ["", attn_bench.NOTE]
  lines += ["", "Kernel time: summed GPU operations per call from a profiler trace (median of "
            "interleaved rounds); wall: back-to-back calls."]
  timing.write_report(lines, args.out)


if __name__ == "__main__":
  main()

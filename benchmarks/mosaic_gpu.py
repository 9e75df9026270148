"""The Mosaic GPU programming model on the GPU: one source, three implementations, one run.

The docs' one-warpgroup matmul (``plgpu.emit_pipeline`` over K, ``wgmma`` into an accumulator,
TMA in and out) written once against a ``pl``/``plgpu`` pair, run on pallax (Gluon, sm_90a) and on
JAX's Mosaic GPU, beside XLA's dot (cuBLAS). Kernel time from a profiler trace (the summed device
operations of batches of calls, median of interleaved rounds) and back-to-back wall time per call.
Every result is checked against XLA's product first.

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

import triton_vs_pallas as tvp  # noqa: E402  (timing helpers)


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


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--small", action="store_true")
  ap.add_argument("--out", default=None)
  args = ap.parse_args()
  import pallax as pl
  import pallax.mosaic_gpu as plgpu
  import jax.experimental.pallas as jpl
  import jax.experimental.pallas.mosaic_gpu as jplgpu
  device = jax.devices()[0].device_kind
  lines = [f"# Mosaic GPU model: pallax (Gluon) vs JAX Mosaic GPU vs cuBLAS, {device}, "
           f"{datetime.date.today()}", "",
           "| work | kernel | rel. error vs XLA | kernel time (µs) | TFLOP/s | wall per call (µs) | kernel time / cuBLAS |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
  sizes = [(1024, 1024, 1024)] if args.small else [(4096, 4096, 4096), (8192, 8192, 8192)]
  for dtype in (jnp.bfloat16, jnp.float16):
    for m, k, n in sizes:
      ka, kb = jax.random.split(jax.random.key(m + k))
      a = jax.random.normal(ka, (m, k), jnp.float32).astype(dtype)
      b = jax.random.normal(kb, (k, n), jnp.float32).astype(dtype)
      fns = {"cublas": jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32).astype(x.dtype)),
             "pallax": jax.jit(lambda x, y: pipeline_matmul(pl, plgpu, x, y)),
             "jax_mosaic": jax.jit(lambda x, y: pipeline_matmul(jpl, jplgpu, x, y))}
      ref = fns["cublas"](a, b)
      outs = tvp.checked_outputs(fns, (a, b), f"{jnp.dtype(dtype).name} {m}x{k}x{n}")
      errs = {name: tvp.rel_err(got, ref) for name, got in outs.items()}
      dev = tvp.device_times(fns, (a, b))
      wall = tvp.time_calls(fns, (a, b))
      flops = 2 * m * n * k
      for name in fns:
        lines.append(f"| matmul {jnp.dtype(dtype).name} {m}x{k}x{n} | {name} | {errs[name]:.1e} | "
                     f"{tvp.time_columns(dev[name], wall[name][0], flops)} | "
                     f"{dev[name] / dev['cublas']:.2f}x |")
  lines += ["", "Kernel time: summed GPU operations per call from a profiler trace (median of 7 "
            "interleaved rounds of 10 calls); wall: back-to-back calls (median of 15 rounds of 10). "
            "The pallax kernel is the one-warpgroup Gluon subset (no warp specialization yet)."]
  tvp.write_report(lines, args.out)


if __name__ == "__main__":
  main()

"""Probe (issue 27): JAX's test_get_swap_with_swizzle_transform stores registers into a swizzled
SMEM buffer through ``.T`` and copies it out by TMA without ``plgpu.commit_smem``. pallax's
interpreter reports that race; this runs the kernel on the GPU with and without the commit,
several times, and counts the elements that differ from ``2 * x``.

  PYTHONPATH=$PWD python3 benchmarks/probes/transposed_store_without_commit.py
"""
import jax
import jax.numpy as jnp
import numpy as np

import pallax.mosaic_gpu as plgpu


def kernel(transposed, commit, dtype=jnp.bfloat16, swizzle=128):
  n = swizzle // jnp.dtype(dtype).itemsize

  def body(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    view = smem.T if transposed else smem
    layout = plgpu.Layout.WGMMA_TRANSPOSED if transposed else plgpu.Layout.WGMMA
    view[...] = plgpu.load(view, layout=layout) * 2
    if commit:
      plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref)
    plgpu.wait_smem_to_gmem(0)

  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((n, n), dtype),
                      scratch_types=[plgpu.SMEM((n, n), dtype,
                                                transforms=(plgpu.SwizzleTransform(swizzle),)),
                                     plgpu.Barrier()]), (n, n)


def main():
  for transposed in (False, True):
    for commit in (False, True):
      f, shape = kernel(transposed, commit)
      x = jnp.arange(np.prod(shape), dtype=jnp.bfloat16).reshape(shape)
      bad = [int((np.asarray(f(x), np.float32) != np.asarray(x, np.float32) * 2).sum())
             for _ in range(20)]
      print(f"transposed={transposed} commit_smem={commit}: wrong elements per run {bad}")


if __name__ == "__main__":
  main()

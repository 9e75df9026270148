"""Probe (issue 27, a wrong result on the GPU): a 3-D float32 SMEM buffer filled by one TMA box
of rank 3 and read by registers through ``scratch.at[0]`` (rank 2), as JAX's
test_gmem_to_smem_with_multiple_smem_indexers does inside a one-step ``emit_pipeline``. On an
H200 (2026-11-27) a (2, 64, 64) float32 buffer came back wrong from column 32 on, while rows no
wider than the 128-byte swizzle agreed. Prints, per shape and kernel, the elements that differ
from the first plane, Gluon on the GPU.

  PYTHONPATH=$PWD python3 benchmarks/probes/wide_rows_of_a_reinterpreted_buffer.py
"""
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

import pallax.mosaic_gpu as plgpu

sys.path.insert(0, "tests")
from test_gluon_pipeline_smem_outputs import first_plane  # noqa: E402


def direct(x):
  """The same without a pipeline: TMA in, registers read plane 0, registers write the output."""
  @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct(x.shape[1:], x.dtype),
                     scratch_types=[plgpu.SMEM(x.shape, x.dtype), plgpu.Barrier()])
  def kernel(x_gmem, o_gmem, scratch, bar):
    plgpu.copy_gmem_to_smem(x_gmem, scratch, bar)
    plgpu.barrier_wait(bar)
    o_gmem[...] = scratch[0]
  return kernel(x)


def main():
  for dtype, shape in ((jnp.float32, (2, 64, 64)), (jnp.float32, (2, 32, 64)),
                       (jnp.float32, (2, 24, 48)), (jnp.float32, (2, 64, 32)),
                       (jnp.bfloat16, (2, 64, 128)), (jnp.float32, (2, 8, 64)),
                       (jnp.float32, (4, 64, 64))):
    x = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, shape), dtype)
    want = np.asarray(x[0], np.float32)
    for name, f in (("pipeline", lambda x: first_plane(x, (), interpret=False)), ("direct", direct)):
      try:
        got = np.asarray(f(x), np.float32)
        bad = np.argwhere(got != want)
        print(jnp.dtype(dtype).name, shape, name, "wrong:", len(bad), "first at", bad[:1].tolist())
      except Exception as e:  # noqa: BLE001
        print(jnp.dtype(dtype).name, shape, name, "error:", str(e).splitlines()[0][:200])


if __name__ == "__main__":
  main()

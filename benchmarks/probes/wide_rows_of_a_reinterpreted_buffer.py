"""Probe (issue 27, known wrong result on the GPU, not fixed): a (2, 64, 64) float32 SMEM buffer
filled by one TMA box of rank 3 and read by registers through ``scratch.at[0]`` (rank 2) inside
a one-step ``emit_pipeline`` (JAX's test_gmem_to_smem_with_multiple_smem_indexers). On an H200
(2026-11-27) about half the output differed from the interpreter, from column 32 on; with 32
float32 or 64 bfloat16 columns (rows no wider than the 128-byte swizzle) it agrees, and so does a
(2, 24, 48) float32 buffer (tests/test_gluon_layouts.py). Prints the mismatching count per shape.

  PYTHONPATH=$PWD python3 benchmarks/probes/wide_rows_of_a_reinterpreted_buffer.py
"""
import sys

import jax.numpy as jnp
import numpy as np

sys.path.insert(0, "tests")
from test_gluon_pipeline_smem_outputs import first_plane  # noqa: E402


def main():
  for dtype, cols in ((jnp.float32, 64), (jnp.float32, 32), (jnp.bfloat16, 64)):
    x = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (2, 64, cols)), dtype)
    got = np.asarray(first_plane(x, (32,), interpret=False), np.float32)   # on the GPU: Gluon
    print(jnp.dtype(dtype).name, cols, "wrong elements:", int((got != np.asarray(x[0], np.float32)).sum()))


if __name__ == "__main__":
  main()

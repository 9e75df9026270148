"""Mosaic GPU kernels that JAX's own tests run and that the Gluon backend once could not lower.
Each runs in the interpreter against a NumPy reference; on a machine without a GPU the suite's
conftest also lowers it to sm_90a PTX through the Gluon backend (``gluon_check.py``), on a GPU
runs it there against the interpreter."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu


def _random(shape, dtype=jnp.float32, seed=0):
  x = np.random.default_rng(seed).standard_normal(shape)
  return jnp.asarray(x, dtype)


def test_store_of_run_time_rows_into_a_3d_gmem_view():
  """SMEM rows from a start known only at run time, stored to a GMEM view that indexes the
  leading dimension of a 3-D array with an integer (JAX's multicast tests do this)."""
  batch, rows, cols = 3, 32, 64

  def body(x_ref, o_ref, smem, bar):
    b = lax.axis_index("b")
    plgpu.copy_gmem_to_smem(x_ref.at[b], smem, bar)
    plgpu.barrier_wait(bar)
    plgpu.commit_smem()

    @pl.loop(0, rows // 8)
    def _(j):
      part = pl.ds(j * 8, 8)
      plgpu.copy_smem_to_gmem(smem.at[part], o_ref.at[b, part, :])
    plgpu.wait_smem_to_gmem(0)

  x = _random((batch, rows, cols))
  f = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(batch,),
                   grid_names=("b",), scratch_types=[plgpu.SMEM((rows, cols), x.dtype), plgpu.Barrier()])
  np.testing.assert_array_equal(f(x), x)

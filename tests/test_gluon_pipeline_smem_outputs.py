"""A one-step ``plgpu.emit_pipeline`` whose output block is staged in SMEM and written from
registers, row slice by row slice, out of a slice of a 3-D SMEM scratch buffer filled by TMA (as
JAX's ``test_gmem_to_smem_with_multiple_smem_indexers`` writes it through its test helper). The
output must be the scratch's first plane, exactly; on a GPU the Gluon kernel is compared with the
interpreter (conftest.py, gluon_check.py). float32 and bfloat16, halves and slices of different sizes.

The Gluon backend stores a buffer whose views are 2-D (``scratch.at[0]``) in a 2-D swizzled layout,
and TMA writes the whole 3-D buffer through a 3-D reinterpretation of its bytes. Where the box's
rows are wider than the swizzle (64 float32 = 256 bytes, 128-byte swizzle), on an H200 the output
came back wrong from column 32 on, although a (2, 24, 48) float32 buffer read the same way
(tests/test_gluon_layouts.py) agrees: not understood yet, not refused yet, and so not in this
file; ``benchmarks/probes/wide_rows_of_a_reinterpreted_buffer.py`` reproduces it. Rows that fit
the swizzle (32 float32, 64 bfloat16) lower and agree with the interpreter on the GPU.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax as pl
import pallax.mosaic_gpu as plgpu

pytestmark = pytest.mark.interpreter


def first_plane(x, cuts, interpret=True):
  planes, rows, cols = x.shape

  @functools.partial(
      plgpu.kernel, out_type=jax.ShapeDtypeStruct((rows, cols), x.dtype), interpret=interpret,
      scratch_types=[plgpu.SMEM(x.shape, x.dtype), plgpu.Barrier()])
  def kernel(x_gmem, o_gmem, scratch, bar):
    def body(_, x_ref, o_smem):
      plgpu.copy_gmem_to_smem(x_ref, scratch, bar)
      plgpu.barrier_wait(bar)
      plane = scratch.at[0, :, :]
      for lo, hi in zip((0, *cuts), (*cuts, rows)):
        o_smem[pl.ds(lo, hi - lo), :] = plane[pl.ds(lo, hi - lo), :]

    plgpu.emit_pipeline(body, grid=(),
                        in_specs=[pl.BlockSpec(memory_space=plgpu.GMEM)],
                        out_specs=[pl.BlockSpec((rows, cols), lambda: (0, 0))])(x_gmem, o_gmem)

  return kernel(x)


@pytest.mark.parametrize("dtype,cols", [(jnp.float32, 32), (jnp.bfloat16, 64)],
                         ids=["float32-32", "bfloat16-64"])
@pytest.mark.parametrize("cuts", [(), (32,), (16, 32)], ids=["whole", "halves", "quarter-quarter-half"])
def test_output_staged_in_smem_holds_the_first_plane(dtype, cols, cuts):
  x = jnp.asarray(np.random.default_rng(len(cuts)).uniform(-1, 1, (2, 64, cols)), dtype)
  np.testing.assert_array_equal(np.asarray(first_plane(x, cuts)), np.asarray(x[0]))


"""A one-step ``plgpu.emit_pipeline`` whose output block is staged in SMEM and written from
registers, row slice by row slice, out of a slice of a 3-D SMEM scratch buffer filled by TMA (as
JAX's ``test_gmem_to_smem_with_multiple_smem_indexers`` writes it through its test helper). The
output must be the scratch's first plane, exactly; on a GPU the Gluon kernel is compared with the
interpreter (conftest.py, gluon_check.py). float32 and bfloat16, halves and slices of different sizes.

The Gluon backend stores a buffer whose views are 2-D (``scratch.at[0]``) in a 2-D swizzled layout.
TMA used to write the whole 3-D buffer through a 3-D reinterpretation of its bytes; where rows
are wider than the swizzle (64 float32 = 256 bytes, 128-byte swizzle) NVMMA layouts of ranks 2 and
3 order the rows' column chunks differently, and on an H200 the output came back wrong from
column 32 on (``benchmarks/probes/wide_rows_of_a_reinterpreted_buffer.py``). Such a box is now
copied plane by plane through the buffer's own layout.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax as pl
import pallax.mosaic_gpu as plgpu
from pallax._src.gluon import events as ev

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


@pytest.mark.parametrize("dtype,planes,rows,cols", [
    (jnp.float32, 2, 64, 32), (jnp.bfloat16, 2, 64, 64), (jnp.float32, 2, 64, 64),
    (jnp.float32, 3, 64, 48), (jnp.bfloat16, 2, 64, 128), (jnp.float32, 2, 8, 64)],
    ids=["float32-32", "bfloat16-64", "float32-64", "float32-3planes-48", "bfloat16-128",
         "float32-8rows-64"])
@pytest.mark.parametrize("cuts", [(), (32,)], ids=["whole", "halves"])
def test_output_staged_in_smem_holds_the_first_plane(dtype, planes, rows, cols, cuts):
  x = jnp.asarray(np.random.default_rng(cols).uniform(-1, 1, (planes, rows, cols)), dtype)
  cuts = tuple(c for c in cuts if c < rows)
  np.testing.assert_array_equal(np.asarray(first_plane(x, cuts)), np.asarray(x[0]))


def test_wide_rows_are_copied_plane_by_plane():
  """Rows wider than the swizzle: one TMA box per plane, each through ``smem.at[p]`` (so TMA
  places the bytes as the buffer's rank-2 layout does), at GMEM rows p."""
  (k,) = plgpu.lower(lambda x: first_plane(x, (), interpret=False),
                     jax.ShapeDtypeStruct((3, 64, 64), jnp.float32))
  copies = [e for e in k.generated.partitions[0].events if isinstance(e, ev.Copy)]
  into_smem = [(e.smem.steps, e.box, e.coords[0]) for e in copies if e.direction == "in"]
  assert [(steps[0][0], steps[0][1].value, box) for steps, box, _ in into_smem] == [
      ("index", p, (1, 64, 64)) for p in range(3)]


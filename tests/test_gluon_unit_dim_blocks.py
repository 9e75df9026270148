"""Blocks with leading dimensions of one (``pl.BlockSpec((1, 1, n), ...)``, as JAX's tests write
the blocks of a grid of more than two axes) read and written by registers inside
``plgpu.emit_pipeline``: the pipeline's slots are buffers of rank 4, stored with their leading
dimensions flattened, and each block is seen in a layout of its own rank (3), by the registers
and by the TMA copies alike (rows no wider than the swizzle: a TMA box of such a view with wider
rows is refused, as before). Checked in the interpreter against NumPy (exact), and on a GPU the
Gluon kernel against the interpreter (conftest.py)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax as pl
import pallax.mosaic_gpu as plgpu
from helpers import rand_seeded as rand

pytestmark = pytest.mark.interpreter

S = jax.ShapeDtypeStruct


def per_block(grid, tail, dtype, steps):
  """out[a, b] = x[a, b] * 2 + (a * grid[1] + b) for a kernel grid (a, b) of blocks
  (1, 1, *tail), through a pipeline over ``steps`` blocks of the last tail dimension."""
  def body(x_gmem, o_gmem):
    a, b = jax.lax.axis_index("a"), jax.lax.axis_index("b")
    block = (1, 1, *tail[:-1], tail[-1] // steps)
    index = lambda s: (a, b, *(0,) * (len(tail) - 1), s)

    @functools.partial(plgpu.emit_pipeline, grid=(steps,),
                       in_specs=[pl.BlockSpec(block, index)], out_specs=[pl.BlockSpec(block, index)])
    def pipe(_, x_ref, o_ref):
      o_ref[...] = x_ref[...] * 2 + (a * grid[1] + b).astype(dtype)

    pipe(x_gmem, o_gmem)

  shape = (*grid, *tail)
  return plgpu.kernel(body, out_shape=S(shape, dtype), grid=grid, grid_names=("a", "b"))


@pytest.mark.parametrize("grid,tail,steps", [((2, 3), (128,), 1), ((3, 2), (256,), 2),
                                             ((2, 2), (64, 32), 1), ((1, 3), (16, 64), 2)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.int32])
def test_unit_leading_dims_of_pipeline_blocks(grid, tail, steps, dtype):
  x = rand(1, (*grid, *tail), dtype)
  ids = np.arange(grid[0] * grid[1]).reshape(grid).astype(dtype)
  want = x * 2 + ids.reshape(*grid, *(1,) * len(tail))
  np.testing.assert_array_equal(per_block(grid, tail, dtype, steps)(x), want)

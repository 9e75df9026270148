"""Reshapes of register values between shapes that pallax's Gluon backend pads differently
(``(384, 8)`` is stored as ``(512, 8)``, ``(2, 3, 64, 8)`` as ``(2, 4, 64, 8)``): both seen as
rows of their common trailing dimensions, each row of the result gathered from the row of the
source that holds the same elements (``reshapes._gathered``); and static slices of register tiles of rank other than 2 (``x[1, 1]`` of
a (2, 3, 64, 8) tile), the rows kept gathered the same way. Checked in the interpreter against
NumPy (exact: data movement only), and on a GPU the Gluon kernel against the interpreter
(conftest.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax.mosaic_gpu as plgpu
from helpers import rand_seeded as rand

pytestmark = pytest.mark.interpreter

S = jax.ShapeDtypeStruct


def reshape_kernel(before, after, dtype):
  """o = x.reshape(after) * 2 + 1, x loaded from GMEM into registers."""
  def body(x_ref, o_ref):
    o_ref[...] = x_ref[...].reshape(after) * 2 + 1
  return plgpu.kernel(body, out_shape=S(after, dtype))


@pytest.mark.parametrize("before,after", [
    ((384, 8), (2, 3, 64, 8)),    # JAX's tiled reshape
    ((2, 3, 64, 8), (384, 8)),    # and back
    ((6, 32), (3, 64)),           # no common trailing dimension
    ((96, 16), (3, 32, 16)),
    ((5, 24), (3, 40)),           # padding in every dimension
])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.int32, jnp.float16])
def test_reshape_between_differently_padded_shapes(before, after, dtype):
  x = rand(3, before, dtype)
  got = reshape_kernel(before, after, dtype)(x)
  want = (x.reshape(after) * 2 + 1).astype(dtype)
  np.testing.assert_array_equal(got, want)


def slice_kernel(shape, index, out_shape, dtype):
  """o = x[index] + 1, x loaded from GMEM into registers."""
  def body(x_ref, o_ref):
    o_ref[...] = x_ref[...][index] + 1
  return plgpu.kernel(body, out_shape=S(out_shape, dtype))


@pytest.mark.parametrize("shape,index", [
    ((2, 3, 64, 8), (1, 1)),                          # JAX's slice of untiled dimensions
    ((2, 3, 64, 8), (slice(0, 1), slice(1, 3))),
    ((3, 5, 32), (2,)),
    ((3, 5, 32), (slice(1, 3), slice(2, 5))),
    ((24,), slice(8, 16)),                            # rank 1
    ((4, 2, 16, 8), (slice(1, 3), 1, slice(4, 12))),  # a trailing dimension sliced too
])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.int32])
def test_static_slices_of_tiles_of_rank_other_than_two(shape, index, dtype):
  x = rand(4, shape, dtype)
  want = (x[index] + 1).astype(dtype)
  np.testing.assert_array_equal(slice_kernel(shape, index, want.shape, dtype)(x), want)

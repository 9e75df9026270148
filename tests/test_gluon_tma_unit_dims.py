"""TMA copies of operands with more dimensions than TMA takes (5): the operand's dimensions of
size one are left out of the copy (gluon/copies.py), so a 7-D operand whose middle dimensions
are ones copies as a 3-D one. Exact round trips through SMEM in the interpreter, lowered on the
CPU, and on a GPU the Gluon kernel against the interpreter (conftest.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax.mosaic_gpu as plgpu
from pallax._src.gpu.source import Unsupported

pytestmark = pytest.mark.interpreter


def round_trip(shape, dtype, transforms=()):
  def kernel(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    plgpu.copy_smem_to_gmem(smem, o_ref)
    plgpu.wait_smem_to_gmem(0)

  return plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct(shape, dtype),
                      scratch_types=[plgpu.SMEM(shape, dtype, transforms=transforms),
                                     plgpu.Barrier()])


@pytest.mark.parametrize("shape,dtype,tiling", [
    ((2, 64, 1, 1, 1, 1, 128), jnp.float32, (2, 1, 1, 1, 1, 1, 32)),
    ((3, 1, 16, 1, 1, 64), jnp.bfloat16, None),
    ((1, 1, 1, 1, 1, 8, 32), jnp.int32, None),
], ids=["7d-f32-tiled", "6d-bf16", "7d-i32-leading-ones"])
def test_unit_dimensions_are_left_out_of_the_copy(shape, dtype, tiling):
  transforms = (plgpu.TilingTransform(tiling),) if tiling else ()
  rng = np.random.default_rng(len(shape))
  x = jnp.asarray(rng.integers(-1000, 1000, shape) if dtype == jnp.int32
                  else rng.normal(size=shape), dtype)
  np.testing.assert_array_equal(round_trip(shape, dtype, transforms)(x), x)


def test_more_than_five_dimensions_of_more_than_one_are_refused():
  shape = (2, 2, 2, 2, 2, 2, 32)
  with pytest.raises(Unsupported, match="TMA copies have at most 5 dimensions"):
    plgpu.lower(round_trip(shape, jnp.float32), jax.ShapeDtypeStruct(shape, jnp.float32))

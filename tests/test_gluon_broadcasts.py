"""Broadcasts of register tiles of any rank (``lax.broadcast_in_dim``, ``x[None, ...]`` and
size-one dimensions), beyond a vector to a 2-D tile: exact against numpy in the interpreter on
random inputs, sizes that are not powers of two included; on a GPU each kernel also runs as
Gluon and is compared with the interpreter (conftest.py, gluon_check.py). The Gluon backend
places the tile's dimensions among dimensions of one (a reshape) and broadcasts.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax.mosaic_gpu as plgpu

pytestmark = pytest.mark.interpreter

CASES = [   # (source shape, result shape, broadcast_dimensions)
    ((1, 128), (2, 4, 128), (1, 2)),
    ((128,), (2, 4, 128), (2,)),
    ((4, 1), (4, 8, 16), (0, 2)),
    ((8, 16), (3, 8, 16), (1, 2)),
    ((5,), (5, 3, 8), (0,)),
    ((16,), (2, 16), (1,)),
]


@pytest.mark.parametrize("src,shape,dims", CASES, ids=[f"{s}->{t}" for s, t, _ in CASES])
def test_broadcast_in_dim(src, shape, dims):
  def body(x_ref, o_ref):
    o_ref[...] = lax.broadcast_in_dim(x_ref[...], shape, dims) * 2

  x = jnp.asarray(np.random.default_rng(len(shape)).uniform(-1, 1, src), jnp.float32)
  f = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(shape, jnp.float32), interpret=True)
  np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(lax.broadcast_in_dim(x, shape, dims)) * 2)


@pytest.mark.parametrize("shape", [(4, 128), (2, 4, 128), (3, 2, 64)])
def test_a_row_added_to_a_tile_of_more_dimensions(shape):
  def body(x_ref, side_ref, o_ref):
    x = plgpu.load(x_ref, layout=plgpu.Layout.WG_STRIDED(x_ref.shape, vec_size=1))
    side = plgpu.load(side_ref, layout=plgpu.Layout.WG_STRIDED(shape, vec_size=1))
    for _ in range(len(shape) - 1):
      x = x[None, ...]
    o_ref[...] = x + side

  rng = np.random.default_rng(sum(shape))
  x = jnp.asarray(rng.uniform(-1, 1, shape[-1:]), jnp.float32)
  side = jnp.asarray(rng.uniform(-1, 1, shape), jnp.float32)
  f = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(shape, jnp.float32), interpret=True)
  np.testing.assert_array_equal(np.asarray(f(x, side)), np.asarray(x) + np.asarray(side))

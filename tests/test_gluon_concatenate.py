"""``lax.concatenate`` of register tiles in Mosaic GPU kernels: exact against numpy in the
interpreter on random inputs (operands of different sizes, sizes that are not powers of two,
three operands, rank 3, float32, bfloat16 and int32); on a GPU each kernel also runs as Gluon and
is compared with the interpreter (conftest.py, gluon_check.py). Gluon has no concatenation of
register tiles: the backend stores the operands into an SMEM scratch, each at a multiple of its
padded size, and gathers the result from it.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax.mosaic_gpu as plgpu

pytestmark = pytest.mark.interpreter

CASES = [   # (operand shapes, dimension, dtype)
    (((64, 64), (128, 64)), 0, jnp.float32),
    (((64, 64), (64, 128)), 1, jnp.float32),
    (((3, 8), (5, 8), (1, 8)), 0, jnp.float32),
    (((16, 24), (16, 8)), 1, jnp.bfloat16),
    (((2, 3, 32), (2, 6, 32)), 1, jnp.int32),
    (((32,), (32,)), 0, jnp.float32),
]


def _operand(rng, shape, dtype):
  if jnp.issubdtype(dtype, jnp.integer):
    return jnp.asarray(rng.integers(-1000, 1000, shape), dtype)
  return jnp.asarray(rng.uniform(-1, 1, shape), dtype)


@pytest.mark.parametrize("shapes,dim,dtype", CASES,
                         ids=[f"{'+'.join(map(str, s))}-dim{d}-{jnp.dtype(t).name}"
                              for s, d, t in CASES])
def test_concatenate(shapes, dim, dtype):
  rng = np.random.default_rng(len(shapes) + dim)
  xs = [_operand(rng, s, dtype) for s in shapes]
  want = np.concatenate([np.asarray(x) for x in xs], axis=dim)

  def body(*refs):
    *ins, out = refs
    out[...] = lax.concatenate([r[...] for r in ins], dimension=dim)

  f = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(want.shape, dtype), interpret=True)
  np.testing.assert_array_equal(np.asarray(f(*xs)), want)


def test_concatenate_of_wgmma_layout_loads():
  """As JAX's test_concatenate writes it: operands loaded in the wgmma layout."""
  rng = np.random.default_rng(0)
  a, b = _operand(rng, (64, 64), jnp.float32), _operand(rng, (128, 64), jnp.float32)

  def body(a_ref, b_ref, o_ref):
    x = plgpu.load(a_ref, layout=plgpu.Layout.WGMMA, optimized=False)
    y = plgpu.load(b_ref, layout=plgpu.Layout.WGMMA, optimized=False)
    o_ref[...] = lax.concatenate([x, y], dimension=0)

  f = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((192, 64), jnp.float32), interpret=True)
  np.testing.assert_array_equal(np.asarray(f(a, b)), np.concatenate([a, b], axis=0))

"""``pl.swap`` (masked or not) and ``jnp.unstack`` inside kernels: in the interpreter, on the Triton
backend (every kernel here also lowers to PTX for sm_75/80/90 on a CPU, see conftest.py), compared
elementwise and exactly with NumPy. A masked swap returns, where the mask is False, the value
given for that lane (JAX Pallas's rule); the Ref keeps its old value there."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax as pl

DTYPES = [np.float32, jnp.bfloat16, np.int32, np.int8]


def _values(key, shape, dtype):
  if np.issubdtype(np.dtype(dtype), np.integer):
    info = np.iinfo(dtype)
    return np.asarray(jax.random.randint(key, shape, info.min, info.max, dtype))
  return np.asarray(jax.random.normal(key, shape, jnp.float32).astype(dtype))


def _keys(n, seed):
  return jax.random.split(jax.random.key(seed), n)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(16, 32), (5, 7), (1, 3)])
def test_masked_swap_of_two_aliased_outputs(dtype, shape):
  # As JAX's own test: x_ref <- swap(y_ref, x) on the lanes of the mask; elsewhere both stay.
  kx, ky, km = _keys(3, hash((shape, np.dtype(dtype).name)) % 1000)
  x, y = _values(kx, shape, dtype), _values(ky, shape, dtype)
  mask = np.asarray(jax.random.bernoulli(km, 0.5, shape))

  @functools.partial(pl.pallas_call, out_shape=(jax.ShapeDtypeStruct(shape, dtype),) * 2,
                     input_output_aliases={0: 0, 1: 1})
  def kernel(_, _2, mask_ref, x_ref, y_ref):
    x_ref[...] = pl.swap(y_ref, (slice(None),), x_ref[...], mask=mask_ref[...])

  out_x, out_y = kernel(x, y, mask)
  np.testing.assert_array_equal(np.asarray(out_x), np.where(mask, y, x))
  np.testing.assert_array_equal(np.asarray(out_y), np.where(mask, x, y))


@pytest.mark.parametrize("n", [16, 11])
def test_masked_swap_past_the_end_from_a_dynamic_start(n):
  # The slice runs past y's end; the mask keeps those lanes out.
  m = 32
  kx, ky, ks = _keys(3, n)
  x, y = _values(kx, (n,), np.float32), _values(ky, (m,), np.float32)
  start = int(jax.random.randint(ks, (), m - n + 1, m))
  idx = np.arange(n) + start
  mask = idx < m

  @functools.partial(pl.pallas_call, out_shape=(jax.ShapeDtypeStruct((n,), jnp.float32),
                                                jax.ShapeDtypeStruct((m,), jnp.float32)),
                     input_output_aliases={0: 0, 1: 1})
  def kernel(_, _2, mask_ref, start_ref, x_ref, y_ref):
    x_ref[...] = pl.swap(y_ref, (pl.ds(start_ref[()], n),), x_ref[...], mask=mask_ref[...])

  out_x, out_y = kernel(x, y, mask, np.int32(start))
  want_x, want_y = x.copy(), y.copy()
  want_x[mask] = y[idx[mask]]
  want_y[idx[mask]] = x[mask]
  np.testing.assert_array_equal(np.asarray(out_x), want_x)
  np.testing.assert_array_equal(np.asarray(out_y), want_y)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_swap_with_a_broadcast_mask_inside_a_grid(dtype):
  # A (1, 8) mask row applied to every row of an (8, 8) block, block by block over a grid of 3.
  kx, ky, km = _keys(3, 3)
  x, y = _values(kx, (24, 8), dtype), _values(ky, (24, 8), dtype)
  row = np.asarray(jax.random.bernoulli(km, 0.5, (1, 8)))

  def kernel(x_ref, y_ref, m_ref, o_ref, old_ref):
    o_ref[...] = y_ref[...]
    old_ref[...] = pl.swap(o_ref, (slice(None), slice(None)), x_ref[...], mask=m_ref[...])

  spec = pl.BlockSpec((8, 8), lambda i: (i, 0))
  o, old = pl.pallas_call(
      kernel, out_shape=(jax.ShapeDtypeStruct((24, 8), dtype),) * 2, grid=(3,),
      in_specs=[spec, spec, pl.BlockSpec((1, 8), lambda i: (0, 0))], out_specs=(spec, spec))(x, y, row)
  np.testing.assert_array_equal(np.asarray(o), np.where(row, x, y))
  np.testing.assert_array_equal(np.asarray(old), np.where(row, y, x))


def test_unmasked_swap_returns_every_old_value():
  kx, ky = _keys(2, 5)
  x, y = _values(kx, (6, 10), np.float32), _values(ky, (6, 10), np.float32)

  def kernel(x_ref, y_ref, o_ref, old_ref):
    o_ref[...] = y_ref[...]
    old_ref[1:5] = pl.swap(o_ref, (pl.ds(1, 4),), x_ref[1:5])
    old_ref[0], old_ref[5] = x_ref[0], x_ref[5]

  o, old = pl.pallas_call(kernel, out_shape=(jax.ShapeDtypeStruct((6, 10), jnp.float32),) * 2)(x, y)
  want_o = y.copy()
  want_o[1:5] = x[1:5]
  want_old = x.copy()
  want_old[1:5] = y[1:5]
  np.testing.assert_array_equal(np.asarray(o), want_o)
  np.testing.assert_array_equal(np.asarray(old), want_old)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape,axis", [((2, 8), 0), ((3, 5, 4), 1), ((6, 3), 1), ((1, 16), 0),
                                        ((4, 6, 5), 2)])
def test_unstack(dtype, shape, axis):
  (kx,) = _keys(1, len(shape) * 10 + axis)
  x = _values(kx, shape, dtype)
  count = shape[axis]
  part_shape = shape[:axis] + shape[axis + 1:]

  def kernel(x_ref, *o_refs):
    for o_ref, part in zip(o_refs, jnp.unstack(x_ref[...], axis=axis)):
      o_ref[...] = part

  outs = pl.pallas_call(kernel, out_shape=[jax.ShapeDtypeStruct(part_shape, dtype)] * count)(x)
  for k, got in enumerate(outs):
    np.testing.assert_array_equal(np.asarray(got), np.take(x, k, axis=axis))


def test_unstacked_rows_in_arithmetic():
  # The parts feed other operations (not only stores): 2 * a + b - c, row by row.
  (kx,) = _keys(1, 9)
  x = _values(kx, (3, 5, 12), np.float32)

  def kernel(x_ref, o_ref):
    a, b, c = jnp.unstack(x_ref[...], axis=0)
    o_ref[...] = 2 * a + b - c

  got = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((5, 12), jnp.float32))(x)
  want = 2 * x[0] + x[1] - x[2]
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)

"""The cells of the Pallas introduction notebook (spec 004), run with pallax.

``import pallax as pl`` stands in for ``import jax.experimental.pallas as pl``;
no ``interpret=`` flag is passed anywhere: on CPU pallax runs its interpreter.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax as pl


def draw(key, shape, dtype=jnp.float32):
  """Fresh random values from jax.random for ``key`` (never all zeros).

  Drawn at one fixed size and cut to ``shape``, so that new shapes cost no new
  compilation of the random number generator.
  """
  n = int(np.prod(shape))
  assert n <= 4096
  if jnp.issubdtype(dtype, jnp.integer):
    v = np.asarray(jax.random.randint(key, (4096,), -1000, 1000, jnp.int32))
    v = np.where(v == 0, 1, v)
  else:
    v = np.asarray(jax.random.normal(key, (4096,), jnp.float32))
  return jnp.asarray(v[:n].reshape(shape), dtype)


# --- cell: add_vectors under jax.jit ------------------------------------------------

def add_vectors_kernel(x_ref, y_ref, o_ref):
  x, y = x_ref[...], y_ref[...]
  o_ref[...] = x + y


@jax.jit
def add_vectors(x: jax.Array, y: jax.Array) -> jax.Array:
  return pl.pallas_call(
      add_vectors_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype)
  )(x, y)


def test_add_vectors_arange():
  out = add_vectors(jnp.arange(8), jnp.arange(8))
  assert out.shape == (8,)
  assert out.dtype == jnp.arange(8).dtype
  np.testing.assert_array_equal(out, np.arange(8) * 2)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int32])
def test_add_vectors_random(dtype):
  k1, k2 = jax.random.split(jax.random.key(101))
  x, y = draw(k1, (8,), dtype), draw(k2, (8,), dtype)
  out = add_vectors(x, y)
  assert out.dtype == dtype
  np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(x + y, np.float32))


def test_add_vectors_other_shapes():
  # The same jitted function retraces for new shapes: 2D, non-power-of-two, size 1.
  for i, shape in enumerate([(3, 5), (1,), (13,)]):
    k1, k2 = jax.random.split(jax.random.key(110 + i))
    x, y = draw(k1, shape), draw(k2, shape)
    np.testing.assert_array_equal(add_vectors(x, y), np.asarray(x) + np.asarray(y))


def test_add_vectors_eager_matches_jit():
  k1, k2 = jax.random.split(jax.random.key(120))
  x, y = draw(k1, (8,)), draw(k2, (8,))
  eager = pl.pallas_call(add_vectors_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)
  np.testing.assert_array_equal(eager, add_vectors(x, y))
  np.testing.assert_array_equal(eager, np.asarray(x) + np.asarray(y))


# --- cell: iota ---------------------------------------------------------------------------

def iota_kernel(o_ref):
  i = pl.program_id(0)
  o_ref[i] = i


def iota(size: int):
  return pl.pallas_call(iota_kernel,
                        out_shape=jax.ShapeDtypeStruct((size,), jnp.int32),
                        grid=(size,))()


def test_iota_8():
  out = iota(8)
  assert out.dtype == jnp.int32
  np.testing.assert_array_equal(out, np.arange(8, dtype=np.int32))


@pytest.mark.parametrize("size", [1, 7, 33])
def test_iota_sizes(size):
  np.testing.assert_array_equal(iota(size), jnp.arange(size, dtype=jnp.int32))


def test_iota_under_jit():
  np.testing.assert_array_equal(jax.jit(iota, static_argnums=0)(8), np.arange(8))


# --- cell: the 1024x1024 matmul on a 2x2 grid ------------------------------------------------

def matmul_kernel(x_ref, y_ref, z_ref):
  z_ref[...] = x_ref[...] @ y_ref[...]


def matmul(x: jax.Array, y: jax.Array):
  return pl.pallas_call(
      matmul_kernel,
      out_shape=jax.ShapeDtypeStruct((x.shape[0], y.shape[1]), x.dtype),
      grid=(2, 2),
      in_specs=[
          pl.BlockSpec((x.shape[0] // 2, x.shape[1]), lambda i, j: (i, 0)),
          pl.BlockSpec((y.shape[0], y.shape[1] // 2), lambda i, j: (0, j))
      ],
      out_specs=pl.BlockSpec(
          (x.shape[0] // 2, y.shape[1] // 2), lambda i, j: (i, j),
      )
  )(x, y)


def assert_default_precision_product(z, x, y, **tol):
  """On a GPU a default-precision float32 dot may round its inputs to tf32 (Triton's and XLA's
  default, in different summation orders): there, compare with the exact product at tf32's
  accuracy. On the CPU the interpreter computes ``x @ y`` exactly as XLA does."""
  if jax.devices()[0].platform == "gpu":
    exact = np.asarray(x, np.float64) @ np.asarray(y, np.float64)
    assert np.linalg.norm(np.asarray(z) - exact) / np.linalg.norm(exact) < 1e-3
  else:
    np.testing.assert_allclose(z, x @ y, **tol)


def test_matmul_1024_notebook_cell():
  # The notebook's cell, including its (default-tolerance) assert_allclose on the CPU.
  k1, k2 = jax.random.split(jax.random.key(0))
  x = jax.random.normal(k1, (1024, 1024))
  y = jax.random.normal(k2, (1024, 1024))
  z = matmul(x, y)
  assert z.shape == (1024, 1024) and z.dtype == jnp.float32
  assert_default_precision_product(z, x, y)


def test_matmul_1024_fresh_inputs_jit():
  k1, k2 = jax.random.split(jax.random.key(130))
  x = jax.random.normal(k1, (1024, 1024))
  y = jax.random.normal(k2, (1024, 1024))
  z = jax.jit(matmul)(x, y)
  assert_default_precision_product(z, x, y, rtol=1e-5, atol=1e-4)


def test_matmul_small_rectangular():
  k1, k2 = jax.random.split(jax.random.key(131))
  x, y = draw(k1, (6, 10)), draw(k2, (10, 14))
  ref = np.asarray(x, np.float64) @ np.asarray(y, np.float64)
  np.testing.assert_allclose(matmul(x, y), ref, rtol=1e-5, atol=1e-5)


# --- cell: "You can transform a pallas function with vmap" -------------------------------------

def test_vmap_add_vectors():
  k1, k2 = jax.random.split(jax.random.key(140))
  xs, ys = draw(k1, (4, 8)), draw(k2, (4, 8))
  np.testing.assert_array_equal(jax.vmap(add_vectors)(xs, ys), np.asarray(xs) + np.asarray(ys))


def test_vmap_matmul_grid():
  k1, k2 = jax.random.split(jax.random.key(141))
  xs, ys = draw(k1, (3, 16, 8)), draw(k2, (3, 8, 12))
  out = jax.vmap(matmul)(xs, ys)
  ref = np.einsum("bij,bjk->bik", np.asarray(xs, np.float64), np.asarray(ys, np.float64))
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_vmap_under_jit():
  k1, k2 = jax.random.split(jax.random.key(142))
  xs, ys = draw(k1, (5, 8), jnp.int32), draw(k2, (5, 8), jnp.int32)
  out = jax.jit(jax.vmap(add_vectors))(xs, ys)
  np.testing.assert_array_equal(out, np.asarray(xs) + np.asarray(ys))


# --- cell: program_id (blockIdx) and num_programs (grid size) ------------------------------------

def test_program_id_and_num_programs():
  def kernel(x_ref, o_ref):
    i, j = pl.program_id(0), pl.program_id(1)
    n0, n1 = pl.num_programs(0), pl.num_programs(1)
    o_ref[...] = x_ref[...] * (i * n1 + j + 1) + n0 * 1000 + n1 * 100

  x = jnp.abs(draw(jax.random.key(150), (6, 8), jnp.int32)) % 9 + 1
  out = pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(3, 2),
      in_specs=[pl.BlockSpec((2, 4), lambda i, j: (i, j))],
      out_specs=pl.BlockSpec((2, 4), lambda i, j: (i, j)))(x)
  lin = np.repeat(np.repeat(np.arange(6).reshape(3, 2), 2, axis=0), 4, axis=1) + 1
  np.testing.assert_array_equal(out, np.asarray(x) * lin + 3000 + 200)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_program_id_three_axes(axis):
  grid = (2, 3, 4)

  def kernel(o_ref):
    o_ref[pl.program_id(0), pl.program_id(1), pl.program_id(2)] = (
        pl.program_id(axis) + 10 * pl.num_programs(axis))

  out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(grid, jnp.int32), grid=grid)()
  expect = np.indices(grid)[axis] + 10 * grid[axis]
  np.testing.assert_array_equal(out, expect)

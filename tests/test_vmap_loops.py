"""``jax.vmap`` of kernels whose loops run a data-dependent number of times, with the interpreter's
checks on: each batch element is a program of a new grid axis, and a check inside a loop sees that
program's trip count (JAX cannot check a batched while loop). Compared with JAX Pallas in
interpret mode on the same kernel source."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as jpl

import pallax


def prefix_sums(pl, interpret):
  """o[j] = sum of x[start : start + n] for each j (a loop of n steps, n read from a Ref)."""
  def kernel(n_ref, start_ref, x_ref, o_ref):
    def body(i, acc):
      return acc + x_ref[pl.ds(start_ref[0] + i, 1)]
    o_ref[...] = jnp.broadcast_to(lax.fori_loop(0, n_ref[0], body, jnp.zeros((1,))), o_ref.shape)
  def f(n, start, x):
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((4,), x.dtype),
                          interpret=interpret)(n, start, x)
  return f


def while_until(pl, interpret):
  """A while loop whose exit depends on the data: the first index where the running sum of
  ``x`` passes ``limit``, over a grid of two row blocks."""
  def kernel(limit_ref, x_ref, o_ref):
    def cond(c):
      i, s = c
      return (i < x_ref.shape[1]) & (s <= limit_ref[0])
    def body(c):
      i, s = c
      return i + 1, s + x_ref[0, pl.ds(i, 1)][0]
    i, _ = lax.while_loop(cond, body, (jnp.int32(0), jnp.float32(0)))
    o_ref[...] = jnp.full(o_ref.shape, i, jnp.int32)
  def f(limit, x):
    return pl.pallas_call(
        kernel, grid=(x.shape[0],), out_shape=jax.ShapeDtypeStruct((x.shape[0], 8), jnp.int32),
        in_specs=[pl.BlockSpec((1,), lambda r: (0,)), pl.BlockSpec((1, x.shape[1]), lambda r: (r, 0))],
        out_specs=pl.BlockSpec((1, 8), lambda r: (r, 0)), interpret=interpret)(limit, x)
  return f


@pytest.mark.interpreter
@pytest.mark.parametrize("interpret", [True, pallax.InterpretParams(parallel=False)],
                         ids=["lanes", "sequential"])
def test_vmapped_data_dependent_fori_matches_jax_pallas(interpret):
  k = jax.random.split(jax.random.key(0), 2)
  x = jax.random.normal(k[0], (5, 37))
  n = jnp.array([[3], [0], [17], [1], [30]], jnp.int32)
  start = jnp.array([[0], [5], [20], [36], [7]], jnp.int32)
  got = jax.vmap(prefix_sums(pallax, interpret))(n, start, x)
  want = jax.vmap(prefix_sums(jpl, True))(n, start, x)
  ref = np.stack([np.full(4, np.asarray(x)[b, s:s + c].sum(), np.float32)
                  for b, (c, s) in enumerate(zip(np.asarray(n)[:, 0], np.asarray(start)[:, 0]))])
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.interpreter
def test_vmapped_while_loop_over_a_grid_matches_jax_pallas_under_jit():
  x = jax.random.uniform(jax.random.key(1), (3, 6, 19))
  limit = jnp.array([[0.5], [3.0], [100.0]])
  got = jax.jit(jax.vmap(while_until(pallax, True)))(limit, x)
  want = jax.jit(jax.vmap(while_until(jpl, True)))(limit, x)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  assert np.asarray(got).min() >= 1 and np.asarray(got)[2].max() == 19


@pytest.mark.interpreter
def test_out_of_bounds_read_in_one_vmapped_loop_is_reported():
  """Only the last batch element's loop runs past its block: the check still sees it."""
  x = jax.random.normal(jax.random.key(2), (3, 37))
  n = jnp.array([[3], [5], [4]], jnp.int32)
  start = jnp.array([[0], [30], [35]], jnp.int32)
  with pytest.raises(IndexError, match="out-of-bounds read"):
    jax.block_until_ready(jax.vmap(prefix_sums(pallax, True))(n, start, x))
  ok = jax.vmap(prefix_sums(pallax, True))(n.at[2, 0].set(2), start, x)
  np.testing.assert_allclose(np.asarray(ok)[2], np.asarray(x)[2, 35:37].sum(), rtol=1e-5)

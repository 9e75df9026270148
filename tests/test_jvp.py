"""Forward-mode differentiation of pallas_call (``jax.jvp``, ``jax.linearize``), as in JAX Pallas:
the tangent kernel is JAX's JVP of the kernel body, with a tangent Ref beside each float Ref and
the same block specs. Checked against ``jax.jvp`` of plain-JAX references on random inputs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl


def _rand(seed, shape, dtype=jnp.float32):
  return jax.random.normal(jax.random.key(seed), shape, dtype)


def _close(got, want, tol=1e-5):
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), rtol=tol, atol=tol)


def test_elementwise_kernel():
  def kernel(x_ref, o_ref):
    o_ref[...] = jnp.sin(x_ref[...]) * x_ref[...]

  f = lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
  ref = lambda x: jnp.sin(x) * x
  x, t = _rand(0, (37,)), _rand(1, (37,))
  _close(jax.jvp(f, (x,), (t,)), jax.jvp(ref, (x,), (t,)))
  _close(jax.jit(lambda x, t: jax.jvp(f, (x,), (t,)))(x, t), jax.jvp(ref, (x,), (t,)))


@pytest.mark.parametrize("shape", [(64, 48), (50, 40)], ids=["whole_blocks", "partial_blocks"])
def test_grid_with_block_specs_slices_loops_and_two_outputs(shape):
  def kernel(x_ref, y_ref, o_ref, p_ref):
    x = x_ref[...]
    o_ref[...] = jnp.exp(x) * y_ref[...]
    p_ref[:, :8] = lax.fori_loop(0, 3, lambda i, a: a * x[:, :8] + 1.0, jnp.ones_like(x[:, :8]))
    p_ref[:, 8:] = y_ref[:, 8:] ** 2

  spec = pl.BlockSpec((16, 16), lambda i, j: (i, j))
  f = lambda x, y: pl.pallas_call(
      kernel, out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype)] * 2,
      grid=(pl.cdiv(x.shape[0], 16), pl.cdiv(x.shape[1], 16)), in_specs=[spec, spec],
      out_specs=[spec, spec])(x, y)

  def ref(x, y):
    cols = (jnp.arange(x.shape[1]) % 16) < 8
    poly = ((x + 1) * x + 1) * x + 1
    return [jnp.exp(x) * y, jnp.where(cols[None, :], poly, y ** 2)]

  x, y, tx, ty = (_rand(k, shape) for k in range(2, 6))
  _close(jax.jvp(f, (x, y), (tx, ty)), jax.jvp(ref, (x, y), (tx, ty)), tol=2e-5)


def test_linearize_and_a_zero_tangent():
  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] * y_ref[...] + jnp.tanh(x_ref[...])

  f = lambda x, y: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)
  ref = lambda x, y: x * y + jnp.tanh(x)
  x, y, tx = _rand(6, (8, 128)), _rand(7, (8, 128)), _rand(8, (8, 128))
  out, lin = jax.linearize(f, x, y)
  ref_out, ref_lin = jax.linearize(ref, x, y)
  _close(out, ref_out)
  _close(lin(tx, tx), ref_lin(tx, tx))
  _close(jax.jvp(lambda x: f(x, y), (x,), (tx,)), jax.jvp(lambda x: ref(x, y), (x,), (tx,)))


def test_integer_operands_and_outputs_have_zero_tangents():
  def kernel(x_ref, n_ref, o_ref, c_ref):
    o_ref[...] = x_ref[...] * n_ref[...].astype(jnp.float32)
    c_ref[...] = n_ref[...] + 1

  f = lambda x, n: pl.pallas_call(kernel, out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype),
                                                     jax.ShapeDtypeStruct(n.shape, n.dtype)])(x, n)
  x, t = _rand(9, (16,)), _rand(10, (16,))
  n = jnp.arange(16, dtype=jnp.int32)
  (o, c), (to, tc) = jax.jvp(lambda x: f(x, n), (x,), (t,))
  np.testing.assert_allclose(np.asarray(to), np.asarray(t) * np.arange(16), rtol=1e-6)
  assert tc.dtype == jax.dtypes.float0 and np.asarray(c).tolist() == list(range(1, 17))


def test_scratch_and_aliased_operands():
  def kernel(x_ref, acc_in_ref, o_ref, scratch_ref):
    scratch_ref[...] = x_ref[...] * x_ref[...]
    o_ref[...] = acc_in_ref[...] + scratch_ref[...]

  f = lambda x, acc: pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), input_output_aliases={1: 0},
      scratch_shapes=[pl.ANY(x.shape, x.dtype)])(x, acc)
  ref = lambda x, acc: acc + x * x
  x, a, tx, ta = (_rand(k, (32,)) for k in range(11, 15))
  _close(jax.jvp(f, (x, a), (tx, ta)), jax.jvp(ref, (x, a), (tx, ta)))


def test_reverse_mode_is_a_clear_error():
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2

  f = lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
  with pytest.raises(NotImplementedError, match="reverse-mode.*jax.jvp.*custom_vjp"):
    jax.grad(lambda x: f(x).sum())(_rand(15, (8,)))

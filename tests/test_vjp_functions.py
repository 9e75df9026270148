"""The reverse-mode split that ``as_torch_kernel`` hands to ``torch.autograd``
(``pallax/_src/torch/autograd.vjp_functions``), checked with JAX alone on any machine: the forward
function's outputs and the backward function's cotangents equal ``jax.vjp``'s, for JAX's own ops
with ``custom_vjp`` backward kernels (run here in the interpreter)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax as pl
from pallax._src.torch.autograd import vjp_functions
from jax_gpu_ops import load


def _ops():
  k = jax.random.split(jax.random.key(3), 6)
  x, w, b = jax.random.normal(k[0], (2, 8, 200)), jax.random.normal(k[1], (200,)), \
      jax.random.normal(k[2], (200,))
  q, kk, v = (jax.random.normal(kk_, (1, 128, 2, 64)) for kk_ in jax.random.split(k[3], 3))
  ln, rms, att = load("layer_norm"), load("rms_norm"), load("attention")
  return [
      ("layer_norm", lambda x, w, b: ln.layer_norm(x, w, b, interpret=True), (x, w, b)),
      ("rms_norm", lambda x, w, b: rms.rms_norm(x, w, b, interpret=True), (x, w, b)),
      ("mha causal", lambda q, k, v: att.mha(q, k, v, segment_ids=None, causal=True,
                                             interpret=True), (q, kk, v)),
  ]


@pytest.mark.interpreter
@pytest.mark.parametrize("name,fn,args", _ops(), ids=lambda v: v if isinstance(v, str) else "")
def test_forward_and_backward_equal_jax_vjp(name, fn, args):
  avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
  forward, backward, out_shape, res_shape = vjp_functions(fn, avals)
  out, residuals = jax.jit(forward)(*args)
  want_out, pullback = jax.vjp(fn, *args)
  ct = jax.random.normal(jax.random.key(9), want_out.shape)
  got = jax.jit(backward)(*residuals, ct)
  want = pullback(ct)
  assert out.shape == out_shape.shape and len(residuals) == len(res_shape)
  np.testing.assert_allclose(out, want_out, rtol=1e-6, atol=1e-6)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.interpreter
def test_integer_inputs_get_no_cotangent():
  def scale(x, n):
    return x * n.astype(x.dtype)
  avals = [jax.ShapeDtypeStruct((4,), jnp.float32), jax.ShapeDtypeStruct((4,), jnp.int32)]
  forward, backward, _, _ = vjp_functions(scale, avals)
  x, n = jnp.arange(4.0), jnp.arange(4, dtype=jnp.int32) + 1
  _, residuals = forward(x, n)
  dx, dn = backward(*residuals, jnp.ones(4))
  np.testing.assert_array_equal(dx, n.astype(jnp.float32))
  assert dn is None


def test_integer_outputs_are_refused_clearly():
  avals = [jax.ShapeDtypeStruct((4,), jnp.float32)]
  with pytest.raises(ValueError, match="gradients need floating-point outputs.*torch.no_grad"):
    vjp_functions(lambda x: x.astype(jnp.int32), avals)


@pytest.mark.interpreter
def test_a_kernel_without_custom_vjp_says_what_to_do():
  def double(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2
  f = lambda x: pl.pallas_call(double, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),  # noqa: E731
                               interpret=True)(x)
  with pytest.raises(NotImplementedError, match="Wrap the function that calls pallas_call in jax.custom_vjp"):
    vjp_functions(f, [jax.ShapeDtypeStruct((8,), jnp.float32)])

"""JAX's own Mosaic GPU kernels, their import lines switched to pallax, in the interpreter at small
shapes, against their references (tolerances of JAX's own tests: atol 2e-3, rtol 1e-3)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mgpu_ops import load

pytestmark = pytest.mark.interpreter


@pytest.fixture(scope="module")
def attention():
  return load("attention_mgpu")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("batch,seq,heads,kv_heads,head_dim", [(1, 128, 2, 1, 64), (2, 256, 2, 2, 128)])
def test_attention_forward(attention, causal, batch, seq, heads, kv_heads, head_dim):
  k = jax.random.split(jax.random.key(seq + head_dim + causal), 3)
  q = jax.random.normal(k[0], (batch, seq, heads, head_dim), jnp.float16)
  kk = jax.random.normal(k[1], (batch, seq, kv_heads, head_dim), jnp.float16)
  v = jax.random.normal(k[2], (batch, seq, kv_heads, head_dim), jnp.float16)
  config = attention.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2, causal=causal)
  out = np.asarray(attention.attention(q, kk, v, config), np.float32)
  ref = np.asarray(attention.attention_reference(q, kk, v, causal=causal), np.float32)
  np.testing.assert_allclose(out, ref, atol=2e-3, rtol=1e-3)


def test_attention_forward_with_residuals_under_jit(attention):
  k = jax.random.split(jax.random.key(3), 3)
  q, kk, v = (jax.random.normal(x, (1, 128, 1, 64), jnp.float16) for x in k)
  config = attention.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2)
  out, (lse,) = jax.jit(lambda *a: attention._attention_forward(*a, config, save_residuals=True))(q, kk, v)
  ref, ref_lse = attention.attention_reference(q, kk, v, save_residuals=True)
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32), atol=2e-3, rtol=1e-3)
  np.testing.assert_allclose(np.asarray(lse), np.asarray(ref_lse).reshape(lse.shape), atol=2e-3, rtol=1e-3)

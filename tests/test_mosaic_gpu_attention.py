"""JAX's own warp-specialized flash attention (``attention_mgpu.py``, imports switched) on the
Gluon backend: two compute threads and a TMA thread, loop-carried softmax statistics in the
wgmma layout's row slices (from ``layout_cast(..., Layout.WGMMA.reduce(1))``), register-``a``
wgmma, causal masks from ``broadcasted_iota(..., layout=WGMMA)``. sm_90a PTX on any machine; on
a Hopper GPU, against JAX's reference at the tolerances of JAX's own test (atol 2e-3, rtol 1e-3)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mgpu_ops
import pallax.mosaic_gpu as plgpu
from pallax._src.gluon import events as ev


@functools.cache
def attention_module():
  return mgpu_ops.load("attention_mgpu")


def _on_hopper() -> bool:
  d = jax.devices()[0]
  return d.platform == "gpu" and float(getattr(d, "compute_capability", "0")) >= 9.0


gpu = pytest.mark.skipif(not _on_hopper(), reason="needs a Hopper GPU")


def inputs(batch, seq, heads, kv_heads, head_dim, seed=0):
  k = jax.random.split(jax.random.key(seed), 3)
  q = jax.random.normal(k[0], (batch, seq, heads, head_dim), jnp.float16)
  kk = jax.random.normal(k[1], (batch, seq, kv_heads, head_dim), jnp.float16)
  v = jax.random.normal(k[2], (batch, seq, kv_heads, head_dim), jnp.float16)
  return q, kk, v


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 192])
def test_jax_attention_lowers_to_warp_specialized_sm90a_ptx(causal, head_dim):
  """A head dim of 192 lives in tiles padded to 256 (Gluon's tensors are powers of two)."""
  am = attention_module()
  s = jax.ShapeDtypeStruct((1, 256, 2, head_dim), jnp.float16)
  cfg = am.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2, causal=causal)
  (k,) = plgpu.lower(lambda q, k, v: am.attention(q, k, v, cfg), s, s, s)
  assert len(k.generated.partitions) == 3 and k.num_warps == 12   # two compute threads, one memory
  assert all(w in k.ptx for w in ("wgmma.mma_async", "setmaxnreg", "cp.async.bulk.tensor"))
  boxes = {e.box for p in k.generated.partitions for e in p.events if isinstance(e, ev.Copy)}
  assert boxes == {(1, 64, 1, 1 << (head_dim - 1).bit_length())}   # a head's block, padded


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("batch,seq,heads,kv_heads,head_dim,block_q,block_kv", [
    (1, 256, 2, 1, 64, 64, 64), (2, 512, 2, 2, 128, 64, 64), (1, 1024, 4, 2, 64, 64, 128),
    (1, 2048, 2, 2, 128, 64, 128), (1, 512, 2, 2, 256, 64, 64), (1, 512, 2, 2, 192, 64, 64)])
def test_jax_attention_on_the_gpu(causal, batch, seq, heads, kv_heads, head_dim, block_q, block_kv):
  am = attention_module()
  q, k, v = inputs(batch, seq, heads, kv_heads, head_dim, seed=seq + head_dim)
  cfg = am.TuningConfig(block_q=block_q, block_kv=block_kv, max_concurrent_steps=2, causal=causal)
  out = np.asarray(jax.jit(lambda q, k, v: am.attention(q, k, v, cfg))(q, k, v), np.float32)
  ref = np.asarray(am.attention_reference(q, k, v, causal=causal), np.float32)
  np.testing.assert_allclose(out, ref, atol=2e-3, rtol=1e-3)


@pytest.mark.gpu
@gpu
def test_jax_attention_residuals_on_the_gpu():
  am = attention_module()
  q, k, v = inputs(1, 256, 2, 2, 64, seed=5)
  cfg = am.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2)
  out, (lse,) = jax.jit(lambda *a: am._attention_forward(*a, cfg, save_residuals=True))(q, k, v)
  ref, ref_lse = am.attention_reference(q, k, v, save_residuals=True)
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32), atol=2e-3, rtol=1e-3)
  np.testing.assert_allclose(np.asarray(lse), np.asarray(ref_lse).reshape(lse.shape), atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("kind", ["pipeline_emitter", "backward"])
def test_jax_attention_variants_lower(kind):
  """``attention_with_pipeline_emitter`` (``emit_pipeline_warp_specialized``; its softmax
  statistics start as plain ``jnp.full`` constants: the loop body tells their layout) and the
  backward kernels (dq, dkv)."""
  am = attention_module()
  s = jax.ShapeDtypeStruct((1, 256, 2, 64), jnp.float16)
  cfg = am.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2, block_q_dkv=64,
                        block_kv_dkv=64, block_q_dq=64, block_kv_dq=64)
  if kind == "pipeline_emitter":
    f = lambda q, k, v: am.attention_with_pipeline_emitter(q, k, v, cfg)
  else:
    f = lambda q, k, v: jax.vjp(lambda q, k, v: am.attention(q, k, v, cfg), q, k, v)[1](q)
  kernels = plgpu.lower(f, s, s, s)
  assert kernels and all("wgmma.mma_async" in k.ptx for k in kernels)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_jax_attention_with_pipeline_emitter_on_the_gpu(head_dim):
  am = attention_module()
  q, k, v = inputs(1, 512, 2, 2, head_dim, seed=11)
  cfg = am.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2)
  out = np.asarray(jax.jit(lambda q, k, v: am.attention_with_pipeline_emitter(q, k, v, cfg))(q, k, v), np.float32)
  ref = np.asarray(am.attention_reference(q, k, v), np.float32)
  np.testing.assert_allclose(out, ref, atol=2e-3, rtol=1e-3)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("compute_wgs", [1, 2])
def test_jax_attention_backward_on_the_gpu(compute_wgs):
  """dq, dk, dv against the reference's gradient in float32, within two float16 roundings of
  the largest gradient (as the interpreter's test)."""
  am = attention_module()
  q, k, v = inputs(1, 512, 2, 2, 64, seed=12)
  do = jax.random.normal(jax.random.key(13), q.shape, jnp.float16)
  cfg = am.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2, block_q_dkv=64,
                        block_kv_dkv=64, block_q_dq=64, block_kv_dq=64, compute_wgs_bwd=compute_wgs)
  grads = jax.jit(lambda q, k, v, do: jax.vjp(lambda q, k, v: am.attention(q, k, v, cfg), q, k, v)[1](do))
  f32 = lambda t: t.astype(jnp.float32)
  _, vjp_ref = jax.vjp(lambda q, k, v: am.attention_reference(q, k, v), f32(q), f32(k), f32(v))
  for got, want in zip(grads(q, k, v, do), vjp_ref(f32(do))):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=2.0**-11 * 2 * np.abs(want).max())

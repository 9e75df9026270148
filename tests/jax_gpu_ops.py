"""JAX's own Pallas GPU ops (jax/experimental/pallas/ops/gpu), run on pallax by switching their
two import lines: the compatibility check for kernels written for JAX's Triton path."""
import types

import jax
import jax.numpy as jnp

import helpers

IMPORTS = {
    "from jax.experimental import pallas as pl": "import pallax as pl",
    "from jax.experimental.pallas import triton as plgpu": "import pallax.triton as plgpu",
}


def load(name: str) -> types.ModuleType:
  return helpers.load_jax_ops_module(name, IMPORTS, "pallax_port_")


def _ln_ref(x, w, b, eps=1e-5):
  return (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + eps) * w + b


def _rms_ref(x, w, b, eps=1e-5):
  return x / jnp.sqrt((x * x).mean(-1, keepdims=True) + eps) * w + b


def _paged_inputs(key):
  """Paged attention's operands (pages in a random order) and the same K/V laid out per sequence."""
  kq, kk, kv, kp = jax.random.split(key, 4)
  batch, heads, kv_heads, head_dim, page, pages, per_seq = 2, 16, 2, 64, 16, 16, 8
  q = jax.random.normal(kq, (batch, heads, head_dim))
  k_pages = jax.random.normal(kk, (kv_heads, pages, page, head_dim))
  v_pages = jax.random.normal(kv, (kv_heads, pages, page, head_dim))
  tables = jax.random.permutation(kp, pages)[:batch * per_seq].reshape(batch, per_seq).astype(jnp.int32)
  lengths = jnp.array([100, 37], jnp.int32)
  def per_sequence(p):   # [batch, per_seq * page, kv_heads, head_dim]
    x = p[:, tables].reshape(kv_heads, batch, per_seq * page, head_dim)
    return x.transpose(1, 2, 0, 3)
  return (q, k_pages, v_pages, tables, lengths), (per_sequence(k_pages), per_sequence(v_pages))


def cases():
  """(name, module name, function of (module, interpret) -> f(*args), args, reference: a
  function of the module)."""
  k = jax.random.split(jax.random.key(7), 6)
  x2 = jax.random.normal(k[0], (64, 300))
  x3 = jax.random.normal(k[1], (4, 16, 200))
  w, b = jax.random.normal(k[2], (200,)), jax.random.normal(k[3], (200,))
  q, kk, v = (jax.random.normal(kk_, (1, 256, 2, 64)) for kk_ in jax.random.split(k[0], 3))
  # Decoding: q [batch, heads, dim], k/v [batch, seq, (kv_heads,) dim], per-batch windows.
  dq, dk, dv = (jax.random.normal(kk_, s) for kk_, s in zip(
      jax.random.split(k[4], 3), [(2, 16, 64), (2, 256, 64), (2, 256, 64)]))
  gk, gv = (jax.random.normal(kk_, (2, 256, 2, 64)) for kk_ in jax.random.split(k[5], 2))
  start, length = jnp.array([8, 30], jnp.int32), jnp.array([200, 129], jnp.int32)
  paged_args, (pk, pv) = _paged_inputs(k[5])
  decode = dict(block_k=32, k_splits=4)
  return [
      ("softmax", "softmax", lambda m, i: lambda x: m.softmax(x, axis=-1, interpret=i), (x2,),
       lambda m: jax.nn.softmax(x2, axis=-1)),
      ("layer_norm", "layer_norm", lambda m, i: lambda x, w, b: m.layer_norm(x, w, b, interpret=i),
       (x3, w, b), lambda m: _ln_ref(x3, w, b)),
      ("rms_norm", "rms_norm", lambda m, i: lambda x, w, b: m.rms_norm(x, w, b, interpret=i),
       (x3, w, b), lambda m: _rms_ref(x3, w, b)),
      ("mha", "attention", lambda m, i: lambda q, k, v: m.mha(q, k, v, segment_ids=None, interpret=i),
       (q, kk, v), lambda m: m.mha_reference(q, kk, v, segment_ids=None)),
      # Data-dependent loop trip counts under jax.vmap (the ops vmap their kernels).
      ("mqa", "decode_attention",
       lambda m, i: lambda *a: m.mqa(*a, **decode, interpret=i), (dq, dk, dv, start, length),
       lambda m: m.mqa_reference(dq, dk, dv, start, length)),
      ("gqa", "decode_attention",
       lambda m, i: lambda *a: m.gqa(*a, **decode, interpret=i), (dq, gk, gv, start, length),
       lambda m: m.gqa_reference(dq, gk, gv, start, length)),
      ("paged_attention", "paged_attention",
       lambda m, i: lambda *a: m.paged_attention(*a, k_splits=2, pages_per_compute_block=2,
                                                 interpret=i), paged_args,
       lambda m: m.paged_attention_reference(paged_args[0], pk, pv, paged_args[4])),
  ]


# The ops whose custom_vjp backward passes are Pallas kernels.
WITH_BACKWARD = ("layer_norm", "rms_norm", "mha")

"""A generated Gluon kernel defines only what it uses: in every function of the module (each
thread's partition function and the kernel itself) every variable assigned and every named
layout declared is read somewhere in that function. Checked through Python's ``ast`` over the
generated source (``helpers.unused_definitions``), for kernels of the suite that cover what the
backend writes: a pipelined matmul (``emit_pipeline`` with wgmma), warp-specialized kernels
(``num_threads``: a producer and a consumer, JAX's three-thread Hopper matmul), JAX's attention
(forward, with the pipeline emitter, backward) and cluster kernels (a multicast operand, JAX's
matmul with a cluster dimension)."""
import functools

import jax
import jax.numpy as jnp
import pytest

import mgpu_ops
import pallax.mosaic_gpu as plgpu
from helpers import unused_definitions
from test_mosaic_gpu_clusters import cluster_matmul
from test_mosaic_gpu_gluon import producer_consumer
from test_mosaic_gpu_pipeline import quickstart_matmul

S = jax.ShapeDtypeStruct
F16 = jnp.float16


@functools.cache
def _module(name: str, num_sms: int = 132):
  return mgpu_ops.load(name, num_sms=num_sms)


def _hopper_matmul(cluster: str | None):
  hm = _module("hopper_matmul_mgpu")
  cfg = hm.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2, epi_tile_m=None,
                        epi_tile_n=None, wg_dimension=hm.MatmulDimension.N,
                        **({"cluster_dimension": getattr(hm.MatmulDimension, cluster)} if cluster else {}))
  return lambda a, b: hm.matmul(a, b, None, cfg), (S((1024, 512), F16), S((512, 1024), F16))


def _attention(kind: str):
  am = _module("attention_mgpu")
  s = S((1, 256, 2, 64), F16)
  cfg = am.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2, block_q_dkv=64,
                        block_kv_dkv=64, block_q_dq=64, block_kv_dq=64, causal=kind == "causal")
  if kind == "pipeline_emitter":
    f = lambda q, k, v: am.attention_with_pipeline_emitter(q, k, v, cfg)
  elif kind == "backward":
    f = lambda q, k, v: jax.vjp(lambda q, k, v: am.attention(q, k, v, cfg), q, k, v)[1](q)
  else:
    f = lambda q, k, v: am.attention(q, k, v, cfg)
  return f, (s, s, s)


KERNELS = {
    "pipelined_matmul": lambda: (quickstart_matmul, (S((128, 256), F16), S((256, 128), F16))),
    "producer_consumer": lambda: (producer_consumer, (S((320, 64), F16),)),
    "jax_hopper_matmul": lambda: _hopper_matmul(None),
    "jax_attention": lambda: _attention("causal"),
    "jax_attention_pipeline_emitter": lambda: _attention("pipeline_emitter"),
    "jax_attention_backward": lambda: _attention("backward"),
    "cluster_matmul": lambda: (functools.partial(cluster_matmul, cluster=(2,)),
                               (S((256, 64), F16), S((64, 128), F16))),
    "jax_hopper_matmul_cluster": lambda: _hopper_matmul("M"),
}


@pytest.mark.parametrize("name", list(KERNELS))
def test_every_function_defines_only_what_it_uses(name):
  f, args = KERNELS[name]()
  kernels = plgpu.lower(f, *args)
  assert kernels
  for k in kernels:
    assert unused_definitions(k.source) == [], k.name


def test_bindings_nothing_reads_are_left_out_with_their_layouts():
  """``statements.live`` over hand-made statements: a chain of bindings read by nothing goes
  (the layout only it takes is not declared), a block left empty gets ``pass``, an impure
  statement and what it reads stay."""
  from pallax._src.gluon import layouts as L
  from pallax._src.gluon import statements as st
  from pallax._src.gpu import expr as ex
  i32 = jnp.dtype(jnp.int32)
  blocked = L.blocked((64,), i32)
  name = lambda n: ex.Name(n, dtype=i32)
  full = ex.call("gl.full", ex.Token("[64]"), ex.Lit(0, dtype=i32),
                 layout=ex.Token(st.LayoutName("L0", blocked)), dtype=i32, shape=(64,))
  a = st.Binding("    a = gl.full(...)", "a", full, 1)
  b = st.Binding("    b = a + 1", "b", ex.binary("+", name("a"), ex.Lit(1, dtype=i32)), 1)
  c = st.Binding("        c = i // 2", "c", ex.binary("//", name("i"), ex.Lit(2, dtype=i32)), 2)
  d = st.Binding("    d = i * 2", "d", ex.binary("*", name("i"), ex.Lit(2, dtype=i32)), 1)
  lines = ["    for i in range(4):", c, a, b, d, "    gl.store(p, d)"]
  ((kept, layouts),) = st.live([(lines, set())], reads={"d", "p"})
  assert kept == ["    for i in range(4):", "        pass", d, "    gl.store(p, d)"]
  assert layouts == set()
  ((kept, layouts),) = st.live([(lines, set())], reads={"b", "d"})
  assert [k for k in kept if isinstance(k, st.Binding)] == [a, b, d] and layouts == {blocked}

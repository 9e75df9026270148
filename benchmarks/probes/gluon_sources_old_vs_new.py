"""Do the Gluon benchmark kernels (JAX's hopper matmul and attention, as
``gluon_old_vs_new.py`` times them) compile to the same PTX with an earlier pallax? Needs no GPU.
Identical PTX (debug information and ``.loc`` lines left out) needs no timing; a difference is
what ``gluon_old_vs_new.py`` must time on the GPU.

``python benchmarks/probes/gluon_sources_old_vs_new.py DIR`` prints, per kernel, hashes of its
Gluon source and PTX for ``DIR/pallax``; run it for the old and the new tree and compare."""
import hashlib
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
root = os.path.abspath(sys.argv[1])
pkg = os.path.join(root, "pallax")
spec = importlib.util.spec_from_file_location("pallax", os.path.join(pkg, "__init__.py"),
                                              submodule_search_locations=[pkg])
module = importlib.util.module_from_spec(spec)
sys.modules["pallax"] = module
spec.loader.exec_module(module)
sys.path[:0] = [os.path.dirname(HERE), os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests")]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import mgpu_ops  # noqa: E402
import hopper_matmul as mm  # noqa: E402
import pallax.mosaic_gpu as plgpu  # noqa: E402


def code_hash(ptx: str) -> str:
  code = [l for l in ptx.split(".section")[0].splitlines()
          if not l.strip().startswith((".loc", "//", "$L__")) and ".file" not in l]
  return hashlib.sha256("\n".join(code).encode()).hexdigest()[:16]


def show(name, fn, *args):
  for k in plgpu.lower(fn, *args):
    print(name, k.name, hashlib.sha256(k.source.encode()).hexdigest()[:16], code_hash(k.ptx),
          flush=True)


hm = mgpu_ops.load("hopper_matmul_mgpu", num_sms=132)
S = jax.ShapeDtypeStruct
a = S((8192, 8192), jnp.bfloat16)
for cname, fields in {**mm.CONFIGS, **mm.CLUSTER_CONFIGS}.items():
  cfg = hm.TuningConfig(**mm._fields(hm, fields))
  show(f"matmul {cname}", lambda x, y, cfg=cfg: hm.matmul(x, y, None, cfg), a, a)
am = mgpu_ops.load("attention_mgpu")
q = S((1, 4096, 16, 128), jnp.float16)
for causal in (False, True):
  cfg = am.TuningConfig(block_q=64, block_kv=128, max_concurrent_steps=2, causal=causal)
  show(f"attention causal={causal}", lambda q, k, v, cfg=cfg: am.attention(q, k, v, cfg), q, q, q)

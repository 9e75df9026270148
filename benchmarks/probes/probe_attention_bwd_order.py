"""JAX's attention_mgpu backward on pallax (Gluon), per kernel, against JAX's Mosaic GPU, with a
variant of the source whose dK/dV step releases LSE together with dO (the release moved down,
past the dV/dP wgmmas): what the barriers around Gluon 3.6's ``mbarrier.arrive`` still cost.
pallax already reads delta before releasing dO (``gluon/order.py``). A research
probe for issue 11; the variant is not something pallax does.

On the GPU machine: ``PYTHONPATH=$PWD python3 benchmarks/probes/probe_attention_bwd_order.py``.
"""
from __future__ import annotations

import builtins
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import attention_mgpu as attn_bench  # noqa: E402
import mgpu_ops  # noqa: E402
import probe_kernel_breakdown as pkb  # noqa: E402

# The LSE release moved down to just before dO's (both after the dV/dP wgmmas).
SINK_LSE = [
    ("      plgpu.barrier_arrive(lse_consumed_barrier)\n      pT = jnp.exp2",
     "      pT = jnp.exp2"),
    ("      dv_acc, dpT = pl.run_state(_compute)((plgpu.ACC.init(dv_acc), plgpu.ACC.init(zeros)))\n"
     "      plgpu.barrier_arrive(do_consumed_barrier)",
     "      dv_acc, dpT = pl.run_state(_compute)((plgpu.ACC.init(dv_acc), plgpu.ACC.init(zeros)))\n"
     "      plgpu.barrier_arrive(lse_consumed_barrier)\n"
     "      plgpu.barrier_arrive(do_consumed_barrier)"),
]


def load_patched(patches):
  """pallax's attention_mgpu with ``patches`` (old, new) applied to JAX's source text."""
  real = builtins.open

  class Patched:
    def __init__(self, f):
      self.f = f

    def read(self):
      s = self.f.read()
      for old, new in patches:
        assert old in s, old
        s = s.replace(old, new)
      return s

    def __enter__(self):
      return self

    def __exit__(self, *exc):
      self.f.close()

  builtins.open = lambda p, *a, **k: (Patched(real(p, *a, **k)) if str(p).endswith("attention_mgpu.py")
                                      else real(p, *a, **k))
  try:
    module = mgpu_ops.load("attention_mgpu")
  finally:
    builtins.open = real
  sys.modules.pop(module.__name__, None)
  return module


def main():
  pallax_am, jax_am = attn_bench.modules()
  mods = {"pallax": pallax_am, "pallax, LSE released with dO": load_patched(SINK_LSE),
          "jax_mosaic": jax_am}
  ks = jax.random.split(jax.random.key(42), 4)
  q, k, v, do = (jax.random.normal(x, (1, 4096, 16, 128), jnp.float16) for x in ks)
  blocks = dict(block_q_dkv=64, block_kv_dkv=64, block_q_dq=64, block_kv_dq=64)
  fns = {}
  for name, am in mods.items():
    cfg = am.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2, **blocks)
    fns[name] = jax.jit(attn_bench._with_grads(lambda q, k, v, am=am, cfg=cfg: am.attention(q, k, v, cfg)))
  outs = {n: np.asarray(f(q, k, v, do)) for n, f in fns.items()}
  for n, o in outs.items():
    print(f"{n}: max |diff| against pallax {float(np.max(np.abs(o - outs['pallax']))):.3g}")
  for rep in range(3):
    for name, per in pkb.breakdown(fns, (q, k, v, do)).items():
      top = sorted(per.items(), key=lambda t: -t[1])[:3]
      print(f"round {rep} {name:30s} total {sum(per.values()):7.1f} µs | "
            + " | ".join(f"{op[:24]} {us:6.1f}" for op, us in top), flush=True)


if __name__ == "__main__":
  main()

"""JAX's Mosaic GPU attention (``attention_mgpu``, which asks for ``approx_math=True``) on pallax's
Gluon backend with exact math (XLA's exp2: ``exp(x * ln 2)`` through libdevice) and with the fast
approximation (``ex2.approx.ftz``), beside JAX's Mosaic GPU: kernel time per call from a profiler
trace, in one process. A research probe: until ``gluon/codegen.generate`` passes the kernel's
``approx_math`` to its writer, the approximate variant sets the writer's flag by hand.

    PYTHONPATH=$PWD python3 benchmarks/probes/probe_gluon_math_modes.py
"""
import datetime
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import attention_mgpu as bench  # noqa: E402
import timing  # noqa: E402
from pallax._src.gluon import writer  # noqa: E402


def main():
  ours, theirs = bench.modules()
  print(f"device: {jax.devices()[0].device_kind}; {datetime.date.today()}")
  print("| work | pallax exact µs | pallax approx µs | JAX Mosaic µs | exact / approx | "
        "JAX / exact | JAX / approx | max |exact - approx| |")
  print("| --- | --- | --- | --- | --- | --- | --- | --- |")
  for causal in (False, True):
    for head_dim in (64, 128):
      ks = jax.random.split(jax.random.key(7), 3)
      q, k, v = (jax.random.normal(x, (1, 4096, 16, head_dim), jnp.float16) for x in ks)
      fns, outs = {}, {}
      for name, am, approx in (("exact", ours, False), ("approx", ours, True), ("jax", theirs, None)):
        cfg = am.TuningConfig(block_q=64, block_kv=128, max_concurrent_steps=2, causal=causal)
        f = jax.jit(lambda q, k, v, am=am, cfg=cfg: am.attention(q, k, v, cfg))
        init = writer.Writer.__init__
        if approx:   # lowered now, with the writer's flag on
          writer.Writer.__init__ = lambda self, *a, **kw: (init(self, *a, **kw),
                                                           setattr(self, "approx_math", True))[0]
        try:
          outs[name] = np.asarray(f(q, k, v), np.float32)
        finally:
          writer.Writer.__init__ = init
        fns[name] = f
      dev = {n: t * 1e6 for n, t in timing.device_times(fns, (q, k, v)).items()}
      diff = float(np.abs(outs["exact"] - outs["approx"]).max())
      print(f"| d {head_dim} {'causal' if causal else 'full'} | {dev['exact']:.1f} | {dev['approx']:.1f} | "
            f"{dev['jax']:.1f} | {dev['exact'] / dev['approx']:.3f}x | {dev['jax'] / dev['exact']:.3f}x | "
            f"{dev['jax'] / dev['approx']:.3f}x | {diff:.1e} |", flush=True)


if __name__ == "__main__":
  main()

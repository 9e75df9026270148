"""The optimized HLO that XLA runs for one of JAX's GPU ops on pallax and on JAX Pallas, side by
side: where a call's host time could go besides the kernel (extra ops, copies, buffers).

On the GPU machine: ``PYTHONPATH=$PWD python3 benchmarks/probes/probe_hlo_diff.py [OUT_DIR]``.
"""
from __future__ import annotations

import importlib
import os
import sys

import jax

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import jax_gpu_ops  # noqa: E402  (loads an op with pallax's imports)


def main():
  out = sys.argv[1] if len(sys.argv) > 1 else "."
  import jax.experimental.pallas.ops.gpu as gpu_ops
  ks = iter(jax.random.split(jax.random.key(0), 8))
  for op, shape in (("layer_norm", (1, 16, 1024)), ("rms_norm", (1, 16, 1024))):
    x, w, b = (jax.random.normal(next(ks), s) for s in (shape, shape[-1:], shape[-1:]))
    for side, mod in (("pallax", jax_gpu_ops.load(op)),
                      ("jax_pallas", importlib.import_module(f"{gpu_ops.__name__}.{op}"))):
      f = jax.jit(lambda x, w, b, m=mod: getattr(m, op)(x, w, b))
      text = f.lower(x, w, b).compile().as_text()
      with open(os.path.join(out, f"{op}_{side}.hlo"), "w") as fh:
        fh.write(text)
      entry = text[text.index("ENTRY"):]
      print(f"== {op} {side}: {entry.count(chr(10))} lines in ENTRY")
      print(entry[:3000])


if __name__ == "__main__":
  main()

"""pallax against an earlier version of itself, in one process: did a change move GPU time?

Run on the GPU machine:
``PYTHONPATH=$PWD python3 benchmarks/pallax_vs_previous.py --previous DIR``, where ``DIR/pallax``
is the earlier package (for example ``git archive <commit> pallax | tar -x -C DIR``). The earlier
package is copied under the name ``pallax_previous`` so that both import side by side; JAX Pallas
runs too, as a control for drift. The kernels and timing are those of ``triton_vs_pallas.py``.
The new version runs in both math modes: its default (XLA's functions, ``new``) and
``approx_math=True`` (``new approx``, the GPU's fast approximations; the previous version's
only mode was close to it before 57b5c80). Run it for every change to generated code.
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import sys
import tempfile

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import triton_vs_pallas as tvp  # noqa: E402
import timing  # noqa: E402


def import_previous(directory: str):
  """The package ``directory/pallax``, importable as ``pallax_previous``."""
  root = tempfile.mkdtemp(prefix="pallax_previous_")
  dst = os.path.join(root, "pallax_previous")
  shutil.copytree(os.path.join(directory, "pallax"), dst)
  for base, _, files in os.walk(dst):
    for f in files:
      if f.endswith(".py"):
        p = os.path.join(base, f)
        text = open(p).read()
        open(p, "w").write(re.sub(r"\bpallax(\.|\b)", r"pallax_previous\1", text))
  sys.path.insert(0, root)
  import pallax_previous
  import pallax_previous.triton
  return pallax_previous


def _cases(small: bool, key):
  n = 1024 if small else 8192
  x, y = (jax.random.normal(next(key), (n, n), jnp.float32).astype(jnp.bfloat16) for _ in range(2))
  yield "matmul bf16 (inner K loop)", lambda P, T: (lambda a, b: tvp.blocked_matmul(P, T, a, b)), (x, y)
  heads, seq, d = (2, 512, 128) if small else (16, 4096, 128)
  q, k, v = (jax.random.normal(next(key), (heads, seq, d), jnp.float32).astype(jnp.bfloat16)
             for _ in range(3))
  for causal in (False, True):
    yield (f"flash attention{' causal' if causal else ''}",
           lambda P, T, cz=causal: (lambda a, b, c: tvp.flash_attention(P, T, a, b, c, cz)), (q, k, v))
  r, c = (1024, 8192) if small else (16384, 8192)
  x = jax.random.normal(next(key), (r, c), jnp.float32)
  w, b = (jax.random.normal(next(key), (1, c), jnp.float32) for _ in range(2))
  yield "layer norm f32", lambda P, T: (lambda a, ww, bb: tvp.layer_norm(P, T, a, ww, bb)), (x, w, b)
  yield "softmax f32", lambda P, T: (lambda a: tvp.softmax(P, T, a)), (x,)
  n = 256 if small else 1024
  x, y = (jax.random.normal(next(key), (n, n), jnp.float32) for _ in range(2))
  yield "notebook matmul f32 (grid 2x2)", lambda P, T: (lambda a, b: tvp.notebook_matmul(P, T, a, b)), (x, y)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--previous", required=True)
  ap.add_argument("--rounds", type=int, default=15)
  ap.add_argument("--small", action="store_true")
  ap.add_argument("--out", default="")
  opts = ap.parse_args()
  import functools

  import pallax
  import pallax.triton
  prev = import_previous(opts.previous)
  from jax.experimental.pallas import triton as jplt
  impls = {"new": (pallax, pallax.triton.CompilerParams),
           "new_approx": (pallax, functools.partial(pallax.triton.CompilerParams, approx_math=True)),
           "previous": (prev, prev.triton.CompilerParams),
           "jax_pallas": (tvp.jax_pallas(), jplt.CompilerParams)}
  key = iter(jax.random.split(jax.random.key(7), 64))
  lines = [f"# pallax against its previous version ({opts.previous})", "",
           f"device: {jax.devices()[0].device_kind}; date: {datetime.date.today()}; wall: median of "
           f"{opts.rounds} interleaved rounds of 10 back-to-back calls; device: summed GPU time per "
           "call from a profiler trace (7 interleaved rounds). Ratios > 1: the new version is faster.",
           "", "| kernel | new / new approx / previous / JAX Pallas wall ms | previous / new wall | "
           "new / new approx / previous / JAX Pallas device ms | previous / new device | "
           "previous / new approx device | same result (new, new approx: rel. diff from previous) |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
  for name, make, args in _cases(opts.small, key):
    fns, outs = {}, {}
    for k, (P, T) in impls.items():
      try:
        f = jax.jit(make(P, T))
        outs[k] = jax.block_until_ready(f(*args))
        fns[k] = f
      except Exception as e:  # noqa: BLE001  (JAX Pallas fails on the notebook's blocks)
        print(f"{name}: {k} failed: {str(e).splitlines()[0][:120]}", flush=True)
    same = [timing.rel_err(outs[k], outs["previous"]) for k in ("new", "new_approx")]
    wall = timing.time_calls(fns, args, rounds=opts.rounds)
    dev = timing.device_times(fns, args)
    w = [wall[k][0] * 1e3 if k in wall else float("nan") for k in impls]
    d = [dev[k] * 1e3 if k in dev else float("nan") for k in impls]
    row = (f"| {name} | {w[0]:.3f} / {w[1]:.3f} / {w[2]:.3f} / {w[3]:.3f} | {w[2] / w[0]:.3f}x | "
           f"{d[0]:.3f} / {d[1]:.3f} / {d[2]:.3f} / {d[3]:.3f} | {d[2] / d[0]:.3f}x | "
           f"{d[2] / d[1]:.3f}x | {same[0]:.1e}, {same[1]:.1e} |")
    print(row, flush=True)
    lines.append(row)
  if opts.out:
    with open(opts.out, "w") as f:
      f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
  main()

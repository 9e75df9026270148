"""The timing library of the benchmarks (scripts here and in ``probes/``): wall time of
back-to-back calls in interleaved rounds, the GPU's own time per call from a profiler trace,
checked outputs, the table cells and the report.

Wall time per call: the median over rounds of (wall time of ``n`` back-to-back calls) / n, after
a warm-up, each round in a fresh random order. Kernel time: the summed device operations of a
batch of ``n`` calls in a ``jax.profiler`` trace, over ``n`` (median of rounds, each in a fresh
random order too).
"""
from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

# The repository root first on the path: a benchmark run from a checkout measures that checkout's
# pallax (the scripts that import this library rely on it).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def time_calls(fns: dict, args, n=10, rounds=15):
  """Median seconds per call of each function, timed in interleaved rounds, each round in a fresh
  random order, so that neither drift nor a place in the round favours one function."""
  for f in fns.values():
    jax.block_until_ready(f(*args))
    jax.block_until_ready(f(*args))
  samples = {k: [] for k in fns}
  order = list(fns)
  rng = np.random.default_rng(0)
  for _ in range(rounds):
    rng.shuffle(order)
    for k in order:
      f = fns[k]
      t = time.perf_counter()
      out = None
      for _ in range(n):
        out = f(*args)
      jax.block_until_ready(out)
      samples[k].append((time.perf_counter() - t) / n)
  return {k: (float(np.median(v)), float(np.percentile(v, 10)), float(np.percentile(v, 90)))
          for k, v in samples.items()}


def device_ops(fns: dict, args, n=10, rounds=7) -> dict:
  """Per function, per round: the device operations (kernels, copies; trace events with their
  ``name``, ``ts`` and ``dur`` in µs) that a batch of ``n`` back-to-back calls ran, from a
  profiler trace. Rounds interleave the functions, each round in a fresh random order (as
  ``time_calls``: a kernel that heats the GPU would otherwise slow the one after it in every
  round)."""
  import glob
  import gzip
  import json
  import tempfile
  d = tempfile.mkdtemp(prefix="pallax_trace_")
  batches = {k: [] for k in fns}
  order = list(fns)
  rng = np.random.default_rng(1)
  with jax.profiler.trace(d, create_perfetto_trace=True):
    for r in range(rounds):
      rng.shuffle(order)
      for k in order:
        f = fns[k]
        with jax.profiler.TraceAnnotation(f"batch {k} {r}"):
          out = None
          for _ in range(n):
            out = f(*args)
          jax.block_until_ready(out)
  (path,) = glob.glob(os.path.join(d, "**", "perfetto_trace.json.gz"), recursive=True)
  events = json.load(gzip.open(path))
  events = events["traceEvents"] if isinstance(events, dict) else events
  device_pids = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
                 and "GPU" in str(e.get("args", {}).get("name", ""))}
  device = [e for e in events if e.get("ph") == "X" and e.get("pid") in device_pids]
  for e in events:
    if e.get("ph") == "X" and e.get("name", "").startswith("batch "):
      _, k, _ = e["name"].split(" ")
      t0, t1 = e["ts"], e["ts"] + e["dur"]
      batches[k].append([x for x in device if t0 <= x["ts"] < t1])
  return batches


def device_times(fns: dict, args, n=10, rounds=7):
  """Median GPU time per call of each function, from a profiler trace: the summed durations of
  the device operations (kernels, copies) that a batch of ``n`` calls ran, over ``n``. Unlike
  the wall clock, this leaves out the host's dispatch and the wait for the result."""
  spans = {k: [sum(x["dur"] for x in ops) * 1e-6 / n for ops in batches]
           for k, batches in device_ops(fns, args, n, rounds).items()}
  return {k: float(np.median(v)) if v and min(v) > 0 else float("nan") for k, v in spans.items()}


def time_columns(seconds: float, wall_seconds: float, flops: float) -> str:
  """The table cells every kernel benchmark reports: kernel µs | TFLOP/s | wall µs."""
  return f"{seconds * 1e6:.1f} | {flops / seconds / 1e12:.0f} | {wall_seconds * 1e6:.1f}"


def checked_outputs(fns: dict, args, label: str) -> dict:
  """Each function's output as float32 NumPy. A function that fails is reported and dropped
  from ``fns`` (so that the timings skip it)."""
  outs = {}
  for name, f in list(fns.items()):
    try:
      outs[name] = np.asarray(f(*args), np.float32)
    except Exception as e:  # noqa: BLE001 (reported, and the kernel left out)
      print(f"{name} {label} failed: {type(e).__name__}: {str(e)[:400]}", flush=True)
      del fns[name]
  return outs


def write_report(lines: list, path: str | None):
  """Prints the report's lines and writes them to ``path`` too, if given."""
  text = "\n".join(lines)
  print(text)
  if path:
    with open(path, "w") as f:
      f.write(text + "\n")


def rel_err(a, b):
  a = np.asarray(jnp.asarray(a, jnp.float32), np.float64)
  b = np.asarray(jnp.asarray(b, jnp.float32), np.float64)
  return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))

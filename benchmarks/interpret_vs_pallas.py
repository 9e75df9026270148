"""Interpreter speed: pallax (interpret=True) vs jax.experimental.pallas (interpret=True).

Each kernel is written once, as a function of a ``pl`` module, and built with both
``pallax`` and ``jax.experimental.pallas``; the two builds run the same kernel source.

Method, per kernel and per implementation:
  * the pallas_call is wrapped in ``jax.jit``;
  * correctness: it runs on fresh random inputs (their own jax.random keys) and is compared
    with a plain-JAX reference; the error reported is max|out - ref| / max|ref|;
  * warm-up: compile + one run on the timing inputs (other keys);
  * timing: N calls of ``f(*args).block_until_ready()`` timed with ``time.perf_counter``;
    the median is reported. The two implementations alternate in rounds (the faster one
    called several times per round) so that both see the same machine load; at least
    --reps (>= 5) rounds, more while the per-kernel --budget allows.

Prints a table and the geometric-mean speedup (pallas ms / pallax ms), and writes the
table as markdown to benchmarks/results/interpret_vs_pallas_<YYYY-MM-DD>.md.

Run: cd /work/main && .venv/bin/python benchmarks/interpret_vs_pallas.py
Options: --reps N (minimum rounds, >= 5), --budget S (seconds per kernel), --only NAME[,NAME...],
--no-write, --verbose.
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))

import pallax  # noqa: E402
from jax.experimental import pallas as jax_pallas  # noqa: E402

IMPLS = {"pallax": pallax, "pallas": jax_pallas}

HIGHEST = jax.lax.Precision.HIGHEST
VERBOSE = False  # --verbose: full tracebacks of failing builds

# Known failures: a substring of the error -> a note (with a minimal repro) for the report.
KNOWN_ISSUES = {
    "Checkify does not support batched while-loops": """\
pallax with the default `interpret=True` (bounds checks on) fails on any kernel whose
`fori_loop` trip count depends on `pl.program_id` (a while loop with a per-program
predicate): the interpreter vmaps the parallel grid axes and wraps the result in
`checkify`, and JAX rejects checkify-of-vmap-of-while. `InterpretParams(check_bounds=False)`
or `InterpretParams(parallel=False)` both work (jax.experimental.pallas runs it fine).
Minimal repro:

```python
import jax, jax.numpy as jnp
import pallax as pl

def kernel(x_ref, o_ref):
  x = x_ref[...]
  o_ref[...] = jax.lax.fori_loop(0, pl.program_id(0) + 1, lambda i, a: a + x,
                                 jnp.zeros((8,), jnp.float32))

f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((32,), jnp.float32), grid=(4,),
                   in_specs=[pl.BlockSpec((8,), lambda i: (i,))],
                   out_specs=pl.BlockSpec((8,), lambda i: (i,)), interpret=True)
f(jnp.ones((32,), jnp.float32))
# ValueError: Checkify does not support batched while-loops (checkify-of-vmap-of-while).
```""",
}


# --- kernels: each builder takes a `pl` module and returns a callable of the inputs ----

def build_add(pl, interpret=True, n=1 << 20, block=1024):
  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]

  spec = pl.BlockSpec((block,), lambda i: (i,))
  return pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((n,), jnp.float32),
      grid=(n // block,), in_specs=[spec, spec], out_specs=spec, interpret=interpret)


def inputs_add(key, n=1 << 20):
  kx, ky = jax.random.split(key)
  return (jax.random.normal(kx, (n,), jnp.float32), jax.random.normal(ky, (n,), jnp.float32))


def ref_add(x, y):
  return x + y


def build_matmul(pl, interpret=True, m=1024, k=1024, n=1024, bm=64, bn=64, bk=128):
  def kernel(x_ref, y_ref, o_ref):
    def body(c, acc):
      start = pl.multiple_of(c * bk, bk)
      xs = x_ref[:, pl.ds(start, bk)]
      ys = y_ref[pl.ds(start, bk), :]
      return acc + jnp.dot(xs, ys, preferred_element_type=jnp.float32, precision=HIGHEST)

    acc = jax.lax.fori_loop(0, k // bk, body, jnp.zeros((bm, bn), jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)

  return pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
      grid=(m // bm, n // bn),
      in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                pl.BlockSpec((k, bn), lambda i, j: (0, j))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
      interpret=interpret)


def inputs_matmul(key, m=1024, k=1024, n=1024):
  kx, ky = jax.random.split(key)
  return (jax.random.normal(kx, (m, k), jnp.float32), jax.random.normal(ky, (k, n), jnp.float32))


def ref_matmul(x, y):
  return jnp.dot(x, y, precision=HIGHEST, preferred_element_type=jnp.float32)


def build_matmul_kgrid(pl, interpret=True, m=1024, k=1024, n=1024, bm=128, bn=128, bk=256):
  """K in the grid (last, 'arbitrary' axis); the f32 output block is the accumulator."""
  def kernel(x_ref, y_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
      o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32,
                          precision=HIGHEST)

  return pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
      grid=(m // bm, n // bn, k // bk),
      in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
      interpret=interpret)


def build_softmax(pl, interpret=True, rows=4096, cols=1024, br=64):
  def kernel(x_ref, o_ref):
    x = x_ref[...]
    x = x - jnp.max(x, axis=-1, keepdims=True)
    e = jnp.exp(x)
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)

  spec = pl.BlockSpec((br, cols), lambda i: (i, 0))
  return pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((rows, cols), jnp.float32),
      grid=(rows // br,), in_specs=[spec], out_specs=spec, interpret=interpret)


def inputs_softmax(key, rows=4096, cols=1024):
  return (jax.random.normal(key, (rows, cols), jnp.float32) * 3.0,)


def ref_softmax(x):
  return jax.nn.softmax(x, axis=-1)


def build_layernorm(pl, interpret=True, rows=4096, cols=1024, br=64, eps=1e-5):
  def kernel(x_ref, w_ref, b_ref, o_ref):
    x = x_ref[...]
    mean = jnp.mean(x, axis=-1, keepdims=True)
    xc = x - mean
    var = jnp.mean(xc * xc, axis=-1, keepdims=True)
    o_ref[...] = xc * jax.lax.rsqrt(var + eps) * w_ref[...] + b_ref[...]

  spec = pl.BlockSpec((br, cols), lambda i: (i, 0))
  vec = pl.BlockSpec((1, cols), lambda i: (0, 0))
  return pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((rows, cols), jnp.float32),
      grid=(rows // br,), in_specs=[spec, vec, vec], out_specs=spec, interpret=interpret)


def inputs_layernorm(key, rows=4096, cols=1024):
  kx, kw, kb = jax.random.split(key, 3)
  return (jax.random.normal(kx, (rows, cols), jnp.float32) * 2.0 + 0.5,
          jax.random.normal(kw, (1, cols), jnp.float32),
          jax.random.normal(kb, (1, cols), jnp.float32))


def ref_layernorm(x, w, b, eps=1e-5):
  mean = jnp.mean(x, axis=-1, keepdims=True)
  var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
  return (x - mean) / jnp.sqrt(var + eps) * w + b


FA = dict(batch=1, heads=4, seq=1024, dim=64, block_q=128, block_k=128)


def build_flash(pl, interpret=True, causal=False, batch=FA["batch"], heads=FA["heads"], seq=FA["seq"],
                dim=FA["dim"], block_q=FA["block_q"], block_k=FA["block_k"]):
  """Flash-attention forward: grid (batch*heads, seq // block_q); online softmax over kv blocks."""
  bh = batch * heads
  scale = 1.0 / math.sqrt(dim)

  def kernel(q_ref, k_ref, v_ref, o_ref):
    qi = pl.program_id(1)
    q = q_ref[0] * scale                                     # (block_q, dim)

    def body(j, carry):
      m_prev, l_prev, acc = carry
      start = pl.multiple_of(j * block_k, block_k)
      k = k_ref[0, pl.ds(start, block_k), :]                 # (block_k, dim)
      v = v_ref[0, pl.ds(start, block_k), :]
      s = jnp.dot(q, k.T, preferred_element_type=jnp.float32, precision=HIGHEST)
      if causal:
        rows = qi * block_q + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)
        cols = start + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)
        s = jnp.where(rows >= cols, s, -jnp.inf)
      m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
      p = jnp.exp(s - m_new)
      alpha = jnp.exp(m_prev - m_new)
      l_new = alpha * l_prev + jnp.sum(p, axis=1, keepdims=True)
      acc = acc * alpha + jnp.dot(p, v, preferred_element_type=jnp.float32, precision=HIGHEST)
      return m_new, l_new, acc

    init = (jnp.full((block_q, 1), -jnp.inf, jnp.float32),
            jnp.zeros((block_q, 1), jnp.float32),
            jnp.zeros((block_q, dim), jnp.float32))
    if causal:
      n_kv = ((qi + 1) * block_q + block_k - 1) // block_k   # dynamic trip count
    else:
      n_kv = seq // block_k
    _, l, acc = jax.lax.fori_loop(0, n_kv, body, init)
    o_ref[0] = (acc / l).astype(o_ref.dtype)

  q_spec = pl.BlockSpec((1, block_q, dim), lambda b, i: (b, i, 0))
  kv_spec = pl.BlockSpec((1, seq, dim), lambda b, i: (b, 0, 0))
  call = pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((bh, seq, dim), jnp.float32),
      grid=(bh, seq // block_q), in_specs=[q_spec, kv_spec, kv_spec], out_specs=q_spec,
      interpret=interpret)

  def fn(q, k, v):  # (batch, heads, seq, dim)
    out = call(q.reshape(bh, seq, dim), k.reshape(bh, seq, dim), v.reshape(bh, seq, dim))
    return out.reshape(batch, heads, seq, dim)
  return fn


def inputs_flash(key):
  shape = (FA["batch"], FA["heads"], FA["seq"], FA["dim"])
  kq, kk, kv = jax.random.split(key, 3)
  return tuple(jax.random.normal(k_, shape, jnp.float32) for k_ in (kq, kk, kv))


def ref_attention(q, k, v, causal=False):
  s = jnp.einsum("bhqd,bhkd->bhqk", q, k, precision=HIGHEST) / math.sqrt(q.shape[-1])
  if causal:
    n = q.shape[2]
    s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), s, -jnp.inf)
  return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v, precision=HIGHEST)


NO_BOUNDS_CHECK = pallax.InterpretParams(check_bounds=False)


def causal_flash(pl, interpret=True):
  return build_flash(pl, interpret=interpret, causal=True)


def ref_causal(q, k, v):
  return ref_attention(q, k, v, causal=True)


# name, builder(pl, interpret), inputs(key), reference, description, options.
# options: "interpret": {impl: value} overriding interpret=True for one implementation;
#          "gmean": False keeps the row out of the geometric mean (non-default settings).
KERNELS = [
    ("add", build_add, inputs_add, ref_add,
     "elementwise add, 2^20 f32, grid 1024, block 1024", {}),
    ("matmul", build_matmul, inputs_matmul, ref_matmul,
     "1024^3 f32 matmul, grid 16x16, blocks 64x1024 / 1024x64, fori_loop over K chunks of 128 "
     "(pl.ds slices, f32 accumulator)", {}),
    ("matmul_kgrid", build_matmul_kgrid, inputs_matmul, ref_matmul,
     "1024^3 f32 matmul, grid 8x8x4 (K in grid), blocks 128x256 / 256x128, f32 output block "
     "as accumulator, pl.when init", {}),
    ("softmax", build_softmax, inputs_softmax, ref_softmax,
     "row softmax 4096x1024 f32, grid 64, block 64x1024", {}),
    ("layernorm", build_layernorm, inputs_layernorm, ref_layernorm,
     "row layernorm 4096x1024 f32 (+ weight, bias), grid 64, block 64x1024", {}),
    ("flash_attn", build_flash, inputs_flash, ref_attention,
     "flash attention fwd, B1 H4 S1024 D64, bq=bk=128, non-causal, grid (4, 8), fori_loop over "
     "8 kv blocks (pl.ds slices of whole-sequence K/V blocks)", {}),
    ("flash_attn_causal", causal_flash, inputs_flash, ref_causal,
     "as flash_attn but causal: fori_loop trip count depends on pl.program_id(1)", {}),
    ("flash_attn_causal*", causal_flash, inputs_flash, ref_causal,
     "as flash_attn_causal, but pallax runs with interpret=pallax.InterpretParams("
     "check_bounds=False) (workaround, see Notes); not in the geometric mean",
     {"interpret": {"pallax": NO_BOUNDS_CHECK}, "gmean": False}),
]


# --- measurement -------------------------------------------------------------------------

def rel_err(out, ref) -> float:
  out = np.asarray(out, np.float64)
  ref = np.asarray(ref, np.float64)
  if not np.all(np.isfinite(out)):
    return float("inf")
  return float(np.max(np.abs(out - ref)) / max(np.max(np.abs(ref)), 1e-30))


def time_interleaved(fns: dict, args, min_reps: int, budget_s: float) -> dict:
  """Times the implementations in alternation so that both see the same machine load.

  Each round calls every implementation; after the first round a faster implementation is
  called several times per round (up to 20, about as long as the slowest one's call), so it
  gets more samples. Runs at least ``min_reps`` rounds, more while ``budget_s`` lasts (at
  most 50). Returns {impl: (median s, samples, min s)}."""
  for fn in fns.values():                    # warm-up: compile + one run on the timing inputs
    fn(*args).block_until_ready()
  times = {impl: [] for impl in fns}
  inner = {impl: 1 for impl in fns}
  start = time.perf_counter()
  rounds = 0
  while True:
    for impl, fn in fns.items():
      for _ in range(inner[impl]):
        t = time.perf_counter()
        fn(*args).block_until_ready()
        times[impl].append(time.perf_counter() - t)
    rounds += 1
    meds = {impl: statistics.median(t) for impl, t in times.items()}
    slowest = max(meds.values())
    inner = {impl: max(1, min(20, int(slowest / max(m, 1e-9)))) for impl, m in meds.items()}
    round_s = sum(meds[i] * inner[i] for i in fns)
    if rounds >= min_reps and (rounds >= 50 or time.perf_counter() - start + round_s > budget_s):
      break
  return {impl: (statistics.median(t), len(t), min(t)) for impl, t in times.items()}


def run_kernel(name, builder, make_inputs, ref, options, seed, min_reps, budget_s):
  key = jax.random.key(seed)
  k_check, k_time = jax.random.split(key)
  check_args = make_inputs(k_check)
  time_args = make_inputs(k_time)
  expected = jax.jit(ref)(*check_args)
  row = {"name": name, "gmean": options.get("gmean", True)}
  fns = {}
  for impl, pl in IMPLS.items():             # build + correctness check on fresh inputs
    try:
      fn = jax.jit(builder(pl, interpret=options.get("interpret", {}).get(impl, True)))
      t0 = time.perf_counter()
      out = fn(*check_args).block_until_ready()
      row[f"{impl}_first_s"] = time.perf_counter() - t0     # trace + compile + run
      row[f"{impl}_err"] = rel_err(out, expected)
      fns[impl] = fn
    except Exception as e:  # a failing implementation is reported, not fatal
      row[f"{impl}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
      if VERBOSE:
        traceback.print_exc()
  if fns:
    for impl, (med, reps, best) in time_interleaved(fns, time_args, min_reps, budget_s).items():
      row[f"{impl}_ms"], row[f"{impl}_reps"], row[f"{impl}_min_ms"] = med * 1e3, reps, best * 1e3
  for impl in IMPLS:
    print(f"  {name:18s} {impl:7s} "
          + (f"{row[f'{impl}_ms']:9.2f} ms (median of {row[f'{impl}_reps']}, min "
             f"{row[f'{impl}_min_ms']:.2f}), first call {row[f'{impl}_first_s']:.2f} s, "
             f"rel err {row[f'{impl}_err']:.2e}"
             if f"{impl}_ms" in row else f"FAILED: {row[f'{impl}_error']}"), flush=True)
  if "pallax_ms" in row and "pallas_ms" in row:
    row["speedup"] = row["pallas_ms"] / row["pallax_ms"]
  return row


def fmt(v, spec):
  return "FAIL" if v is None else format(v, spec)


def table(rows, markdown: bool) -> str:
  head = ["kernel", "pallax ms", "pallas ms", "speedup (pallas/pallax)", "pallax rel err",
          "pallas rel err", "pallax 1st call s", "pallas 1st call s", "samples (pallax/pallas)"]
  body = []
  for r in rows:
    body.append([r["name"], fmt(r.get("pallax_ms"), ".2f"), fmt(r.get("pallas_ms"), ".2f"),
                 fmt(r.get("speedup"), ".2f") + ("x" if "speedup" in r else ""),
                 fmt(r.get("pallax_err"), ".1e"), fmt(r.get("pallas_err"), ".1e"),
                 fmt(r.get("pallax_first_s"), ".2f"), fmt(r.get("pallas_first_s"), ".2f"),
                 f"{r.get('pallax_reps', '-')}/{r.get('pallas_reps', '-')}"])
  if markdown:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(b) + " |" for b in body]
    return "\n".join(lines)
  widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
  lines = ["  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(head, widths)))]
  lines.append("  ".join("-" * w for w in widths))
  lines += ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(b, widths)))
            for b in body]
  return "\n".join(lines)


def cpu_model() -> str:
  try:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return "unknown"


def machine() -> dict:
  return {
      "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S"),
      "platform.processor()": platform.processor() or "(empty)",
      "platform.machine()": platform.machine(),
      "CPU model (/proc/cpuinfo)": cpu_model(),
      "platform.platform()": platform.platform(),
      "os.cpu_count()": os.cpu_count(),
      "usable CPUs (sched_getaffinity)": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "n/a",
      "python": platform.python_version(),
      "jax": jax.__version__,
      "jaxlib": getattr(jax.lib, "__version__", None) or __import__("jaxlib").__version__,
      "pallax": pallax.__version__,
      "jax backend": jax.default_backend(),
      "devices": ", ".join(str(d) for d in jax.devices()),
      "load average at start (1/5/15 min)": load_average(),
  }


def load_average() -> str:
  try:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())
  except OSError:
    return "n/a"


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--reps", type=int, default=5, help="minimum timed repetitions (>= 5)")
  ap.add_argument("--budget", type=float, default=4.0,
                  help="seconds of timed rounds per kernel (both implementations) beyond --reps")
  ap.add_argument("--only", default="", help="comma-separated kernel names")
  ap.add_argument("--no-write", action="store_true", help="do not write the markdown file")
  ap.add_argument("--verbose", action="store_true", help="print tracebacks of failing builds")
  args = ap.parse_args(argv)
  global VERBOSE
  VERBOSE = args.verbose
  min_reps = max(5, args.reps)
  chosen = [k for k in KERNELS if not args.only or k[0] in args.only.split(",")]

  info = machine()
  print("interpret=True: pallax vs jax.experimental.pallas")
  for k, v in info.items():
    print(f"  {k}: {v}")
  t_start = time.perf_counter()
  rows = []
  for seed, (name, builder, make_inputs, ref, desc, options) in enumerate(chosen):
    rows.append(run_kernel(name, builder, make_inputs, ref, options, 1000 + 17 * seed, min_reps,
                           args.budget))
  total = time.perf_counter() - t_start
  info["load average at end (1/5/15 min)"] = load_average()

  in_gmean = [r["name"] for r in rows if "speedup" in r and r["gmean"]]
  speedups = [r["speedup"] for r in rows if "speedup" in r and r["gmean"]]
  no_add = [r["speedup"] for r in rows if "speedup" in r and r["gmean"] and r["name"] != "add"]
  gmean_no_add = math.exp(sum(map(math.log, no_add)) / len(no_add)) if no_add else float("nan")
  gmean = math.exp(sum(map(math.log, speedups)) / len(speedups)) if speedups else float("nan")
  print()
  print(table(rows, markdown=False))
  print(f"\ngeometric-mean speedup (pallas ms / pallax ms) over {len(speedups)} kernels "
        f"({', '.join(in_gmean)}): {gmean:.2f}x")
  print(f"  without add (whose ratio dominates): {gmean_no_add:.2f}x over {len(no_add)} kernels")
  print(f"total benchmark time: {total:.1f} s; load average at end: {info['load average at end (1/5/15 min)']}"
        f" ({os.cpu_count()} CPUs; other processes on the machine disturb the timings)")
  failures = [(r["name"], impl, r[f"{impl}_error"]) for r in rows for impl in IMPLS
              if f"{impl}_error" in r]
  for name, impl, err in failures:
    print(f"FAILED {name} on {impl}: {err}")
  notes = [note for key, note in KNOWN_ISSUES.items() if any(key in e for _, _, e in failures)]
  for note in notes:
    print("\n" + note)

  if not args.no_write:
    out_dir = Path(__file__).resolve().parent / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"interpret_vs_pallas_{datetime.date.today().isoformat()}.md"
    md = [f"# Interpreter: pallax vs jax.experimental.pallas (interpret=True)", "",
          "Generated by `benchmarks/interpret_vs_pallas.py` (same kernel source built with both "
          "modules, each pallas_call under `jax.jit`).", "", "## Machine", ""]
    md += [f"- {k}: {v}" for k, v in info.items()]
    md += ["", "## Method", "",
           "- correctness: each build runs on fresh random inputs (own `jax.random` keys) and is "
           "compared with a plain-JAX reference; *rel err* = max|out - ref| / max|ref|.",
           "- warm-up: compile + one run on the timing inputs (different keys); *1st call s* is the "
           "first call of the jitted function (trace + compile + run).",
           f"- timing: median of N >= {min_reps} calls of `f(*args).block_until_ready()`, each timed "
           "with `time.perf_counter`. The two implementations alternate in rounds so that both see "
           "the same machine load; the faster one is called several times per round (up to 20) to "
           f"get more samples. At least {min_reps} rounds, more while a {args.budget:g} s budget "
           "per kernel allows (at most 50); samples per implementation in the last column.",
           "- a load average above this run's own ~1-2 means other processes shared the CPUs: "
           "absolute times are then inflated and noisy; the alternation keeps the ratios "
           "comparable.",
           "- speedup = pallas ms / pallax ms (> 1: pallax faster). Both at their default "
           "`interpret=True` settings (for pallax that includes run-time bounds checks).",
           "", "## Kernels", ""]
    md += [f"- `{name}`: {desc}" for name, _, _, _, desc, _ in chosen]
    md += ["", "## Results", "", table(rows, markdown=True), "",
           f"Geometric-mean speedup over {len(speedups)} kernels ({', '.join(in_gmean)}): "
           f"**{gmean:.2f}x**", "",
           f"Without `add` (whose ratio dominates the mean): {gmean_no_add:.2f}x over "
           f"{len(no_add)} kernels.", "",
           f"Total benchmark time: {total:.1f} s"]
    if failures:
      md += ["", "## Failures", ""] + [f"- `{n}` on {i}: {e}" for n, i, e in failures]
    if notes:
      md += ["", "## Notes", ""] + notes
    path.write_text("\n".join(md) + "\n")
    print(f"wrote {path.relative_to(ROOT)}")
  return 0  # failures are reported in the table and the file, not through the exit status


if __name__ == "__main__":
  sys.exit(main())

"""Host-side trace events per call, pallax vs JAX Pallas softmax on a tiny input (host-bound).

    PYTHONPATH=$PWD python3 benchmarks/probes/probe_host_events.py
"""
import glob, gzip, json, os, sys, time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np
import jax, jax.numpy as jnp
import triton_vs_pallas as tvp
import pallax, pallax.triton as plt_
from jax.experimental.pallas import triton as jplt
JP = tvp.jax_pallas()
OUT = os.environ.get("OUT", "/tmp")
x = jax.random.normal(jax.random.key(int(time.time())), (8, 8192), jnp.float32)
fns = {"pallax": jax.jit(lambda a: tvp.softmax(pallax, plt_.CompilerParams, a)),
       "jax_pallas": jax.jit(lambda a: tvp.softmax(JP, jplt.CompilerParams, a))}
for f in fns.values():
  for _ in range(5): jax.block_until_ready(f(x))
# dispatch-only and blocking per call, no profiler
for k, f in fns.items():
  for mode in ("async", "sync"):
    ts = []
    for r in range(20):
      t = time.perf_counter()
      for _ in range(100):
        o = f(x)
        if mode == "sync": o.block_until_ready()
      jax.block_until_ready(o)
      ts.append((time.perf_counter() - t) / 100)
    print(f"{k:11} {mode}: {np.median(ts)*1e6:.2f} us/call (p10 {np.percentile(ts,10)*1e6:.2f})")
N = 200
d = os.path.join(OUT, "trace_host")
with jax.profiler.trace(d, create_perfetto_trace=True):
  for k, f in fns.items():
    with jax.profiler.TraceAnnotation(f"ROUND_{k}"):
      o = None
      for _ in range(N):
        o = f(x)
      jax.block_until_ready(o)
    time.sleep(0.02)
p = glob.glob(os.path.join(d, "**", "*perfetto_trace.json.gz"), recursive=True)
ev = json.load(gzip.open(p[0]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
X = [e for e in ev if e.get("ph") == "X"]
agg = {}
for k in fns:
  rnd = [e for e in X if e["name"] == f"ROUND_{k}"][0]
  t0, t1 = rnd["ts"], rnd["ts"] + rnd["dur"]
  print(f"{k}: round {rnd['dur']/N:.2f} us/call")
  for e in X:
    if t0 <= e["ts"] <= t1 and not e["name"].startswith("ROUND"):
      a = agg.setdefault(e["name"][:70], {}).setdefault(k, [])
      a.append(e["dur"])
rows = []
for nm, d_ in agg.items():
  tot = {k: sum(d_.get(k, [])) / N for k in fns}
  cnt = {k: len(d_.get(k, [])) / N for k in fns}
  rows.append((max(tot.values()), nm, tot, cnt))
rows.sort(reverse=True)
print(f"{'event':70} {'pallax us/call (n/call)':>24} {'jax_pallas':>20}")
for _, nm, tot, cnt in rows[:45]:
  print(f"{nm:70} {tot['pallax']:9.2f} ({cnt['pallax']:.1f}) {tot['jax_pallas']:12.2f} ({cnt['jax_pallas']:.1f})")

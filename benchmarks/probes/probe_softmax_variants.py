"""Variants of the benchmark's softmax kernel (pallax's generated source, edited, or compiled or
launched differently) against JAX Pallas's kernel: GPU time per kernel from one profiler trace,
interleaved. A research probe: it patches pallax internals.

    PYTHONPATH=$PWD python3 benchmarks/probes/probe_softmax_variants.py
"""
import dataclasses, glob, gzip, json, os, sys, time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np
import jax, jax.numpy as jnp
import triton_vs_pallas as tvp
import timing
import pallax, pallax.triton as plt_
from pallax._src.triton import compile as pc
from jax.experimental.pallas import triton as jplt
JP = tvp.jax_pallas()
OUT = os.environ.get("OUT", "/tmp")

VARIANTS = {  # name -> (source edits, extra triton options; "_smem": launch with this much shared
              # memory, to cap the CTAs per SM; "_strip": drop the PTX's debug info)
  "base": ([], {}),
  "maxnreg40": ([], {"maxnreg": 40}),
  "maxnreg32": ([], {"maxnreg": 32}),
  "tlmax": ([("tl.reduce(x, 1, _max)", "tl.max(x, 1)")], {}),
  "recip": ([("v3 = v2 / bcast2", "v3 = v2 * (1.0 / bcast2)")], {}),
  "tlexp": ([("v2 = _exp2(v * 1.4426950408889634)", "v2 = tl.exp(v)")], {}),
  "nodebug": ([], {"_strip": True}),
  "smem50k": ([], {"_smem": 50 * 1024}),   # 4 CTAs/SM, as JAX Pallas's kernel gets (56 registers)
  "smem70k": ([], {"_smem": 70 * 1024}),   # 3 CTAs/SM
  # cache hints: the output is written once and not read back here, the input read once
  "st_cs": ([(", v3)", ", v3, cache_modifier='.cs')")], {}),
  "st_evf": ([(", v3)", ", v3, eviction_policy='evict_first')")], {}),
  "ld_cg": ([("[None, :])\n", "[None, :], cache_modifier='.cg')\n")], {}),
  "ldst_cs": ([("[None, :])\n", "[None, :], cache_modifier='.cs')\n"),
               (", v3)", ", v3, cache_modifier='.cs')")], {}),
}
current = {}
orig_compile = pc._compile
def patched_compile(ks, cc, entry):
  edits, extra = current["v"]
  src = ks.source
  for a, b in edits:
    assert a in src, (a, src)
    src = src.replace(a, b)
  name = "k_" + current["name"]
  src = src.replace("def kernel(", f"def {name}(")
  ks = dataclasses.replace(ks, source=src, name=name)
  import triton
  real = triton.compile
  def comp(src_, target, options):
    o = dict(options); o.update({k: v for k, v in extra.items() if not k.startswith("_")})
    return real(src_, target=target, options=o)
  triton.compile = comp
  try:
    c = orig_compile(ks, cc, entry + "_" + current["name"])
  finally:
    triton.compile = real
  if extra.get("_smem"):
    c = dataclasses.replace(c, shared_mem_bytes=extra["_smem"])
  if extra.get("_strip"):
    ptx = "\n".join(l for l in c.ptx.splitlines() if not l.strip().startswith(".loc"))
    ptx = ptx.split("\t.section\t.debug_abbrev")[0]
    c = dataclasses.replace(c, ptx=ptx)
  return c
pc._compile = patched_compile
orig_key = pc._key
pc._key = lambda ks, cc: orig_key(ks, cc) + current["name"]
pc._memory.clear()
os.environ["PALLAX_CACHE_DIR"] = "/tmp/pallax_probe_cache"

x = jax.random.normal(jax.random.key(int(time.time())), (16384, 8192), jnp.float32)
ref = jax.nn.softmax(x, axis=1)
fns = {}
for vn, v in VARIANTS.items():
  current["v"], current["name"] = v, vn
  pc._memory.clear()
  f = jax.jit(lambda a: tvp.softmax(pallax, plt_.CompilerParams, a))
  try:
    err = timing.rel_err(f(x), ref)
  except Exception as e:
    print(vn, "FAILED", type(e).__name__, str(e)[:200]); continue
  print(vn, f"err {err:.2e}", flush=True)
  fns["k_" + vn] = f
fns["kernel"] = jax.jit(lambda a: tvp.softmax(JP, jplt.CompilerParams, a))
print("jax_pallas err", f"{timing.rel_err(fns['kernel'](x), ref):.2e}")
for f in fns.values():
  jax.block_until_ready(f(x))
d = os.path.join(OUT, "trace")
with jax.profiler.trace(d, create_perfetto_trace=True):
  for r in range(6):
    for k, f in fns.items():
      out = None
      for _ in range(10):
        out = f(x)
      jax.block_until_ready(out)
p = glob.glob(os.path.join(d, "**", "*perfetto_trace.json.gz"), recursive=True)
ev = json.load(gzip.open(p[0]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
durs = {}
for e in ev:
  if e.get("ph") == "X" and e.get("name") in fns and e.get("dur", 0) > 50:
    durs.setdefault(e["name"], []).append(e["dur"])
base = np.median(durs["kernel"])
print(f"{'variant':12} {'n':>4} {'median us':>10} {'p10':>8} {'p90':>8}  vs JAX Pallas")
for k, v in durs.items():
  v = np.array(v)
  print(f"{k:12} {len(v):4d} {np.median(v):10.1f} {np.percentile(v,10):8.1f} {np.percentile(v,90):8.1f}  {base/np.median(v):.4f}x")

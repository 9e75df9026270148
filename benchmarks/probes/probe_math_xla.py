"""Which Triton function computes XLA's float32 math bit for bit? A research probe for issue 31.

For each lax math function, candidate Triton expressions (libdevice, Triton's own ``tl.*``, the
PTX approximations) run on the same inputs as XLA's own kernel on this GPU (random values of the
function's domain, random bit patterns, log-uniform magnitudes, edge values: zeros, denormals,
extremes, infinities, NaN), compiled with libdevice's flush-to-zero switch on (Triton's default)
and off (XLA's). Prints, per candidate: how many results differ from XLA's (all, and those whose
input and result are normal numbers), the largest distance in ulps, and the largest distance from
the float64 truth on the domain's random values. float16/bfloat16: the float32 candidate rounded.
XLA's generated LLVM IR and PTX go to ``$OUT/xla_dump.tgz`` (which libdevice functions it calls).

    XLA_FLAGS=--xla_dump_to=/tmp/xla_dump PYTHONPATH=$PWD python3 benchmarks/probes/probe_math_xla.py
"""
import importlib.util
import json
import math
import os
import sys
import tarfile
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import torch
import triton
from jax import lax

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "tests"))
from gpu_math import ulps  # noqa: E402

from pallax._src.triton.codegen import PROLOGUE  # noqa: E402  (_exp, _exp2)

OUT = os.environ.get("OUT", "/tmp")
LOG2E = "1.4426950408889634"


def _asm(op: str) -> str:
  """The PTX instruction ``op`` on x."""
  return (f'tl.inline_asm_elementwise("{op} $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, '
          'pack=1)')


# name -> (lax function, domain, {candidate: expression of x (and y)})
LD = "libdevice."
UNARY = {
    "exp": (lax.exp, (-90, 90), {"ld": "libdevice.exp(x)", "tl": "tl.exp(x)", "exp3ulp": "_exp(x)",
                                 "ex2ftz": f"_exp2(x * {LOG2E})", "fast": "libdevice.fast_expf(x)"}),
    "exp2": (lax.exp2, (-130, 130), {"ld": "libdevice.exp2(x)", "tl": "tl.exp2(x)", "ex2ftz": "_exp2(x)"}),
    "log": (lax.log, (1e-30, 1e30), {"ld": "libdevice.log(x)", "tl": "tl.log(x)",
                                     "lg2ftz": _asm("lg2.approx.ftz.f32") + " * 0.6931471805599453",
                                     "fast": "libdevice.fast_logf(x)"}),
    "log2": (lax.log2, (1e-30, 1e30), {"ld": "libdevice.log2(x)", "tl": "tl.log2(x)",
                                       "lg2ftz": _asm("lg2.approx.ftz.f32")}),
    "log1p": (lax.log1p, (-0.99, 1e4), {"ld": "libdevice.log1p(x)"}),
    "expm1": (lax.expm1, (-20, 20), {"ld": "libdevice.expm1(x)"}),
    "sin": (lax.sin, (-100, 100), {"ld": "libdevice.sin(x)", "tl": "tl.sin(x)",
                                   "approx": _asm("sin.approx.f32")}),
    "cos": (lax.cos, (-100, 100), {"ld": "libdevice.cos(x)", "tl": "tl.cos(x)",
                                   "approx": _asm("cos.approx.f32")}),
    "tan": (lax.tan, (-1.5, 1.5), {"ld": "libdevice.tan(x)"}),
    "sqrt": (lax.sqrt, (0, 1e30), {"rn": "tl.sqrt_rn(x)", "ld": "libdevice.sqrt(x)", "tl": "tl.sqrt(x)"}),
    "rsqrt": (lax.rsqrt, (1e-30, 1e30), {"ld": "libdevice.rsqrt(x)", "tl": "tl.rsqrt(x)",
                                         "div_rn": "tl.div_rn(1.0, tl.sqrt_rn(x))",
                                         "approx": _asm("rsqrt.approx.f32")}),
    "cbrt": (lax.cbrt, (-1e6, 1e6), {"ld": "libdevice.cbrt(x)"}),
    "tanh": (lax.tanh, (-12, 12), {"ld": "libdevice.tanh(x)", "approx": _asm("tanh.approx.f32")}),
    "sinh": (lax.sinh, (-90, 90), {"ld": "libdevice.sinh(x)"}),
    "cosh": (lax.cosh, (-90, 90), {"ld": "libdevice.cosh(x)"}),
    "asin": (lax.asin, (-1, 1), {"ld": "libdevice.asin(x)"}),
    "acos": (lax.acos, (-1, 1), {"ld": "libdevice.acos(x)"}),
    "atan": (lax.atan, (-1e3, 1e3), {"ld": "libdevice.atan(x)"}),
    "asinh": (lax.asinh, (-1e3, 1e3), {"ld": "libdevice.asinh(x)"}),
    "acosh": (lax.acosh, (1, 1e3), {"ld": "libdevice.acosh(x)"}),
    "atanh": (lax.atanh, (-1, 1), {"ld": "libdevice.atanh(x)"}),
    "erf": (lax.erf, (-5, 5), {"ld": "libdevice.erf(x)", "tl": "tl.erf(x)"}),
    "erfc": (lax.erfc, (-5, 10), {"ld": "libdevice.erfc(x)"}),
    "logistic": (lax.logistic, (-30, 30), {
        "tl": "tl.sigmoid(x)", "ld_div": "1.0 / (1.0 + libdevice.exp(-x))",
        "ld_divrn": "tl.div_rn(1.0, 1.0 + libdevice.exp(-x))",
        "ex2_div": f"1.0 / (1.0 + _exp2(-x * {LOG2E}))"}),
}
BINARY = {
    "pow": (lax.pow, (0.01, 100), (-30, 30), {"ld": "libdevice.pow(x, y)"}),
    "atan2": (lax.atan2, (-100, 100), (-100, 100), {"ld": "libdevice.atan2(x, y)"}),
}
N = 1 << 18
TINY = np.finfo(np.float32).tiny


def edges() -> np.ndarray:
  e = [0.0, 1e-45, 1e-44, 1e-40, 1e-39, 1.1754942e-38, TINY, 1e-30, 1e-10, 1e-7, 1e-4, 0.1, 0.5, 1.0,
       1.5, 2.0, 3.0, 10.0, 50.0, 87.3, 88.0, 88.72, 88.73, 89.0, 100.0, 103.0, 104.0, 126.0, 127.0,
       128.0, 149.0, 150.0, 1e4, 1e10, 1e30, 3.4028235e38, np.inf, np.nan]
  e = np.asarray(e, np.float32)
  return np.concatenate([e, -e])


def inputs(lo, hi, rng) -> tuple[np.ndarray, int]:
  """(inputs, how many leading ones are the domain's random values)."""
  dom = rng.uniform(lo, hi, N).astype(np.float32)
  bits = rng.integers(0, 2**32, N, dtype=np.uint64).astype(np.uint32).view(np.float32)
  mag = (rng.choice([-1.0, 1.0], N) * 10.0 ** rng.uniform(-45, 38.5, N)).astype(np.float32)
  return np.concatenate([dom, bits, mag, edges()]), N


def module(exprs: dict, nin: int, in_dtype: str) -> object:
  """One kernel per candidate: (X, [Y,] O, n)."""
  src = PROLOGUE
  args = "X, Y, O, n" if nin == 2 else "X, O, n"
  for k, e in exprs.items():
    load_y = "    y = tl.load(Y + offs, mask=m).to(tl.float32)\n" if nin == 2 else ""
    src += f"""

@triton.jit
def {k}({args}, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(X + offs, mask=m).to(tl.float32)
{load_y}    r = {e}
    tl.store(O + offs, r.to(O.dtype.element_ty), mask=m)
"""
  d = tempfile.mkdtemp()
  path = os.path.join(d, f"probe_{in_dtype}.py")
  with open(path, "w") as f:
    f.write(src)
  spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
  m = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(m)
  return m


TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def to_torch(a: np.ndarray, dtype: str):
  if dtype == "bfloat16":
    return torch.from_numpy(a.view(np.uint16).copy()).cuda().view(torch.bfloat16)
  return torch.from_numpy(a.copy()).cuda()


def from_torch(t, dtype: str) -> np.ndarray:
  if dtype == "bfloat16":
    return t.view(torch.int16).cpu().numpy().view(jnp.bfloat16)
  return t.cpu().numpy()


def run(fn, xs, dtype, ftz) -> np.ndarray:
  n = xs[0].size
  ts = [to_torch(x, dtype) for x in xs]
  o = torch.empty(n, dtype=TORCH[dtype], device="cuda")
  fn[(triton.cdiv(n, 1024),)](*ts, o, n, BLOCK=1024, enable_reflect_ftz=ftz)
  return from_torch(o, dtype)


def truth(name, xs) -> np.ndarray | None:
  import scipy.special as sp
  f = {"exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "log1p": np.log1p,
       "expm1": np.expm1, "sin": np.sin, "cos": np.cos, "tan": np.tan, "sqrt": np.sqrt,
       "rsqrt": lambda x: 1 / np.sqrt(x), "cbrt": np.cbrt, "tanh": np.tanh, "sinh": np.sinh,
       "cosh": np.cosh, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "asinh": np.arcsinh,
       "acosh": np.arccosh, "atanh": np.arctanh, "erf": sp.erf, "erfc": sp.erfc,
       "logistic": sp.expit, "pow": np.power, "atan2": np.arctan2}[name]
  with np.errstate(all="ignore"):
    return f(*[x.astype(np.float64) for x in xs]).astype(np.float32)


def compare(got, want, xs, ndom, true) -> dict:
  g32, w32 = got.astype(np.float32), want.astype(np.float32)
  d = ulps(g32, w32)
  bad = d != 0
  normal = np.ones(bad.shape, bool)
  for a in (*xs, w32, g32):
    a = a.astype(np.float32)
    normal &= np.isfinite(a) & ((np.abs(a) >= TINY) | (a == 0))
  r = {"diff": int(bad.sum()), "diff_normal": int((bad & normal).sum()),
       "max_ulps": int(d[np.isfinite(w32) & np.isfinite(g32)].max(initial=0))}
  if bad.any():
    k = int(np.argmax(bad & normal)) if (bad & normal).any() else int(np.argmax(bad))
    r["example"] = [[float(a[k]) for a in xs], float(g32[k]), float(w32[k])]
  if true is not None:
    dom = slice(0, ndom)
    ok = np.isfinite(true[dom]) & (np.abs(true[dom]) >= TINY)
    r["ulps_true"] = int(ulps(g32[dom], true[dom])[ok].max(initial=0))
    r["xla_ulps_true"] = int(ulps(w32[dom], true[dom])[ok].max(initial=0))
  return r


def main():
  rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
  results = {}
  cases = {n: (f, [inputs(*dom, rng)], c) for n, (f, dom, c) in UNARY.items()}
  for n, (f, d1, d2, c) in BINARY.items():
    a, nd = inputs(*d1, rng)
    b, _ = inputs(*d2, rng)
    b = np.concatenate([b[:nd // 2], np.round(b[nd // 2:nd]), rng.permutation(b[nd:])])
    cases[n] = (f, [(a, nd), (b, nd)], c)
  for dtype in ("float32", "float16", "bfloat16"):
    allc = {f"{n}__{k}": e for n, (_, xs, c) in cases.items() for k, e in c.items() if len(xs) == 1}
    mods = {1: module(allc, 1, dtype),
            2: module({f"{n}__{k}": e for n, (_, xs, c) in cases.items() for k, e in c.items()
                       if len(xs) == 2}, 2, dtype)}
    for name, (f, xs, cands) in cases.items():
      arrs = [x.astype(jnp.dtype(dtype)) for x, _ in xs]
      want = np.asarray(jax.jit(f)(*[jnp.asarray(a) for a in arrs]))
      true = truth(name, arrs) if dtype == "float32" else None
      for k in cands:
        for ftz in ((True, False) if dtype == "float32" else (False, True)):
          try:
            got = run(getattr(mods[len(xs)], f"{name}__{k}"), arrs, dtype, ftz)
          except Exception as e:   # noqa: BLE001 (a probe: report and go on)
            results[f"{dtype} {name} {k} ftz={ftz}"] = {"error": str(e)[:300]}
            continue
          r = compare(got, want, arrs, xs[0][1], true)
          results[f"{dtype} {name} {k} ftz={ftz}"] = r
          print(f"{dtype:8} {name:8} {k:9} ftz={ftz!s:5} diff {r['diff']:7} normal {r['diff_normal']:7} "
                f"max {r['max_ulps']:>10} true {r.get('ulps_true', '-'):>6} xla {r.get('xla_ulps_true', '-'):>6} "
                f"{r.get('example', '')}", flush=True)
  with open(os.path.join(OUT, "probe_math_xla.json"), "w") as f:
    json.dump(results, f, indent=1)
  dump = os.environ.get("XLA_FLAGS", "").partition("--xla_dump_to=")[2].split(" ")[0]
  if dump and os.path.isdir(dump):
    with tarfile.open(os.path.join(OUT, "xla_dump.tgz"), "w:gz") as t:
      for fn in os.listdir(dump):
        if fn.endswith((".ll", ".ptx")) or "after_optimizations.txt" in fn:
          t.add(os.path.join(dump, fn), fn)


if __name__ == "__main__":
  print(jax.devices(), triton.__version__, math.pi)
  main()

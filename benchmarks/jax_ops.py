"""JAX's shipped Pallas GPU ops (``jax/experimental/pallas/ops/gpu``) on pallax and on JAX Pallas,
same sources (pallax's copy has its two import lines switched), same inputs, in one process.

Run on the GPU machine: ``PYTHONPATH=$PWD python3 benchmarks/jax_ops.py [--out FILE]``.

For every op: each side's result is checked against the op's own reference (relative error,
and the largest elementwise difference between the two sides); then the back-to-back wall time
per call (``n`` calls, then one wait) and the GPU time per call (profiler trace) of both. pallax
runs twice: through XLA's own kernel launch (the default) and through jaxlib's Triton call
(``PALLAX_TRITON_LAUNCH=ffi``, the launch path before issue 13), so the launch cost shows before
and after in the same process; and once more with ``approx_math=True`` in every kernel's
``CompilerParams`` (the GPU's fast math approximations; the default is XLA's functions), which
the ops' sources cannot ask for: their ``plgpu.CompilerParams`` is switched for this run. First,
the trivial kernel's launch cost against JAX Pallas and plain XLA, alone and as three kernels with
XLA ops between them in one ``jit``.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import jax_gpu_ops  # noqa: E402  (loads an op with pallax's imports)
import triton_vs_pallas as tvp  # noqa: E402
import timing  # noqa: E402

S = jax.ShapeDtypeStruct


def _jit_with_launch(f, path: str, args):
  """``jax.jit(f)``, compiled now with pallax's launch path ``path``."""
  old = os.environ.get("PALLAX_TRITON_LAUNCH")
  os.environ["PALLAX_TRITON_LAUNCH"] = path
  try:
    g = jax.jit(f)
    jax.block_until_ready(g(*args))
  finally:
    if old is None:
      del os.environ["PALLAX_TRITON_LAUNCH"]
    else:
      os.environ["PALLAX_TRITON_LAUNCH"] = old
  return g


# --- the trivial kernel ------------------------------------------------------------------------

def _add_one(x_ref, o_ref):
  o_ref[...] = x_ref[...] + 1


def _trivial(P, TP):
  def f(x):
    return P.pallas_call(_add_one, out_shape=S(x.shape, x.dtype), compiler_params=TP())(x)
  return f


def _three(P, TP):
  k = _trivial(P, TP)
  return lambda x: k(k(x) * 2.0) - k(jnp.sin(x))


def launch_cost(rounds: int) -> list:
  import pallax
  import pallax.triton as plt_
  from jax.experimental.pallas import triton as jplt
  JP = tvp.jax_pallas()
  x = jax.random.normal(jax.random.key(int(time.time())), (128,), jnp.float32)
  lines = ["| jit body | pallax (XLA launch) µs | pallax (jaxlib FFI launch) µs | JAX Pallas µs | "
           "XLA µs | pallax / JAX Pallas speed | FFI / JAX Pallas speed |", "|" + " --- |" * 7]
  bodies = {"one kernel `x + 1` (128 f32)": (_trivial, lambda a: a + 1),
            "three kernels and XLA ops": (_three, lambda a: (a + 1) * 2.0 + 1 - (jnp.sin(a) + 1))}
  for label, (make, xla) in bodies.items():
    fns = {"xla_launch": _jit_with_launch(make(pallax, plt_.CompilerParams), "xla", (x,)),
           "ffi_launch": _jit_with_launch(make(pallax, plt_.CompilerParams), "ffi", (x,)),
           "jax_pallas": jax.jit(make(JP, jplt.CompilerParams)), "xla": jax.jit(xla)}
    want = np.asarray(xla(x))
    for k, f in fns.items():
      np.testing.assert_allclose(np.asarray(f(x)), want, rtol=1e-6, atol=1e-6, err_msg=k)
    t = {k: v[0] * 1e6 for k, v in timing.time_calls(fns, (x,), n=100, rounds=3 * rounds).items()}
    lines.append(f"| {label} | {t['xla_launch']:.1f} | {t['ffi_launch']:.1f} | {t['jax_pallas']:.1f} | "
                 f"{t['xla']:.1f} | {t['jax_pallas'] / t['xla_launch']:.3f}x | "
                 f"{t['jax_pallas'] / t['ffi_launch']:.3f}x |")
    print(lines[-1], flush=True)
  return lines


# --- the ops -----------------------------------------------------------------------------------

def _vjp(fwd):
  """fwd+bwd: the gradients of ``sum(fwd(*args) * dout)``."""
  def f(*args):
    *primals, dout = args
    out, pull = jax.vjp(fwd, *primals)
    return pull(dout.astype(out.dtype))
  return f


def _paged(key, batch, heads, kv_heads, dim, page, per_seq, pages):
  kq, kk, kv, kp, kl = jax.random.split(key, 5)
  q = jax.random.normal(kq, (batch, heads, dim), jnp.float16)
  k_pages = jax.random.normal(kk, (kv_heads, pages, page, dim), jnp.float16)
  v_pages = jax.random.normal(kv, (kv_heads, pages, page, dim), jnp.float16)
  tables = jax.random.permutation(kp, pages)[:batch * per_seq].reshape(batch, per_seq)
  lengths = jax.random.randint(kl, (batch,), per_seq * page // 2, per_seq * page + 1)
  return q, k_pages, v_pages, tables.astype(jnp.int32), lengths.astype(jnp.int32)


def cases(small: bool, key):
  """(label, op module name, function of the op's module -> f(*args), args, function of JAX's
  module -> the reference f(*args))."""
  ks = iter(jax.random.split(key, 40))
  rnd = lambda shape, dt=jnp.float32: jax.random.normal(next(ks), shape, dt)  # noqa: E731
  rows = (256, 1024) if small else (4096, 4096)
  for shape in ((32, 1024), rows):
    x = rnd(shape)
    yield (f"softmax {shape[0]}x{shape[1]} f32", "softmax", lambda m: lambda x: m.softmax(x, axis=-1),
           (x,), lambda m: lambda x: jax.nn.softmax(x, axis=-1))
  refs = {"layer_norm": jax_gpu_ops._ln_ref, "rms_norm": jax_gpu_ops._rms_ref}
  for name in ("layer_norm", "rms_norm"):
    for shape in ((1, 16, 1024), (2, 256, 1024) if small else (4, 1024, 4096)):
      x, w, b = rnd(shape), rnd(shape[-1:]), rnd(shape[-1:])
      norm = lambda m, n=name: lambda x, w, b: getattr(m, n)(x, w, b)  # noqa: E731
      yield (f"{name} fwd {'x'.join(map(str, shape))} f32", name, norm, (x, w, b),
             lambda m, n=name: refs[n])
    yield (f"{name} fwd+bwd {'x'.join(map(str, shape))} f32", name,
           lambda m, f=norm: _vjp(f(m)), (x, w, b, rnd(shape)), lambda m, n=name: _vjp(refs[n]))
  b, s, h, d = (1, 512, 2, 64) if small else (2, 2048, 8, 64)
  q, k, v, do = (rnd((b, s, h, d), jnp.float16) for _ in range(4))
  for causal in (False, True):
    tag = f"{'causal ' if causal else ''}{b}x{s}x{h}x{d} f16"
    mha = lambda m, c=causal: lambda q, k, v: m.mha(q, k, v, segment_ids=None, causal=c)  # noqa: E731
    ref = lambda m, c=causal: lambda q, k, v: m.mha_reference(q, k, v, segment_ids=None, causal=c)  # noqa: E731
    yield f"mha fwd {tag}", "attention", mha, (q, k, v), ref
    yield (f"mha fwd+bwd {tag}", "attention", lambda m, f=mha: _vjp(f(m)), (q, k, v, do),
           lambda m, f=ref: _vjp(f(m)))
  b, h, t, d = (2, 16, 512, 64) if small else (16, 32, 4096, 128)
  start = jax.random.randint(next(ks), (b,), 0, t // 4).astype(jnp.int32)
  length = jax.random.randint(next(ks), (b,), t // 2, t + 1).astype(jnp.int32)
  q, k, v = rnd((b, h, d), jnp.float16), rnd((b, t, d), jnp.float16), rnd((b, t, d), jnp.float16)
  yield (f"decode mqa {b}x{h}x{t}x{d} f16", "decode_attention",
         lambda m: lambda *a: m.mqa(*a), (q, k, v, start, length), lambda m: m.mqa_reference)
  kvh = 2 if small else 8
  k, v = rnd((b, t, kvh, d), jnp.float16), rnd((b, t, kvh, d), jnp.float16)
  yield (f"decode gqa {b}x{h}x{t}x{kvh}x{d} f16", "decode_attention",
         lambda m: lambda *a: m.gqa(*a), (q, k, v, start, length), lambda m: m.gqa_reference)
  page, per_seq = 16, (t // 16)
  args = _paged(next(ks), b, h, kvh, d, page, per_seq, b * per_seq)
  yield (f"paged attention {b}x{h}x{t}x{kvh}x{d} f16", "paged_attention",
         lambda m: lambda *a: m.paged_attention(*a, k_splits=4, pages_per_compute_block=4), args,
         lambda m: _paged_reference(m, args))


def _paged_reference(m, args):
  q, k_pages, v_pages, tables, lengths = args
  kv_heads, _, page, dim = k_pages.shape
  def per_sequence(p):   # [batch, seq, kv_heads, dim]
    x = p[:, tables].reshape(kv_heads, tables.shape[0], -1, dim)
    return x.transpose(1, 2, 0, 3)
  return lambda *_: m.paged_attention_reference(q, per_sequence(k_pages), per_sequence(v_pages), lengths)


def _approx(module):
  """``module`` (an op loaded with pallax's imports) with its kernels compiled with
  ``approx_math=True``: its ``plgpu`` global becomes ``pallax.triton`` with that default."""
  import functools
  import types

  import pallax.triton as plt_
  ns = types.SimpleNamespace(**{k: getattr(plt_, k) for k in dir(plt_) if not k.startswith("_")})
  ns.CompilerParams = functools.partial(plt_.CompilerParams, approx_math=True)
  module.plgpu = ns
  return module


def _flat(tree) -> np.ndarray:
  return np.concatenate([np.asarray(x, np.float32).ravel() for x in jax.tree.leaves(tree)])


def run_op(label, op, make, args, ref, rounds) -> str:
  import jax.experimental.pallas.ops.gpu as gpu_ops
  jm = importlib.import_module(f"{gpu_ops.__name__}.{op}")
  pm = jax_gpu_ops.load(op)
  want = _flat(ref(jm)(*args))
  fns, outs = {}, {}
  for name, make_fn in (("pallax", lambda: _jit_with_launch(make(pm), "xla", args)),
                        ("pallax_approx",
                         lambda: _jit_with_launch(make(_approx(jax_gpu_ops.load(op))), "xla", args)),
                        ("pallax_ffi", lambda: _jit_with_launch(make(pm), "ffi", args)),
                        ("jax_pallas", lambda: jax.jit(make(jm)))):
    try:
      fns[name] = make_fn()
      outs[name] = _flat(fns[name](*args))
    except Exception as e:  # noqa: BLE001 (reported; the side is left out of the timings)
      print(f"{label}: {name} failed: {type(e).__name__}: {str(e)[:400]}", flush=True)
      fns.pop(name, None)
  err = {k: float(np.linalg.norm(o - want) / np.linalg.norm(want)) for k, o in outs.items()}
  diff = (float(np.max(np.abs(outs["pallax"] - outs["jax_pallas"])))
          if {"pallax", "jax_pallas"} <= outs.keys() else float("nan"))
  wall = {k: v[0] * 1e6 for k, v in timing.time_calls(fns, args, n=10, rounds=rounds).items()}
  gpu = {k: v * 1e6 for k, v in timing.device_times(fns, args, n=10, rounds=max(3, rounds // 2)).items()}
  g = lambda d, k: d.get(k, float("nan"))  # noqa: E731
  return (f"| {label} | {g(err, 'pallax'):.1e} / {g(err, 'pallax_approx'):.1e} / "
          f"{g(err, 'jax_pallas'):.1e} | {diff:.1e} | {g(gpu, 'pallax'):.1f} | "
          f"{g(gpu, 'pallax_approx'):.1f} | {g(gpu, 'jax_pallas'):.1f} | "
          f"{g(gpu, 'jax_pallas') / g(gpu, 'pallax'):.3f}x | "
          f"{g(gpu, 'jax_pallas') / g(gpu, 'pallax_approx'):.3f}x | "
          f"{g(gpu, 'pallax') / g(gpu, 'pallax_approx'):.3f}x | {g(wall, 'pallax'):.1f} | "
          f"{g(wall, 'pallax_ffi'):.1f} | {g(wall, 'jax_pallas'):.1f} | "
          f"{g(wall, 'jax_pallas') / g(wall, 'pallax'):.3f}x |")


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--only", default="", help="comma-separated substrings of op labels")
  ap.add_argument("--rounds", type=int, default=15)
  ap.add_argument("--small", action="store_true", help="small sizes (a quick check)")
  ap.add_argument("--out", default="")
  opts = ap.parse_args()
  dev = jax.devices()[0]
  lines = ["# JAX's Pallas GPU ops: pallax against JAX Pallas", "",
           f"Device: {dev.device_kind}; {datetime.date.today()}; jax {jax.__version__}. "
           f"Command: `PYTHONPATH=$PWD python3 benchmarks/jax_ops.py{' --small' if opts.small else ''}"
           f" --rounds {opts.rounds}`.",
           "", "## Launch cost: back-to-back wall time per call (100 calls, then one wait)", ""]
  lines += launch_cost(opts.rounds)
  lines += ["", "## The ops", "",
            "Errors: relative to the op's own reference (pallax / pallax approx / JAX Pallas); max "
            "|diff|: largest elementwise difference between pallax (default math) and JAX Pallas. "
            "GPU: kernel time per call from a profiler trace. Wall: back-to-back, 10 calls then "
            "one wait. Speed = JAX Pallas time / pallax time (>1: pallax faster). pallax: its "
            "default math (XLA's functions); approx: approx_math=True (the GPU's fast "
            "approximations); approx speed-up: pallax GPU time / approx GPU time.", "",
            "| op | rel. error | max \\|diff\\| | pallax GPU µs | pallax approx GPU µs | JAX Pallas "
            "GPU µs | GPU speed | approx GPU speed | approx speed-up | pallax wall µs | "
            "pallax (FFI launch) wall µs | JAX Pallas wall µs | wall speed |",
            "|" + " --- |" * 13]
  only = [s for s in opts.only.split(",") if s]
  for case in cases(opts.small, jax.random.key(int(time.time()))):
    if only and not any(s in case[0] for s in only):
      continue
    lines.append(run_op(*case, opts.rounds))
    print(lines[-1], flush=True)
  timing.write_report(lines, opts.out or None)


if __name__ == "__main__":
  main()

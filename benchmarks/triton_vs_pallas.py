"""pallax (Triton backend) against JAX Pallas (its Triton backend) on the GPU, same kernel sources.

Run on the GPU machine: ``PYTHONPATH=$PWD python3 benchmarks/triton_vs_pallas.py``.
Each kernel is written once as a function of the Pallas module ``P`` and its Triton
compiler-params class ``TP``; XLA (cuBLAS/cuDNN) is the ceiling. Kernels with float math run on
pallax twice: with its default math (XLA's functions, ``pallax``) and with
``approx_math=True`` (the GPU's fast approximations, ``pallax_approx``). Time per call: the median
over repeats of (wall time of ``n`` back-to-back calls) / n, after a warm-up, and the GPU's own
time per call from a profiler trace; inputs are fresh random data; every result is checked
against a float32 reference first.
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from timing import (checked_outputs, device_times, rel_err, time_calls,  # noqa: E402,F401
                    time_columns, write_report)

S = jax.ShapeDtypeStruct


# --- the kernels, written once --------------------------------------------------------------

def notebook_matmul(P, TP, x, y):
  def kernel(x_ref, y_ref, z_ref):
    z_ref[...] = x_ref[...] @ y_ref[...]
  return P.pallas_call(
      kernel, out_shape=S((x.shape[0], y.shape[1]), x.dtype), grid=(2, 2),
      in_specs=[P.BlockSpec((x.shape[0] // 2, x.shape[1]), lambda i, j: (i, 0)),
                P.BlockSpec((y.shape[0], y.shape[1] // 2), lambda i, j: (0, j))],
      out_specs=P.BlockSpec((x.shape[0] // 2, y.shape[1] // 2), lambda i, j: (i, j)),
      compiler_params=TP())(x, y)


def blocked_matmul(P, TP, x, y, bm=128, bn=256, bk=64, warps=8, stages=3):
  def kernel(x_ref, y_ref, o_ref):
    def body(k, acc):
      return acc + jnp.dot(x_ref[:, P.ds(k * bk, bk)], y_ref[P.ds(k * bk, bk), :],
                           preferred_element_type=jnp.float32)
    acc = lax.fori_loop(0, x_ref.shape[1] // bk, body, jnp.zeros(o_ref.shape, jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)
  m, k = x.shape
  n = y.shape[1]
  return P.pallas_call(
      kernel, out_shape=S((m, n), x.dtype), grid=(m // bm, n // bn),
      in_specs=[P.BlockSpec((bm, k), lambda i, j: (i, 0)), P.BlockSpec((k, bn), lambda i, j: (0, j))],
      out_specs=P.BlockSpec((bm, bn), lambda i, j: (i, j)),
      compiler_params=TP(num_warps=warps, num_stages=stages))(x, y)


def flash_attention(P, TP, q, k, v, causal, block_q=128, block_k=64, warps=8, stages=3):
  """q, k, v: (batch*heads, seq, head_dim)."""
  bh, seq, d = q.shape
  scale = 1.0 / math.sqrt(d)

  def kernel(q_ref, k_ref, v_ref, o_ref):
    q = q_ref[...]
    qi = P.program_id(1)
    m = jnp.full((block_q,), -jnp.inf, jnp.float32)
    l = jnp.zeros((block_q,), jnp.float32)
    acc = jnp.zeros((block_q, d), jnp.float32)

    def body(j, carry):
      m, l, acc = carry
      kb = k_ref[P.ds(j * block_k, block_k), :]
      vb = v_ref[P.ds(j * block_k, block_k), :]
      s = lax.dot_general(q, kb, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
      if causal:
        rows = qi * block_q + lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)
        cols = j * block_k + lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)
        s = jnp.where(rows >= cols, s, -jnp.inf)
      m_new = jnp.maximum(m, s.max(axis=1))
      p = jnp.exp(s - m_new[:, None])
      alpha = jnp.exp(m - m_new)
      l = l * alpha + p.sum(axis=1)
      acc = acc * alpha[:, None] + jnp.dot(p.astype(vb.dtype), vb, preferred_element_type=jnp.float32)
      return m_new, l, acc

    upper = ((qi + 1) * block_q + block_k - 1) // block_k if causal else seq // block_k
    m, l, acc = lax.fori_loop(0, upper, body, (m, l, acc))
    o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)

  return P.pallas_call(
      kernel, out_shape=S(q.shape, q.dtype), grid=(bh, seq // block_q),
      in_specs=[P.BlockSpec((None, block_q, d), lambda b, i: (b, i, 0)),
                P.BlockSpec((None, seq, d), lambda b, i: (b, 0, 0)),
                P.BlockSpec((None, seq, d), lambda b, i: (b, 0, 0))],
      out_specs=P.BlockSpec((None, block_q, d), lambda b, i: (b, i, 0)),
      compiler_params=TP(num_warps=warps, num_stages=stages))(q, k, v)


def layer_norm(P, TP, x, w, b, eps=1e-5, warps=8):
  r, c = x.shape

  def kernel(x_ref, w_ref, b_ref, o_ref):
    x = x_ref[...]
    mean = jnp.mean(x, axis=1, keepdims=True)
    xc = x - mean
    var = jnp.mean(xc * xc, axis=1, keepdims=True)
    o_ref[...] = xc * lax.rsqrt(var + eps) * w_ref[...] + b_ref[...]

  return P.pallas_call(
      kernel, out_shape=S(x.shape, x.dtype), grid=(r,),
      in_specs=[P.BlockSpec((1, c), lambda i: (i, 0)), P.BlockSpec((1, c), lambda i: (0, 0)),
                P.BlockSpec((1, c), lambda i: (0, 0))],
      out_specs=P.BlockSpec((1, c), lambda i: (i, 0)), compiler_params=TP(num_warps=warps))(x, w, b)


def softmax(P, TP, x, warps=8):
  r, c = x.shape

  def kernel(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=1, keepdims=True)

  return P.pallas_call(
      kernel, out_shape=S(x.shape, x.dtype), grid=(r,),
      in_specs=[P.BlockSpec((1, c), lambda i: (i, 0))], out_specs=P.BlockSpec((1, c), lambda i: (i, 0)),
      compiler_params=TP(num_warps=warps))(x)


# --- XLA references (the ceiling) -----------------------------------------------------------------

def xla_attention(q, k, v, causal):
  bh, s, d = q.shape
  q4, k4, v4 = (t.reshape(1, bh, s, d).transpose(0, 2, 1, 3) for t in (q, k, v))
  try:
    o = jax.nn.dot_product_attention(q4, k4, v4, is_causal=causal, implementation="cudnn")
  except Exception:  # noqa: BLE001
    o = jax.nn.dot_product_attention(q4, k4, v4, is_causal=causal)
  return o.transpose(0, 2, 1, 3).reshape(bh, s, d)


def ref_attention(q, k, v, causal):
  q, k, v = (t.astype(jnp.float32) for t in (q, k, v))
  s = jnp.einsum("bqd,bkd->bqk", q, k, precision="highest") / math.sqrt(q.shape[-1])
  if causal:
    n = q.shape[1]
    s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), s, -jnp.inf)
  return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(s, axis=-1), v, precision="highest")


def ref_layer_norm(x, w, b, eps=1e-5):
  m = x.mean(axis=1, keepdims=True)
  v = ((x - m) ** 2).mean(axis=1, keepdims=True)
  return (x - m) / jnp.sqrt(v + eps) * w + b


# --- JAX Pallas, as the kernels above take it -------------------------------------------------------


def jax_pallas():
  """JAX Pallas on its Triton backend, as a module-like namespace for the kernels above."""
  from jax.experimental import pallas as jpl
  from jax.experimental.pallas import triton as jplt
  JP = type("JP", (), {})
  for n in ("BlockSpec", "ds", "program_id"):
    setattr(JP, n, staticmethod(getattr(jpl, n)))
  # JAX 0.11 picks the Triton backend from Triton compiler params.
  JP.pallas_call = staticmethod(lambda *a, compiler_params=None, **kw: jpl.pallas_call(
      *a, compiler_params=compiler_params or jplt.CompilerParams(), **kw))
  return JP


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--only", default="")
  ap.add_argument("--skip", default="")
  ap.add_argument("--rounds", type=int, default=15)
  ap.add_argument("--out", default="")
  ap.add_argument("--small", action="store_true", help="small sizes (a quick check)")
  opts = ap.parse_args()

  import functools

  import pallax
  import pallax.triton as plt_
  from jax.experimental.pallas import triton as jplt

  JP = jax_pallas()
  approx = functools.partial(plt_.CompilerParams, approx_math=True)

  small = opts.small
  key = iter(jax.random.split(jax.random.key(int(time.time())), 64))
  rows = []
  dev = jax.devices()[0]

  def bench(name, flops, nbytes, impls, args, ref, tol):
    if opts.only and not any(o in name for o in opts.only.split(",")):
      return
    if opts.skip and any(o in name for o in opts.skip.split(",")):
      return
    res, ok_fns = {}, {}
    for impl, f in impls.items():
      try:
        fj = jax.jit(f)
        err = rel_err(fj(*args), ref)
        res[impl] = (float("nan"), err, err <= tol, "")
        ok_fns[impl] = fj
      except Exception as e:  # noqa: BLE001
        res[impl] = (float("nan"), float("nan"), False, f"{type(e).__name__}: {str(e).splitlines()[0][:150]}")
    for impl, (med, lo, hi) in time_calls(ok_fns, args, rounds=opts.rounds).items():
      res[impl] = (med, res[impl][1], res[impl][2], f"(p10 {lo * 1e3:.3f}, p90 {hi * 1e3:.3f})")
    dev_t = device_times(ok_fns, args)
    rows.append((name, flops, nbytes, res, dev_t))
    line = [f"{name:34}"]
    for impl, (med, err, ok, msg) in res.items():
      line.append(f"{impl}: {med * 1e3:8.3f} ms (device {dev_t.get(impl, float('nan')) * 1e3:.3f}) "
                  f"err {err:.1e}{'' if ok else ' (WRONG/FAILED)'} {msg}")
    print(" | ".join(line), flush=True)

  n = 1024 if small else 8192
  x, y = (jax.random.normal(next(key), (n, n), jnp.float32).astype(jnp.bfloat16) for _ in range(2))
  ref = jnp.dot(x, y, preferred_element_type=jnp.float32)
  bench(f"matmul bf16 {n}^3 (inner K loop)", 2 * n**3, 3 * n * n * 2,
        {"pallax": lambda a, b: blocked_matmul(pallax, plt_.CompilerParams, a, b),
         "jax_pallas": lambda a, b: blocked_matmul(JP, jplt.CompilerParams, a, b),
         "xla": lambda a, b: jnp.dot(a, b)}, (x, y), ref, 2e-2)
  # attention
  heads, seq, d = (2, 512, 128) if small else (16, 4096, 128)
  q, k, v = (jax.random.normal(next(key), (heads, seq, d), jnp.float32).astype(jnp.bfloat16) for _ in range(3))
  for causal in (False, True):
    ref = ref_attention(q, k, v, causal)
    fl = 4 * heads * seq * seq * d * (0.5 if causal else 1.0)
    bench(f"flash attention b1 s{seq} h{heads} d{d}{' causal' if causal else ''}", fl, 4 * heads * seq * d * 2,
          {"pallax": lambda a, b, c, cz=causal: flash_attention(pallax, plt_.CompilerParams, a, b, c, cz),
           "pallax_approx": lambda a, b, c, cz=causal: flash_attention(pallax, approx, a, b, c, cz),
           "jax_pallas": lambda a, b, c, cz=causal: flash_attention(JP, jplt.CompilerParams, a, b, c, cz),
           "xla": lambda a, b, c, cz=causal: xla_attention(a, b, c, cz)}, (q, k, v), ref, 2e-2)
  # row-wise
  r, c = (1024, 8192) if small else (16384, 8192)
  x = jax.random.normal(next(key), (r, c), jnp.float32)
  w = jax.random.normal(next(key), (1, c), jnp.float32)
  b = jax.random.normal(next(key), (1, c), jnp.float32)
  bench(f"layer norm f32 {r}x{c}", 8 * r * c, 2 * r * c * 4,
        {"pallax": lambda a, ww, bb: layer_norm(pallax, plt_.CompilerParams, a, ww, bb),
         "pallax_approx": lambda a, ww, bb: layer_norm(pallax, approx, a, ww, bb),
         "jax_pallas": lambda a, ww, bb: layer_norm(JP, jplt.CompilerParams, a, ww, bb),
         "xla": lambda a, ww, bb: ref_layer_norm(a, ww, bb)}, (x, w, b), ref_layer_norm(x, w, b), 1e-5)
  bench(f"softmax f32 {r}x{c}", 5 * r * c, 2 * r * c * 4,
        {"pallax": lambda a: softmax(pallax, plt_.CompilerParams, a),
         "pallax_approx": lambda a: softmax(pallax, approx, a),
         "jax_pallas": lambda a: softmax(JP, jplt.CompilerParams, a),
         "xla": lambda a: jax.nn.softmax(a, axis=1)}, (x,), jax.nn.softmax(x, axis=1), 1e-5)

  # the notebook matmul last: JAX Pallas may spend minutes in ptxas on its 512x1024 blocks
  n = 256 if small else 1024
  x, y = (jax.random.normal(next(key), (n, n), jnp.float32) for _ in range(2))
  ref = jnp.dot(x, y, precision="highest")
  bench(f"notebook matmul f32 {n}^3 (grid 2x2)", 2 * n**3, 3 * n * n * 4,
        {"pallax": lambda a, b: notebook_matmul(pallax, plt_.CompilerParams, a, b),
         "jax_pallas": lambda a, b: notebook_matmul(JP, jplt.CompilerParams, a, b),
         "xla": lambda a, b: jnp.dot(a, b)}, (x, y), ref, 5e-3)

  # the table
  lines = ["# pallax (Triton) vs JAX Pallas (Triton) vs XLA", "",
           f"device: {dev.device_kind}; date: {datetime.date.today()}; jax {jax.__version__}; "
           f"time per call = median over {opts.rounds} interleaved rounds of (10 back-to-back calls) / 10, "
           "wall clock to block_until_ready; p10-p90 of the rounds in the log. Device time per call: "
           "GPU operations' summed durations from a profiler trace (7 interleaved rounds of 10 calls), "
           "which leaves out host dispatch. pallax: its default math (XLA's functions); pallax "
           "approx: approx_math=True (the GPU's fast approximations), for kernels with float math", "",
           "| kernel | pallax ms | pallax approx ms | JAX Pallas ms | XLA ms | pallax / JAX Pallas speed | "
           "device time: pallax / pallax approx / JAX Pallas ms | device speed (pallax, approx / JAX "
           "Pallas) | approx / exact device speed | pallax rate | JAX Pallas rate | XLA rate |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for name, fl, nb, res, dev_t in rows:
    def rate(impl):
      med, err, ok, msg = res.get(impl, (float("nan"),) * 2 + (False, ""))
      if not ok:
        return "failed" if msg else "wrong"
      return f"{fl / med / 1e12:.0f} TFLOP/s" if fl / nb > 50 else f"{nb / med / 1e12:.2f} TB/s"
    def ms(impl):
      med, err, ok, msg = res.get(impl, (float("nan"),) * 2 + (False, ""))
      if ok:
        return f"{med * 1e3:.3f}"
      return f"wrong (err {err:.1e})" if msg.startswith("(p10") or not msg else "failed: " + msg
    pm, jm = res["pallax"][0], res["jax_pallas"][0]
    both = res["pallax"][2] and res["jax_pallas"][2]
    ratio = f"{jm / pm:.2f}x" if both else "n/a"
    pd, jd = dev_t.get("pallax", float("nan")), dev_t.get("jax_pallas", float("nan"))
    ad = dev_t.get("pallax_approx", float("nan")) if res.get("pallax_approx", (0, 0, False))[2] else float("nan")
    dev = f"{pd * 1e3:.3f} / {ad * 1e3:.3f} / {jd * 1e3:.3f}" if both else "n/a"
    dev_ratio = f"{jd / pd:.3f}x, {jd / ad:.3f}x" if both else "n/a"
    lines.append(f"| {name} | {ms('pallax')} | {ms('pallax_approx') if 'pallax_approx' in res else '-'} | "
                 f"{ms('jax_pallas')} | {ms('xla')} | {ratio} | {dev} | {dev_ratio} | {pd / ad:.3f}x | "
                 f"{rate('pallax')} | {rate('jax_pallas')} | {rate('xla')} |")
  write_report(lines, opts.out)


if __name__ == "__main__":
  main()

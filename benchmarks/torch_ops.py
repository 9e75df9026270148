"""pallax kernels called from PyTorch (``pallax.as_torch_kernel``) against torch's own ops, in one
process on the GPU machine: ``PYTHONPATH=$PWD python3 benchmarks/torch_ops.py [--out FILE]``.

First the launch cost of a trivial kernel (``x + 1`` on 128 floats) from torch: pallax, Triton's
own ``kernel[grid](...)`` launcher, and ``torch.add``. Then JAX's shipped Pallas ops (imports
switched to pallax) called with torch tensors against ``torch.softmax``, ``F.layer_norm``,
``F.rms_norm`` and ``F.scaled_dot_product_attention``, forward and forward+backward (through
``torch.autograd``: the ops' custom_vjp backward kernels against torch's own); and JAX's
warp-specialized Mosaic GPU attention (``attention_mgpu.py``, pallax's Gluon backend) against
SDPA's flash and cuDNN backends. Each result is checked against torch's
first; times are back-to-back wall time per call (``n`` calls, then one synchronize) and GPU time
per call (the CUDA kernels' summed durations in a ``torch.profiler`` trace).
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
sys.path.insert(0, HERE)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import pallax as pl  # noqa: E402
import jax_gpu_ops  # noqa: E402
import mgpu_ops  # noqa: E402
import timing  # noqa: E402


def wall_us(fns: dict, args, n: int, rounds: int) -> dict:
  for f in fns.values():
    f(*args)
  torch.cuda.synchronize()
  samples = {k: [] for k in fns}
  order, rng = list(fns), np.random.default_rng(0)
  for _ in range(rounds):
    rng.shuffle(order)
    for k in order:
      t = time.perf_counter()
      for _ in range(n):
        fns[k](*args)
      torch.cuda.synchronize()
      samples[k].append((time.perf_counter() - t) / n * 1e6)
  return {k: float(np.median(v)) for k, v in samples.items()}


def gpu_us(f, args, n=20) -> float:
  from torch.profiler import ProfilerActivity, profile
  f(*args)
  torch.cuda.synchronize()
  with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(n):
      f(*args)
    torch.cuda.synchronize()
  return sum(e.self_device_time_total for e in prof.key_averages()) / n


def _triton_add_one():
  import triton
  import triton.language as tl

  @triton.jit
  def add_one(x, o, n: tl.constexpr):
    i = tl.arange(0, n)
    tl.store(o + i, tl.load(x + i) + 1)

  def run(x):
    o = torch.empty_like(x)
    add_one[(1,)](x, o, x.numel(), num_warps=1)
    return o
  return run


def launch_cost(rounds: int) -> list:
  x = torch.randn(128, device="cuda")
  def k(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1
  fns = {"pallax": pl.as_torch_kernel(lambda a: pl.pallas_call(
             k, out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype))(a)),
         "triton": _triton_add_one(), "torch": lambda a: torch.add(a, 1)}
  for name, f in fns.items():
    torch.testing.assert_close(f(x), x + 1, msg=name)
  t = wall_us(fns, (x,), n=100, rounds=rounds)
  return ["| trivial kernel (128 f32) | pallax µs | Triton `kernel[grid]` µs | torch.add µs | "
          "pallax / Triton speed |", "| --- | --- | --- | --- | --- |",
          f"| back-to-back wall per call | {t['pallax']:.1f} | {t['triton']:.1f} | {t['torch']:.1f} | "
          f"{t['triton'] / t['pallax']:.3f}x |"]


def _fwd_bwd(f, dout):
  """A training step of ``f``: the gradients of ``sum(f(*args) * dout)``, flattened into one."""
  def step(*args):
    args = [a.detach().requires_grad_() for a in args]
    grads = torch.autograd.grad(f(*args), args, dout)
    return torch.cat([g.float().ravel() for g in grads])
  return step


def _cases(key):
  """(label, pallax function of torch tensors, torch reference, args)."""
  ks = iter(jax.random.split(key, 16))
  t = lambda shape, dt=torch.float32: torch.from_dlpack(jax.device_put(  # noqa: E731
      jax.random.normal(next(ks), shape, jnp.float32))).to(dt)
  sm = jax_gpu_ops.load("softmax")
  x = t((4096, 4096))
  yield ("softmax 4096x4096 f32", pl.as_torch_kernel(lambda a: sm.softmax(a, axis=-1)),
         lambda a: torch.softmax(a, dim=-1), (x,))
  ln, rms = jax_gpu_ops.load("layer_norm"), jax_gpu_ops.load("rms_norm")
  x, w, b = t((4, 1024, 4096)), t((4096,)), t((4096,))
  yield ("layer_norm fwd 4x1024x4096 f32", pl.as_torch_kernel(ln.layer_norm),
         lambda a, ww, bb: F.layer_norm(a, (4096,), ww, bb, eps=1e-5), (x, w, b))
  yield ("rms_norm fwd 4x1024x4096 f32 (JAX's op adds a bias)", pl.as_torch_kernel(rms.rms_norm),
         lambda a, ww, bb: F.rms_norm(a, (4096,), ww, eps=1e-5) + bb, (x, w, b))
  dout = t((4, 1024, 4096))
  yield ("layer_norm fwd+bwd 4x1024x4096 f32", _fwd_bwd(pl.as_torch_kernel(ln.layer_norm), dout),
         _fwd_bwd(lambda a, ww, bb: F.layer_norm(a, (4096,), ww, bb, eps=1e-5), dout), (x, w, b))
  yield ("rms_norm fwd+bwd 4x1024x4096 f32", _fwd_bwd(pl.as_torch_kernel(rms.rms_norm), dout),
         _fwd_bwd(lambda a, ww, bb: F.rms_norm(a, (4096,), ww, eps=1e-5) + bb, dout), (x, w, b))
  att = jax_gpu_ops.load("attention")
  q, k, v = (t((2, 2048, 8, 64), torch.float16) for _ in range(3))
  dout = t((2, 2048, 8, 64), torch.float16)
  for causal in (False, True):
    mha = pl.as_torch_kernel(lambda a, bb, c, cz=causal: att.mha(
        a, bb, c, segment_ids=None, causal=cz, sm_scale=1 / 8))
    tag = f"{' causal' if causal else ''} 2x2048x8x64 f16"
    yield f"mha fwd{tag}", mha, _sdpa(causal, 1 / 8), (q, k, v)
    yield f"mha fwd+bwd{tag}", _fwd_bwd(mha, dout), _fwd_bwd(_sdpa(causal, 1 / 8), dout), (q, k, v)
  # JAX's warp-specialized Mosaic GPU attention (plgpu kernels, pallax's Gluon backend)
  am = mgpu_ops.load("attention_mgpu")
  q, k, v, dout = (t((1, 4096, 16, 128), torch.float16) for _ in range(4))
  for causal in (False, True):
    cfg = am.TuningConfig(block_q=64, block_kv=128, max_concurrent_steps=2, causal=causal,
                          block_q_dkv=64, block_kv_dkv=64, block_q_dq=64, block_kv_dq=64)
    mgpu = pl.as_torch_kernel(lambda a, bb, c, cfg=cfg: am.attention(a, bb, c, cfg))
    tag = f"{' causal' if causal else ''} 1x4096x16x128 f16"
    for backend in ("FLASH_ATTENTION", "CUDNN_ATTENTION"):
      ref = _sdpa(causal, 1.0, backend)   # JAX's attention_mgpu does not scale the logits
      yield f"attention_mgpu fwd{tag} vs SDPA {backend}", mgpu, ref, (q, k, v)
      if not causal:   # JAX's kernel has no causal backward pass yet
        yield (f"attention_mgpu fwd+bwd{tag} vs SDPA {backend}", _fwd_bwd(mgpu, dout),
               _fwd_bwd(ref, dout), (q, k, v))


def _sdpa(causal: bool, scale: float, backend: str = ""):
  """torch's scaled_dot_product_attention on [batch, seq, heads, dim] tensors, with the given
  backend (torch.nn.attention.SDPBackend) or torch's own choice."""
  from torch.nn.attention import SDPBackend, sdpa_kernel

  def f(q, k, v):
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    if not backend:
      return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale).transpose(1, 2)
    with sdpa_kernel(getattr(SDPBackend, backend)):
      return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale).transpose(1, 2)
  return f


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--rounds", type=int, default=15)
  ap.add_argument("--out", default="")
  opts = ap.parse_args()
  lines = ["# pallax kernels from PyTorch against torch's ops", "",
           f"Device: {torch.cuda.get_device_name()}; {datetime.date.today()}; torch "
           f"{torch.__version__}. Command: `PYTHONPATH=$PWD python3 benchmarks/torch_ops.py`.", ""]
  lines += launch_cost(3 * opts.rounds) + [""]
  lines += ["| op | max rel. diff vs torch | pallax GPU µs | torch GPU µs | GPU speed | "
            "pallax wall µs | torch wall µs | wall speed |", "|" + " --- |" * 8]
  for label, f, ref, args in _cases(jax.random.key(int(time.time()))):
    try:
      got, want = f(*args).float(), ref(*args).float()
    except Exception as e:   # one failing case does not stop the run: its row says why
      lines.append(f"| {label} | failed: {type(e).__name__}: {str(e).splitlines()[0][:200]} |")
      print(lines[-1], flush=True)
      continue
    diff = float(((got - want).abs().max() / want.abs().max()).item())
    g = {"pallax": gpu_us(f, args), "torch": gpu_us(ref, args)}
    w = wall_us({"pallax": f, "torch": ref}, args, n=10, rounds=opts.rounds)
    lines.append(f"| {label} | {diff:.1e} | {g['pallax']:.1f} | {g['torch']:.1f} | "
                 f"{g['torch'] / g['pallax']:.3f}x | {w['pallax']:.1f} | {w['torch']:.1f} | "
                 f"{w['torch'] / w['pallax']:.3f}x |")
    print(lines[-1], flush=True)
  timing.write_report(lines, opts.out or None)


if __name__ == "__main__":
  main()

"""Where a training step through ``as_torch_kernel`` spends its wall time, on the GPU machine:
``PYTHONPATH=$PWD python3 benchmarks/probes/probe_torch_backward.py``.

For JAX's layer_norm (4x1024x4096 f32) called from torch: back-to-back wall time per call of the
plain forward program, the differentiable forward, the backward program alone, and the whole
``torch.autograd.grad`` step; then the step's host-side profile (torch.profiler, CPU and CUDA),
its longest entries first."""
from __future__ import annotations

import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import pallax as pl  # noqa: E402
import jax_gpu_ops  # noqa: E402


def per_call_us(f, n=20, rounds=7) -> float:
  f()
  torch.cuda.synchronize()
  best = []
  for _ in range(rounds):
    t = time.perf_counter()
    for _ in range(n):
      f()
    torch.cuda.synchronize()
    best.append((time.perf_counter() - t) / n * 1e6)
  return sorted(best)[len(best) // 2]


def main():
  ln = jax_gpu_ops.load("layer_norm")
  x, w, b = (torch.randn(s, device="cuda") for s in ((4, 1024, 4096), (4096,), (4096,)))
  dout = torch.randn_like(x)
  f = pl.as_torch_kernel(ln.layer_norm)
  args = [a.detach().requires_grad_() for a in (x, w, b)]

  def step():
    return torch.autograd.grad(f(*args), args, dout)

  step()
  with torch.no_grad():
    print(f"plain forward: {per_call_us(lambda: f(x, w, b)):.1f} µs")
  print(f"forward with grad (no backward): {per_call_us(lambda: f(*args)):.1f} µs")
  print(f"autograd step: {per_call_us(step):.1f} µs")
  out = f(*args)
  print(f"autograd.grad on a kept output: "
        f"{per_call_us(lambda: torch.autograd.grad(out, args, dout, retain_graph=True)):.1f} µs")
  from torch.profiler import ProfilerActivity, profile
  with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(10):
      step()
    torch.cuda.synchronize()
  print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25))
  print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=12))


if __name__ == "__main__":
  main()

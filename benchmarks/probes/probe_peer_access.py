"""Probe (two GPUs): can a kernel on GPU 0 write into an XLA buffer of GPU 1 through its address?

Prints, in order: whether CUDA reports peer access possible, whether XLA has already enabled
it (a write attempted before pallax enables anything), and the result after
``cuCtxEnablePeerAccess``. Each attempt runs in a child process: an illegal address is a sticky
CUDA error that ends the process.

    PYTHONPATH=$PWD python3 benchmarks/probes/probe_peer_access.py
"""
import ctypes
import subprocess
import sys

CHILD = r'''
import ctypes, sys
import jax, jax.numpy as jnp, numpy as np
import triton, triton.language as tl
import torch

@triton.jit
def _write(dst, n, BLOCK: tl.constexpr):
  i = tl.arange(0, BLOCK)
  tl.store(dst + i, (i + 1).to(tl.float32), mask=i < n)

class Ptr:
  def __init__(self, p): self.p = p
  def data_ptr(self): return self.p

d0, d1 = jax.devices()[:2]
x1 = jax.device_put(jnp.zeros((1024,), jnp.float32), d1)
x1.block_until_ready()
p1 = x1.unsafe_buffer_pointer()
if sys.argv[1] == "enable":
  cu = ctypes.CDLL("libcuda.so.1")
  ctx0, ctx1 = ctypes.c_void_p(), ctypes.c_void_p()
  assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx0), 0) == 0
  assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx1), 1) == 0
  assert cu.cuCtxPushCurrent_v2(ctx0) == 0
  print("cuCtxEnablePeerAccess(0 -> 1):", cu.cuCtxEnablePeerAccess(ctx1, 0), flush=True)
  cu.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
with torch.cuda.device(0):
  _write[(1,)](Ptr(p1), 1024, BLOCK=1024)
  torch.cuda.synchronize(0)
got = np.asarray(x1)
print("written from GPU 0 into GPU 1:", bool((got == np.arange(1, 1025)).all()), got[:4], flush=True)
'''


def main():
  cu = ctypes.CDLL("libcuda.so.1")
  cu.cuInit(0)
  can = ctypes.c_int()
  cu.cuDeviceCanAccessPeer(ctypes.byref(can), 0, 1)
  print("cuDeviceCanAccessPeer(0, 1):", can.value, flush=True)
  import tempfile
  with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
    f.write(CHILD)   # (Triton compiles functions defined in a file)
  for mode in ("as-is", "enable"):
    r = subprocess.run([sys.executable, f.name, mode], capture_output=True, text=True,
                       timeout=240)
    tail = (r.stdout + r.stderr).strip().splitlines()[-4:]
    print(f"[{mode}] rc={r.returncode}", *tail, sep="\n  ", flush=True)


if __name__ == "__main__":
  main()

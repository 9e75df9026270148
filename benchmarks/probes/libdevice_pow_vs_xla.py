"""Which compile option makes Triton's libdevice ``powf`` give XLA's float32 ``pow`` bit for bit
(issue 31: ``jnp.power(2, x)`` in pallax's Triton backend is 1 ulp from XLA on a third of the
inputs, JAX Pallas's is not). Tries fp-contraction off and each ``libdevice.10.bc`` found on the
machine. Run on the GPU machine: ``python3 benchmarks/probes/libdevice_pow_vs_xla.py``."""
import glob
import hashlib
import os
import site

import jax
import jax.numpy as jnp
import numpy as np
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def _pow(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
  offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  x = tl.load(x_ptr + offs, mask=offs < n)
  tl.store(y_ptr + offs, libdevice.pow(2.0, x), mask=offs < n)


def _libdevices():
  roots = site.getsitepackages() + ["/usr/local"]
  found = set()
  for r in roots:
    found.update(glob.glob(os.path.join(r, "**", "libdevice*.bc"), recursive=True))
  return sorted(found)


def main():
  x = jax.random.normal(jax.random.key(0), (1 << 16,), jnp.float32)
  want = np.asarray(jax.jit(lambda v: jnp.power(2, v))(x))
  xt = torch.from_numpy(np.asarray(x)).cuda()
  variants = [("default (ftz off)", {"enable_reflect_ftz": False}),
              ("ftz off, no fp fusion", {"enable_reflect_ftz": False, "enable_fp_fusion": False})]
  for path in _libdevices():
    digest = hashlib.md5(open(path, "rb").read()).hexdigest()[:8]
    variants.append((f"ftz off, {path} ({digest})",
                     {"enable_reflect_ftz": False, "extern_libs": {"libdevice": path}}))
  for name, opts in variants:
    y = torch.empty_like(xt)
    try:
      _pow[(len(xt) // 1024,)](xt, y, len(xt), BLOCK=1024, **opts)
    except Exception as e:   # noqa: BLE001  (a probe: report and go on)
      print(f"{name}: {type(e).__name__}: {str(e)[:200]}")
      continue
    got = y.cpu().numpy()
    print(f"{name}: {(got != want).sum()} of {got.size} differ from XLA")


if __name__ == "__main__":
  main()

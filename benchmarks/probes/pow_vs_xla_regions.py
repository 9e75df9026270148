"""Where pallax's float32 ``pow`` (libdevice ``powf``, linked from XLA's libdevice) differs from
XLA's: by kind of input, as ``tests/test_math_gpu.py`` draws them. GPU machine:
``PYTHONPATH=$PWD:$PWD/tests python3 benchmarks/probes/pow_vs_xla_regions.py``."""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import test_math_gpu as t
from gpu_math import ulps


def main():
  rng = np.random.default_rng(0)
  fn, (a, b), nd = t._cases(rng)["pow"]
  got = np.asarray(t._triton(fn, [jnp.asarray(a), jnp.asarray(b)]))
  want = np.asarray(jax.jit(lax.pow)(a, b))
  bad = ~t._same(got, want)
  n = nd
  parts = {"domain, real exponents": slice(0, n // 2), "domain, integer exponents": slice(n // 2, n),
           "random bits": slice(n, 2 * n), "magnitudes": slice(2 * n, 3 * n), "edges": slice(3 * n, None)}
  for name, s in parts.items():
    k = np.flatnonzero(bad[s])
    u = ulps(got[s], want[s])[k] if k.size else np.zeros(0)
    print(f"{name}: {k.size} of {bad[s].size} differ, ulps max {u.max(initial=0)}")
    for i in k[:4]:
      j = i + (s.start or 0)
      print(f"   pow({a[j]!r}, {b[j]!r}): pallax {got[j]!r} XLA {want[j]!r}")
  den = bad & (np.abs(want) < np.finfo(np.float32).tiny)
  print(f"of which XLA's result is denormal or zero: {den.sum()}")


if __name__ == "__main__":
  main()

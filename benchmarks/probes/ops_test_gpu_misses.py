"""Why two of JAX's ops_test cases differ on the GPU (issue 31): ``jnp.power(2, x)`` compared with
XLA at tolerance 0, and float16 ``jnp.cumsum`` compared at 1e-2. pallax's Triton backend, JAX
Pallas's Triton lowering and XLA on the same inputs. Run on the GPU machine:
  PYTHONPATH=$PWD python3 benchmarks/probes/ops_test_gpu_misses.py"""
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as jpl

import pallax as pl


def _call(mod, fn, x):
  def kernel(x_ref, y_ref):
    y_ref[...] = fn(x_ref[...])
  return mod.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _report(name, got, want, x):
  got, want = np.asarray(got), np.asarray(want)
  bad = ~((got == want) | (np.isnan(got) & np.isnan(want)))
  err = np.abs(got.astype(np.float64) - want.astype(np.float64))
  print(f"  {name}: {bad.sum()} of {got.size} differ, max |diff| {err.max():.3g}")
  for i in np.flatnonzero(bad.ravel())[:3]:
    print(f"    x={x.ravel()[i]!r} got={got.ravel()[i]!r} want={want.ravel()[i]!r}")


def pow2():
  for shape in [(2, 64), (64, 64), (8, 4, 32)]:
    x = jax.random.normal(jax.random.key(0), shape, jnp.float32)
    fn = lambda v: jnp.power(2, v)
    want = jax.jit(fn)(x)
    print(f"pow(2, x) {shape}")
    _report("pallax vs XLA", _call(pl, fn, x), want, x)
    _report("JAX Pallas vs XLA", _call(jpl, fn, x), want, x)
    _report("pallax exp2 vs XLA", _call(pl, jnp.exp2, x), want, x)
    two = lambda v: jnp.power(jnp.full_like(v, 2) + 0 * v, v)   # a base the compiler cannot fold
    _report("pallax, base not a constant, vs XLA", _call(pl, two, x), want, x)
    _report("pallax lax.pow(x, 2.0)... square vs XLA", _call(pl, lambda v: v * v, x), jax.jit(lambda v: v * v)(x), x)


def cumsum():
  for axis in (0, 1):
    worst = {}
    for key in jax.random.split(jax.random.key(0), 20):
      x = jax.random.normal(key, (32, 8), jnp.float16)
      want = np.asarray(jnp.cumsum(x, axis=axis), np.float64)
      exact = np.cumsum(np.asarray(x, np.float64), axis=axis)
      for name, got in [("pallax", _call(pl, lambda v: jnp.cumsum(v, axis=axis), x)),
                        ("JAX Pallas", _call(jpl, lambda v: jnp.cumsum(v, axis=axis), x)),
                        ("pallax f32 acc", _call(pl, lambda v: jnp.cumsum(v.astype(jnp.float32), axis=axis).astype(v.dtype), x)),
                        ("XLA", want)]:
        g = np.asarray(got, np.float64)
        d = np.abs(g - want) - (1e-2 + 1e-2 * np.abs(want))
        w = worst.setdefault(name, [0, 0.0, 0.0])
        w[0] += int((d > 0).sum()); w[1] = max(w[1], np.abs(g - want).max()); w[2] = max(w[2], np.abs(g - exact).max())
    print(f"cumsum float16 (32, 8) axis {axis}, 20 inputs:")
    for name, (n, dx, de) in worst.items():
      print(f"  {name}: {n} outside tol, max |diff| vs XLA {dx:.3g}, vs exact {de:.3g}")


if __name__ == "__main__":
  pow2()
  cumsum()

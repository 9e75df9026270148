"""`make demo`: the seed notebook's kernels and a few more, each checked against plain JAX and timed.

Runs wherever JAX runs: on a CPU machine the kernels go through pallax's interpreter.
"""
import time

import jax
import jax.numpy as jnp
import numpy as np

import pallax as pl


def timed(f, *args, reps=5):
  out = jax.block_until_ready(f(*args))
  ts = []
  for _ in range(reps):
    t = time.perf_counter()
    jax.block_until_ready(f(*args))
    ts.append(time.perf_counter() - t)
  return out, float(np.median(ts)) * 1e3


def rel_err(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


# --- the notebook's kernels ----------------------------------------------------------

def add_vectors_kernel(x_ref, y_ref, o_ref):
  x, y = x_ref[...], y_ref[...]
  o_ref[...] = x + y


@jax.jit
def add_vectors(x, y):
  return pl.pallas_call(add_vectors_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)


def iota_kernel(o_ref):
  i = pl.program_id(0)
  o_ref[i] = i


def iota(size):
  return pl.pallas_call(iota_kernel, out_shape=jax.ShapeDtypeStruct((size,), jnp.int32),
                        grid=(size,))()


def matmul_kernel(x_ref, y_ref, z_ref):
  z_ref[...] = x_ref[...] @ y_ref[...]


@jax.jit
def matmul(x, y):
  return pl.pallas_call(
      matmul_kernel,
      out_shape=jax.ShapeDtypeStruct((x.shape[0], y.shape[1]), x.dtype),
      grid=(2, 2),
      in_specs=[pl.BlockSpec((x.shape[0] // 2, x.shape[1]), lambda i, j: (i, 0)),
                pl.BlockSpec((y.shape[0], y.shape[1] // 2), lambda i, j: (0, j))],
      out_specs=pl.BlockSpec((x.shape[0] // 2, y.shape[1] // 2), lambda i, j: (i, j)))(x, y)


# --- a few more -------------------------------------------------------------------------

def blocked_matmul(x, y, bm=128, bn=128, bk=128):
  """K loop in the grid: the output block is revisited along axis 2 and accumulates."""
  def kernel(x_ref, y_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
      o_ref[...] = jnp.zeros_like(o_ref)
    o_ref[...] += pl.dot(x_ref[...], y_ref[...])
  m, k = x.shape
  n = y.shape[1]
  return pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
      grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), pl.cdiv(k, bk)),
      in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)))(x, y)


def softmax(x, block_rows=8):
  def kernel(x_ref, o_ref):
    v = x_ref[...]
    e = jnp.exp(v - v.max(axis=1, keepdims=True))
    o_ref[...] = e / e.sum(axis=1, keepdims=True)
  r, c = x.shape
  spec = pl.BlockSpec((block_rows, c), lambda i: (i, 0))
  return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                        grid=(pl.cdiv(r, block_rows),), in_specs=[spec], out_specs=spec)(x)


def masked_scale(x, block=256):
  """Triton style: whole arrays, pl.ds offsets from program_id, a mask for the ragged end."""
  n = x.shape[0]
  def kernel(x_ref, o_ref):
    offs = pl.program_id(0) * block + jnp.arange(block)
    v = pl.load(x_ref, (pl.ds(pl.program_id(0) * block, block),), mask=offs < n, other=0.0)
    pl.store(o_ref, (pl.ds(pl.program_id(0) * block, block),), v * 3.0, mask=offs < n)
  return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                        grid=(pl.cdiv(n, block),))(x)


def main():
  keys = jax.random.split(jax.random.key(42), 8)
  rows = []
  # f32 dots in kernels use TF32 on a GPU by default (as in Pallas): relative error ~1e-3.
  on_gpu = jax.devices()[0].platform == "gpu"
  mm_tol = 2e-3 if on_gpu else 1e-5
  x8, y8 = jax.random.randint(keys[0], (8,), 0, 100), jax.random.randint(keys[1], (8,), 0, 100)
  out, ms = timed(add_vectors, x8, y8)
  rows.append(("add_vectors (notebook)", np.array_equal(out, x8 + y8), 0.0, ms))
  out, ms = timed(iota, 8)
  rows.append(("iota (notebook)", np.array_equal(out, np.arange(8)), 0.0, ms))
  x = jax.random.normal(keys[2], (1024, 1024))
  y = jax.random.normal(keys[3], (1024, 1024))
  out, ms = timed(matmul, x, y)
  ref = jnp.dot(x, y, precision="highest")
  rows.append(("matmul 1024^2, 2x2 grid (notebook)", rel_err(out, ref) < mm_tol, rel_err(out, ref), ms))
  xb = jax.random.normal(keys[4], (8, 1024, 1024))
  out, ms = timed(jax.jit(jax.vmap(matmul)), xb, xb)
  ref = jnp.einsum("bij,bjk->bik", xb, xb, precision="highest")
  rows.append(("vmap(matmul) x8 (notebook)", rel_err(out, ref) < mm_tol, rel_err(out, ref), ms))
  a = jax.random.normal(keys[5], (300, 512))  # M, N partial blocks; K must divide (NaN padding!)
  b = jax.random.normal(keys[6], (512, 200))
  out, ms = timed(jax.jit(blocked_matmul), a, b)
  ref = jnp.dot(a, b, precision="highest")
  rows.append(("matmul, K loop in the grid, partial blocks", rel_err(out, ref) < mm_tol,
               rel_err(out, ref), ms))
  s = jax.random.normal(keys[7], (1000, 384))
  out, ms = timed(jax.jit(softmax), s)
  ref = jax.nn.softmax(s, axis=1)
  rows.append(("softmax 1000x384", rel_err(out, ref) < 1e-6, rel_err(out, ref), ms))
  v = jax.random.normal(keys[0], (1000,))
  out, ms = timed(jax.jit(masked_scale), v)
  rows.append(("masked load/store, ragged end", np.allclose(out, v * 3), rel_err(out, v * 3), ms))

  print(f"\n{'kernel':46} {'agrees':>7} {'rel. error':>11} {'time (ms)':>10}")
  for name, ok, err, ms in rows:
    print(f"{name:46} {'yes' if ok else 'NO':>7} {err:11.2e} {ms:10.3f}")
  if not all(r[1] for r in rows):
    raise SystemExit("some kernels disagree with their reference")
  print(f"\nall {len(rows)} kernels agree with plain JAX (device: {jax.devices()[0].device_kind}; "
        f"f32 matmuls within {mm_tol:g} relative error)")


if __name__ == "__main__":
  main()

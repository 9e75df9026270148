"""`make demo`: Pallas kernels run by pallax, each checked against plain JAX and timed beside it.

1. Every kernel runs in pallax's interpreter on the CPU (how kernels run on a machine without a
   GPU, with bounds checks on), against the same computation in plain `jax.numpy`.
2. On a machine with an NVIDIA GPU, the same kernels run on the GPU, compiled through Triton.
3. The Triton source pallax generates for one kernel (no GPU needed to generate it).
"""
import dataclasses
import functools
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import pallax as pl

CALLS = 5   # timed calls per function, after one untimed call that traces and compiles


# --- the kernels of JAX's Pallas quickstart tutorial, unchanged but for `import pallax as pl` ---

def add_vectors_kernel(x_ref, y_ref, o_ref):
  x, y = x_ref[...], y_ref[...]
  o_ref[...] = x + y


@jax.jit
def add_vectors(x, y):
  return pl.pallas_call(add_vectors_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)


def iota_kernel(o_ref):
  i = pl.program_id(0)
  o_ref[i] = i


@functools.partial(jax.jit, static_argnums=0)
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


# --- a few more ----------------------------------------------------------------------------------

@jax.jit
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


@jax.jit
def softmax(x, block_rows=8):
  def kernel(x_ref, o_ref):
    v = x_ref[...]
    e = jnp.exp(v - v.max(axis=1, keepdims=True))
    o_ref[...] = e / e.sum(axis=1, keepdims=True)
  r, c = x.shape
  spec = pl.BlockSpec((block_rows, c), lambda i: (i, 0))
  return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                        grid=(pl.cdiv(r, block_rows),), in_specs=[spec], out_specs=spec)(x)


@jax.jit
def masked_scale(x, block=256):
  """Triton style: whole arrays, pl.ds offsets from program_id, a mask for the ragged end."""
  n = x.shape[0]
  def kernel(x_ref, o_ref):
    offs = pl.program_id(0) * block + jnp.arange(block)
    v = pl.load(x_ref, (pl.ds(pl.program_id(0) * block, block),), mask=offs < n, other=0.0)
    pl.store(o_ref, (pl.ds(pl.program_id(0) * block, block),), v * 3.0, mask=offs < n)
  return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                        grid=(pl.cdiv(n, block),))(x)


# --- running and timing ------------------------------------------------------------------------

def _dot(a, b):
  return jnp.matmul(a, b, precision="highest")


@dataclasses.dataclass(frozen=True)
class Case:
  name: str
  inputs: str                  # the inputs' shapes and dtypes, and the grid
  kernel: Callable
  plain: Callable              # the same computation in plain jax.numpy
  make_args: Callable          # key -> the arguments
  matmul: bool = False         # float32 dots: TF32 on a GPU, as in Pallas


def cases() -> list[Case]:
  normal = jax.random.normal
  pair = lambda shape: lambda key: tuple(normal(k, shape) for k in jax.random.split(key))
  return [
      Case("add_vectors [tutorial]", "2 x int32[8], no grid", add_vectors, lambda x, y: x + y,
           lambda key: tuple(jax.random.randint(k, (8,), 0, 100) for k in jax.random.split(key))),
      Case("iota [tutorial]", "out int32[8], grid (8,)", lambda: iota(8),
           jax.jit(lambda: jnp.arange(8, dtype=jnp.int32)), lambda key: ()),
      Case("matmul [tutorial]", "2 x f32[1024,1024], grid (2,2)", matmul, jax.jit(_dot),
           pair((1024, 1024)), matmul=True),
      Case("vmap(matmul) [tutorial]", "2 x f32[8,1024,1024]", jax.jit(jax.vmap(matmul)),
           jax.jit(_dot), pair((8, 1024, 1024)), matmul=True),
      Case("matmul, K loop in the grid", "f32[300,512] @ f32[512,200], grid (3,2,4)",
           blocked_matmul, jax.jit(_dot),
           lambda key: (normal(key, (300, 512)), normal(jax.random.fold_in(key, 1), (512, 200))),
           matmul=True),   # M and N end in partial blocks
      Case("softmax", "f32[1000,384], grid (125,)", softmax,
           jax.jit(lambda x: jax.nn.softmax(x, axis=1)), lambda key: (normal(key, (1000, 384)),)),
      Case("masked load/store, ragged end", "f32[1000], grid (4,)", masked_scale,
           jax.jit(lambda x: x * 3.0), lambda key: (normal(key, (1000,)),)),
  ]


def warm_median_ms(f, *args) -> float:
  """The median time of CALLS calls of ``f``, after one call that traces and compiles."""
  jax.block_until_ready(f(*args))
  times = []
  for _ in range(CALLS):
    t = time.perf_counter()
    jax.block_until_ready(f(*args))
    times.append(time.perf_counter() - t)
  return float(np.median(times)) * 1e3


def rel_err(a, b) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def run_all(device) -> bool:
  """Runs every case on ``device``, prints a table; whether all agree with plain JAX."""
  gpu = device.platform == "gpu"
  mm_tol = 2e-3 if gpu else 1e-5   # f32 dots on a GPU use TF32 by default, as in Pallas
  print(f"{'kernel':31} {'inputs':43} {'agrees':>6} {'rel. err':>9} {'pallax ms':>10} "
        f"{'jnp ms':>8}")
  ok = True
  for i, case in enumerate(cases()):
    args = jax.device_put(case.make_args(jax.random.key(i)), device)
    with jax.default_device(device):
      out, want = case.kernel(*args), case.plain(*args)
      err = rel_err(out, want)
      agrees = err < (mm_tol if case.matmul else 1e-6)
      ms, plain_ms = warm_median_ms(case.kernel, *args), warm_median_ms(case.plain, *args)
    ok &= agrees
    print(f"{case.name:31} {case.inputs:43} {'yes' if agrees else 'NO':>6} {err:9.1e} "
          f"{ms:10.3f} {plain_ms:8.3f}")
  return ok


def show_triton_source(lines: int = 24):
  """The generated Triton source of the softmax kernel, as ``pallax.triton.lower`` returns it."""
  try:
    import pallax.triton as plgpu
    art = plgpu.lower(softmax, jax.ShapeDtypeStruct((1000, 384), jnp.float32),
                      compute_capability=90)[0]
  except ImportError:
    print("(the `triton` package is not installed here: pip install 'pallax[triton]' to see it)")
    return
  src = art.source.splitlines()
  start = next(i for i, line in enumerate(src) if line.startswith(f"def {art.name}(")) - 1
  print(f"{len(src)} lines in all; the kernel function, without the helpers defined above it:\n")
  for line in src[start:start + lines]:
    print("    " + (line if len(line) <= 120 else line[:117] + "..."))
  if len(src) > start + lines:
    print("    ...")


def main():
  print("pallax demo: Pallas kernels run by pallax, each checked against plain JAX and timed "
        "beside it.")
  print(f"\nTimes: the median of {CALLS} warm calls in milliseconds (the first call, which traces "
        "and compiles, is\nnot counted). 'jnp ms' times the same computation written in plain "
        "jax.numpy, jitted, on the same\ndevice. [tutorial]: a kernel of JAX's Pallas quickstart "
        "tutorial, unchanged but for `import pallax as pl`.\nrel. err: |pallax - jnp| / |jnp| "
        "over the whole output.")
  print("\n1. In pallax's interpreter on the CPU (the reference semantics; bounds checks on)\n")
  ok = run_all(jax.devices("cpu")[0])
  gpus = [d for d in jax.devices() if d.platform == "gpu"]
  if gpus:
    print(f"\n2. On the GPU ({gpus[0].device_kind}), compiled through Triton\n")
    ok &= run_all(gpus[0])
  else:
    print("\n2. On a GPU: no GPU here. On a machine with an NVIDIA GPU (and pallax's `triton` "
          "extra), the same\n   kernels run there, compiled through Triton.")
  print("\n3. The Triton source pallax generates for the softmax kernel "
        "(pallax.triton.lower(softmax, x, compute_capability=90),\n   which needs no GPU)\n")
  show_triton_source()
  if not ok:
    raise SystemExit("\nsome kernels disagree with plain JAX")
  print("\nAll kernels agree with plain JAX.")


if __name__ == "__main__":
  main()

"""int64/uint64/float64 kernels on Triton against the interpreter, with jax_enable_x64 on (run in
a process of its own by tests/test_triton_gpu.py, or on a CPU to check it lowers)."""
import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import pallax as pl  # noqa: E402
import pallax.triton as plgpu  # noqa: E402

S = jax.ShapeDtypeStruct


def kernel(i_ref, u_ref, f_ref, oi_ref, ou_ref, of_ref):
  i, u, f = i_ref[...], u_ref[...], f_ref[...]
  big = jnp.int64(3) << 40                                # does not fit in 32 bits
  oi_ref[...] = (i * 3 + big) // 7 - (i >> 3) + jnp.max(i) + f.astype(jnp.int64)
  ou_ref[...] = (u ^ (u >> 13)) * jnp.uint64(0x9E3779B97F4A7C15) + i.astype(jnp.uint64)
  of_ref[...] = jnp.exp(f / 1e3) * jnp.sqrt(jnp.abs(f)) + jnp.sum(f) + i.astype(jnp.float64)


def build(interpret):
  return jax.jit(lambda i, u, f: pl.pallas_call(
      kernel, out_shape=(S((300,), jnp.int64), S((300,), jnp.uint64), S((300,), jnp.float64)),
      grid=(3,), in_specs=[pl.BlockSpec((100,), lambda g: (g,))] * 3,
      out_specs=[pl.BlockSpec((100,), lambda g: (g,))] * 3, interpret=interpret)(i, u, f))


def args():
  k = jax.random.split(jax.random.key(11), 3)
  i = jax.random.randint(k[0], (300,), -2**62, 2**62, dtype=jnp.int64)
  u = jax.random.bits(k[1], (300,), dtype=jnp.uint64)
  f = jax.random.normal(k[2], (300,), jnp.float64) * 1e3
  return i, u, f


if __name__ == "__main__":
  a = args()
  if jax.devices()[0].platform != "gpu":
    arts = plgpu.lower(build(False), *a, compute_capability=90)
    print("lowered:", [x.name for x in arts])
  else:
    got, want = build(False)(*a), build(True)(*a)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_allclose(got[2], want[2], rtol=1e-12)
    print("RESULT: x64 kernels agree")

"""What a failing pl.debug_check does on the GPU (run in its own process: a device assert
poisons the CUDA context)."""
import jax
import jax.numpy as jnp

import pallax as pl


def kernel(x_ref, o_ref):
  pl.debug_check(jnp.all(x_ref[...] < 0), "x must be negative")
  o_ref[...] = x_ref[...]


with pl.enable_debug_checks():
  f = jax.jit(lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((32,), jnp.float32))(x))
  try:
    print(jax.block_until_ready(f(jnp.ones(32))))
    print("RESULT: no error raised")
  except Exception as e:  # noqa: BLE001
    print("RESULT: raised", type(e).__name__, str(e)[:300])

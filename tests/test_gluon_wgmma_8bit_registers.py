"""``plgpu.wgmma`` with an 8-bit ``a`` in registers (``Layout.WGMMA_8BIT``) and ``b`` in SMEM
read K-major, as JAX's own tests write it: float8 (e4m3, e5m2) into a float32 accumulator and
int8 into an int32 one, against numpy on random inputs; N of 64 and a non-power of two (192).

On the Gluon backend such a wgmma completes before the next statement (Triton 3.6 cannot keep
8-bit register operands alive through ``warpgroup_mma_wait``); integer wgmmas wider than 128
columns are refused by name (Triton 3.6 writes int8 wgmmas up to N=128). On a GPU each kernel
also runs as Gluon and is compared with the interpreter (conftest.py, gluon_check.py).

Tolerances: int8 products summed in int32 are exact; float8 products are exact in float32,
so only the summation order differs (rtol=1e-5, atol=1e-5 of the result's scale).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax as pl
import pallax.mosaic_gpu as plgpu

pytestmark = pytest.mark.interpreter

M, K = 64, 128


def wgmma_from_registers(n, dtype):
  acc_dtype = jnp.int32 if jnp.issubdtype(dtype, jnp.integer) else jnp.float32
  tiles = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(64))

  def body(a_gmem, b_gmem, o_ref, a_smem, b_smem, bar):
    plgpu.copy_gmem_to_smem(a_gmem, a_smem, bar)
    plgpu.copy_gmem_to_smem(b_gmem, b_smem, bar)
    plgpu.barrier_wait(bar)

    def scope(acc_ref):
      a = plgpu.load(a_smem, layout=plgpu.Layout.WGMMA_8BIT)
      plgpu.wgmma(acc_ref, a, plgpu.transpose_ref(b_smem, (1, 0)))
      return acc_ref[...]
    o_ref[...] = pl.run_scoped(scope, plgpu.ACC((M, n), acc_dtype))

  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((M, n), acc_dtype), interpret=True,
                      scratch_types=[plgpu.SMEM((M, K), dtype, transforms=tiles),
                                     plgpu.SMEM((n, K), dtype, transforms=tiles),
                                     plgpu.Barrier(num_arrivals=2)])


def operands(seed, n, dtype):
  rng = np.random.default_rng(seed)
  if jnp.issubdtype(dtype, jnp.integer):
    a, b = rng.integers(-128, 128, (M, K)), rng.integers(-128, 128, (n, K))
  else:
    a, b = rng.uniform(-2, 2, (M, K)), rng.uniform(-2, 2, (n, K))
  return jnp.asarray(a, dtype), jnp.asarray(b, dtype)


@pytest.mark.parametrize("n", [64, 192])
@pytest.mark.parametrize("dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2],
                         ids=["float8_e4m3fn", "float8_e5m2"])
def test_float8_a_from_registers(dtype, n):
  a, b = operands(n, n, dtype)
  got = np.asarray(wgmma_from_registers(n, dtype)(a, b))
  want = np.asarray(a, np.float32) @ np.asarray(b, np.float32).T
  scale = float(np.abs(want).max())
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale)


def test_int8_a_from_registers():
  a, b = operands(3, 64, jnp.int8)
  got = np.asarray(wgmma_from_registers(64, jnp.int8)(a, b))
  np.testing.assert_array_equal(got, np.asarray(a, np.int32) @ np.asarray(b, np.int32).T)


@pytest.mark.gluon_refuses("int8 wgmma 192 wide")
def test_int8_wider_than_128_columns_is_refused_by_gluon():
  a, b = operands(4, 192, jnp.int8)
  got = np.asarray(wgmma_from_registers(192, jnp.int8)(a, b))
  np.testing.assert_array_equal(got, np.asarray(a, np.int32) @ np.asarray(b, np.int32).T)

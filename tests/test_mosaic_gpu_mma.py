"""``plgpu.mma`` (``acc + a @ b`` from registers, Ampere's ``mma.sync``), issue 27: against
``jnp.dot`` in the accumulator's dtype on random inputs, every operand dtype JAX takes, an
accumulator carried through a K loop, and JAX's type errors (with its words).

Integer results are compared exactly; float32 accumulations of 16- and 8-bit products with
rtol=1e-5, atol=1e-5 (the products are exact in float32, only the summation order differs).
Every kernel is also lowered to Gluon for sm_90a here (``mma_v2``), and compared on a GPU
(tests/gluon_check.py); Gluon has no int4 operands, which it refuses by name.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu

S = jax.ShapeDtypeStruct
# Semantics tests: on a GPU machine they run in the interpreter on the host, and each plgpu kernel
# also runs as Gluon on the GPU, compared with the interpreter (conftest.py, gluon_check.py).
pytestmark = pytest.mark.interpreter


def operands(seed, m, k, n, dtype):
  rng = np.random.default_rng(seed)
  if jnp.issubdtype(dtype, jnp.integer):
    info = jnp.iinfo(dtype)
    a, b = (rng.integers(info.min, info.max + 1, s) for s in ((m, k), (k, n)))
  else:
    a, b = (rng.uniform(-1, 1, s) + 0.25 for s in ((m, k), (k, n)))
  return a.astype(dtype), b.astype(dtype)


def reference(acc, a, b):
  wide = acc.dtype
  return np.asarray(acc + jnp.dot(a.astype(wide), b.astype(wide), precision="highest",
                                  preferred_element_type=wide))


def product_kernel(m, n, acc_dtype, dtype):
  @plgpu.kernel(out_type=S((m, n), acc_dtype), interpret=True)
  def product(acc_ref, a_ref, b_ref, o_ref):
    acc = plgpu.layout_cast(acc_ref[...], plgpu.Layout.MMA_ACC(dtype))
    a = plgpu.load(a_ref, layout=plgpu.Layout.MMA_LHS(dtype), optimized=False)
    b = plgpu.load(b_ref, layout=plgpu.Layout.MMA_RHS(dtype), optimized=False)
    o_ref[...] = plgpu.mma(acc, a, b)
  return product


DTYPES = [jnp.float16, jnp.bfloat16, jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.int8]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("mkn", [(128, 128, 8), (64, 32, 16)])
def test_mma_matches_dot_in_the_accumulators_dtype(dtype, mkn):
  m, k, n = mkn
  a, b = operands(0, m, k, n, dtype)
  integer = jnp.issubdtype(dtype, jnp.integer)
  acc_dtype = jnp.int32 if integer else jnp.float32
  acc = (np.arange(m * n).reshape(m, n) % 7 - 3).astype(acc_dtype)
  got = product_kernel(m, n, acc_dtype, dtype)(acc, a, b)
  if integer:
    np.testing.assert_array_equal(got, reference(acc, a, b))
  else:
    np.testing.assert_allclose(got, reference(acc, a, b), rtol=1e-5, atol=1e-5)


@pytest.mark.gluon_refuses("plgpu.mma of int4", "is int4, packed two or four values per byte")
def test_mma_of_int4():
  a, b = operands(1, 64, 64, 8, jnp.int4)
  acc = np.ones((64, 8), np.int32)
  np.testing.assert_array_equal(product_kernel(64, 8, jnp.int32, jnp.int4)(acc, a, b),
                                reference(acc, a, b))


def test_mma_accumulates_over_a_k_loop():
  m, k, n, tk = 64, 128, 16, 32
  a, b = operands(2, m, k, n, jnp.float16)

  @plgpu.kernel(out_type=S((m, n), jnp.float32), interpret=True)
  def k_loop(a_ref, b_ref, o_ref):
    def step(i, acc):
      cols = pl.ds(pl.multiple_of(i * tk, tk), tk)
      return plgpu.mma(acc, a_ref[:, cols], b_ref[cols, :])
    o_ref[...] = lax.fori_loop(0, k // tk, step, jnp.zeros((m, n), jnp.float32))

  want = reference(np.zeros((m, n), np.float32), a, b)
  np.testing.assert_allclose(k_loop(a, b), want, rtol=1e-5, atol=1e-5)


def test_mma_type_errors_carry_jaxs_words():
  def run(acc, a, b):
    @plgpu.kernel(out_type=S(acc.shape, acc.dtype), interpret=True)
    def k(o_ref):
      o_ref[...] = plgpu.mma(acc, a, b)
    return jax.make_jaxpr(k)()

  f32, f16 = jnp.float32, jnp.float16
  with pytest.raises(ValueError, match="Incompatible shapes for matrix multiplication"):
    run(jnp.zeros((64, 8), f32), jnp.ones((64, 32), f16), jnp.ones((16, 8), f16))
  with pytest.raises(TypeError, match="Operand dtypes must match"):
    run(jnp.zeros((64, 8), f32), jnp.ones((64, 32), f16), jnp.ones((32, 8), jnp.bfloat16))
  with pytest.raises(NotImplementedError, match="Only int32 accumulator supported"):
    run(jnp.zeros((64, 8), f32), jnp.ones((64, 32), jnp.int8), jnp.ones((32, 8), jnp.int8))
  with pytest.raises(NotImplementedError, match="Only float64, float32 and float16 accumulators"):
    run(jnp.zeros((64, 8), jnp.bfloat16), jnp.ones((64, 32), f16), jnp.ones((32, 8), f16))

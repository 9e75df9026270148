"""int4 and uint4 operands of Mosaic GPU (plgpu) kernels: read from GMEM into registers (through
the bytes that pack two values each), converted to wider types and computed with. Each kernel
runs in the interpreter against NumPy (exactly); on a machine without a GPU the suite's conftest
also lowers it to sm_90a PTX through the Gluon backend, on a GPU runs it there. What the Gluon
backend does not read or write packed (SMEM buffers, stores into GMEM) is refused by name."""
import functools
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu

SUB = [jnp.int4, jnp.uint4]
IDS = ["int4", "uint4"]


def _random(dtype, shape, seed):
  """Values over the type's whole range, none of them zero (a zero would hide a nibble read
  from the wrong half of its byte as often as not)."""
  info = ml_dtypes.iinfo(np.dtype(dtype))
  rng = np.random.default_rng(seed)
  nonzero = np.array([v for v in range(int(info.min), int(info.max) + 1) if v])
  return jnp.asarray(rng.choice(nonzero, size=shape).astype(np.int8)).astype(dtype)


def _wide(x):
  return np.asarray(x.astype(jnp.int32))


@pytest.mark.parametrize("dtype", SUB, ids=IDS)
@pytest.mark.parametrize("to", [jnp.bfloat16, jnp.float32, jnp.int8, jnp.int32],
                         ids=["bfloat16", "float32", "int8", "int32"])
def test_gmem_load_in_the_wgmma_layout_converted(dtype, to):
  x = _random(dtype, (64, 192), seed=1)

  @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct(x.shape, to))
  def f(x_ref, o_ref):
    v = plgpu.load(x_ref, layout=plgpu.Layout.WGMMA, optimized=False).astype(to)
    o_ref[...] = v * 3 - 1

  np.testing.assert_array_equal(np.asarray(f(x)), (_wide(x) * 3 - 1).astype(to))


@pytest.mark.parametrize("dtype", SUB, ids=IDS)
@pytest.mark.parametrize("shape", [(127,), (24, 34), (5, 3, 7)], ids=["127", "24x34", "5x3x7"])
def test_gmem_load_of_shapes_that_are_not_powers_of_two(dtype, shape):
  """Odd sizes: the last byte of the array holds a single value; rows of odd length start in the
  high nibble of a byte."""
  x = _random(dtype, shape, seed=2)

  @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct(shape, jnp.int32))
  def f(x_ref, o_ref):
    o_ref[...] = x_ref[...].astype(jnp.int32) * 7 + 2

  np.testing.assert_array_equal(np.asarray(f(x)), _wide(x) * 7 + 2)


@pytest.mark.parametrize("dtype", SUB, ids=IDS)
def test_gmem_views_at_odd_offsets_over_a_grid(dtype):
  """Each block reads rows from a run-time start and columns from an odd static start, and a
  view of the transposed array: elements of both halves of their bytes."""
  x = _random(dtype, (48, 70), seed=3)

  @functools.partial(plgpu.kernel, out_type=[jax.ShapeDtypeStruct((3, 16, 33), jnp.float32),
                                             jax.ShapeDtypeStruct((3, 33, 16), jnp.int32)],
                     grid=(3,), grid_names=("i",))
  def f(x_ref, o_ref, t_ref):
    i = lax.axis_index("i")
    o_ref[i] = x_ref[pl.ds(i * 16, 16), pl.ds(5, 33)].astype(jnp.float32) + 0.5
    t_ref[i] = x_ref.T[pl.ds(3, 33), pl.ds(i * 16, 16)].astype(jnp.int32)

  w = _wide(x)
  o, t = f(x)
  np.testing.assert_array_equal(np.asarray(o), np.stack([w[16 * i:16 * i + 16, 5:38] + 0.5 for i in range(3)]))
  np.testing.assert_array_equal(np.asarray(t), np.stack([w[16 * i:16 * i + 16, 3:36].T for i in range(3)]))


@pytest.mark.parametrize("dtype", SUB, ids=IDS)
def test_scalar_reads_select(dtype):
  """Single elements at even and odd positions, read as scalars."""
  x = _random(dtype, (8, 64), seed=4)

  @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((8, 64), jnp.int32))
  def f(x_ref, o_ref):
    a, b = x_ref[2, 6].astype(jnp.int32), x_ref[5, 9].astype(jnp.int32)
    v = x_ref[...].astype(jnp.int32)
    o_ref[...] = jnp.where(a > b, v * a, v - b)

  w = _wide(x)
  a, b = w[2, 6], w[5, 9]
  np.testing.assert_array_equal(np.asarray(f(x)), w * a if a > b else w - b)


@pytest.mark.parametrize("dtype", SUB, ids=IDS)
def test_sub_byte_arithmetic_wraps_in_registers(dtype):
  """Arithmetic on the loaded values in their own type wraps modulo 16, as lax's does; the
  result leaves the kernel widened."""
  x, y = _random(dtype, (16, 96), seed=5), _random(dtype, (16, 96), seed=6)

  def compute(a, b):
    return ((a * b + a) ^ (b >> 1)).astype(jnp.int8), (a.astype(jnp.int32) + 9).astype(dtype).astype(jnp.int8)

  @functools.partial(plgpu.kernel, out_type=[jax.ShapeDtypeStruct(x.shape, jnp.int8)] * 2)
  def f(x_ref, y_ref, o_ref, p_ref):
    o_ref[...], p_ref[...] = compute(x_ref[...], y_ref[...])

  for got, want in zip(f(x, y), compute(x, y)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("dtype", SUB, ids=IDS)
def test_mma_of_sub_byte_operands(dtype):
  """plgpu.mma (mma.sync) of int4 or uint4 operands read from GMEM, accumulated in int32: the
  operands are multiplied as int8, which holds them exactly."""
  m, k, n = 64, 96, 16
  a, b = _random(dtype, (m, k), seed=7), _random(dtype, (n, k), seed=8)

  @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((m, n), jnp.int32))
  def f(a_ref, b_ref, o_ref):
    acc = plgpu.layout_cast(jnp.zeros((m, n), jnp.int32), plgpu.Layout.MMA_ACC(jnp.int8))
    x = plgpu.load(a_ref, layout=plgpu.Layout.MMA_LHS(jnp.int8), optimized=False)
    y = plgpu.load(b_ref.T, layout=plgpu.Layout.MMA_RHS(jnp.int8), optimized=False)
    o_ref[...] = plgpu.mma(acc, x, y)

  np.testing.assert_array_equal(np.asarray(f(a, b)), _wide(a) @ _wide(b).T)


# --- what the Gluon backend refuses ------------------------------------------------------------

def _store_kernel(dtype):
  @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((8, 64), dtype))
  def f(x_ref, o_ref):
    o_ref[...] = (x_ref[...].astype(jnp.int32) + 1).astype(dtype)
  return f


def _smem_kernel(dtype):
  def body(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    o_ref[...] = smem[...].astype(jnp.bfloat16)
  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((64, 128), jnp.bfloat16),
                      scratch_types=[plgpu.SMEM((64, 128), dtype), plgpu.Barrier()])


@pytest.mark.interpreter   # on a GPU machine Gluon refuses the kernel: the interpreter runs it
@pytest.mark.gluon_refuses("packed two or four values a byte")
@pytest.mark.parametrize("dtype", SUB, ids=IDS)
def test_stores_and_smem_of_sub_byte_types_run_in_the_interpreter(dtype):
  x = _random(dtype, (8, 64), seed=9)
  np.testing.assert_array_equal(_wide(_store_kernel(dtype)(x)), _wide((_wide(x) + 1).astype(dtype)))
  x = _random(dtype, (64, 128), seed=10)
  np.testing.assert_array_equal(np.asarray(_smem_kernel(dtype)(x)), _wide(x).astype(jnp.bfloat16))


@pytest.mark.parametrize("make, shape, what", [
    (_store_kernel, (8, 64), "a store or atomic into out[0] from registers of int4"),
    (_smem_kernel, (64, 128), "a register load of an SMEM buffer of int4")],
    ids=["gmem_store", "smem"])
def test_gluon_refuses_what_it_does_not_write_packed(make, shape, what):
  with pytest.raises(NotImplementedError, match=re.escape(
      f"{what}, packed two or four values a byte: pallax's Gluon backend moves packed SMEM by "
      "TMA and MMAs only, and reads sub-byte integers into registers from GMEM only")):
    plgpu.lower(make(jnp.int4), jax.ShapeDtypeStruct(shape, jnp.int4))

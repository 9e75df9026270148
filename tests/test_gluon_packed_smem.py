"""Sub-byte values (int4, uint4, int2, float4) in SMEM on the Gluon backend: held packed as in
GMEM, two or four a byte, and moved by TMA as their bytes. Each kernel runs in the interpreter
on random values and must give its input back exactly; on a GPU it also runs as Gluon and is
compared with the interpreter (conftest.py, gluon_check.py). What registers would read or write
packed is refused by name.
"""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import pallax as pl
import pallax.mosaic_gpu as plgpu

pytestmark = pytest.mark.interpreter

S = jax.ShapeDtypeStruct
TYPES = [jnp.int4, jnp.uint4, jnp.int2, jnp.float4_e2m1fn]


def _values(dtype, shape, seed):
  """Every value of the type, shuffled (float4: its 16 codes, NaN-free)."""
  rng = np.random.default_rng(seed)
  if dtype == jnp.float4_e2m1fn:
    codes = rng.integers(0, 16, shape).astype(np.uint8)
    return jnp.asarray(codes.view(ml_dtypes.float4_e2m1fn))
  info = ml_dtypes.iinfo(dtype)
  return jnp.asarray(rng.integers(int(info.min), int(info.max) + 1, shape), dtype)


def _round_trip(shape, block, dtype):
  """Blocks of rows copied GMEM -> SMEM -> GMEM by TMA, one block per program, the block's rows
  taken from the array's other end (so that a wrong row order shows)."""
  rows = block[0]
  n = shape[0] // rows

  @plgpu.kernel(out_shape=S(shape, dtype), grid=(n,), grid_names=("i",),
                scratch_shapes=[plgpu.SMEM(block, dtype), plgpu.Barrier()])
  def kernel(x_ref, o_ref, smem, bar):
    i = jax.lax.axis_index("i")
    plgpu.copy_gmem_to_smem(x_ref.at[pl.ds((n - 1 - i) * rows, rows)], smem, bar)
    plgpu.barrier_wait(bar)
    plgpu.copy_smem_to_gmem(smem, o_ref.at[pl.ds(i * rows, rows)])
    plgpu.wait_smem_to_gmem(0)

  return kernel


@pytest.mark.parametrize("dtype", TYPES, ids=lambda t: jnp.dtype(t).name)
@pytest.mark.parametrize("shape,block", [((128, 256), (64, 256)), ((8, 64), (8, 64))])
def test_tma_moves_packed_values_exactly(shape, block, dtype):
  x = _values(dtype, shape, seed=len(shape) + block[0])
  got = _round_trip(shape, block, dtype)(x)
  rows = block[0]
  want = np.concatenate([np.asarray(x)[k * rows:(k + 1) * rows]
                         for k in reversed(range(shape[0] // rows))])
  np.testing.assert_array_equal(np.asarray(got).view(np.uint8), want.view(np.uint8))


def _lowered(kernel, *args):
  from pallax._src.gluon import compile as gluon_compile
  (c,) = gluon_compile.lower(kernel, *args)
  return c.source


def test_packed_buffers_are_rows_of_bytes():
  """A (64, 256) int4 buffer is 64 rows of 128 bytes; each copy expects those bytes."""
  x = _values(jnp.int4, (128, 256), seed=1)
  source = _lowered(_round_trip((128, 256), (64, 256), jnp.int4), x)
  assert "gl.allocate_shared_memory(gl.uint8, [64, 128]" in source
  assert "mbarrier.expect(bar.index(0), 8192)" in source


@pytest.mark.gluon_refuses("a register load of an SMEM buffer of int4")
def test_register_loads_of_packed_smem_are_refused():
  @plgpu.kernel(out_shape=S((64, 128), jnp.int8),
                scratch_shapes=[plgpu.SMEM((64, 128), jnp.int4), plgpu.Barrier()])
  def kernel(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    o_ref[...] = smem[...].astype(jnp.int8)

  x = _values(jnp.int4, (64, 128), seed=2)
  np.testing.assert_array_equal(kernel(x), np.asarray(x).astype(np.int8))
  with pytest.raises(NotImplementedError, match="a register load of an SMEM buffer of int4"):
    _lowered(kernel, x)


@pytest.mark.gluon_refuses("splits a byte")
def test_views_that_split_a_byte_are_refused():
  @plgpu.kernel(out_shape=S((64, 127), jnp.uint4),
                scratch_shapes=[plgpu.SMEM((64, 128), jnp.uint4), plgpu.Barrier()])
  def kernel(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    plgpu.copy_smem_to_gmem(smem.at[:, pl.ds(1, 127)], o_ref)
    plgpu.wait_smem_to_gmem(0)

  x = _values(jnp.uint4, (64, 128), seed=3)
  with pytest.raises(NotImplementedError, match="splits a byte"):
    _lowered(kernel, x)

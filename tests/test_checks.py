"""The interpreter's checks and semantics: dynamic bounds checks, poison, races,
the iota trap, accumulation patterns, and parallel == sequential evaluation."""
import inspect
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax as pl
from helpers import rand

pytestmark = pytest.mark.interpreter

S = jax.ShapeDtypeStruct
SEQUENTIAL = pl.InterpretParams(parallel=False)
PARALLEL = pl.InterpretParams(parallel=True)


def line_of(fn, needle):
  """'file:line' of the first line of ``fn``'s source containing ``needle``."""
  lines, start = inspect.getsourcelines(fn)
  for k, l in enumerate(lines):
    if needle in l:
      return f"{os.path.basename(inspect.getsourcefile(fn))}:{start + k}"
  raise AssertionError(needle)


def bits(x):
  x = np.asarray(x)
  if x.dtype.kind == "f" or x.dtype == np.dtype(jnp.bfloat16):
    return x.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])
  return x


# --- dynamic out-of-bounds Ref indices --------------------------------------------------------------

def scalar_oob_kernel(x_ref, o_ref):
  i = pl.program_id(0)
  o_ref[...] = jnp.broadcast_to(x_ref[i * 5], (2,))      # program 2 reads x_ref[10]


def _scalar_oob_call():
  return pl.pallas_call(scalar_oob_kernel, out_shape=S((3, 2), jnp.float32), grid=(3,),
                        out_specs=pl.BlockSpec((None, 2), lambda i: (i, 0)))


def test_dynamic_oob_eager_raises_index_error():
  x = rand((10,))
  where = line_of(scalar_oob_kernel, "x_ref[i * 5]")
  with pytest.raises(IndexError) as info:
    _scalar_oob_call()(x)
  msg = str(info.value)
  assert "scalar_oob_kernel" in msg
  assert "args[0]" in msg
  assert "10" in msg                                     # the offending index
  assert where in msg, (where, msg)                      # the kernel's source line


def test_dynamic_oob_under_jit_raises_at_run_time():
  x = rand((10,))
  where = line_of(scalar_oob_kernel, "x_ref[i * 5]")
  f = jax.jit(_scalar_oob_call())
  with pytest.raises(Exception) as info:
    jax.block_until_ready(f(x))
  msg = str(info.value)
  assert "scalar_oob_kernel" in msg and "args[0]" in msg and "10" in msg and where in msg, msg


def test_dynamic_oob_in_bounds_inputs_do_not_raise():
  # The same kernel on an array long enough for every program is fine, eager and jitted.
  x = rand((11,))
  out = _scalar_oob_call()(x)
  np.testing.assert_array_equal(out, np.repeat(x[[0, 5, 10]][:, None], 2, axis=1))
  np.testing.assert_array_equal(jax.jit(_scalar_oob_call())(x), out)


def ds_oob_kernel(x_ref, o_ref):
  i = pl.program_id(0)
  o_ref[...] = x_ref[pl.ds(i * 4, 4)]                   # program 2 reads 8..11 of 10


def test_dynamic_ds_oob_eager_and_jit():
  x = rand((10,))
  call = pl.pallas_call(ds_oob_kernel, out_shape=S((4,), jnp.float32), grid=(3,))
  where = line_of(ds_oob_kernel, "x_ref[pl.ds(i * 4, 4)]")
  with pytest.raises(IndexError, match=re.escape(where)) as info:
    call(x)
  assert "ds_oob_kernel" in str(info.value) and "args[0]" in str(info.value)
  with pytest.raises(Exception, match=re.escape(where)):
    jax.block_until_ready(jax.jit(call)(x))


def test_dynamic_oob_store_names_output():
  def store_oob_kernel(x_ref, o_ref):
    i = pl.program_id(0)
    o_ref[i + 6] = x_ref[i]                             # program 2 writes o_ref[8] of 8

  x = rand((3,))
  with pytest.raises(IndexError) as info:
    pl.pallas_call(store_oob_kernel, out_shape=S((8,), jnp.float32), grid=(3,))(x)
  msg = str(info.value)
  assert "store_oob_kernel" in msg and "out[0]" in msg and "8" in msg
  assert line_of(store_oob_kernel, "o_ref[i + 6]") in msg


def test_dynamic_oob_in_blocked_operand_names_block():
  def blk_kernel(x_ref, y_ref, o_ref):
    j = y_ref[0]                                       # a data-dependent index
    o_ref[...] = jnp.broadcast_to(x_ref[j], (4,))

  x = rand((8,))
  y = np.array([1, 9], np.int32)                       # 9 is past the block of 4
  spec = pl.BlockSpec((4,), lambda i: (i,))
  call = pl.pallas_call(blk_kernel, out_shape=S((8,), jnp.float32), grid=(2,),
                        in_specs=[spec, pl.BlockSpec((1,), lambda i: (i,))], out_specs=spec)
  with pytest.raises(IndexError) as info:
    call(x, y)
  msg = str(info.value)
  assert "blk_kernel" in msg and "args[0]" in msg and "9" in msg
  ok = call(x, np.array([1, 3], np.int32))
  np.testing.assert_array_equal(ok, np.concatenate([np.full(4, x[1]), np.full(4, x[7])]))


def test_dynamic_oob_inside_loop_and_run_scoped():
  def loop_oob_kernel(x_ref, o_ref):
    @pl.loop(0, 5)
    def _(i):
      o_ref[i] = x_ref[i * 3]                           # i = 4 reads x_ref[12] of 12

  x = rand((12,))
  with pytest.raises(IndexError) as info:
    pl.pallas_call(loop_oob_kernel, out_shape=S((5,), jnp.float32))(x)
  msg = str(info.value)
  assert "loop_oob_kernel" in msg and "args[0]" in msg and "12" in msg
  assert line_of(loop_oob_kernel, "x_ref[i * 3]") in msg

  def scoped_oob_kernel(x_ref, o_ref):
    def body(tmp_ref):
      tmp_ref[...] = x_ref[...]
      o_ref[...] = jnp.broadcast_to(tmp_ref[x_ref.shape[0] + pl.program_id(0) - 1], (2,))
    pl.run_scoped(body, pl.ANY((4,), jnp.float32))

  x4 = rand((4,))
  ok = pl.pallas_call(scoped_oob_kernel, out_shape=S((2,), jnp.float32), grid=(1,))(x4)
  np.testing.assert_array_equal(ok, np.full(2, x4[3]))
  with pytest.raises(IndexError, match="scoped_oob_kernel"):
    pl.pallas_call(scoped_oob_kernel, out_shape=S((2,), jnp.float32), grid=(2,))(x4)


def test_masked_lanes_may_point_past_the_end():
  def tail_kernel(x_ref, o_ref):
    i = pl.program_id(0)
    idx = i * 8 + jnp.arange(8)
    v = pl.load(x_ref, (pl.ds(i * 8, 8),), mask=idx < 13, other=0.0)
    pl.store(o_ref, (pl.ds(i * 8, 8),), v + 1, mask=idx < 13)

  x = rand((13,))
  out = pl.pallas_call(tail_kernel, out_shape=S((13,), jnp.float32), grid=(2,))(x)
  np.testing.assert_allclose(out, x + 1, rtol=1e-6)

  def unmasked_kernel(x_ref, o_ref):
    i = pl.program_id(0)
    o_ref[pl.ds(i * 8, 8)] = x_ref[pl.ds(i * 8, 8)] + 1

  with pytest.raises(IndexError, match="unmasked_kernel"):
    pl.pallas_call(unmasked_kernel, out_shape=S((13,), jnp.float32), grid=(2,))(x)


def test_check_bounds_false_skips_the_check():
  x = rand((11,))
  call = pl.pallas_call(scalar_oob_kernel, out_shape=S((3, 2), jnp.float32), grid=(3,),
                        out_specs=pl.BlockSpec((None, 2), lambda i: (i, 0)),
                        interpret=pl.InterpretParams(check_bounds=False))
  np.testing.assert_array_equal(call(x), np.repeat(x[[0, 5, 10]][:, None], 2, axis=1))


# --- poison ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
def test_reading_output_before_writing_gives_nan(dtype):
  def read_first_kernel(x_ref, o_ref):
    o_ref[...] = o_ref[...] + x_ref[...]

  x = rand((8,), dtype)
  out = np.asarray(pl.pallas_call(read_first_kernel, out_shape=S((8,), dtype))(x)).astype(np.float32)
  assert np.isnan(out).all(), out


def test_reading_output_before_writing_in_a_grid():
  def half_kernel(x_ref, o_ref):
    @pl.when(pl.program_id(0) == 0)
    def _():
      o_ref[...] = x_ref[...]
    o_ref[...] = o_ref[...] * 2                        # program 1 reads its unwritten block

  x = rand((8,))
  spec = pl.BlockSpec((4,), lambda i: (i,))
  out = np.asarray(pl.pallas_call(half_kernel, out_shape=S((8,), jnp.float32), grid=(2,),
                                  in_specs=[spec], out_specs=spec)(x))
  np.testing.assert_allclose(out[:4], x[:4] * 2, rtol=1e-6)
  assert np.isnan(out[4:]).all(), out


def test_partial_edge_block_padding_is_poison():
  def copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]

  x = rand((10,))
  spec = pl.BlockSpec((4,), lambda i: (i,))
  out = np.asarray(pl.pallas_call(copy_kernel, out_shape=S((12,), jnp.float32), grid=(3,),
                                  in_specs=[spec], out_specs=spec)(x))
  np.testing.assert_array_equal(out[:10], x)
  assert np.isnan(out[10:]).all(), out


def test_scratch_before_writing_is_poison():
  def scratch_kernel(x_ref, o_ref, s_ref):
    o_ref[...] = s_ref[...] + x_ref[...]

  x = rand((4,))
  out = np.asarray(pl.pallas_call(scratch_kernel, out_shape=S((4,), jnp.float32),
                                  scratch_shapes=[pl.ANY((4,), jnp.float32)])(x))
  assert np.isnan(out).all(), out


def test_written_output_is_not_poisoned():
  def full_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 3

  x = rand((16,))
  spec = pl.BlockSpec((4,), lambda i: (i,))
  out = pl.pallas_call(full_kernel, out_shape=S((16,), jnp.float32), grid=(4,),
                       in_specs=[spec], out_specs=spec)(x)
  assert not np.isnan(np.asarray(out)).any()
  np.testing.assert_allclose(out, x * 3, rtol=1e-6)


# --- races ------------------------------------------------------------------------------------

def racy_kernel(x_ref, o_ref):
  o_ref[0] = x_ref[pl.program_id(0)]                   # every program writes o_ref[0]


def iota_kernel(o_ref):
  i = pl.program_id(0)
  o_ref[i] = i


def test_race_reported_when_all_programs_write_one_element():
  x = rand((4,))
  call = pl.pallas_call(racy_kernel, out_shape=S((2,), jnp.float32), grid=(4,),
                        interpret=pl.InterpretParams(detect_races=True))
  with pytest.raises(Exception, match="race") as info:
    call(x)
  assert "racy_kernel" in str(info.value) and "out[0]" in str(info.value)
  with pytest.raises(Exception, match="racy_kernel"):
    jax.block_until_ready(jax.jit(call)(x))


def test_race_in_2d_grid_along_one_axis():
  def row_race_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]                            # programs (i, 0) and (i, 1) share a block

  x = rand((4, 4))
  with pytest.raises(Exception, match="race"):
    pl.pallas_call(row_race_kernel, out_shape=S((4, 2), jnp.float32), grid=(2, 2),
                   in_specs=[pl.BlockSpec((2, 2), lambda i, j: (i, j))],
                   out_specs=pl.BlockSpec((2, 2), lambda i, j: (i, 0)),
                   interpret=pl.InterpretParams(detect_races=True))(x)


def test_no_race_reported_for_iota():
  out = pl.pallas_call(iota_kernel, out_shape=S((8,), jnp.int32), grid=(8,),
                       interpret=pl.InterpretParams(detect_races=True))()
  np.testing.assert_array_equal(out, np.arange(8))


def test_no_race_for_disjoint_blocks_and_for_sequential_accumulation():
  x = rand((8, 6))

  def blocks_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1

  spec = pl.BlockSpec((4, 3), lambda i, j: (i, j))
  out = pl.pallas_call(blocks_kernel, out_shape=S((8, 6), jnp.float32), grid=(2, 2),
                       in_specs=[spec], out_specs=spec,
                       interpret=pl.InterpretParams(detect_races=True))(x)
  np.testing.assert_allclose(out, x + 1, rtol=1e-6)

  def acc_kernel(x_ref, o_ref):        # reads then writes o_ref: a reduction, not a race
    @pl.when(pl.program_id(0) == 0)
    def _():
      o_ref[...] = jnp.zeros_like(o_ref)
    o_ref[...] += x_ref[...]

  out = pl.pallas_call(acc_kernel, out_shape=S((1, 6), jnp.float32), grid=(8,),
                       in_specs=[pl.BlockSpec((1, 6), lambda i: (i, 0))],
                       out_specs=pl.BlockSpec((1, 6), lambda i: (0, 0)),
                       interpret=pl.InterpretParams(detect_races=True))(x)
  np.testing.assert_allclose(out, x.sum(0, keepdims=True), rtol=1e-5, atol=1e-5)


def test_racy_kernel_without_detection_runs():
  x = rand((4,))
  out = np.asarray(pl.pallas_call(racy_kernel, out_shape=S((2,), jnp.float32), grid=(4,))(x))
  assert out[0] in x                                   # one program's value wins


# --- the iota trap ----------------------------------------------------------------------------------

@pytest.mark.parametrize("n,interp", [(1, False), (8, False), (37, PARALLEL), (37, SEQUENTIAL)],
                         ids=["1-default", "8-default", "37-parallel", "37-sequential"])
def test_iota(n, interp):
  out = pl.pallas_call(iota_kernel, out_shape=S((n,), jnp.int32), grid=(n,), interpret=interp)()
  np.testing.assert_array_equal(out, np.arange(n, dtype=np.int32))


def test_iota_2d_and_jit():
  def iota2_kernel(o_ref):
    i, j = pl.program_id(0), pl.program_id(1)
    o_ref[i, j] = i * pl.num_programs(1) + j

  call = pl.pallas_call(iota2_kernel, out_shape=S((3, 5), jnp.int32), grid=(3, 5))
  np.testing.assert_array_equal(call(), np.arange(15).reshape(3, 5))
  np.testing.assert_array_equal(jax.jit(call)(), np.arange(15).reshape(3, 5))


def test_iota_float_output_with_input():
  def scaled_iota_kernel(x_ref, o_ref):
    i = pl.program_id(0)
    o_ref[i] = x_ref[i] * i.astype(jnp.float32)

  x = rand((9,))
  out = pl.pallas_call(scaled_iota_kernel, out_shape=S((9,), jnp.float32), grid=(9,))(x)
  np.testing.assert_allclose(out, x * np.arange(9), rtol=1e-6)


# --- accumulation patterns ------------------------------------------------------------------------

def kloop_matmul_kernel(x_ref, y_ref, o_ref):
  @pl.when(pl.program_id(2) == 0)
  def _():
    o_ref[...] = jnp.zeros_like(o_ref)
  o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)


def kloop_matmul(x, y, bm, bn, bk, interpret=False):
  m, k = x.shape
  _, n = y.shape
  return pl.pallas_call(
      kloop_matmul_kernel, out_shape=S((m, n), jnp.float32),
      grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), pl.cdiv(k, bk)),
      in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
      interpret=interpret)(x, y)


@pytest.mark.parametrize("shape,blocks", [
    ((32, 48, 16), (16, 8, 16)),
    ((24, 40, 24), (8, 8, 8)),
])
def test_kloop_matmul_accumulating_into_output(shape, blocks):
  m, k, n = shape
  x, y = rand((m, k), salt="x"), rand((k, n), salt="y")
  out = kloop_matmul(x, y, *blocks)
  ref = x.astype(np.float64) @ y.astype(np.float64)
  np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
  np.testing.assert_array_equal(bits(jax.jit(lambda a, b: kloop_matmul(a, b, *blocks))(x, y)),
                                bits(out))


def test_kloop_matmul_bfloat16_inputs():
  x = rand((16, 32), jnp.bfloat16, salt="x")
  y = rand((32, 8), jnp.bfloat16, salt="y")
  out = kloop_matmul(x, y, 8, 8, 8)
  ref = x.astype(np.float64) @ y.astype(np.float64)
  np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-3)


def scratch_matmul_kernel(x_ref, y_ref, o_ref, acc_ref):
  @pl.when(pl.program_id(2) == 0)
  def _():
    acc_ref[...] = jnp.zeros_like(acc_ref)
  acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

  @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
  def _():
    o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def scratch_matmul(x, y, bm, bn, bk, out_dtype=jnp.float32, interpret=False):
  m, k = x.shape
  _, n = y.shape
  return pl.pallas_call(
      scratch_matmul_kernel, out_shape=S((m, n), out_dtype),
      grid=(m // bm, n // bn, k // bk),
      in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
      scratch_shapes=[pl.ANY((bm, bn), jnp.float32)], interpret=interpret)(x, y)


def test_scratch_accumulator_matmul():
  x, y = rand((32, 64), salt="x"), rand((64, 16), salt="y")
  out = scratch_matmul(x, y, 16, 8, 16)
  np.testing.assert_allclose(out, x.astype(np.float64) @ y.astype(np.float64), rtol=1e-4, atol=1e-4)


def test_scratch_accumulator_bfloat16_output():
  x, y = rand((16, 32), jnp.bfloat16, salt="x"), rand((32, 16), jnp.bfloat16, salt="y")
  out = scratch_matmul(x, y, 8, 8, 8, out_dtype=jnp.bfloat16)
  assert out.dtype == jnp.bfloat16
  ref = x.astype(np.float64) @ y.astype(np.float64)
  np.testing.assert_allclose(np.asarray(out).astype(np.float32), ref, rtol=2e-2, atol=2e-2)


def test_scratch_row_sum_reduction_int():
  def rowsum_kernel(x_ref, o_ref, acc_ref):
    k = pl.program_id(1)

    @pl.when(k == 0)
    def _():
      acc_ref[...] = jnp.zeros_like(acc_ref)
    acc_ref[...] += jnp.sum(x_ref[...], axis=1, keepdims=True)

    @pl.when(k == pl.num_programs(1) - 1)
    def _():
      o_ref[...] = acc_ref[...]

  x = rand((12, 20), np.int32)
  out = pl.pallas_call(rowsum_kernel, out_shape=S((12, 1), jnp.int32), grid=(3, 5),
                       in_specs=[pl.BlockSpec((4, 4), lambda i, k: (i, k))],
                       out_specs=pl.BlockSpec((4, 1), lambda i, k: (i, 0)),
                       scratch_shapes=[pl.ANY((4, 1), jnp.int32)])(x)
  np.testing.assert_array_equal(out, x.sum(1, keepdims=True))


# --- parallel vs sequential interpretation ------------------------------------------------------------

def _elementwise(interp):
  x = rand((10, 12), salt="x")
  spec = pl.BlockSpec((4, 4), lambda i, j: (i, j))

  def ew_kernel(x_ref, o_ref):
    v = x_ref[...]
    o_ref[...] = jnp.sin(v) * jnp.exp(-v * v) + jnp.tanh(v) / 3

  out = pl.pallas_call(ew_kernel, out_shape=S(x.shape, jnp.float32), grid=(3, 3),
                       in_specs=[spec], out_specs=spec, interpret=interp)(x)
  ref = np.sin(x) * np.exp(-x * x) + np.tanh(x) / 3
  return out, ref


def _softmax(interp):
  x = rand((12, 16), salt="s")

  def softmax_kernel(x_ref, o_ref):
    v = x_ref[...]
    e = jnp.exp(v - jnp.max(v, axis=1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=1, keepdims=True)

  spec = pl.BlockSpec((4, 16), lambda i: (i, 0))
  out = pl.pallas_call(softmax_kernel, out_shape=S(x.shape, jnp.float32), grid=(3,),
                       in_specs=[spec], out_specs=spec, interpret=interp)(x)
  e = np.exp(x - x.max(1, keepdims=True))
  return out, e / e.sum(1, keepdims=True)


def _kloop(interp):
  x, y = rand((24, 32), salt="x"), rand((32, 16), salt="y")
  return kloop_matmul(x, y, 8, 8, 8, interpret=interp), x.astype(np.float64) @ y.astype(np.float64)


def _scratch(interp):
  x, y = rand((16, 32), salt="x"), rand((32, 16), salt="y")
  return scratch_matmul(x, y, 8, 8, 8, interpret=interp), x.astype(np.float64) @ y.astype(np.float64)


def _iota(interp):
  return (pl.pallas_call(iota_kernel, out_shape=S((13,), jnp.int32), grid=(13,),
                         interpret=interp)(), np.arange(13))


def _masked_tail(interp):
  x = rand((21,), salt="t")

  def tail_kernel(x_ref, o_ref):
    i = pl.program_id(0)
    idx = i * 8 + jnp.arange(8)
    v = pl.load(x_ref, (pl.ds(i * 8, 8),), mask=idx < 21, other=1.0)
    pl.store(o_ref, (pl.ds(i * 8, 8),), jnp.log(jnp.abs(v) + 1), mask=idx < 21)

  out = pl.pallas_call(tail_kernel, out_shape=S((21,), jnp.float32), grid=(3,),
                       interpret=interp)(x)
  return out, np.log(np.abs(x) + 1)


def _vmapped(interp):
  xs = rand((3, 8, 8), salt="v")

  def vm_kernel(x_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], x_ref[...].T) + pl.program_id(0).astype(jnp.float32)

  spec = pl.BlockSpec((4, 8), lambda i: (i, 0))
  call = pl.pallas_call(vm_kernel, out_shape=S((8, 4), jnp.float32), grid=(2,),
                        in_specs=[spec], out_specs=pl.BlockSpec((4, 4), lambda i: (i, 0)),
                        interpret=interp)
  ref = np.stack([np.concatenate([x[:4] @ x[:4].T, x[4:] @ x[4:].T + 1]) for x in
                  xs.astype(np.float64)])
  return jax.vmap(call)(xs), ref


@pytest.mark.parametrize("case", [_elementwise, _softmax, _kloop, _scratch, _iota, _masked_tail,
                                  _vmapped], ids=lambda f: f.__name__.strip("_"))
def test_parallel_and_sequential_are_bit_identical(case):
  par, ref = case(PARALLEL)
  seq, _ = case(SEQUENTIAL)
  np.testing.assert_array_equal(bits(par), bits(seq))
  np.testing.assert_allclose(np.asarray(seq, np.float64), ref, rtol=1e-4, atol=1e-4)


def test_parallel_and_sequential_bit_identical_under_jit():
  x, y = rand((16, 24), salt="x"), rand((24, 8), salt="y")
  par = jax.jit(lambda a, b: kloop_matmul(a, b, 8, 8, 8, interpret=PARALLEL))(x, y)
  seq = jax.jit(lambda a, b: kloop_matmul(a, b, 8, 8, 8, interpret=SEQUENTIAL))(x, y)
  np.testing.assert_array_equal(bits(par), bits(seq))
  np.testing.assert_allclose(seq, x.astype(np.float64) @ y.astype(np.float64), rtol=1e-4, atol=1e-4)

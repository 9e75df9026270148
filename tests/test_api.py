"""One or more value-checked tests per public name of ``pallax``.

Every kernel result is compared with a plain NumPy/JAX reference computed on
fresh random inputs: jax.random with a key derived from the test's id (so each
test gets its own inputs), drawn at one fixed size (one compilation) and cut to
shape as NumPy arrays, so that the references cost no compilations.
"""
import dataclasses
import functools
import math
import os
import re
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax as pl
from pallax._src import pallas_call as pallas_call_lib

BF16 = np.dtype(jnp.bfloat16)


# --- helpers ------------------------------------------------------------------------------

_POOL = 4096


class Rand:
  """Fresh random NumPy inputs from jax.random; a key per test, split on every draw."""

  def __init__(self, salt=""):
    name = os.environ.get("PYTEST_CURRENT_TEST", "test").split(" ")[0]
    self.key = jax.random.key(zlib.crc32((name + salt).encode()))

  def next_key(self):
    self.key, k = jax.random.split(self.key)
    return k

  def __call__(self, shape, dtype=np.float32, lo=-100, hi=100):
    shape = tuple(shape)
    n = math.prod(shape)
    assert n <= _POOL
    k = self.next_key()
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
      v = np.asarray(jax.random.bernoulli(k, 0.5, (_POOL,)))
    elif np.issubdtype(dtype, np.integer):
      v = np.asarray(jax.random.randint(k, (_POOL,), lo, hi, jnp.int32))
      v = np.where(v == 0, 1, v)          # never zeros
    else:
      v = np.asarray(jax.random.normal(k, (_POOL,), jnp.float32))
    return v[:n].reshape(shape).astype(dtype)


def f32(x):
  return np.asarray(x).astype(np.float32)


def assert_close(out, ref, dtype=None):
  out, ref = np.asarray(out), np.asarray(ref)
  assert out.shape == ref.shape, (out.shape, ref.shape)
  dtype = np.dtype(dtype or ref.dtype)
  assert out.dtype == dtype, (out.dtype, dtype)
  if np.issubdtype(dtype, np.integer) or dtype == np.bool_:
    np.testing.assert_array_equal(out, ref)
  elif dtype == BF16:
    np.testing.assert_allclose(f32(out), f32(ref), rtol=1e-2, atol=1e-2)
  else:
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def sds(x_or_shape, dtype=None):
  if hasattr(x_or_shape, "shape"):
    return jax.ShapeDtypeStruct(x_or_shape.shape, dtype or x_or_shape.dtype)
  return jax.ShapeDtypeStruct(tuple(x_or_shape), dtype or jnp.float32)


DTYPES = [np.float32, BF16, np.int32]
DTYPE_IDS = ["float32", "bfloat16", "int32"]


def affine(x):
  """x * 3 + 1 in x's dtype (NumPy arrays and in-kernel JAX values alike)."""
  t = np.dtype(x.dtype).type
  return x * t(3) + t(1)


def affine_kernel(x_ref, o_ref):
  o_ref[...] = affine(x_ref[...])


# --- BlockSpec / Blocked / grids -------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("n,block", [(1, 1), (10, 4), (13, 8)])
def test_blockspec_1d_dtypes_and_edges(dtype, n, block):
  x = Rand()((n,), dtype)
  spec = pl.BlockSpec((block,), lambda i: (i,))
  out = pl.pallas_call(affine_kernel, out_shape=sds(x), grid=(pl.cdiv(n, block),),
                       in_specs=[spec], out_specs=spec)(x)
  assert_close(out, affine(x))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_blockspec_2d_two_inputs_partial_blocks(dtype):
  r = Rand()
  x, y = r((10, 13), dtype), r((10, 13), dtype)
  two = np.dtype(dtype).type(2)

  def kernel(x_ref, y_ref, o_ref):
    assert x_ref.shape == (4, 8) and y_ref.shape == (4, 8) and o_ref.shape == (4, 8)
    o_ref[...] = x_ref[...] - y_ref[...] * two

  spec = pl.BlockSpec((4, 8), lambda i, j: (i, j))
  out = pl.pallas_call(kernel, out_shape=sds(x), grid=(3, 2), in_specs=[spec, spec],
                       out_specs=spec)(x, y)
  assert_close(out, x - y * two)


def test_blockspec_transposing_index_map():
  x = Rand()((12, 8))

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...].T

  out = pl.pallas_call(kernel, out_shape=sds((8, 12)), grid=(2, 3),
                       in_specs=[pl.BlockSpec((4, 4), lambda i, j: (j, i))],
                       out_specs=pl.BlockSpec((4, 4), lambda i, j: (i, j)))(x)
  np.testing.assert_array_equal(out, x.T)


def test_blockspec_reversed_blocks_and_broadcast_block():
  r = Rand()
  x, b = r((12,)), r((4,))

  def kernel(x_ref, b_ref, o_ref):
    o_ref[...] = x_ref[...][::-1] + b_ref[...]

  out = pl.pallas_call(kernel, out_shape=sds(x), grid=(3,),
                       in_specs=[pl.BlockSpec((4,), lambda i: (2 - i,)),
                                 pl.BlockSpec((4,), lambda i: (0,))],
                       out_specs=pl.BlockSpec((4,), lambda i: (i,)))(x, b)
  np.testing.assert_array_equal(out, x[::-1] + np.tile(b, 3))


def test_blockspec_whole_array_forms():
  r = Rand()
  x, y, z = r((6, 5)), r((6, 5)), r((6, 5))

  def kernel(x_ref, y_ref, z_ref, o_ref):
    assert x_ref.shape == y_ref.shape == z_ref.shape == (6, 5)
    o_ref[...] = x_ref[...] * y_ref[...] + z_ref[...]

  # BlockSpec() (no block_shape, no index_map), None, and a full-shape block.
  out = pl.pallas_call(kernel, out_shape=sds(x), grid=(1,),
                       in_specs=[pl.BlockSpec(), None, pl.BlockSpec((6, 5), lambda i: (0, 0))],
                       out_specs=pl.BlockSpec(index_map=lambda i: (0, 0)))(x, y, z)
  np.testing.assert_allclose(out, x * y + z, rtol=1e-6)
  out2 = pl.pallas_call(affine_kernel, out_shape=sds(x), in_specs=[pl.BlockSpec(None)],
                        out_specs=pl.BlockSpec(None))(x)
  np.testing.assert_allclose(out2, affine(x), rtol=1e-6)


def test_blocked_is_same_as_int_block():
  x = Rand()((10, 6))

  def run(block):
    spec = pl.BlockSpec(block, lambda i: (i, 0))
    return pl.pallas_call(affine_kernel, out_shape=sds(x), grid=(3,), in_specs=[spec],
                          out_specs=spec)(x)

  a = run((4, 6))
  b = run((pl.Blocked(4), pl.Blocked(6)))
  np.testing.assert_array_equal(a, b)
  np.testing.assert_allclose(b, affine(x), rtol=1e-6)
  assert pl.Blocked(4).block_size == 4


@pytest.mark.parametrize("sq", [None, pl.squeezed, pl.Squeezed()], ids=["None", "squeezed", "Squeezed()"])
def test_squeezed_block_dims(sq):
  x = Rand()((3, 5, 7))
  seen = []

  def kernel(x_ref, o_ref):
    seen.append((x_ref.shape, o_ref.shape))
    o_ref[...] = x_ref[...] * 2 + 1

  out = pl.pallas_call(
      kernel, out_shape=sds(x), grid=(3, 2),
      in_specs=[pl.BlockSpec((sq, 4, 7), lambda i, j: (i, j, 0))],
      out_specs=pl.BlockSpec((sq, 4, 7), lambda i, j: (i, j, 0)))(x)
  assert seen[0] == ((4, 7), (4, 7))
  np.testing.assert_allclose(out, x * 2 + 1, rtol=1e-6)


def test_squeezed_singleton_row_reduction():
  assert pl.squeezed.block_size == 1
  assert pl.Squeezed() == pl.squeezed
  x = Rand()((4, 6), np.int32)

  def kernel(x_ref, o_ref):   # a row per program, reduced to one element per row
    o_ref[...] = jnp.sum(x_ref[...], keepdims=True)

  out = pl.pallas_call(kernel, out_shape=sds((4, 1), jnp.int32), grid=(4,),
                       in_specs=[pl.BlockSpec((pl.squeezed, 6), lambda i: (i, 0))],
                       out_specs=pl.BlockSpec((pl.squeezed, 1), lambda i: (i, 0)))(x)
  np.testing.assert_array_equal(out, x.sum(1, keepdims=True))


def test_element_block_overlapping_windows():
  x = Rand()((18,))

  def kernel(x_ref, o_ref):
    w = x_ref[...]
    assert w.shape == (6,)
    o_ref[...] = w[0:4] + w[1:5] + w[2:6]

  out = pl.pallas_call(kernel, out_shape=sds((16,)), grid=(4,),
                       in_specs=[pl.BlockSpec((pl.Element(6),), lambda i: (i * 4,))],
                       out_specs=pl.BlockSpec((4,), lambda i: (i,)))(x)
  np.testing.assert_allclose(out, x[:-2] + x[1:-1] + x[2:], rtol=1e-5, atol=1e-6)


def test_element_block_with_padding():
  x = Rand()((16,), np.int32)

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[pl.ds(1, 4)] * 5   # skip the one padded element in front

  el = pl.Element(6, (1, 1))
  assert el.block_size == 6 and el.padding == (1, 1)
  out = pl.pallas_call(kernel, out_shape=sds(x), grid=(4,),
                       in_specs=[pl.BlockSpec((el,), lambda i: (i * 4,))],
                       out_specs=pl.BlockSpec((4,), lambda i: (i,)))(x)
  np.testing.assert_array_equal(out, x * 5)


# --- GridSpec / PrefetchScalarGridSpec / no_block_spec -------------------------------------------

def test_gridspec_object():
  r = Rand()
  x, y = r((8, 12)), r((8, 12))
  spec = pl.BlockSpec((4, 4), lambda i, j: (i, j))

  def kernel(x_ref, y_ref, o_ref, s_ref):
    s_ref[...] = x_ref[...] * y_ref[...]
    o_ref[...] = s_ref[...] + 1

  gs = pl.GridSpec(grid=(2, 3), in_specs=[spec, spec], out_specs=spec,
                   scratch_shapes=[pl.ANY((4, 4), jnp.float32)])
  assert gs.grid == (2, 3) and gs.num_scalar_prefetch == 0
  out = pl.pallas_call(kernel, out_shape=sds(x), grid_spec=gs)(x, y)
  np.testing.assert_allclose(out, x * y + 1, rtol=1e-6)
  out_jit = jax.jit(pl.pallas_call(kernel, out_shape=sds(x), grid_spec=gs))(x, y)
  np.testing.assert_array_equal(out_jit, out)


def test_gridspec_int_grid():
  x = Rand()((9,), np.int32)
  spec = pl.BlockSpec((3,), lambda i: (i,))
  out = pl.pallas_call(affine_kernel, out_shape=sds(x),
                       grid_spec=pl.GridSpec(grid=3, in_specs=[spec], out_specs=spec))(x)
  np.testing.assert_array_equal(out, affine(x))


def test_prefetch_scalar_grid_spec_gathers_blocks():
  r = Rand()
  x = r((20,))
  perm = np.argsort(r((5,))).astype(np.int32)

  def kernel(perm_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2 + perm_ref[pl.program_id(0)].astype(jnp.float32)

  gs = pl.PrefetchScalarGridSpec(
      num_scalar_prefetch=1, grid=(5,),
      in_specs=[pl.BlockSpec((4,), lambda i, p: (p[i],))],
      out_specs=pl.BlockSpec((4,), lambda i, p: (i,)))
  out = pl.pallas_call(kernel, out_shape=sds(x), grid_spec=gs)(perm, x)
  blocks = x.reshape(5, 4)[perm] * 2 + perm[:, None].astype(np.float32)
  np.testing.assert_allclose(out, blocks.reshape(-1), rtol=1e-6)
  out_jit = jax.jit(pl.pallas_call(kernel, out_shape=sds(x), grid_spec=gs))(perm, x)
  np.testing.assert_array_equal(out_jit, out)


def test_prefetch_scalar_operand_read_in_kernel_only():
  r = Rand()
  x = r((8,), np.int32)
  s = r((2,), np.int32)

  def kernel(s_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...] * s_ref[0] + s_ref[1]

  spec = pl.BlockSpec((4,), lambda i, s: (i,))
  gs = pl.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(2,), in_specs=[spec],
                                 out_specs=spec)
  out = pl.pallas_call(kernel, out_shape=sds(x), grid_spec=gs)(s, x)
  np.testing.assert_array_equal(out, x * s[0] + s[1])


def test_no_block_spec_means_whole_array():
  x = Rand()((5, 3), np.int32)
  out = pl.pallas_call(affine_kernel, out_shape=sds(x), in_specs=pl.no_block_spec,
                       out_specs=pl.no_block_spec)(x)
  np.testing.assert_array_equal(out, affine(x))
  out2 = pl.pallas_call(affine_kernel, out_shape=sds(x), in_specs=[pl.no_block_spec],
                        out_specs=pl.no_block_spec)(x)
  np.testing.assert_array_equal(out2, affine(x))


# --- pallas_call ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_pallas_call_eager_and_jit_agree(dtype):
  x = Rand()((7, 3), dtype)
  call = pl.pallas_call(affine_kernel, out_shape=sds(x), grid=(2,),
                        in_specs=[pl.BlockSpec((4, 3), lambda i: (i, 0))],
                        out_specs=pl.BlockSpec((4, 3), lambda i: (i, 0)))
  eager = call(x)
  jitted = jax.jit(call)(x)
  assert_close(eager, affine(x))
  np.testing.assert_array_equal(f32(eager), f32(jitted))


def test_pallas_call_scalar_and_numpy_operands():
  x = Rand()((4,))

  def kernel(x_ref, s_ref, o_ref):
    o_ref[...] = x_ref[...] * s_ref[...]

  out = pl.pallas_call(kernel, out_shape=sds(x.shape, jnp.float32))(x, np.float32(2.5))
  np.testing.assert_allclose(out, x * np.float32(2.5), rtol=1e-6)


def test_pallas_call_tuple_and_list_of_outputs_and_specs():
  r = Rand()
  x, y = r((8,)), r((8,))

  def kernel(x_ref, y_ref, s_ref, d_ref):
    s_ref[...] = x_ref[...] + y_ref[...]
    d_ref[...] = x_ref[...] - y_ref[...]

  spec = pl.BlockSpec((4,), lambda i: (i,))
  s, d = pl.pallas_call(kernel, out_shape=(sds(x), sds(x)), grid=(2,), in_specs=[spec, spec],
                        out_specs=(spec, spec))(x, y)
  np.testing.assert_allclose(s, x + y, rtol=1e-6)
  np.testing.assert_allclose(d, x - y, rtol=1e-6)
  lst = pl.pallas_call(kernel, out_shape=[sds(x), sds(x)], grid=(2,), in_specs=[spec, spec],
                       out_specs=[spec, spec])(x, y)
  assert isinstance(lst, tuple) and len(lst) == 2   # a list out_shape gives a tuple, as in JAX
  np.testing.assert_array_equal(lst[0], s)
  np.testing.assert_array_equal(lst[1], d)


def test_pallas_call_outputs_of_different_dtypes_and_shapes():
  x = Rand()((6, 4), np.int32)

  def kernel(x_ref, o_sum, o_f):
    o_sum[...] = jnp.sum(x_ref[...], axis=1)
    o_f[...] = x_ref[...].astype(jnp.float32) / 2

  a, b = pl.pallas_call(kernel, out_shape=(sds((6,), jnp.int32), sds((6, 4), jnp.float32)))(x)
  np.testing.assert_array_equal(a, x.sum(1))
  np.testing.assert_allclose(b, x.astype(np.float32) / 2)


def test_pallas_call_dict_out_shape_and_specs():
  # As in Pallas: the kernel receives the outputs in out_shape's pytree structure.
  x = Rand()((8,))

  def kernel(x_ref, o):
    o["double"][...] = x_ref[...] * 2
    o["neg"][...] = -x_ref[...]

  spec = pl.BlockSpec((4,), lambda i: (i,))
  out = pl.pallas_call(kernel, out_shape={"double": sds(x), "neg": sds(x)}, grid=(2,),
                       in_specs=[spec], out_specs={"double": spec, "neg": spec})(x)
  assert set(out) == {"double", "neg"}
  np.testing.assert_allclose(out["double"], x * 2)
  np.testing.assert_allclose(out["neg"], -x)


def test_pallas_call_pytree_operand_and_in_specs():
  # As in Pallas: a tuple operand arrives in the kernel as a tuple of Refs.
  r = Rand()
  x, y = r((8,)), r((8,))

  def kernel(xy, o_ref):
    a_ref, b_ref = xy
    o_ref[...] = a_ref[...] * b_ref[...]

  spec = pl.BlockSpec((4,), lambda i: (i,))
  out = pl.pallas_call(kernel, out_shape=sds(x), grid=(2,), in_specs=[(spec, spec)],
                       out_specs=spec)((x, y))
  np.testing.assert_allclose(out, x * y, rtol=1e-6)


def test_pallas_call_scratch_shapes_dict_are_keyword_refs():
  # As in Pallas: a dict of scratch shapes is passed to the kernel as keyword arguments.
  x = Rand()((8,))

  def kernel(x_ref, o_ref, *, acc):
    acc[...] = x_ref[...] * 5
    o_ref[...] = acc[...] + 1

  out = pl.pallas_call(kernel, out_shape=sds(x),
                       scratch_shapes=dict(acc=pl.ANY((8,), jnp.float32)))(x)
  np.testing.assert_allclose(out, x * 5 + 1, rtol=1e-6)


def test_input_output_aliases_in_place_update():
  r = Rand()
  x, y = r((12,)), r((12,))

  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = o_ref[...] * 2 + x_ref[...]   # o starts as y (aliased)

  spec = pl.BlockSpec((4,), lambda i: (i,))
  call = pl.pallas_call(kernel, out_shape=sds(y), grid=(3,), in_specs=[spec, spec],
                        out_specs=spec, input_output_aliases={1: 0})
  np.testing.assert_allclose(call(x, y), y * 2 + x, rtol=1e-6)
  np.testing.assert_allclose(jax.jit(call)(x, y), y * 2 + x, rtol=1e-6)


def test_input_output_aliases_untouched_blocks_keep_input_values():
  x = Rand()((12,), np.int32)

  def kernel(x_ref, o_ref):   # only the middle block is visited
    o_ref[...] = x_ref[...] * 7

  out = pl.pallas_call(kernel, out_shape=sds(x), grid=(1,),
                       in_specs=[pl.BlockSpec((4,), lambda i: (1,))],
                       out_specs=pl.BlockSpec((4,), lambda i: (1,)),
                       input_output_aliases={0: 0})(x)
  expect = x.copy()
  expect[4:8] *= 7
  np.testing.assert_array_equal(out, expect)


def test_scratch_shapes_accumulate_over_grid():
  x = Rand()((6, 8))

  def kernel(x_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(0) == 0)
    def _():
      acc_ref[...] = jnp.zeros_like(acc_ref)
    acc_ref[...] += x_ref[...]
    @pl.when(pl.program_id(0) == pl.num_programs(0) - 1)
    def _():
      o_ref[...] = acc_ref[...]

  out = pl.pallas_call(kernel, out_shape=sds((1, 8)), grid=(6,),
                       in_specs=[pl.BlockSpec((1, 8), lambda i: (i, 0))],
                       out_specs=pl.BlockSpec((1, 8), lambda i: (0, 0)),
                       scratch_shapes=[pl.ANY((1, 8), jnp.float32)])(x)
  np.testing.assert_allclose(out, x.sum(0, keepdims=True), rtol=1e-5, atol=1e-5)


def test_name_used_in_debug_output_and_errors(capsys):
  x = Rand()((4,))

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1

  out = pl.pallas_call(kernel, out_shape=sds(x), name="my_renamed_kernel", debug=True)(x)
  np.testing.assert_allclose(out, x + 1)
  assert "my_renamed_kernel" in capsys.readouterr().out

  def bad(x_ref, o_ref):
    o_ref[...] = x_ref[10] + jnp.zeros(4)

  with pytest.raises(IndexError, match="my_renamed_kernel"):
    pl.pallas_call(bad, out_shape=sds(x), name="my_renamed_kernel")(x)


def test_debug_true_prints_jaxpr_and_grid_mapping(capsys):
  r = Rand()
  x, y = r((8, 6)), r((8, 6))

  def add_debug_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.sin(x_ref[...]) + y_ref[...]

  spec = pl.BlockSpec((4, 6), lambda i: (i, 0))
  out = pl.pallas_call(add_debug_kernel, out_shape=sds(x), grid=(2,), in_specs=[spec, spec],
                       out_specs=spec, debug=True)(x, y)
  np.testing.assert_allclose(out, np.sin(x) + y, rtol=1e-5, atol=1e-6)
  printed = capsys.readouterr().out
  assert "add_debug_kernel" in printed
  assert "lambda" in printed and "sin" in printed             # the kernel jaxpr
  assert "GridMapping" in printed and "grid=(2,)" in printed  # the grid mapping
  assert "args[0]" in printed and "args[1]" in printed and "out[0]" in printed
  assert "(4, 6)" in printed


def test_debug_false_prints_nothing(capsys):
  x = Rand()((4,))
  out = pl.pallas_call(affine_kernel, out_shape=sds(x))(x)
  np.testing.assert_allclose(out, affine(x), rtol=1e-6)
  assert "GridMapping" not in capsys.readouterr().out


def test_cost_estimate_and_compiler_params_accepted():
  x = Rand()((16,))
  ce = pl.CostEstimate(flops=32, transcendentals=0, bytes_accessed=128)
  assert ce.flops == 32 and ce.transcendentals == 0 and ce.bytes_accessed == 128
  with pytest.raises(dataclasses.FrozenInstanceError):
    ce.flops = 1
  cp = pl.CompilerParams()
  assert dataclasses.is_dataclass(cp) and pl.CompilerParams() == cp
  spec = pl.BlockSpec((8,), lambda i: (i,))
  call = pl.pallas_call(affine_kernel, out_shape=sds(x), grid=(2,), in_specs=[spec],
                        out_specs=spec, cost_estimate=ce, compiler_params=cp,
                        metadata={"k": "v"})
  np.testing.assert_allclose(call(x), affine(x), rtol=1e-6)
  np.testing.assert_allclose(jax.jit(call)(x), affine(x), rtol=1e-6)


def test_interpret_flag_forms_agree():
  ip = pl.InterpretParams()
  assert ip.detect_races is False and ip.check_bounds is True and ip.parallel is True
  x = Rand()((10,))
  spec = pl.BlockSpec((4,), lambda i: (i,))
  outs = [pl.pallas_call(affine_kernel, out_shape=sds(x), grid=(3,), in_specs=[spec],
                         out_specs=spec, interpret=interp)(x)
          for interp in (True, pl.InterpretParams(), pl.InterpretParams(check_bounds=False),
                         pl.InterpretParams(detect_races=True, parallel=False))]
  for o in outs:
    np.testing.assert_array_equal(o, outs[0])
  np.testing.assert_allclose(outs[0], affine(x), rtol=1e-6)
  # interpret=False: the default backend (Triton on a GPU, which may fuse x * a + b into an fma)
  default = pl.pallas_call(affine_kernel, out_shape=sds(x), grid=(3,), in_specs=[spec],
                           out_specs=spec, interpret=False)(x)
  np.testing.assert_allclose(default, outs[0], rtol=1e-6)


def test_kernel_with_functools_partial_and_scalar_closure():
  x = Rand()((8,))
  c = 3.5   # a Python scalar closed over is fine

  def kernel(x_ref, o_ref, *, scale):
    o_ref[...] = x_ref[...] * scale + c

  out = pl.pallas_call(functools.partial(kernel, scale=2.0), out_shape=sds(x))(x)
  np.testing.assert_allclose(out, x * 2 + c, rtol=1e-6)


def test_zero_operand_call_and_size_one_grid():
  c = int(Rand()((1,), np.int32)[0])

  def kernel(o_ref):
    o_ref[...] = jnp.full(o_ref.shape, c, o_ref.dtype)

  out = pl.pallas_call(kernel, out_shape=sds((1,), jnp.int32), grid=(1,))()
  np.testing.assert_array_equal(out, [c])


# --- program_id / num_programs ---------------------------------------------------------------

def test_program_id_num_programs_under_jit():
  x = Rand()((4, 6), np.int32)

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + pl.program_id(0) * 100 + pl.program_id(1) * 10 + pl.num_programs(1)

  call = pl.pallas_call(kernel, out_shape=sds(x), grid=(2, 3),
                        in_specs=[pl.BlockSpec((2, 2), lambda i, j: (i, j))],
                        out_specs=pl.BlockSpec((2, 2), lambda i, j: (i, j)))
  expect = x + np.repeat(np.arange(2), 2)[:, None] * 100 + np.repeat(np.arange(3), 2)[None, :] * 10 + 3
  np.testing.assert_array_equal(jax.jit(call)(x), expect)
  np.testing.assert_array_equal(call(x), expect)


def test_num_programs_is_static_int():
  seen = []

  def kernel(o_ref):
    n = pl.num_programs(0)
    seen.append(n)
    o_ref[pl.program_id(0)] = n * 2 + pl.program_id(0)

  out = pl.pallas_call(kernel, out_shape=sds((5,), jnp.int32), grid=(5,))()
  assert int(seen[0]) == 5
  np.testing.assert_array_equal(out, 10 + np.arange(5))


# --- cdiv / next_power_of_2 ------------------------------------------------------------------

def test_cdiv_ints_and_arrays_in_kernel():
  for a, b in [(10, 4), (8, 4), (1, 4), (0, 3), (1024, 1), (7, 7), (1025, 512)]:
    assert pl.cdiv(a, b) == -(-a // b) and isinstance(pl.cdiv(a, b), int)
  r = Rand()
  x = r((16,), np.int32, 1, 1000)
  d = r((16,), np.int32, 1, 17)

  def kernel(x_ref, d_ref, o_ref):
    o_ref[...] = pl.cdiv(x_ref[...], d_ref[...])

  out = pl.pallas_call(kernel, out_shape=sds(x))(x, d)
  np.testing.assert_array_equal(out, -(-x // d))


def test_next_power_of_2_positive():
  for v, e in [(1, 1), (2, 2), (3, 4), (5, 8), (8, 8), (9, 16), (1000, 1024), (1024, 1024),
               (1025, 2048)]:
    assert pl.next_power_of_2(v) == e
  # Used to size a block that covers a non-power-of-two array, with masking.
  x = Rand()((11,))
  b = pl.next_power_of_2(11)

  def kernel(x_ref, o_ref):
    idx = jnp.arange(b)
    v = pl.load(x_ref, pl.ds(0, b), mask=idx < 11, other=0.0)
    pl.store(o_ref, pl.ds(0, b), v + 1, mask=idx < 11)

  np.testing.assert_allclose(pl.pallas_call(kernel, out_shape=sds(x))(x), x + 1, rtol=1e-6)


def test_next_power_of_2_zero_and_negative():
  # As in Pallas: 0 -> 1; negative numbers are rejected.
  assert pl.next_power_of_2(0) == 1
  with pytest.raises(ValueError):
    pl.next_power_of_2(-3)


# --- ds / dslice / Slice ---------------------------------------------------------------------

@pytest.mark.parametrize("ds", [pl.ds, pl.dslice], ids=["ds", "dslice"])
def test_ds_dynamic_start(ds):
  x = Rand()((12,), np.int32)

  def kernel(x_ref, o_ref):
    i = pl.program_id(0)
    o_ref[ds(i * 3, 3)] = x_ref[ds(i * 3, 3)] * 2

  out = pl.pallas_call(kernel, out_shape=sds(x), grid=(4,))(x)
  np.testing.assert_array_equal(out, x * 2)


def test_ds_forms_and_stride():
  s = pl.ds(2, 3)
  assert isinstance(s, pl.Slice) and (s.start, s.size, s.stride) == (2, 3, 1)
  s = pl.dslice(5)
  assert (s.start, s.size) == (0, 5)
  x = Rand()((12,))

  def kernel(x_ref, o_ref):
    o_ref[pl.ds(0, 4)] = x_ref[pl.ds(1, 4, 3)]   # x[1], x[4], x[7], x[10]
    o_ref[pl.ds(4, 5)] = x_ref[pl.ds(7)][2:]      # x[2:7]

  out = pl.pallas_call(kernel, out_shape=sds((9,)))(x)
  np.testing.assert_array_equal(out, np.concatenate([x[1::3], x[2:7]]))


def test_slice_objects_as_indices():
  x = Rand()((6, 10))
  sl = pl.Slice(2, 3)
  assert (sl.start, sl.size, sl.stride) == (2, 3, 1)

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[pl.Slice(1, 4), pl.Slice(0, 5, 2)]

  out = pl.pallas_call(kernel, out_shape=sds((4, 5)))(x)
  np.testing.assert_array_equal(out, x[1:5, 0:10:2])


def test_python_slices_and_integer_indexing():
  x = Rand()((4, 8), np.int32)

  def kernel(x_ref, o_ref):
    o_ref[0, :] = x_ref[3, :]
    o_ref[1:3, :] = x_ref[0:2, :]
    o_ref[3] = x_ref[2] + 1

  out = pl.pallas_call(kernel, out_shape=sds(x))(x)
  np.testing.assert_array_equal(out, np.stack([x[3], x[0], x[1], x[2] + 1]))


# --- empty / empty_like / broadcast_to -----------------------------------------------------------

def test_empty_and_empty_like():
  e = pl.empty((3, 4), jnp.bfloat16)
  assert e.shape == (3, 4) and e.dtype == jnp.bfloat16
  tree = {"a": jnp.ones((2,), jnp.int32), "b": (jnp.ones((3, 1)),)}
  el = pl.empty_like(tree)
  assert jax.tree.structure(el) == jax.tree.structure(tree)
  assert el["a"].shape == (2,) and el["a"].dtype == jnp.int32
  assert el["b"][0].shape == (3, 1) and el["b"][0].dtype == jnp.float32
  x = Rand()((4, 8))

  def kernel(x_ref, o_ref):
    buf = pl.empty((4, 8), jnp.float32)
    assert buf.shape == (4, 8) and buf.dtype == jnp.float32
    buf = buf.at[...].set(x_ref[...])        # every element overwritten
    like = pl.empty_like(buf)
    like = like.at[:, :4].set(buf[:, 4:]).at[:, 4:].set(buf[:, :4])
    o_ref[...] = like * 2

  out = pl.pallas_call(kernel, out_shape=sds(x))(x)
  np.testing.assert_array_equal(out, np.concatenate([x[:, 4:], x[:, :4]], 1) * 2)


def test_broadcast_to():
  r = Rand()
  x, s = r((8,)), r((1,))

  def kernel(x_ref, s_ref, o_ref, p_ref):
    o_ref[...] = pl.broadcast_to(x_ref[...][None, :], (4, 8))
    p_ref[...] = pl.broadcast_to(s_ref[0], (3, 2))

  o, p = pl.pallas_call(kernel, out_shape=(sds((4, 8)), sds((3, 2))))(x, s)
  np.testing.assert_array_equal(o, np.broadcast_to(x, (4, 8)))
  np.testing.assert_array_equal(p, np.broadcast_to(s[0], (3, 2)))


# --- load / store / swap -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_load_store_unmasked(dtype):
  x = Rand()((4, 8), dtype)

  def kernel(x_ref, o_ref):
    top = pl.load(x_ref, (pl.ds(0, 2), slice(None)))
    bot = pl.load(x_ref, (pl.ds(2, 2), pl.ds(0, 8)))
    pl.store(o_ref, (pl.ds(0, 2), slice(None)), bot)
    pl.store(o_ref, (pl.ds(2, 2),), top)

  out = pl.pallas_call(kernel, out_shape=sds(x))(x)
  assert_close(out, np.concatenate([x[2:], x[:2]]))


def test_load_store_whole_ref_ellipsis():
  x = Rand()((3, 5), np.int32)

  def kernel(x_ref, o_ref):
    pl.store(o_ref, ..., pl.load(x_ref, ...) * 2)

  np.testing.assert_array_equal(pl.pallas_call(kernel, out_shape=sds(x))(x), x * 2)


@pytest.mark.parametrize("dtype,n", [(np.float32, 1), (np.float32, 13), (BF16, 7), (np.int32, 13)],
                         ids=["float32-1", "float32-13", "bfloat16-7", "int32-13"])
def test_masked_load_store_tail(dtype, n):
  x = Rand()((n,), dtype)
  b = 16
  t = np.dtype(dtype).type

  def kernel(x_ref, o_ref, full_ref):
    idx = jnp.arange(b)
    v = pl.load(x_ref, (pl.ds(0, b),), mask=idx < n, other=t(5))
    full_ref[...] = v
    pl.store(o_ref, (pl.ds(0, b),), v * t(2), mask=idx < n)

  out, full = pl.pallas_call(kernel, out_shape=(sds(x), sds((b,), dtype)))(x)
  assert_close(out, x * t(2))
  assert_close(full, np.concatenate([x, np.full((b - n,), 5, dtype)]))


def test_masked_load_2d_with_other_array():
  r = Rand()
  x = r((4, 6))
  mask = r((4, 6), np.bool_)
  other = r((4, 6))

  def kernel(x_ref, m_ref, y_ref, o_ref):
    o_ref[...] = pl.load(x_ref, (slice(None), slice(None)), mask=m_ref[...], other=y_ref[...])

  out = pl.pallas_call(kernel, out_shape=sds(x))(x, mask, other)
  np.testing.assert_array_equal(out, np.where(mask, x, other))


def test_masked_load_without_other_keeps_masked_in_lanes():
  r = Rand()
  x = r((16,), np.int32)
  mask = r((16,), np.bool_)

  def kernel(x_ref, m_ref, o_ref):
    o_ref[...] = pl.load(x_ref, (pl.ds(0, 16),), mask=m_ref[...])

  out = np.asarray(pl.pallas_call(kernel, out_shape=sds(x))(x, mask))
  np.testing.assert_array_equal(out[mask], x[mask])


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_masked_store_leaves_other_elements(dtype):
  r = Rand()
  x, y = r((3, 8), dtype), r((3, 8), dtype)
  mask = r((3, 8), np.bool_)

  def kernel(x_ref, y_ref, m_ref, o_ref):
    pl.store(o_ref, (slice(None), slice(None)), x_ref[...], mask=m_ref[...])

  out = pl.pallas_call(kernel, out_shape=sds(y), input_output_aliases={1: 0})(x, y, mask)
  assert_close(out, np.where(mask, x, y))


def test_swap_unmasked_returns_old_values():
  r = Rand()
  x, y = r((8,), np.int32), r((8,), np.int32)

  def kernel(x_ref, y_ref, o_ref, old_ref):
    old_ref[...] = pl.swap(o_ref, (pl.ds(0, 8),), x_ref[...])

  o, old = pl.pallas_call(kernel, out_shape=(sds(y), sds(y)), input_output_aliases={1: 0})(x, y)
  np.testing.assert_array_equal(o, x)
  np.testing.assert_array_equal(old, y)


def test_swap_masked():
  r = Rand()
  x, y = r((8,)), r((8,))
  mask = r((8,), np.bool_)

  def kernel(x_ref, y_ref, m_ref, o_ref, old_ref):
    old = pl.swap(o_ref, (pl.ds(0, 8),), x_ref[...], mask=m_ref[...])
    old_ref[...] = jnp.where(m_ref[...], old, 0.0)

  o, old = pl.pallas_call(kernel, out_shape=(sds(y), sds(y)),
                          input_output_aliases={1: 0})(x, y, mask)
  np.testing.assert_array_equal(o, np.where(mask, x, y))
  np.testing.assert_array_equal(old, np.where(mask, y, 0.0))


def test_store_with_gather_indices():
  r = Rand()
  x = r((8,))
  perm = np.argsort(r((8,))).astype(np.int32)

  def kernel(x_ref, p_ref, o_ref):
    pl.store(o_ref, (p_ref[...],), pl.load(x_ref, (pl.ds(0, 8),)))

  out = pl.pallas_call(kernel, out_shape=sds(x))(x, perm)
  expect = np.zeros_like(x)
  expect[perm] = x
  np.testing.assert_array_equal(out, expect)


# --- dot --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_dot_transposes(dtype):
  r = Rand()
  m, k, n = 5, 7, 3
  a, at = r((m, k), dtype, -8, 8), r((k, m), dtype, -8, 8)
  b, bt = r((k, n), dtype, -8, 8), r((n, k), dtype, -8, 8)
  out_dtype = np.int32 if dtype == np.int32 else np.float32

  def kernel(a_ref, at_ref, b_ref, bt_ref, o_nn, o_tn, o_nt, o_tt):
    for o_ref, lhs, rhs, ta, tb in [(o_nn, a_ref, b_ref, False, False),
                                    (o_tn, at_ref, b_ref, True, False),
                                    (o_nt, a_ref, bt_ref, False, True),
                                    (o_tt, at_ref, bt_ref, True, True)]:
      res = pl.dot(lhs[...], rhs[...], trans_a=ta, trans_b=tb)
      assert res.dtype == out_dtype and res.shape == (m, n)
      o_ref[...] = res

  outs = pl.pallas_call(kernel, out_shape=[sds((m, n), out_dtype)] * 4)(a, at, b, bt)
  f64 = lambda v: v.astype(np.float64)
  refs = [f64(a) @ f64(b), f64(at).T @ f64(b), f64(a) @ f64(bt).T, f64(at).T @ f64(bt).T]
  for out, ref in zip(outs, refs):
    if dtype == np.int32:
      np.testing.assert_array_equal(out, ref.astype(np.int32))
    else:
      assert np.asarray(out).dtype == np.float32
      np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)


def test_dot_precision_and_allow_tf32():
  r = Rand()
  a, b = r((8, 16)), r((16, 4))

  def kernel(a_ref, b_ref, o1, o2):
    o1[...] = pl.dot(a_ref[...], b_ref[...], precision=jax.lax.Precision.HIGHEST)
    o2[...] = pl.dot(a_ref[...], b_ref[...], allow_tf32=False)

  o1, o2 = pl.pallas_call(kernel, out_shape=(sds((8, 4)), sds((8, 4))))(a, b)
  ref = a.astype(np.float64) @ b.astype(np.float64)
  np.testing.assert_allclose(o1, ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(o2, ref, rtol=1e-5, atol=1e-5)


# --- control flow: when / loop ----------------------------------------------------------------

def test_when_on_program_id():
  x = Rand()((4, 3), np.int32)

  def kernel(x_ref, o_ref):
    i = pl.program_id(0)
    o_ref[...] = x_ref[...]

    @pl.when(i % 2 == 0)
    def _():
      o_ref[...] = x_ref[...] * 10

    @pl.when(i == 3)
    def _():
      o_ref[...] = -x_ref[...]

  spec = pl.BlockSpec((1, 3), lambda i: (i, 0))
  out = pl.pallas_call(kernel, out_shape=sds(x), grid=(4,), in_specs=[spec], out_specs=spec)(x)
  np.testing.assert_array_equal(out, x * np.array([10, 1, 10, -1])[:, None])


def test_when_python_bool_and_data_dependent():
  x = Rand()((8,))

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]

    @pl.when(True)
    def _():
      o_ref[...] += 1

    @pl.when(False)
    def _():
      o_ref[...] = o_ref[...] * 1000

    @pl.when(x_ref[0] > 0)
    def _():
      o_ref[...] = o_ref[...] * 2

  out = pl.pallas_call(kernel, out_shape=sds(x))(x)
  ref = (x + 1) * (2.0 if x[0] > 0 else 1.0)
  np.testing.assert_allclose(out, ref, rtol=1e-6)


def test_loop_without_carry_and_step():
  x = Rand()((12,), np.int32)

  def kernel(x_ref, o_ref):
    @pl.loop(0, 12, step=3)
    def _(i):
      o_ref[pl.ds(i, 3)] = x_ref[pl.ds(i, 3)] + i

  out = pl.pallas_call(kernel, out_shape=sds(x))(x)
  np.testing.assert_array_equal(out, x + np.repeat(np.arange(0, 12, 3), 3))


def test_loop_with_init_carry():
  x = Rand()((10,))

  def kernel(x_ref, o_ref):
    @pl.loop(1, 8, init_carry=(jnp.float32(0), jnp.int32(0)), step=2)
    def res(i, carry):
      s, c = carry
      return s + x_ref[i], c + 1

    s, c = res
    o_ref[0] = s
    o_ref[1] = c.astype(jnp.float32)

  out = np.asarray(pl.pallas_call(kernel, out_shape=sds((2,)))(x))
  np.testing.assert_allclose(out[0], x[1:8:2].sum(), rtol=1e-5)
  assert out[1] == 4


def test_loop_dynamic_bounds():
  x = Rand()((16,), np.int32)
  n = np.array([11], np.int32)

  def kernel(n_ref, x_ref, o_ref):
    @pl.loop(2, n_ref[0], init_carry=jnp.int32(0))
    def total(i, acc):
      return acc + x_ref[i]
    o_ref[0] = total

  out = pl.pallas_call(kernel, out_shape=sds((1,), jnp.int32))(n, x)
  np.testing.assert_array_equal(out, [x[2:11].sum()])


def test_lax_fori_loop_inside_kernel():
  x = Rand()((4, 8))

  def kernel(x_ref, o_ref):
    def body(i, acc):
      return acc + x_ref[i]
    o_ref[...] = jax.lax.fori_loop(0, 4, body, jnp.zeros((8,), jnp.float32))

  out = pl.pallas_call(kernel, out_shape=sds((8,)))(x)
  np.testing.assert_allclose(out, x.sum(0), rtol=1e-5, atol=1e-6)


# --- compiler hints ---------------------------------------------------------------------------

def test_multiple_of_and_max_contiguous_are_identity():
  x = Rand()((16,))

  def kernel(x_ref, o_ref):
    i = pl.program_id(0)
    start = pl.multiple_of(i * 4, 4)
    idx = pl.max_contiguous(start + jnp.arange(4), 4)
    o_ref[pl.ds(start, 4)] = x_ref[idx] * 2
    s2 = pl.multiple_of(start, [2])
    o_ref[pl.ds(s2, 1)] = o_ref[pl.ds(s2, 1)] + 100

  out = pl.pallas_call(kernel, out_shape=sds(x), grid=(4,))(x)
  expect = x * 2
  expect[::4] += 100
  np.testing.assert_allclose(out, expect, rtol=1e-6)


def test_hints_under_vmap_and_jit():
  x = Rand()((3, 8), np.int32)

  def kernel(x_ref, o_ref):
    i = pl.multiple_of(pl.program_id(0) * 4, 4)
    o_ref[pl.ds(i, 4)] = x_ref[pl.ds(i, 4)] + 1

  call = pl.pallas_call(kernel, out_shape=sds((8,), jnp.int32), grid=(2,))
  np.testing.assert_array_equal(jax.jit(jax.vmap(call))(x), x + 1)


# --- run_scoped -------------------------------------------------------------------------------

def test_run_scoped_scratch():
  x = Rand()((10,))

  def kernel(x_ref, o_ref):
    def body(s_ref):
      s_ref[...] = x_ref[...] + 1
      o_ref[...] = s_ref[...] * 2
    pl.run_scoped(body, pl.ANY((10,), jnp.float32))

  np.testing.assert_allclose(pl.pallas_call(kernel, out_shape=sds(x))(x), (x + 1) * 2, rtol=1e-6)


def test_run_scoped_returns_value_and_kw_types():
  x = Rand()((4, 4), np.int32)

  def kernel(x_ref, o_ref):
    def body(a_ref, *, b_ref):
      a_ref[...] = x_ref[...] * 2
      b_ref[...] = x_ref[...].T
      return a_ref[...] + b_ref[...], jnp.sum(x_ref[...])
    val, tot = pl.run_scoped(body, pl.ANY((4, 4), jnp.int32), b_ref=pl.ANY((4, 4), jnp.int32))
    o_ref[...] = val + tot

  out = pl.pallas_call(kernel, out_shape=sds(x))(x)
  np.testing.assert_array_equal(out, x * 2 + x.T + x.sum())


def test_run_scoped_in_grid_under_jit():
  x = Rand()((12,))

  def kernel(x_ref, o_ref):
    def body(tmp):
      tmp[...] = x_ref[...] * x_ref[...]
      o_ref[...] = tmp[...] - 1
    pl.run_scoped(body, pl.ANY((4,), jnp.float32))

  spec = pl.BlockSpec((4,), lambda i: (i,))
  call = pl.pallas_call(kernel, out_shape=sds(x), grid=(3,), in_specs=[spec], out_specs=spec)
  np.testing.assert_allclose(jax.jit(call)(x), x * x - 1, rtol=1e-6)


# --- semaphores -------------------------------------------------------------------------------

@pytest.mark.interpreter
@pytest.mark.parametrize("sem_type", [pl.SemaphoreType.REGULAR(()), pl.MemorySpace.SEMAPHORE(())],
                         ids=["SemaphoreType.REGULAR", "MemorySpace.SEMAPHORE"])
def test_semaphore_signal_read_wait(sem_type):
  x = Rand()((4,), np.int32)

  def kernel(x_ref, o_ref, sem):
    start = pl.semaphore_read(sem)         # semaphores start at 0
    pl.semaphore_signal(sem, 3)
    after_signal = pl.semaphore_read(sem)
    pl.semaphore_wait(sem, 2)
    after_wait = pl.semaphore_read(sem)
    pl.semaphore_signal(sem)                # inc defaults to 1
    pl.semaphore_wait(sem, 2)               # back to 0
    o_ref[...] = x_ref[...] * 1000 + start * 100 + after_signal * 10 + after_wait

  out = pl.pallas_call(kernel, out_shape=sds(x), scratch_shapes=[sem_type])(x)
  np.testing.assert_array_equal(out, x * 1000 + 0 * 100 + 3 * 10 + 1)


@pytest.mark.interpreter
def test_semaphore_array_and_wait_without_decrement():
  for st in (pl.SemaphoreType.REGULAR(()), pl.SemaphoreType.BARRIER(()),
             pl.MemorySpace.SEMAPHORE(())):
    assert isinstance(st, pl.MemoryRef)
    assert st.shape == () and st.dtype == jnp.int32
    assert st.memory_space is pl.MemorySpace.SEMAPHORE
  assert pl.SemaphoreType.REGULAR((3,)).shape == (3,)
  x = Rand()((3,), np.int32)

  def kernel(x_ref, o_ref, sems):
    pl.semaphore_signal(sems.at[1], 5)
    pl.semaphore_signal(sems.at[2], 2)
    pl.semaphore_wait(sems.at[1], 4, decrement=False)
    o_ref[...] = x_ref[...] + sems[...]

  out = pl.pallas_call(kernel, out_shape=sds(x),
                       scratch_shapes=[pl.SemaphoreType.REGULAR((3,))])(x)
  np.testing.assert_array_equal(out, x + np.array([0, 5, 2]))


@pytest.mark.interpreter
def test_semaphore_wait_that_can_never_succeed_is_reported():
  x = Rand()((2,), np.int32)

  def kernel(x_ref, o_ref, sem):
    pl.semaphore_signal(sem, 1)
    pl.semaphore_wait(sem, 2)
    o_ref[...] = x_ref[...]

  with pytest.raises(pl.KernelCheckError, match="semaphore"):
    pl.pallas_call(kernel, out_shape=sds(x), scratch_shapes=[pl.SemaphoreType.REGULAR(())])(x)


# --- get_global -------------------------------------------------------------------------------

def test_get_global_shared_across_programs():
  x = Rand()((6, 4), np.int32)

  def kernel(x_ref, o_ref):
    g = pl.get_global(pl.ANY((4,), jnp.int32))     # zero-initialized, one per call
    g[...] += x_ref[0]

    @pl.when(pl.program_id(0) == pl.num_programs(0) - 1)
    def _():
      o_ref[...] = g[...]

  call = pl.pallas_call(kernel, out_shape=sds((4,), jnp.int32), grid=(6,),
                        in_specs=[pl.BlockSpec((1, 4), lambda i: (i, 0))],
                        out_specs=pl.BlockSpec((4,), lambda i: (0,)))
  np.testing.assert_array_equal(call(x), x.sum(0))
  # A second call starts from a fresh global again.
  np.testing.assert_array_equal(call(x * 2), (x * 2).sum(0))


@pytest.mark.interpreter
def test_get_global_semaphore_counts_programs():
  def kernel(o_ref):
    sem = pl.get_global(pl.SemaphoreType.REGULAR(()))
    pl.semaphore_signal(sem, 1)
    o_ref[pl.program_id(0)] = pl.semaphore_read(sem)

  out = pl.pallas_call(kernel, out_shape=sds((5,), jnp.int32), grid=(5,))()
  np.testing.assert_array_equal(out, np.arange(1, 6))


# --- debug_check / enable_debug_checks / KernelCheckError / debug_print ---------------------------

def _checked_kernel(x_ref, o_ref):
  pl.debug_check(jnp.all(x_ref[...] > 0), "all inputs must be positive")
  o_ref[...] = x_ref[...] * 2


@pytest.mark.interpreter
def test_debug_check_raises_only_when_enabled():
  x = Rand()((8,))
  x[3] = -abs(x[3]) - 1    # at least one non-positive element
  assert not pl.debug_checks_enabled()
  out = pl.pallas_call(_checked_kernel, out_shape=sds(x))(x)
  np.testing.assert_allclose(out, x * 2)   # disabled: no check, result computed

  with pl.enable_debug_checks():
    assert pl.debug_checks_enabled()
    with pytest.raises(pl.KernelCheckError, match="all inputs must be positive"):
      pl.pallas_call(_checked_kernel, out_shape=sds(x))(x)
    good = np.abs(x) + 1
    np.testing.assert_allclose(pl.pallas_call(_checked_kernel, out_shape=sds(x))(good), good * 2)
  assert not pl.debug_checks_enabled()
  np.testing.assert_allclose(pl.pallas_call(_checked_kernel, out_shape=sds(x))(x), x * 2)


@pytest.mark.interpreter
def test_debug_check_enabled_first_call():
  def pos_kernel(x_ref, o_ref):
    pl.debug_check(jnp.all(x_ref[...] > 0), "x has a non-positive entry")
    o_ref[...] = x_ref[...] + 1

  x = -np.abs(Rand()((8,))) - 1
  with pl.enable_debug_checks():
    with pytest.raises(pl.KernelCheckError, match="x has a non-positive entry"):
      pl.pallas_call(pos_kernel, out_shape=sds(x))(x)
  np.testing.assert_allclose(pl.pallas_call(pos_kernel, out_shape=sds(x))(x), x + 1)


@pytest.mark.interpreter
def test_debug_check_under_jit_raises_at_run_time():
  def neg_kernel(x_ref, o_ref):
    pl.debug_check(jnp.all(x_ref[...] < 0), "inputs must be negative")
    o_ref[...] = x_ref[...] * 3

  x = np.abs(Rand()((8,))) + 1
  with pl.enable_debug_checks():
    f = jax.jit(pl.pallas_call(neg_kernel, out_shape=sds(x)))
    with pytest.raises(Exception, match="inputs must be negative"):
      jax.block_until_ready(f(x))
    np.testing.assert_allclose(f(-x), -x * 3)


@pytest.mark.interpreter
def test_debug_check_in_one_program_of_grid():
  def grid_checked(x_ref, o_ref):
    pl.debug_check(jnp.all(x_ref[...] > 0), "block has a non-positive entry")
    o_ref[...] = x_ref[...] * 2

  x = np.abs(Rand()((12,))) + 1
  x[9] = -1.0
  spec = pl.BlockSpec((4,), lambda i: (i,))
  with pl.enable_debug_checks(True):
    with pytest.raises(pl.KernelCheckError, match="block has a non-positive entry"):
      pl.pallas_call(grid_checked, out_shape=sds(x), grid=(3,), in_specs=[spec],
                     out_specs=spec)(x)
  with pl.enable_debug_checks(False):
    out = pl.pallas_call(grid_checked, out_shape=sds(x), grid=(3,), in_specs=[spec],
                         out_specs=spec)(x)
  np.testing.assert_allclose(out, x * 2)


@pytest.mark.interpreter
def test_enable_debug_checks_as_decorator():
  def dec_kernel(x_ref, o_ref):
    pl.debug_check(jnp.all(x_ref[...] > 0), "must be positive (decorator)")
    o_ref[...] = x_ref[...]

  x = -np.abs(Rand()((4,))) - 1

  @pl.enable_debug_checks()
  def run():
    assert pl.debug_checks_enabled()
    return pl.pallas_call(dec_kernel, out_shape=sds(x))(x)

  with pytest.raises(pl.KernelCheckError, match=re.escape("must be positive (decorator)")):
    run()
  assert not pl.debug_checks_enabled()
  assert issubclass(pl.KernelCheckError, Exception)


@pytest.mark.interpreter
def test_debug_print(capfd):
  x = Rand()((8,))

  def kernel(x_ref, o_ref):
    pl.debug_print("prog {} first={}", pl.program_id(0), x_ref[0])
    o_ref[...] = x_ref[...] + 1

  spec = pl.BlockSpec((4,), lambda i: (i,))
  out = pl.pallas_call(kernel, out_shape=sds(x), grid=(2,), in_specs=[spec], out_specs=spec)(x)
  jax.effects_barrier()
  np.testing.assert_allclose(out, x + 1, rtol=1e-6)
  printed = capfd.readouterr()
  text = printed.out + printed.err
  lines = [l for l in text.splitlines() if l.startswith("prog ")]
  assert len(lines) == 2, text
  got = {}
  for l in lines:
    m = re.match(r"prog (\d+) first=(\S+)", l)
    got[int(m.group(1))] = float(m.group(2))
  assert sorted(got) == [0, 1]
  np.testing.assert_allclose(got[0], float(x[0]), rtol=1e-6)
  np.testing.assert_allclose(got[1], float(x[4]), rtol=1e-6)


@pytest.mark.interpreter
def test_debug_print_under_jit(capfd):
  x = Rand()((3,), np.int32)

  def kernel(x_ref, o_ref):
    pl.debug_print("value={}", x_ref[1])
    o_ref[...] = x_ref[...]

  out = jax.jit(pl.pallas_call(kernel, out_shape=sds(x)))(x)
  jax.block_until_ready(out)
  jax.effects_barrier()
  np.testing.assert_array_equal(out, x)
  text = "".join(capfd.readouterr())
  assert f"value={int(x[1])}" in text


# --- memory spaces, scratch types, params dataclasses ----------------------------------------------

def test_memory_space_any_scratch_type():
  assert pl.ANY is pl.MemorySpace.ANY
  t = pl.ANY((2, 3), jnp.bfloat16)
  assert isinstance(t, pl.MemoryRef)
  assert t.shape == (2, 3) and t.dtype == jnp.bfloat16 and t.memory_space is pl.ANY
  x = Rand()((2, 3), BF16)

  def kernel(x_ref, o_ref, s_ref, t_ref):
    s_ref[...] = x_ref[...] * jnp.bfloat16(2)
    t_ref[...] = x_ref[...].astype(jnp.float32)
    o_ref[...] = s_ref[...] + t_ref[...].astype(jnp.bfloat16)

  out = pl.pallas_call(kernel, out_shape=sds(x),
                       scratch_shapes=[t, pl.MemorySpace.ANY((2, 3), jnp.float32)])(x)
  assert_close(out, x * BF16.type(2) + x)


def test_memory_space_default_scratch_and_blockspec_memory_space():
  x = Rand()((4, 4), np.int32)

  def kernel(x_ref, o_ref, s_ref):
    s_ref[...] = x_ref[...] + 3
    o_ref[...] = s_ref[...] * 2

  out = pl.pallas_call(kernel, out_shape=sds(x),
                       in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                       out_specs=pl.BlockSpec(memory_space=pl.MemorySpace.DEFAULT),
                       scratch_shapes=[pl.MemorySpace.DEFAULT((4, 4), jnp.int32)])(x)
  np.testing.assert_array_equal(out, (x + 3) * 2)


# --- pl.kernel ------------------------------------------------------------------------------------

def test_kernel_basic_and_decorator():
  assert isinstance(pl.__version__, str) and pl.__version__
  x = Rand()((8,))
  mesh = pl.Mesh((2,), ("x",))

  def body(x_ref, o_ref):
    i = pl.program_id("x")
    assert pl.num_programs("x") == 2
    o_ref[pl.ds(i * 4, 4)] = x_ref[pl.ds(i * 4, 4)] * 3

  k = pl.kernel(body, out_type=sds(x), mesh=mesh)
  np.testing.assert_allclose(k(x), x * 3, rtol=1e-6)
  np.testing.assert_allclose(jax.jit(k)(x), x * 3, rtol=1e-6)

  @pl.kernel(mesh=mesh, out_type=sds(x), name="decorated")
  def k2(x_ref, o_ref):
    i = pl.program_id(0)
    o_ref[pl.ds(i * 4, 4)] = x_ref[pl.ds(i * 4, 4)] - 1

  np.testing.assert_allclose(k2(x), x - 1, rtol=1e-6)


def test_kernel_two_axis_mesh():
  x = Rand()((4, 6), np.int32)
  mesh = pl.Mesh((2, 3), ("r", "c"))
  assert mesh.grid == (2, 3) and mesh.grid_names == ("r", "c") and mesh.shape == {"r": 2, "c": 3}
  with pytest.raises(ValueError):
    pl.Mesh((2, 3), ("a",))

  def body(x_ref, o_ref):
    r, c = pl.program_id("r"), pl.program_id("c")
    blk = x_ref[pl.ds(r * 2, 2), pl.ds(c * 2, 2)]
    o_ref[pl.ds(r * 2, 2), pl.ds(c * 2, 2)] = blk + r * 10 + c

  out = pl.kernel(body, out_type=sds(x), mesh=mesh)(x)
  bump = np.repeat(np.arange(2) * 10, 2)[:, None] + np.repeat(np.arange(3), 2)[None, :]
  np.testing.assert_array_equal(out, x + bump)


def test_kernel_out_type_tuple():
  x = Rand()((8,))

  def body(x_ref, a_ref, b_ref):
    a_ref[...] = x_ref[...] * 2
    b_ref[...] = x_ref[...].astype(jnp.int32)

  a, b = pl.kernel(body, out_type=(sds(x), sds(x, jnp.int32)), mesh=pl.Mesh((1,)))(x)
  np.testing.assert_allclose(a, x * 2)
  np.testing.assert_array_equal(b, x.astype(np.int32))


def test_kernel_out_type_dict_pytree():
  # As in Pallas: a non-sequence out_type pytree reaches the body as one pytree of Refs,
  # and the result has out_type's structure.
  x = Rand()((8,))
  mesh = pl.Mesh((2,), ("x",))

  def body(x_ref, o):
    i = pl.program_id("x")
    o["a"][pl.ds(i * 4, 4)] = x_ref[pl.ds(i * 4, 4)] * 2
    o["b"][pl.ds(i * 4, 4)] = x_ref[pl.ds(i * 4, 4)].astype(jnp.int32)

  out = pl.kernel(body, out_type={"a": sds(x), "b": sds(x, jnp.int32)}, mesh=mesh)(x)
  assert set(out) == {"a", "b"}
  np.testing.assert_allclose(out["a"], x * 2)
  np.testing.assert_array_equal(out["b"], x.astype(np.int32))


def test_kernel_scratch_types():
  x = Rand()((8,))
  mesh = pl.Mesh((2,), ("x",))

  def body(x_ref, o_ref, s_ref):
    i = pl.program_id(0)
    s_ref[...] = x_ref[pl.ds(i * 4, 4)] + 1
    o_ref[pl.ds(i * 4, 4)] = s_ref[...] * 3

  out = pl.kernel(body, out_type=sds(x), mesh=mesh,
                  scratch_types=[pl.ANY((4,), jnp.float32)])(x)
  np.testing.assert_allclose(out, (x + 1) * 3, rtol=1e-6)


def test_kernel_ref_passed_in_is_mutated():
  r = Rand()
  x, y = r((8,)), r((8,))
  y_ref = jax.new_ref(jnp.asarray(y))

  def body(x_ref, acc_ref):
    i = pl.program_id(0)
    acc_ref[pl.ds(i * 4, 4)] = acc_ref[pl.ds(i * 4, 4)] + x_ref[pl.ds(i * 4, 4)]

  pl.kernel(body, mesh=pl.Mesh((2,)))(x, y_ref)
  np.testing.assert_allclose(y_ref[...], y + x, rtol=1e-6)


def test_kernel_ref_closed_over_is_mutated():
  r = Rand()
  x, y = r((8,)), r((8,))
  y_ref = jax.new_ref(jnp.asarray(y))

  def body(x_ref):
    i = pl.program_id(0)
    y_ref[pl.ds(i * 4, 4)] = y_ref[pl.ds(i * 4, 4)] * x_ref[pl.ds(i * 4, 4)]

  pl.kernel(body, mesh=pl.Mesh((2,)))(x)
  np.testing.assert_allclose(y_ref[...], y * x, rtol=1e-6)


def test_kernel_ref_passed_in_inside_jit():
  r = Rand()
  x, y = r((8,)), r((8,))

  @jax.jit
  def f(x, y):
    acc = jax.new_ref(y)

    def body(x_ref, acc_ref):
      i = pl.program_id(0)
      acc_ref[pl.ds(i * 4, 4)] = acc_ref[pl.ds(i * 4, 4)] + x_ref[pl.ds(i * 4, 4)] * 2

    pl.kernel(body, mesh=pl.Mesh((2,)))(x, acc)
    return acc[...]

  np.testing.assert_allclose(f(x, y), y + x * 2, rtol=1e-6)


def test_kernel_ref_closed_over_inside_jit():
  r = Rand()
  x, y = r((8,)), r((8,))

  @jax.jit
  def f(x, y):
    acc = jax.new_ref(y)

    def body(x_ref, o_ref):
      i = pl.program_id(0)
      acc[pl.ds(i * 4, 4)] = acc[pl.ds(i * 4, 4)] - x_ref[pl.ds(i * 4, 4)]
      o_ref[pl.ds(i * 4, 4)] = x_ref[pl.ds(i * 4, 4)] * 2

    out = pl.kernel(body, out_type=sds(x), mesh=pl.Mesh((2,)))(x)
    return out, acc[...]

  out, acc = f(x, y)
  np.testing.assert_allclose(out, x * 2, rtol=1e-6)
  np.testing.assert_allclose(acc, y - x, rtol=1e-6)


def test_kernel_mpmd_lists_of_bodies_and_meshes():
  x = Rand()((8,))

  def vector_fn(x_ref, o_ref):
    i = pl.program_id(0)
    o_ref[pl.ds(i * 4, 4)] = x_ref[pl.ds(i * 4, 4)] * 2

  def scalar_fn(x_ref, o_ref):
    o_ref[0] = o_ref[0] + 100.0

  k = pl.kernel(body=[vector_fn, scalar_fn], mesh=[pl.Mesh((2,), ("v",)), pl.Mesh((1,), ("s",))],
                out_type=sds(x))
  expect = x * 2
  expect[0] += 100.0
  np.testing.assert_allclose(k(x), expect, rtol=1e-6)
  np.testing.assert_allclose(jax.jit(k)(x), expect, rtol=1e-6)
  with pytest.raises(ValueError):
    pl.kernel(body=[vector_fn, scalar_fn], mesh=[pl.Mesh((2,))], out_type=sds(x))


# --- core_map -------------------------------------------------------------------------------------

def test_core_map_mutates_closed_over_refs():
  x = Rand()((10,))
  x_ref = jax.new_ref(jnp.asarray(x))
  o_ref = jax.new_ref(jnp.zeros((10,), jnp.float32))

  @pl.core_map(pl.Mesh((2,), ("core",)))
  def _():
    i = pl.program_id("core")
    o_ref[pl.ds(i * 5, 5)] = x_ref[pl.ds(i * 5, 5)] * 3 + i.astype(jnp.float32)

  np.testing.assert_allclose(o_ref[...], x * 3 + np.repeat(np.arange(2.0), 5), rtol=1e-6)
  np.testing.assert_allclose(x_ref[...], x)


def test_core_map_under_jit():
  x = Rand()((6,), np.int32)

  @jax.jit
  def f(x):
    ref = jax.new_ref(x)

    @pl.core_map(pl.Mesh((3,)))
    def _():
      i = pl.program_id(0)
      ref[pl.ds(i * 2, 2)] = ref[pl.ds(i * 2, 2)] * (i + 2)

    return ref[...]

  np.testing.assert_array_equal(f(x), x * np.repeat(np.arange(2, 5), 2))


# --- GridMapping / BlockMapping ---------------------------------------------------------------------

def _gm_specs():
  return dict(grid=(3, 2),
              in_specs=[pl.BlockSpec((4, None), lambda i, j: (i, j)),
                        pl.BlockSpec((3,), lambda i, j: (j,))],
              out_specs=pl.BlockSpec((4, 3), lambda i, j: (i, j)),
              scratch_shapes=[pl.ANY((4,), jnp.float32), pl.SemaphoreType.REGULAR(())])


def _make_gm(debug=False):
  xa = jax.typeof(jnp.zeros((10, 6), jnp.float32))
  ya = jax.typeof(jnp.zeros((6,), jnp.int32))
  oa = jax.typeof(jnp.zeros((10, 6), jnp.float32))
  return pallas_call_lib.make_grid_mapping(
      "gm_kernel", pl.GridSpec(**_gm_specs()), [xa, ya], jax.tree.structure((0, 0)), [oa],
      jax.tree.structure(0), debug)


@pytest.mark.interpreter   # a semaphore scratch operand
def test_grid_mapping_attributes():
  gm = _make_gm()
  assert isinstance(gm, pl.GridMapping)
  gm.check_invariants()
  assert gm.grid == gm.static_grid == (3, 2)
  assert gm.num_inputs == 2 and gm.num_outputs == 1 and gm.num_index_operands == 0
  assert gm.num_scratch_operands == 2 and gm.num_dynamic_grid_bounds == 0
  assert gm.in_shapes == (jax.ShapeDtypeStruct((10, 6), jnp.float32),
                          jax.ShapeDtypeStruct((6,), jnp.int32))
  assert gm.out_shapes == (jax.ShapeDtypeStruct((10, 6), jnp.float32),)
  refs = ["x", "y", "o", "s0", "s1"]   # the kernel's Refs (no index operands here)
  assert refs[gm.slice_index_ops] == []
  assert refs[gm.slice_block_ops] == ["x", "y", "o"]
  assert refs[gm.slice_scratch_ops] == ["s0", "s1"]
  assert len(gm.block_mappings) == 3
  assert gm.block_mappings_output == gm.block_mappings[2:]
  assert [bm.origin for bm in gm.block_mappings] == ["args[0]", "args[1]", "out[0]"]
  assert [tuple(a.shape) for a in gm.index_map_avals] == [(), ()]
  assert gm.vmapped_dims == ()
  assert gm.to_lojax() is gm
  # The same specs that built the GridMapping drive a pallas_call correctly.
  r = Rand()
  x, y = r((10, 6)), r((6,), np.int32)

  def kernel(x_ref, y_ref, o_ref, s_ref, sem_ref):
    assert x_ref.shape == tuple(gm.block_mappings[0].ref_aval.shape)
    s_ref[...] = x_ref[...]
    o_ref[...] = s_ref[...][:, None] + y_ref[...].astype(jnp.float32)[None, :]

  out = pl.pallas_call(kernel, out_shape=sds(x), **_gm_specs())(x, y)
  # Program (i, j) reads column j of x (a squeezed block of size 1) and y's block j.
  cols = np.arange(6) // 3
  np.testing.assert_allclose(out, x[:, cols] + y.astype(np.float32)[None, :], rtol=1e-6)


def test_grid_mapping_with_scalar_prefetch_slices():
  pa = jax.typeof(jnp.zeros((3,), jnp.int32))
  xa = jax.typeof(jnp.zeros((12,), jnp.float32))
  gs = pl.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(3,),
                                 in_specs=[pl.BlockSpec((4,), lambda i, p: (i,))],
                                 out_specs=pl.BlockSpec((4,), lambda i, p: (i,)),
                                 scratch_shapes=[pl.ANY((2,), jnp.float32)])
  gm = pallas_call_lib.make_grid_mapping("pf", gs, [pa, xa], jax.tree.structure((0, 0)), [xa],
                                         jax.tree.structure(0))
  gm.check_invariants()
  refs = ["p", "x", "o", "s"]
  assert gm.num_index_operands == 1
  assert refs[gm.slice_index_ops] == ["p"]
  assert refs[gm.slice_block_ops] == ["x", "o"]
  assert refs[gm.slice_scratch_ops] == ["s"]
  assert gm.in_shapes == (jax.ShapeDtypeStruct((3,), jnp.int32),
                          jax.ShapeDtypeStruct((12,), jnp.float32))
  assert len(gm.index_map_avals) == 2


def test_block_mapping_attributes():
  gm = _make_gm()
  bx, by, bo = gm.block_mappings
  assert isinstance(bx, pl.BlockMapping)
  assert bx.full_block_shape == (4, 1) and bx.squeezed_dims == (1,)
  assert tuple(bx.ref_aval.shape) == (4,) and tuple(bx.block_aval.shape) == (4,)
  assert tuple(bx.array_aval.shape) == (10, 6) and bx.blocks_per_dim == (3, 6)
  assert by.full_block_shape == (3,) and by.blocks_per_dim == (2,)
  assert bo.full_block_shape == (4, 3) and bo.blocks_per_dim == (3, 2)
  assert not bo.has_element_dims
  for bm in gm.block_mappings:
    bm.check_invariants()
  # The index map jaxpr evaluates to the spec's block indices.
  jx = bo.index_map_jaxpr
  out = jax.core.eval_jaxpr(jx.jaxpr, jx.consts, jnp.int32(2), jnp.int32(1))
  assert [int(v) for v in out] == [2, 1]


def test_grid_mapping_replace_and_invariants():
  gm = _make_gm()
  gm2 = gm.replace(debug=True)
  assert gm2.debug and not gm.debug and gm2.grid == gm.grid
  with pytest.raises(AssertionError):
    gm.replace(num_inputs=3)            # block_mappings no longer match
  with pytest.raises(AssertionError):
    gm.replace(grid=(3, 0))             # non-positive grid
  with pytest.raises(AssertionError):
    gm.replace(grid=(3, 2, 1))          # index map avals no longer match the grid
  bx = gm.block_mappings[0]
  with pytest.raises(AssertionError):
    bx.replace(block_shape=(pl.Blocked(4), pl.Blocked(2)))   # disagrees with ref_aval


def test_grid_mapping_trace_env_answers_program_id():
  gm = _make_gm()
  with gm.trace_env(ids=(jnp.int32(2), jnp.int32(1))):
    assert int(pl.program_id(0)) == 2 and int(pl.program_id(1)) == 1
    assert pl.num_programs(0) == 3 and pl.num_programs(1) == 2


# --- vmap ---------------------------------------------------------------------------------------------

def _add_kernel(x_ref, y_ref, o_ref):
  o_ref[...] = x_ref[...] + y_ref[...]


def _add_call(n=10, dtype=jnp.float32):
  return pl.pallas_call(_add_kernel, out_shape=sds((n,), dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_vmap_in_axes_none(dtype):
  r = Rand()
  xs, y = r((3, 10), dtype), r((10,), dtype)
  out = jax.vmap(_add_call(dtype=dtype), in_axes=(0, None))(xs, y)
  assert_close(out, xs + y[None])
  out2 = jax.vmap(_add_call(dtype=dtype), in_axes=(None, 0))(y, xs)
  assert_close(out2, xs + y[None])


def test_vmap_nested():
  r = Rand()
  xs, ys = r((3, 10)), r((4, 10))
  f = jax.vmap(jax.vmap(_add_call(), in_axes=(0, None)), in_axes=(None, 0))
  out = f(xs, ys)
  assert out.shape == (4, 3, 10)
  np.testing.assert_allclose(out, xs[None, :, :] + ys[:, None, :], rtol=1e-6)


def test_vmap_nested_both_batched_with_grid():
  x = Rand()((2, 3, 12), np.int32)
  spec = pl.BlockSpec((4,), lambda i: (i,))

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * (pl.program_id(0) + 1)

  call = pl.pallas_call(kernel, out_shape=sds((12,), jnp.int32), grid=(3,), in_specs=[spec],
                        out_specs=spec)
  out = jax.vmap(jax.vmap(call))(x)
  np.testing.assert_array_equal(out, x * np.repeat(np.arange(1, 4), 4))


def test_vmap_non_leading_axis_and_out_axes():
  r = Rand()
  xs, y = r((10, 3)), r((10,))
  out = jax.vmap(_add_call(), in_axes=(1, None))(xs, y)
  np.testing.assert_allclose(out, xs.T + y, rtol=1e-6)
  out = jax.vmap(_add_call(), in_axes=(1, None), out_axes=1)(xs, y)
  np.testing.assert_allclose(out, xs + y[:, None], rtol=1e-6)
  zs = r((2, 10, 3))
  out = jax.vmap(jax.vmap(_add_call(), in_axes=(1, None)), in_axes=(0, None))(zs, y)
  np.testing.assert_allclose(out, np.swapaxes(zs, 1, 2) + y, rtol=1e-6)


def test_vmap_with_grid_blocks_scratch_and_program_id():
  xs = Rand()((3, 8, 6))

  def kernel(x_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(1) == 0)
    def _():
      acc_ref[...] = jnp.zeros_like(acc_ref)
    acc_ref[...] += x_ref[...]
    o_ref[...] = acc_ref[...] * (pl.program_id(0) + 1).astype(jnp.float32)

  call = pl.pallas_call(kernel, out_shape=sds((8, 2)), grid=(4, 3),
                        in_specs=[pl.BlockSpec((2, 2), lambda i, k: (i, k))],
                        out_specs=pl.BlockSpec((2, 2), lambda i, k: (i, 0)),
                        scratch_shapes=[pl.ANY((2, 2), jnp.float32)])
  out = jax.vmap(call)(xs)
  ref = xs.reshape(3, 8, 3, 2).sum(2) * np.repeat(np.arange(1.0, 5.0), 2)[None, :, None]
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_vmap_with_input_output_aliases_and_unbatched_aliased_input():
  r = Rand()
  xs, y = r((3, 6)), r((6,))

  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = o_ref[...] + x_ref[...]

  call = pl.pallas_call(kernel, out_shape=sds((6,)), input_output_aliases={1: 0})
  out = jax.vmap(call, in_axes=(0, None))(xs, y)
  np.testing.assert_allclose(out, xs + y, rtol=1e-6)


def test_vmap_of_jit_and_jit_of_vmap_agree():
  r = Rand()
  xs, ys = r((5, 10)), r((5, 10))
  a = jax.vmap(jax.jit(_add_call()))(xs, ys)
  b = jax.jit(jax.vmap(_add_call()))(xs, ys)
  np.testing.assert_array_equal(a, b)
  np.testing.assert_allclose(a, xs + ys, rtol=1e-6)


def test_vmap_size_one_batch():
  r = Rand()
  xs, ys = r((1, 10), np.int32), r((1, 10), np.int32)
  np.testing.assert_array_equal(jax.vmap(_add_call(dtype=jnp.int32))(xs, ys), xs + ys)


# --- autodiff -------------------------------------------------------------------------------------

def test_grad_raises_not_implemented_mentioning_custom_vjp():
  x = jnp.asarray(Rand()((10,)))
  call = _add_call()
  with pytest.raises(NotImplementedError, match="reverse-mode.*forward \\(jax.jvp\\).*custom_vjp"):
    jax.grad(lambda v: call(v, v).sum())(x)
  with pytest.raises(NotImplementedError, match="custom_vjp"):
    jax.jit(jax.grad(lambda v: call(v, x).sum()))(x)
  # JAX Pallas stops the same programs with a ValueError saying "Linearization failed".
  with pytest.raises(ValueError, match="Linearization failed"):
    jax.grad(lambda v: call(v, v).sum())(x)


def test_custom_vjp_wrapper_makes_it_differentiable():
  x = jnp.asarray(Rand()((10,)))

  def sq_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * x_ref[...]

  def bwd_kernel(x_ref, g_ref, o_ref):
    o_ref[...] = 2 * x_ref[...] * g_ref[...]

  @jax.custom_vjp
  def square(v):
    return pl.pallas_call(sq_kernel, out_shape=sds(v))(v)

  def fwd(v):
    return square(v), v

  def bwd(v, g):
    return (pl.pallas_call(bwd_kernel, out_shape=sds(v))(v, g),)

  square.defvjp(fwd, bwd)
  np.testing.assert_allclose(jax.grad(lambda v: square(v).sum())(x), 2 * x, rtol=1e-6)
  np.testing.assert_allclose(jax.jit(jax.grad(lambda v: square(v).sum()))(x), 2 * x, rtol=1e-6)

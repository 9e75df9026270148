"""Bad inputs raise ValueError/TypeError/IndexError naming the kernel and the operand.

Each error test also runs the corrected call, checked against a NumPy reference,
so that the error is known to come from the one thing that is wrong.
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax as pl
from helpers import rand

S = jax.ShapeDtypeStruct


def names(*parts):
  """A regex matching all ``parts`` (literally) in any order."""
  return "".join(f"(?=[\\s\\S]*{re.escape(p)})" for p in parts)


def copy_kernel(x_ref, o_ref):
  o_ref[...] = x_ref[...] * 2


def add_kernel(x_ref, y_ref, o_ref):
  o_ref[...] = x_ref[...] + y_ref[...]


BAD_EXC = (ValueError, TypeError, IndexError)


@pytest.fixture(params=["eager", "jit"])
def mode(request):
  return request.param


def call(fn, mode, *args):
  if mode == "jit":
    return jax.block_until_ready(jax.jit(fn)(*args))
  return fn(*args)


# --- block shapes and index maps -----------------------------------------------------------------

def test_block_rank_differs_from_array_rank_input(mode):
  x = rand((8, 4))
  bad = pl.pallas_call(copy_kernel, out_shape=S((8, 4), jnp.float32), grid=(2,),
                       in_specs=[pl.BlockSpec((4,), lambda i: (i,))],
                       out_specs=pl.BlockSpec((4, 4), lambda i: (i, 0)))
  with pytest.raises(ValueError, match=names("copy_kernel", "Block shape for args[0] (4,) must have the same number of dimensions as the array shape (8, 4)")):
    call(bad, mode, x)
  good = pl.pallas_call(copy_kernel, out_shape=S((8, 4), jnp.float32), grid=(2,),
                        in_specs=[pl.BlockSpec((4, 4), lambda i: (i, 0))],
                        out_specs=pl.BlockSpec((4, 4), lambda i: (i, 0)))
  np.testing.assert_allclose(call(good, mode, x), x * 2)


def test_block_rank_differs_from_array_rank_output():
  x = rand((8, 4))
  with pytest.raises(ValueError, match=names("copy_kernel", "Block shape for outputs[0] (4, 4, 1) must have the same number of dimensions")):
    pl.pallas_call(copy_kernel, out_shape=S((8, 4), jnp.float32), grid=(2,),
                   in_specs=[pl.BlockSpec((4, 4), lambda i: (i, 0))],
                   out_specs=pl.BlockSpec((4, 4, 1), lambda i: (i, 0, 0)))(x)


def test_second_operand_block_rank_is_named():
  x, y = rand((8,)), rand((8,), salt="y")
  with pytest.raises(ValueError, match=names("add_kernel", "args[1]")):
    pl.pallas_call(add_kernel, out_shape=S((8,), jnp.float32), grid=(2,),
                   in_specs=[pl.BlockSpec((4,), lambda i: (i,)),
                             pl.BlockSpec((4, 1), lambda i: (i, 0))],
                   out_specs=pl.BlockSpec((4,), lambda i: (i,)))(x, y)


def test_index_map_arity_differs_from_grid_rank(mode):
  x = rand((8, 4))
  bad = pl.pallas_call(copy_kernel, out_shape=S((8, 4), jnp.float32), grid=(2,),
                       in_specs=[pl.BlockSpec((4, 4), lambda i, j: (i, 0))],
                       out_specs=pl.BlockSpec((4, 4), lambda i: (i, 0)))
  with pytest.raises(TypeError, match=names("copy_kernel", "args[0]", "index_map")):
    call(bad, mode, x)


def test_index_map_arity_too_few_for_2d_grid():
  x = rand((8, 4))
  with pytest.raises(TypeError, match=names("copy_kernel", "out[0]", "index_map")):
    pl.pallas_call(copy_kernel, out_shape=S((8, 4), jnp.float32), grid=(2, 1),
                   in_specs=[pl.BlockSpec((4, 4), lambda i, j: (i, j))],
                   out_specs=pl.BlockSpec((4, 4), lambda i: (i, 0)))(x)


def test_index_map_returns_too_few_indices(mode):
  x = rand((8, 4))
  bad = pl.pallas_call(copy_kernel, out_shape=S((8, 4), jnp.float32), grid=(2,),
                       in_specs=[pl.BlockSpec((4, 4), lambda i: (i,))],
                       out_specs=pl.BlockSpec((4, 4), lambda i: (i, 0)))
  with pytest.raises(ValueError, match=names(
      "copy_kernel", "Index map function <lambda> at ", "for args[0] must return 2 values",
      "Currently returning 1 values")):
    call(bad, mode, x)


def test_index_map_returns_too_many_indices():
  x = rand((8, 4))
  with pytest.raises(ValueError, match=names("copy_kernel", "for out[0] must return 2 values",
                                             "Currently returning 3 values")):
    pl.pallas_call(copy_kernel, out_shape=S((8, 4), jnp.float32), grid=(2,),
                   in_specs=[pl.BlockSpec((4, 4), lambda i: (i, 0))],
                   out_specs=pl.BlockSpec((4, 4), lambda i: (i, 0, 0)))(x)


@pytest.mark.parametrize("index_map,where", [
    (lambda i: (i + 1,), "args[0]"),     # past the end at the last program
    (lambda i: (i - 1,), "args[0]"),     # negative at the first program
], ids=["past-end", "negative"])
def test_index_map_returns_block_index_past_array(mode, index_map, where):
  x = rand((8,))
  bad = pl.pallas_call(copy_kernel, out_shape=S((8,), jnp.float32), grid=(2,),
                       in_specs=[pl.BlockSpec((4,), index_map)],
                       out_specs=pl.BlockSpec((4,), lambda i: (i,)))
  with pytest.raises(IndexError, match=names("copy_kernel", where)):
    call(bad, mode, x)


def test_output_index_map_past_array():
  x = rand((8,))
  with pytest.raises(IndexError, match=names("copy_kernel", "out[0]")):
    pl.pallas_call(copy_kernel, out_shape=S((8,), jnp.float32), grid=(3,),
                   in_specs=[pl.BlockSpec((4,), lambda i: (i % 2,))],
                   out_specs=pl.BlockSpec((4,), lambda i: (i,)))(x)


def test_partial_last_block_is_not_past_the_array():
  # 10 elements in blocks of 4: block index 2 is the (partial) last block, so it is valid.
  x = rand((10,))
  out = pl.pallas_call(copy_kernel, out_shape=S((10,), jnp.float32), grid=(3,),
                       in_specs=[pl.BlockSpec((4,), lambda i: (i,))],
                       out_specs=pl.BlockSpec((4,), lambda i: (i,)))(x)
  np.testing.assert_allclose(out, x * 2)
  with pytest.raises(IndexError, match=names("copy_kernel", "args[0]")):
    pl.pallas_call(copy_kernel, out_shape=S((10,), jnp.float32), grid=(3,),
                   in_specs=[pl.BlockSpec((4,), lambda i: (i + 1,))],
                   out_specs=pl.BlockSpec((4,), lambda i: (i,)))(x)


# --- specs vs operands ----------------------------------------------------------------------------

def test_more_in_specs_than_operands(mode):
  x = rand((8,))
  bad = pl.pallas_call(copy_kernel, out_shape=S((8,), jnp.float32),
                       in_specs=[pl.BlockSpec((8,), lambda: (0,)), None])
  with pytest.raises(ValueError, match=names("copy_kernel", "in_specs")):
    call(bad, mode, x)


def test_fewer_in_specs_than_operands(mode):
  x, y = rand((8,)), rand((8,), salt="y")
  bad = pl.pallas_call(add_kernel, out_shape=S((8,), jnp.float32), in_specs=[None])
  with pytest.raises(ValueError, match=names("add_kernel", "in_specs")):
    call(bad, mode, x, y)
  good = pl.pallas_call(add_kernel, out_shape=S((8,), jnp.float32), in_specs=[None, None])
  np.testing.assert_allclose(call(good, mode, x, y), x + y)


def test_more_out_specs_than_outputs():
  x = rand((8,))
  with pytest.raises(ValueError, match=names("copy_kernel", "out_specs")):
    pl.pallas_call(copy_kernel, out_shape=S((8,), jnp.float32), out_specs=[None, None])(x)


@pytest.mark.parametrize("bad_shape,pos", [
    ((8,), "out_shape[0]"),
    ("float32[8]", "out_shape[0]"),
    ([S((8,), jnp.float32), 5], "out_shape[1]"),
], ids=["tuple-of-ints", "string", "list-with-int"])
def test_out_shape_not_shape_dtype_struct(bad_shape, pos):
  x = rand((8,))
  with pytest.raises(TypeError, match=names("copy_kernel", "ShapeDtypeStruct", pos)):
    pl.pallas_call(copy_kernel, out_shape=bad_shape)(x)


def test_grid_spec_and_grid_together():
  x = rand((8,))
  with pytest.raises(ValueError, match=names("copy_kernel", "grid_spec")):
    pl.pallas_call(copy_kernel, out_shape=S((8,), jnp.float32),
                   grid_spec=pl.GridSpec(grid=(1,)), grid=(2,))(x)


# --- kernel signature -----------------------------------------------------------------------------

def test_kernel_takes_more_refs_than_given(mode):
  x = rand((8,))
  bad = pl.pallas_call(add_kernel, out_shape=S((8,), jnp.float32))
  with pytest.raises(TypeError, match=names("add_kernel", "args[0]", "out[0]")):
    call(bad, mode, x)


def test_kernel_takes_fewer_refs_than_given(mode):
  x, y = rand((8,)), rand((8,), salt="y")
  bad = pl.pallas_call(copy_kernel, out_shape=S((8,), jnp.float32))
  with pytest.raises(TypeError, match=names("copy_kernel", "args[1]")):
    call(bad, mode, x, y)


def test_kernel_missing_scratch_ref():
  x = rand((8,))
  with pytest.raises(TypeError, match=names("copy_kernel", "scratch[0]")):
    pl.pallas_call(copy_kernel, out_shape=S((8,), jnp.float32),
                   scratch_shapes=[pl.ANY((8,), jnp.float32)])(x)


def test_kernel_returning_a_value():
  def returns_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]
    return x_ref[...]

  with pytest.raises(ValueError, match=names("returns_kernel")):
    pl.pallas_call(returns_kernel, out_shape=S((8,), jnp.float32))(rand((8,)))


# --- static Ref indices -----------------------------------------------------------------------------

def test_static_index_past_block(mode):
  def read10_kernel(x_ref, o_ref):
    o_ref[...] = jnp.broadcast_to(x_ref[10], (8,))

  x = rand((16,))
  bad = pl.pallas_call(read10_kernel, out_shape=S((8,), jnp.float32), grid=(2,),
                       in_specs=[pl.BlockSpec((8,), lambda i: (i,))],
                       out_specs=pl.BlockSpec((8,), lambda i: (0,)))
  with pytest.raises(IndexError, match=names("read10_kernel", "args[0]", "10")):
    call(bad, mode, x)


def test_static_ds_past_ref(mode):
  def ds_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[pl.ds(8, 4)]

  x = rand((10,))
  bad = pl.pallas_call(ds_kernel, out_shape=S((4,), jnp.float32))
  with pytest.raises(IndexError, match=names("ds_kernel", "args[0]")):
    call(bad, mode, x)


def test_static_store_index_past_output():
  def store9_kernel(x_ref, o_ref):
    o_ref[9] = x_ref[0]

  with pytest.raises(IndexError, match=names("store9_kernel", "out[0]", "9")):
    pl.pallas_call(store9_kernel, out_shape=S((8,), jnp.float32))(rand((8,)))


def test_static_index_past_second_dimension():
  def col_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[:, 5]

  x = rand((8, 4))
  with pytest.raises(IndexError, match=names("col_kernel", "args[0]", "5")):
    pl.pallas_call(col_kernel, out_shape=S((8,), jnp.float32))(x)


def test_static_index_in_bounds_is_fine():
  def last_kernel(x_ref, o_ref):
    o_ref[...] = jnp.broadcast_to(x_ref[7] + x_ref[-8], (2,))

  x = rand((8,))
  out = pl.pallas_call(last_kernel, out_shape=S((2,), jnp.float32))(x)
  np.testing.assert_allclose(out, np.full(2, x[7] + x[0]), rtol=1e-6)


# --- stores of the wrong type ------------------------------------------------------------------

def test_store_of_wrong_shape(mode):
  def short_store_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[pl.ds(0, 4)]

  bad = pl.pallas_call(short_store_kernel, out_shape=S((8,), jnp.float32))
  with pytest.raises(ValueError, match=names("short_store_kernel", "out[0]", "shape")):
    call(bad, mode, rand((8,)))


def test_store_of_wrong_dtype(mode):
  def int_store_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...].astype(jnp.int32)

  bad = pl.pallas_call(int_store_kernel, out_shape=S((8,), jnp.float32))
  with pytest.raises((ValueError, TypeError), match=names("int_store_kernel", "out[0]", "int32")):
    call(bad, mode, rand((8,)))


def test_masked_store_of_wrong_shape():
  def masked_store_kernel(x_ref, o_ref):
    pl.store(o_ref, (pl.ds(0, 8),), x_ref[pl.ds(0, 4)], mask=jnp.arange(8) < 4)

  with pytest.raises(ValueError, match=names("masked_store_kernel", "shape")):
    pl.pallas_call(masked_store_kernel, out_shape=S((8,), jnp.float32))(rand((8,)))


# --- grid axes ---------------------------------------------------------------------------------

def test_program_id_axis_past_grid(mode):
  def pid_kernel(o_ref):
    o_ref[...] = jnp.full((8,), pl.program_id(1), jnp.int32)

  bad = pl.pallas_call(pid_kernel, out_shape=S((8,), jnp.int32), grid=(2,))
  with pytest.raises(ValueError, match=names("pid_kernel", "program_id(1)", "(2,)")):
    call(bad, mode)


def test_num_programs_axis_past_grid():
  def np_kernel(o_ref):
    o_ref[...] = jnp.full((8,), pl.num_programs(2), jnp.int32)

  with pytest.raises(ValueError, match=names("np_kernel", "num_programs(2)")):
    pl.pallas_call(np_kernel, out_shape=S((8,), jnp.int32), grid=(2, 3))()


def test_program_id_axis_with_no_grid():
  def nogrid_kernel(o_ref):
    o_ref[...] = jnp.full((8,), pl.program_id(0), jnp.int32)

  with pytest.raises(ValueError, match=names("nogrid_kernel", "program_id(0)")):
    pl.pallas_call(nogrid_kernel, out_shape=S((8,), jnp.int32))()


@pytest.mark.parametrize("grid,words", [
    ((0,), ("grid=(0,) runs no program", "pl.cdiv(n, block)")),
    ((2, -1), ("grid", "positive")),
    ((3, 0, 2), ("grid=(3, 0, 2) runs no program", "pl.cdiv(n, block)"))],
    ids=["zero", "negative", "zero-inner"])
def test_grid_sizes_not_positive(grid, words):
  x = rand((8,))
  with pytest.raises(ValueError, match=names("copy_kernel", *words)):
    pl.pallas_call(copy_kernel, out_shape=S((8,), jnp.float32), grid=grid)(x)


@pytest.mark.parametrize("where,block", [("args[0]", (0,)), ("args[0]", (-4,)), ("out[0]", (0,))])
def test_block_sizes_not_positive(where, block):
  x = rand((8,))
  in_block = block if where == "args[0]" else (4,)
  out_block = block if where == "out[0]" else (4,)
  with pytest.raises(ValueError, match=names("copy_kernel", where, "positive")):
    pl.pallas_call(copy_kernel, out_shape=S((8,), jnp.float32), grid=(2,),
                   in_specs=[pl.BlockSpec(in_block, lambda i: (i,))],
                   out_specs=pl.BlockSpec(out_block, lambda i: (i,)))(x)


# --- aliases ------------------------------------------------------------------------------------

def test_alias_with_different_shape(mode):
  x = rand((8,))
  bad = pl.pallas_call(copy_kernel, out_shape=S((8, 1), jnp.float32), input_output_aliases={0: 0})
  with pytest.raises(ValueError, match=names("copy_kernel", "args[0]", "out[0]")):
    call(bad, mode, x)


def test_alias_with_different_dtype():
  x = rand((8,))
  with pytest.raises(ValueError, match=names("copy_kernel", "args[0]", "out[0]", "int32")):
    pl.pallas_call(copy_kernel, out_shape=S((8,), jnp.int32), input_output_aliases={0: 0})(x)


def test_alias_naming_a_missing_operand():
  x = rand((8,))
  with pytest.raises(ValueError, match=names("copy_kernel", "input_output_aliases")):
    pl.pallas_call(copy_kernel, out_shape=S((8,), jnp.float32), input_output_aliases={1: 0})(x)
  with pytest.raises(ValueError, match=names("copy_kernel", "input_output_aliases")):
    pl.pallas_call(copy_kernel, out_shape=S((8,), jnp.float32), input_output_aliases={0: 3})(x)


def test_alias_second_input_to_output():
  x, y = rand((8,)), rand((8,), np.int32)
  with pytest.raises(ValueError, match=names("add_kernel", "args[1]", "out[0]")):
    pl.pallas_call(add_kernel, out_shape=S((8,), jnp.float32), input_output_aliases={1: 0})(x, y)


# --- operands that are not arrays ------------------------------------------------------------------

def test_string_operand():
  x = rand((8,))
  with pytest.raises(TypeError, match=names("add_kernel", "args[1]", "str")):
    pl.pallas_call(add_kernel, out_shape=S((8,), jnp.float32))(x, "abc")
  with pytest.raises(TypeError, match=names("add_kernel", "args[0]", "str")):
    pl.pallas_call(add_kernel, out_shape=S((8,), jnp.float32))("abc", x)


def test_list_operand():
  x = rand((8,))
  with pytest.raises(BAD_EXC, match=names("add_kernel", "args[1]")):
    pl.pallas_call(add_kernel, out_shape=S((8,), jnp.float32))(x, [1.0, 2.0])
  with pytest.raises(BAD_EXC, match=names("add_kernel", "args[1]")):
    pl.pallas_call(add_kernel, out_shape=S((8,), jnp.float32))(x, ["a"])


def test_shape_dtype_struct_or_none_as_operand():
  x = rand((8,))
  with pytest.raises(TypeError, match=names("add_kernel", "args[1]", "ShapeDtypeStruct")):
    pl.pallas_call(add_kernel, out_shape=S((8,), jnp.float32))(x, S((8,), jnp.float32))
  with pytest.raises(BAD_EXC, match=names("add_kernel")):
    pl.pallas_call(add_kernel, out_shape=S((8,), jnp.float32))(x, object())


# --- pl.kernel --------------------------------------------------------------------------------

def test_kernel_bodies_and_meshes_mismatch():
  with pytest.raises(ValueError):
    pl.kernel([copy_kernel, copy_kernel], out_type=S((8,), jnp.float32), mesh=[pl.Mesh((1,))])


def test_kernel_mesh_must_be_a_mesh():
  with pytest.raises(TypeError, match="mesh"):
    pl.kernel(copy_kernel, out_type=S((8,), jnp.float32), mesh=(2,))(rand((8,)))


def test_kernel_body_arity_is_checked():
  def mesh_body(x_ref, o_ref):
    o_ref[...] = x_ref[...]

  with pytest.raises(TypeError, match=names("mesh_body")):
    pl.kernel(mesh_body, out_type=(S((8,), jnp.float32), S((8,), jnp.float32)),
              mesh=pl.Mesh((1,)))(rand((8,)))


def test_kernel_static_out_of_bounds_names_body():
  def oob_body(x_ref, o_ref):
    o_ref[...] = x_ref[pl.ds(6, 4)]

  with pytest.raises(IndexError, match=names("oob_body", "args[0]")):
    pl.kernel(oob_body, out_type=S((4,), jnp.float32), mesh=pl.Mesh((1,)))(rand((8,)))

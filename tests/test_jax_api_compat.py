"""Where pallax follows JAX Pallas's API in its details: the errors JAX users know, and small
differences of behaviour.

Every error test runs the same call on JAX Pallas (``interpret=True``) and on pallax: both raise
ValueError; pallax's message names the kernel, the operand and the file:line it knows (the
kernel's definition, or the index map's). Behaviour tests compare pallax with JAX Pallas on fresh
random inputs (jax.random, never zeros), elementwise.
"""
from __future__ import annotations

import os
import re
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as jpl

import pallax
from helpers import rand

HERE = re.escape(__file__) + r":\d+"
BOTH = [pytest.param(jpl, id="jax"), pytest.param(pallax, id="pallax")]


def key(salt=""):
  test = os.environ.get("PYTEST_CURRENT_TEST", "test").split(" ")[0]
  return jax.random.key(zlib.crc32((test + salt).encode()))


def copy_kernel(x_ref, o_ref):
  o_ref[...] = x_ref[...]


def add_kernel(x_ref, y_ref, o_ref):
  o_ref[...] = x_ref[...] + y_ref[...]


ROWS = lambda i: (i, 0)


def rows(pl, kernel, n_in=1, in_specs=None, **kw):
  """A 2-program call over the rows of (16, 32) float32 operands."""
  spec = pl.BlockSpec((8, 32), ROWS)
  return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16, 32), jnp.float32), grid=(2,),
                        in_specs=[spec] * n_in if in_specs is None else in_specs,
                        out_specs=spec, interpret=True, **kw)


# --- a kernel returns something ----------------------------------------------------------------

def returns_unit(x_ref, o_ref):
  o_ref[...] = x_ref[...]
  return ()


def returns_zero(x_ref, o_ref):
  o_ref[...] = x_ref[...]
  return 0


def returns_block(x_ref, o_ref):
  o_ref[...] = x_ref[...]
  return x_ref[...]


@pytest.mark.parametrize("pl", BOTH)
@pytest.mark.parametrize("kernel", [returns_unit, returns_zero, returns_block],
                         ids=lambda k: k.__name__)
def test_a_kernel_that_returns_something(pl, kernel):
  x = rand((16, 32))
  with pytest.raises(ValueError, match=re.escape(kernel.__name__) + ".*should return None"
                     if pl is jpl else
                     f"pallas_call {kernel.__name__}: The kernel function in the pallas_call {kernel.__name__} at {HERE} "
                     "should return None; it returned .*\\. Kernels write their results into output Refs"):
    rows(pl, kernel)(x)


# --- in_specs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("pl", BOTH)
def test_in_specs_that_is_a_single_block_spec(pl):
  x = rand((16, 32))
  spec = pl.BlockSpec((8, 32), ROWS)
  with pytest.raises(ValueError, match="`in_specs` must be a tuple or a list" if pl is jpl else
                     "pallas_call copy_kernel: `in_specs` must be a tuple or a list with one entry "
                     "per input, got a single BlockSpec; wrap it"):
    rows(pl, copy_kernel, in_specs=spec)(x)


@pytest.mark.parametrize("pl", BOTH)
def test_in_specs_with_fewer_entries_than_inputs(pl):
  x, y = rand((16, 32), salt="x"), rand((16, 32), salt="y")
  with pytest.raises(ValueError, match="`in_specs` and `inputs` do not match" if pl is jpl else
                     f"pallas_call add_kernel \\(kernel at {HERE}\\): Pytree for `in_specs` and "
                     "`inputs` do not match. There are 1 mismatches, including: `in_specs` is a "
                     "tuple of length 1 but `inputs` is a tuple of length 2"):
    rows(pl, add_kernel, n_in=1)(x, y)


@pytest.mark.parametrize("pl", BOTH)
def test_in_specs_whose_structure_differs_from_the_inputs(pl):
  # Inputs ((x, y), z): in_specs[0] must hold two specs.
  x, y, z = (rand((16, 32), salt=s) for s in "xyz")
  spec = pl.BlockSpec((8, 32), ROWS)

  def kernel(xy_refs, z_ref, o_ref):
    o_ref[...] = xy_refs[0][...] + xy_refs[1][...] * z_ref[...]

  with pytest.raises(ValueError, match="`in_specs` and `inputs` do not match" if pl is jpl else
                     f"pallas_call kernel \\(kernel at {HERE}\\): Pytree for `in_specs` and "
                     r"`inputs` do not match. There are 1 mismatches, including:\n.*at \[0\], `in_specs` "
                     "is a tuple of length 1 but `inputs` is a tuple of length 2"):
    rows(pl, kernel, in_specs=[(spec,), spec])((x, y), z)
  ok = rows(pl, kernel, in_specs=[(spec, spec), spec])((x, y), z)
  np.testing.assert_allclose(ok, x + y * z, rtol=1e-6, atol=1e-6)


# --- index maps --------------------------------------------------------------------------------

def _index_map_error(pl, index_map, jax_says, pallax_says):
  x = rand((16, 32))
  spec = pl.BlockSpec((8, 32), index_map)
  with pytest.raises(ValueError, match=jax_says if pl is jpl else
                     f"pallas_call copy_kernel: Index map function <lambda> at {HERE} for "
                     "args\\[0\\] " + pallax_says):
    rows(pl, copy_kernel, in_specs=[spec])(x)


@pytest.mark.parametrize("pl", BOTH)
def test_an_index_map_returning_a_vector(pl):
  _index_map_error(pl, lambda i: (jnp.stack([i, i]), 0), "must return integer scalars",
                   r"must return integer scalars. Output\[0\] has type int32\[2\]")


@pytest.mark.parametrize("pl", BOTH)
def test_an_index_map_returning_a_float(pl):
  _index_map_error(pl, lambda i: (i * 0.5, 0), "must return integer scalars",
                   r"must return integer scalars. Output\[0\] has type float32\[\]")


@pytest.mark.parametrize("pl", BOTH)
def test_an_index_map_capturing_an_array_constant(pl):
  table = jnp.asarray([1, 0], jnp.int32)
  _index_map_error(pl, lambda i: (table[i], 0), "must not capture constants",
                   r"must not capture constants: \[int32\[2\]\]; compute the block index from the grid "
                   "indices, or pass the table as a scalar-prefetch operand")


@pytest.mark.parametrize("pl", BOTH)
def test_an_index_map_may_return_a_list_and_scalar_constants(pl):
  # Both accept these: a list of indices, and scalar constants (inlined, not captured).
  x = rand((16, 32))
  spec = pl.BlockSpec((8, 32), lambda i: [1 - i * jnp.int32(1), np.int32(0)])
  out = rows(pl, copy_kernel, in_specs=[spec])(x)
  np.testing.assert_array_equal(out, np.concatenate([x[8:], x[:8]]))


# --- input_output_aliases ---------------------------------------------------------------------

@pytest.mark.parametrize("pl", BOTH)
@pytest.mark.parametrize("aliases,what", [({1: 0}, "'1:0' with input index 1"),
                                          ({-1: 0}, "'-1:0' with input index -1"),
                                          ({0: 1}, "'0:1' with output index 1")],
                         ids=["input", "negative", "output"])
def test_aliases_out_of_range(pl, aliases, what):
  x = rand((16, 32))
  with pytest.raises(ValueError, match="input_output_aliases contains the mapping" if pl is jpl
                     else f"pallas_call copy_kernel \\(kernel at {HERE}\\): input_output_aliases "
                     f"contains the mapping {what} outside the range \\[0, 1\\)"):
    rows(pl, copy_kernel, input_output_aliases=aliases)(x)


# --- padding of partial blocks, poisoned outputs ----------------------------------------------

@pytest.mark.parametrize("dtype", [jnp.int32, jnp.int8, jnp.uint8, jnp.uint32, jnp.float32],
                         ids=lambda d: jnp.dtype(d).name)
def test_partial_blocks_are_padded_as_in_jax(dtype):
  """A partial edge block reads JAX's padding: the smallest integer, NaN for floats. (int16 is
  left out: JAX's interpreter pads it with 0, its semaphores' dtype.)"""
  def build(pl):
    spec = pl.BlockSpec((4, 8), lambda i, j: (i, j))
    return pl.pallas_call(copy_kernel, out_shape=jax.ShapeDtypeStruct((12, 16), dtype),
                          grid=(3, 2), in_specs=[spec], out_specs=spec, interpret=True)

  x = rand((10, 13), dtype)                  # rows 10..11 and columns 13..15 are padding
  out, ref = np.asarray(build(pallax)(x)), np.asarray(build(jpl)(x))
  np.testing.assert_array_equal(out, ref)    # NaN == NaN here
  np.testing.assert_array_equal(out[:10, :13], x)
  pad = np.nan if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min
  np.testing.assert_array_equal(out[10:], np.full((2, 16), pad, dtype))
  np.testing.assert_array_equal(out[:, 13:], np.full((12, 3), pad, dtype))


def test_an_integer_output_read_before_written_is_the_smallest_integer():
  def kernel(x_ref, o_ref):
    o_ref[...] = jnp.minimum(o_ref[...], x_ref[...])   # the unwritten output is poison

  def build(pl):
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 16), jnp.int32),
                          interpret=True)

  x = rand((8, 16), jnp.int32)
  out = np.asarray(build(pallax)(x))
  np.testing.assert_array_equal(out, np.asarray(build(jpl)(x)))
  np.testing.assert_array_equal(out, np.full((8, 16), np.iinfo(np.int32).min))


# --- out_shape as a list -----------------------------------------------------------------------

@pytest.mark.parametrize("pl", BOTH)
def test_a_list_out_shape_returns_a_tuple(pl):
  def kernel(x_ref, a_ref, b_ref):
    a_ref[...] = x_ref[...] * 2
    b_ref[...] = x_ref[...] - 1

  x = rand((16, 32))
  shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
  out = pl.pallas_call(kernel, out_shape=[shape, shape], interpret=True)(x)
  assert type(out) is tuple and len(out) == 2
  np.testing.assert_allclose(out[0], x * 2, rtol=1e-6)
  np.testing.assert_allclose(out[1], x - 1, rtol=1e-6)


# --- vmap of aliased kernels whose aliased operand is not batched -------------------------------

def scale_into_kernel(x_ref, acc_ref, o_ref):
  o_ref[...] = acc_ref[...] * 2 + x_ref[...]          # o_ref starts as acc (aliased)


def aliased(pl, interpret):
  spec = pl.BlockSpec((8, 32), ROWS)
  return pl.pallas_call(scale_into_kernel, out_shape=jax.ShapeDtypeStruct((13, 32), jnp.float32),
                        grid=(2,), in_specs=[spec, spec], out_specs=spec,
                        input_output_aliases={1: 0}, interpret=interpret)


@pytest.mark.parametrize("interpret", [pytest.param(False, id="pallax-default"),
                                       pytest.param(pallax.InterpretParams(parallel=False),
                                                    id="pallax-sequential")])
@pytest.mark.parametrize("in_axes", [(0, None), (None, 0), (1, None), (0, 0)], ids=str)
def test_vmap_with_an_unbatched_aliased_operand(interpret, in_axes):
  """JAX broadcasts an unbatched aliased input to the batch; so does pallax (which lowers it to
  Triton too: tests/conftest.py)."""
  n, x, acc = 3, rand((13, 32), salt="x"), rand((13, 32), salt="acc")
  xs = jnp.stack([x + k for k in range(n)])
  accs = jnp.stack([acc * (k + 1) for k in range(n)])
  (a_x, a_acc) = in_axes
  args = (x if a_x is None else jnp.moveaxis(xs, 0, a_x),
          acc if a_acc is None else jnp.moveaxis(accs, 0, a_acc))
  out = jax.jit(jax.vmap(aliased(pallax, interpret), in_axes=in_axes))(*args)
  ref = jax.vmap(aliased(jpl, True), in_axes=in_axes)(*args)
  np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
  expected = (accs if a_acc is not None else acc[None]) * 2 + (xs if a_x is not None else x[None])
  np.testing.assert_allclose(out, np.broadcast_to(expected, (n, 13, 32)), rtol=1e-6, atol=1e-6)


# --- kernels JAX's Triton path runs (issue point 5): same results on pallax ------------------

def _both(build, *args):
  """``build(pl)`` run on JAX Pallas (interpret) and on pallax; the results, as NumPy."""
  got = jax.tree.map(np.asarray, build(pallax)(*args))
  want = jax.tree.map(np.asarray, build(jpl)(*args))
  return got, want


def test_a_kernel_that_writes_nothing_runs_and_lowers():
  """Its Triton source needs a statement (CI lowers every kernel the tests run)."""
  x = rand((8,))
  out = pallax.pallas_call(lambda x_ref, o_ref: None, out_shape=jax.ShapeDtypeStruct((8,), jnp.float32),
                           interpret=True)(x)
  assert out.shape == (8,)
  import pallax.triton as plt
  (k,) = plt.lower(lambda x: pallax.pallas_call(
      lambda x_ref, o_ref: None, out_shape=jax.ShapeDtypeStruct((8,), jnp.float32))(x),
      jax.ShapeDtypeStruct((8,), jnp.float32), compute_capability=80)
  assert ".entry" in k.ptx


def test_split_and_unstack_match_jax_pallas():
  def build(pl):
    def kernel(x_ref, y_ref, o_ref, p_ref):
      a, b, c = jnp.split(x_ref[...], [2, 8], axis=1)
      o_ref[...] = a.sum(axis=1, keepdims=True) * b[:, :1] + c[:, 3:4]
      v = y_ref[...]
      p_ref[...] = v[0] * v[1] - v[2]
    return lambda x, y: pl.pallas_call(kernel, out_shape=(
        jax.ShapeDtypeStruct((4, 1), jnp.float32), jax.ShapeDtypeStruct((16,), jnp.float32)),
        interpret=True)(x, y)
  got, want = _both(build, rand((4, 12)), rand((3, 16), salt="y"))
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_scan_with_a_cond_over_a_ref_matches_jax_pallas():
  def build(pl):
    def kernel(x_ref, o_ref):
      def body(c, i):
        c = jax.lax.cond(i % 2 == 0, lambda: c + x_ref[...], lambda: c * x_ref[...])
        return c, None
      o_ref[...] = jax.lax.scan(body, jnp.ones(8), jnp.arange(5))[0]
    return lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8,), jnp.float32),
                                    interpret=True)(x)
  got, want = _both(build, rand((8,)))
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_int4_casts_run_in_the_interpreter_and_lower_to_triton():
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...].astype(jnp.int4).astype(jnp.int32)
  x = jax.random.randint(key(), (16,), -8, 8, jnp.int32)
  call = lambda x, interpret: pallax.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((16,), jnp.int32), interpret=interpret)(x)
  np.testing.assert_array_equal(np.asarray(call(x, True)), np.asarray(x))
  import pallax.triton as plt   # sub-byte values take a byte in registers (tests/test_subbyte.py)
  assert plt.lower(lambda x: call(x, False), jax.ShapeDtypeStruct((16,), jnp.int32), compute_capability=80)


@pytest.mark.parametrize("op", ["load", "store"])
def test_a_mask_that_cannot_broadcast_to_the_access_is_a_clear_error(op):
  import pallax.triton as plt
  def kernel(x_ref, o_ref):
    mask = jnp.arange(4) < 2
    if op == "load":
      o_ref[...] = plt.load(x_ref.at[pallax.ds(0, 8)], mask=mask, other=0.0)
    else:
      plt.store(o_ref.at[pallax.ds(0, 8)], x_ref[...], mask=mask)
  with pytest.raises(ValueError, match=rf"pallas_call kernel at {HERE}.*mask has shape \(4,\).*"
                                       r"does not broadcast"):
    pallax.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8,), jnp.float32),
                       interpret=True)(rand((8,)))


def test_scalar_outputs_aliased_to_python_int_inputs_match_jax_pallas():
  """The atomic-lock counter pattern: ``increment(0, 0)`` with ``()``-shaped outputs aliased to
  Python-int inputs (it failed with "cannot reshape array of size 0" before)."""
  def build(pl):
    def increment(a_ref, b_ref, ao, bo):
      ao[...] = a_ref[...] + 1
      bo[...] = b_ref[...] * 3 - 2
    return lambda a, b: pl.pallas_call(increment, out_shape=(jax.ShapeDtypeStruct((), jnp.int32),) * 2,
                                       input_output_aliases={0: 0, 1: 1}, interpret=True)(a, b)
  a, b = (int(v) for v in jax.random.randint(key(), (2,), -100, 100))
  for args in ((0, 0), (a, b)):
    got, want = _both(build, *args)
    assert [np.asarray(g).dtype for g in got] == [np.int32, np.int32]
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    got_jit = jax.jit(build(pallax))(*args)
    np.testing.assert_array_equal(np.asarray(got_jit), np.asarray(want))


# --- tracing ------------------------------------------------------------------------------------

@pytest.mark.parametrize("pl", BOTH)
def test_a_returned_function_traces_its_kernel_once_per_operand_types(pl):
  traces = []
  scale = [2.0]

  def kernel(x_ref, o_ref):
    traces.append(x_ref.shape)
    o_ref[...] = x_ref[...] * scale[0]

  def make():
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8,), jnp.float32),
                          interpret=True)

  f = make()
  x = rand((8,))
  np.testing.assert_array_equal(jax.jit(lambda x: f(f(x)))(x), x * 4)
  assert traces == [(8,)]          # two calls, one trace
  if pl is pallax:   # JAX Pallas may reuse a trace of the same kernel function here, or not
    scale[0] = 3.0   # a new pallas_call traces again and sees the change
    np.testing.assert_array_equal(make()(x), x * 3)
    assert traces == [(8,), (8,)]


@pytest.mark.parametrize("pl", BOTH)
def test_vmap_of_an_aliased_kernel_over_a_python_scalar(pl):
  # The aliased operand is unbatched (a Python int): vmap broadcasts it to the batch.
  def add(x_ref, y_ref, o_ref):
    o_ref[()] = x_ref[()] + o_ref[()] * 3

  f = pl.pallas_call(add, out_shape=jax.ShapeDtypeStruct((), jnp.int32),
                     input_output_aliases={1: 0}, interpret=True)
  x = rand((7,), jnp.int32)
  np.testing.assert_array_equal(jax.vmap(f, in_axes=(0, None))(x, 5), x + 15)

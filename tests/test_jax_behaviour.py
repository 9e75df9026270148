"""Behaviour that JAX's own Pallas test files expect and pallax once did differently: loop bodies
that return a Ref, in_specs whose structure is not the inputs', inputs named by their pytree path
in errors, and grid specs made by JAX Pallas's TPU module. Results are compared with jax.numpy."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl
import pallax.triton as plgpu
from helpers import rand

SHAPE = (8, 128)


def _call(kernel, *args):
  return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(SHAPE, jnp.float32))(*args)


def test_fori_loop_carrying_the_output_ref():
  x = rand(SHAPE, salt="fori")

  def k(x_ref, o_ref):
    def body(i, r):
      r[...] = x_ref[...] * i.astype(jnp.float32)
      return r
    lax.fori_loop(0, 3, body, o_ref)

  np.testing.assert_array_equal(_call(k, x), x * 2)


def test_fori_loop_returning_the_ref_it_closes_over():
  x = rand(SHAPE, salt="closed")

  def k(x_ref, o_ref):
    o_ref[...] = jnp.zeros_like(x_ref)
    def body(i, carry):
      r, acc = carry
      o_ref[...] += x_ref[...]
      return o_ref, acc + 1.0
    _, n = lax.fori_loop(0, 4, body, (o_ref, 0.0))
    o_ref[...] = o_ref[...] / n

  np.testing.assert_allclose(_call(k, x), x * 4 / 4, rtol=1e-6)


def test_scan_carrying_a_ref_and_a_value():
  x = rand(SHAPE, salt="scan")

  def k(x_ref, o_ref):
    o_ref[...] = x_ref[...]
    def body(carry, _):
      r, s = carry
      r[...] = r[...] * 2.0 + s
      return (r, s + 1.0), None
    lax.scan(body, (o_ref, 0.0), None, length=3)

  np.testing.assert_allclose(_call(k, x), ((x * 2) * 2 + 1) * 2 + 2, rtol=1e-6)


def _ref_per_step(x_ref, o_ref):
  def body(c, _):
    o_ref[...] = x_ref[...] + c
    return c + 1.0, o_ref
  lax.scan(body, 0.0, None, length=3)


def test_scan_outputting_a_ref_per_step():
  """The per-step Ref outputs are unused, and pruned as JAX Pallas prunes them (on the CPU the
  kernel also lowers to PTX: the conftest checks it)."""
  x = rand(SHAPE, salt="ys")
  np.testing.assert_array_equal(_call(_ref_per_step, x), x + 2)


def test_triton_refuses_a_loop_that_swaps_refs():
  def k(x_ref, y_ref, o_ref):
    def body(i, refs):
      a, b = refs
      o_ref[...] += a[...]
      return b, a
    o_ref[...] = jnp.zeros_like(o_ref)
    lax.fori_loop(0, 3, body, (x_ref, y_ref))

  f = pl.pallas_call(k, out_shape=jax.ShapeDtypeStruct(SHAPE, jnp.float32))
  s = jax.ShapeDtypeStruct(SHAPE, jnp.float32)
  with pytest.raises(NotImplementedError, match="returns another Ref than the one it carries"):
    plgpu.lower(f, s, s, compute_capability=80)


def test_one_spec_for_a_dict_input_is_refused_as_in_jax():
  a = rand((256,), salt="dict")
  f = pl.pallas_call(lambda x_ref, d, o_ref: None, out_shape=a,
                     in_specs=[pl.BlockSpec((256,), lambda: (0,)), pl.BlockSpec((256,), lambda: (0,))])
  with pytest.raises(ValueError, match=r"Pytree for `in_specs` and `inputs` do not match. There are 1 "
                     r"mismatches, including:\n    \* at \[1\], `in_specs` is a pytree leaf but "
                     r"`inputs` is a <class 'dict'>"):
    f(a, dict(a=a))


def test_a_dict_of_specs_for_a_dict_input():
  a, b = rand((256,), salt="one"), rand((256,), salt="two")
  spec = pl.BlockSpec((128,), lambda i: (i,))
  f = pl.pallas_call(lambda d, o_ref: o_ref.__setitem__(..., d["one"][...] - d["two"][...]),
                     out_shape=a, grid=(2,), in_specs=[dict(one=spec, two=spec)], out_specs=spec)
  np.testing.assert_array_equal(f(dict(one=a, two=b)), a - b)


def test_inputs_are_named_by_their_pytree_path():
  a = rand((256,), salt="path")
  def two_values():
    return 0, 0
  f = pl.pallas_call(lambda d, o_ref: None, out_shape=a,
                     in_specs=[dict(one=pl.BlockSpec((4,), two_values),
                                    two=pl.BlockSpec((8,), two_values))])
  with pytest.raises(ValueError, match=r"for args\[0\]\['one'\] must return 1 values"):
    f(dict(one=a, two=a))


def test_a_grid_spec_made_by_jax_pallas():
  """TPU-first code passes pltpu.PrefetchScalarGridSpec (JAX's class) to pallas_call."""
  from jax.experimental.pallas import tpu as pltpu
  x = rand((4, 16, 256), salt="tpu")
  idx = jnp.array([3], jnp.int32)

  def k(i_ref, x_ref, o_ref):
    o_ref[...] = x_ref[:, pl.ds(i_ref[0], 1), :] * 2.0

  gs = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(2,),
                                    in_specs=[pl.BlockSpec((2, 16, 256), lambda g, i: (g, 0, 0))],
                                    out_specs=pl.BlockSpec((2, 1, 256), lambda g, i: (g, 0, 0)))
  f = pl.pallas_call(k, out_shape=jax.ShapeDtypeStruct((4, 1, 256), jnp.float32), grid_spec=gs)
  np.testing.assert_array_equal(f(idx, x), x[:, 3:4, :] * 2)


def test_a_grid_spec_without_block_specs_made_by_jax_pallas():
  from jax.experimental.pallas import tpu as pltpu
  x = rand(SHAPE, salt="nospec")
  gs = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=0)
  f = pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + 1.0),
                     out_shape=jax.ShapeDtypeStruct(SHAPE, jnp.float32), grid_spec=gs)
  np.testing.assert_array_equal(f(x), x + 1)

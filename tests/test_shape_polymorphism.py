"""Kernels exported with symbolic sizes (``jax.export``'s shape polymorphism): grids computed from
symbolic dimensions (``pl.cdiv(w, 8)``, ``(h + 1) // 128``), operands of symbolic shape, static
blocks. pallax's interpreter runs them (interpret/symbolic.py); each exported kernel is called
at several concrete shapes (partial edge blocks, one block, one row) and compared with numpy,
and with the same kernel run at concrete sizes. The GPU backends refuse them, as JAX's do.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import pallax as pl

pytestmark = pytest.mark.interpreter

# Run-time checks report through host callbacks, which jax.export cannot serialize: exported
# kernels run without them (as for concrete sizes, tests/test_export_interpreter.py).
UNCHECKED = pl.InterpretParams(check_bounds=False)


def copy_plus_one(x, interpret=UNCHECKED):
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1
  block = (8, 128)
  grid = (pl.cdiv(x.shape[0], block[0]), (x.shape[1] + 127) // block[1])
  return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=grid,
                        in_specs=[pl.BlockSpec(block, lambda i, j: (i, j))],
                        out_specs=pl.BlockSpec(block, lambda i, j: (i, j)),
                        interpret=interpret)(x)


@pytest.mark.parametrize("shape", [(16, 256), (13, 200), (1, 128), (8, 1)])
def test_an_exported_copy_runs_at_every_shape(shape):
  w, h = export.symbolic_shape("w, h")
  exp = export.export(jax.jit(copy_plus_one), platforms=["cpu"])(
      jax.ShapeDtypeStruct((w, h), jnp.int32))
  x = jnp.asarray(np.random.default_rng(sum(shape)).integers(-100, 100, shape), jnp.int32)
  np.testing.assert_array_equal(np.asarray(exp.call(x)), np.asarray(x) + 1)
  np.testing.assert_array_equal(np.asarray(exp.call(x)), np.asarray(copy_plus_one(x)))


def matmul(x, y, bm=32, bn=32, bk=16):
  """A K loop over the last grid axis, accumulating into the revisited output block."""
  def kernel(x_ref, y_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
      o_ref[...] = jnp.zeros_like(o_ref)
    o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

  m, k = x.shape
  n = y.shape[1]
  return pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
      grid=(m // bm, n // bn, k // bk),
      in_specs=[pl.BlockSpec((bm, bk), lambda i, j, l: (i, l)),
                pl.BlockSpec((bk, bn), lambda i, j, l: (l, j))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j, l: (i, j)), interpret=UNCHECKED)(x, y)


@pytest.mark.parametrize("mkn", [(64, 32, 96), (32, 48, 32)])
def test_an_exported_matmul_with_divisibility_constraints(mkn):
  m, k, n = export.symbolic_shape("m, k, n", constraints=["mod(m, 32) == 0", "mod(n, 32) == 0",
                                                         "mod(k, 16) == 0"])
  exp = export.export(jax.jit(matmul), platforms=["cpu"])(
      jax.ShapeDtypeStruct((m, k), jnp.float32), jax.ShapeDtypeStruct((k, n), jnp.float32))
  rng = np.random.default_rng(mkn[0])
  x = rng.uniform(-1, 1, mkn[:2]).astype(np.float32)
  y = rng.uniform(-1, 1, mkn[1:]).astype(np.float32)
  # float32 products summed in K blocks: only the summation order differs from numpy's.
  np.testing.assert_allclose(np.asarray(exp.call(x, y)), x.astype(np.float64) @ y,
                             rtol=1e-5, atol=1e-5)


def test_input_output_aliases_and_scalar_prefetch_with_symbolic_sizes():
  def kernel(s_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...] * s_ref[0]

  def f(s, x):
    spec = pl.BlockSpec((4, x.shape[1]), lambda i, s: (i, 0))
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid_spec=pl.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(pl.cdiv(x.shape[0], 4),),
                                            in_specs=[spec], out_specs=spec),
        input_output_aliases={1: 0}, interpret=UNCHECKED)(s, x)

  (w,) = export.symbolic_shape("w")
  exp = export.export(jax.jit(f), platforms=["cpu"])(
      jax.ShapeDtypeStruct((1,), jnp.int32), jax.ShapeDtypeStruct((w, 8), jnp.int32))
  x = jnp.asarray(np.random.default_rng(3).integers(-9, 9, (10, 8)), jnp.int32)
  s = jnp.asarray([3], jnp.int32)
  np.testing.assert_array_equal(np.asarray(exp.call(s, x)), np.asarray(x) * 3)


def test_a_checked_kernel_with_symbolic_sizes_says_how_to_export_it():
  (w,) = export.symbolic_shape("w")
  with pytest.raises(NotImplementedError, match=r"host callbacks.*check_bounds=False"):
    export.export(jax.jit(functools.partial(copy_plus_one, interpret=True)), platforms=["cpu"])(
        jax.ShapeDtypeStruct((w, 128), jnp.int32))


def test_the_gpu_backends_refuse_symbolic_grids_as_jax_does():
  w, h = export.symbolic_shape("w, h")
  with pytest.raises(NotImplementedError, match="dynamic grid bounds not supported in the Triton backend"):
    export.export(jax.jit(functools.partial(copy_plus_one, interpret=False)), platforms=["cuda"])(
        jax.ShapeDtypeStruct((w, h), jnp.int32))


def test_element_blocks_with_symbolic_sizes_are_refused_by_name():
  def f(x):
    def kernel(x_ref, o_ref):
      o_ref[...] = x_ref[...]
    spec = pl.BlockSpec((pl.Element(8), 128), lambda i: (i * 8, 0))
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          grid=(x.shape[0] // 8,), in_specs=[spec],
                          out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                          interpret=UNCHECKED)(x)

  (w,) = export.symbolic_shape("w")
  with pytest.raises(NotImplementedError, match=r"pl.Element block.*symbolic sizes"):
    export.export(jax.jit(f), platforms=["cpu"])(jax.ShapeDtypeStruct((w, 128), jnp.float32))


def test_vmap_over_a_symbolic_batch():
  def add(x, y):
    spec = pl.BlockSpec((16, 16), lambda i, j: (i, j))
    return pl.pallas_call(lambda x_ref, y_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + y_ref[...]),
                          out_shape=jax.ShapeDtypeStruct.like(x),
                          grid=(pl.cdiv(x.shape[0], 16), pl.cdiv(x.shape[1], 16)),
                          in_specs=[spec, spec], out_specs=spec, interpret=UNCHECKED)(x, y)

  b, m, n = export.symbolic_shape("b, m, n")
  s = jax.ShapeDtypeStruct((b, m, n), jnp.float32)
  exp = export.export(jax.jit(jax.vmap(add)), platforms=["cpu"])(s, s)
  rng = np.random.default_rng(5)
  for shape in ((3, 16, 16), (2, 20, 40)):
    x, y = (jnp.asarray(rng.uniform(-1, 1, shape), jnp.float32) for _ in range(2))
    np.testing.assert_array_equal(np.asarray(exp.call(x, y)), np.asarray(x) + np.asarray(y))


def test_an_exported_kernel_survives_serialization():
  """``Exported.serialize`` and ``export.deserialize`` (the module a user stores or ships), then
  calls at two shapes."""
  w, h = export.symbolic_shape("w, h")
  exp = export.export(jax.jit(copy_plus_one), platforms=["cpu"])(
      jax.ShapeDtypeStruct((w, h), jnp.int32))
  again = export.deserialize(exp.serialize())
  for shape in ((9, 130), (24, 128)):
    x = jnp.asarray(np.random.default_rng(shape[0]).integers(-50, 50, shape), jnp.int32)
    np.testing.assert_array_equal(np.asarray(again.call(x)), np.asarray(x) + 1)

"""Sub-byte integers (int4, uint4) in kernels: loads, stores, conversions and arithmetic agree with
jax.numpy on the same values. On the CPU every kernel here also lowers to PTX (conftest); on a GPU
the same tests run on the Triton backend, which unpacks XLA's packed arrays on load and packs pairs
of neighbours on store. What Triton cannot store (a part of a byte) is refused by name."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl
import pallax.triton as plgpu
from pallax._src import jaxpr_util
from pallax._src.gpu import legalize as lg
from pallax._src.gpu import subbyte

SUB = [jnp.int4, jnp.uint4]
IDS = ["int4", "uint4"]


def _range(dtype):
  info = jnp.iinfo(dtype)
  return int(info.min), int(info.max)


def _values(dtype, shape, seed=0):
  """Every value of ``dtype`` first, then random ones."""
  lo, hi = _range(dtype)
  n = int(np.prod(shape))
  every = np.arange(lo, hi + 1)
  rnd = np.asarray(jax.random.randint(jax.random.key(seed), (n,), lo, hi + 1))
  return jnp.asarray(np.concatenate([every, rnd])[:n].reshape(shape)).astype(dtype)


def _same(got, want):
  assert got.dtype == want.dtype and got.shape == want.shape
  np.testing.assert_array_equal(np.asarray(got.astype(jnp.int32)), np.asarray(want.astype(jnp.int32)))


@pytest.mark.parametrize("dtype", SUB, ids=IDS)
@pytest.mark.parametrize("to", [jnp.int8, jnp.int32, jnp.float32, jnp.bfloat16, jnp.bool_],
                         ids=["int8", "int32", "float32", "bfloat16", "bool"])
def test_load_and_convert(dtype, to):
  x = _values(dtype, (256,), seed=1)

  @functools.partial(pl.pallas_call, out_shape=jax.ShapeDtypeStruct(x.shape, to))
  def k(x_ref, o_ref):
    o_ref[...] = x_ref[...].astype(to)

  got = k(x)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(x.astype(to)))


@pytest.mark.parametrize("dtype", SUB, ids=IDS)
def test_strided_load(dtype):
  """Every third element: neighbours in no common byte, nibbles at both positions."""
  x = _values(dtype, (192,), seed=2)
  want = x.astype(jnp.int8)[::3]

  @functools.partial(pl.pallas_call, out_shape=jax.ShapeDtypeStruct(want.shape, jnp.int8))
  def k(x_ref, o_ref):
    o_ref[...] = x_ref[pl.ds(0, 64, stride=3)].astype(jnp.int8)

  np.testing.assert_array_equal(np.asarray(k(x)), np.asarray(want))


@pytest.mark.parametrize("dtype", SUB, ids=IDS)
@pytest.mark.parametrize("src", [jnp.float32, jnp.bfloat16, jnp.int32, jnp.int8],
                         ids=["float32", "bfloat16", "int32", "int8"])
def test_convert_and_store(dtype, src):
  """Conversions to a sub-byte type: floats saturate (NaN -> 0), integers wrap, as in lax."""
  key = jax.random.key(3)
  if jnp.issubdtype(src, jnp.floating):
    x = (jax.random.normal(key, (8, 128)) * 12).astype(src)
    x = x.at[0, :6].set(jnp.array([jnp.nan, jnp.inf, -jnp.inf, 7.5, -8.5, 15.9], src))
  else:
    x = jax.random.randint(key, (8, 128), -120, 120).astype(src)

  @functools.partial(pl.pallas_call, out_shape=jax.ShapeDtypeStruct(x.shape, dtype))
  def k(x_ref, o_ref):
    o_ref[...] = x_ref[...].astype(dtype)

  _same(k(x), x.astype(dtype))


@pytest.mark.parametrize("dtype", SUB, ids=IDS)
def test_arithmetic_wraps_as_lax(dtype):
  a, b = _values(dtype, (16, 64), seed=4), _values(dtype, (16, 64), seed=5)

  def f(x, y):
    s = x * x + 3 * y                                   # wraps modulo 16
    t = jnp.maximum(x, y) - jnp.minimum(x, y)
    u = lax.shift_right_logical(x, jnp.full_like(x, 1)) ^ (y >> 2)
    return s, t, u, (x < y).astype(jnp.int32), jnp.sum(x, axis=1, dtype=dtype)

  @functools.partial(pl.pallas_call, out_shape=jax.tree.map(
      lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype), jax.eval_shape(f, a, b)))
  def k(x_ref, y_ref, s_ref, t_ref, u_ref, c_ref, r_ref):
    s_ref[...], t_ref[...], u_ref[...], c_ref[...], r_ref[...] = f(x_ref[...], y_ref[...])

  for got, want in zip(k(a, b), f(a, b)):
    _same(got, want)


@pytest.mark.parametrize("dtype", SUB, ids=IDS)
def test_blocks_over_a_grid(dtype):
  """Blocks along both axes: each program reads and writes its own bytes of the packed arrays."""
  x = _values(dtype, (32, 64), seed=6)

  @functools.partial(
      pl.pallas_call, out_shape=jax.ShapeDtypeStruct(x.shape, dtype), grid=(4, 2),
      in_specs=[pl.BlockSpec((8, 32), lambda i, j: (i, j))],
      out_specs=pl.BlockSpec((8, 32), lambda i, j: (i, 1 - j)))
  def k(x_ref, o_ref):
    o_ref[...] = (x_ref[...].astype(jnp.int32) + 5).astype(dtype)

  want = (x.astype(jnp.int32) + 5).astype(dtype)
  want = jnp.concatenate([want[:, 32:], want[:, :32]], axis=1)
  _same(k(x), want)


@pytest.mark.parametrize("dtype", SUB, ids=IDS)
def test_odd_sized_array_load(dtype):
  """127 values: the last byte holds one (JAX's Mosaic GPU test uses this size)."""
  x = _values(dtype, (127,), seed=7)

  @functools.partial(pl.pallas_call, out_shape=jax.ShapeDtypeStruct(x.shape, jnp.int32))
  def k(x_ref, o_ref):
    o_ref[...] = x_ref[...].astype(jnp.int32) * 2

  np.testing.assert_array_equal(np.asarray(k(x)), np.asarray(x.astype(jnp.int32) * 2))


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", SUB, ids=IDS)
def test_part_of_a_byte_store_runs_in_the_interpreter(dtype):
  x = _values(dtype, (4, 8), seed=8)

  @functools.partial(pl.pallas_call, out_shape=jax.ShapeDtypeStruct(x.shape, dtype))
  def k(x_ref, o_ref):
    o_ref[:, pl.ds(1, 7)] = x_ref[:, pl.ds(0, 7)]
    o_ref[:, pl.ds(0, 1)] = x_ref[:, pl.ds(7, 1)]

  _same(k(x), jnp.roll(x.astype(jnp.int32), 1, axis=1).astype(dtype))


def test_part_of_a_byte_store_is_refused_by_triton():
  def k(x_ref, o_ref):
    o_ref[:, pl.ds(1, 7)] = x_ref[:, pl.ds(0, 7)]
    o_ref[:, pl.ds(0, 1)] = x_ref[:, pl.ds(7, 1)]

  f = pl.pallas_call(k, out_shape=jax.ShapeDtypeStruct((4, 8), jnp.int4))
  with pytest.raises(NotImplementedError, match="does not write whole bytes"):
    plgpu.lower(f, jax.ShapeDtypeStruct((4, 8), jnp.int4), compute_capability=90)


def test_triton_reads_and_writes_packed_bytes():
  def k(x_ref, o_ref):
    o_ref[...] = (x_ref[...] + 1).astype(jnp.uint4)

  f = pl.pallas_call(k, out_shape=jax.ShapeDtypeStruct((4, 64), jnp.uint4))
  [a] = plgpu.lower(f, jax.ShapeDtypeStruct((4, 64), jnp.int4), compute_capability=80)
  assert "@triton.jit\ndef k(x_ref, o_ref)" in a.source and "!tt.ptr<i8>" in a.ttir   # byte pointers
  assert "// 2" in a.source and "tl.sum(" in a.source   # unpack on load, pack pairs on store


def test_legalized_subbyte_arithmetic_is_xla_bitwise():
  """Legalization leaves only conversions, selects and movement on sub-byte values, and the
  rewritten jaxpr gives the original's answers under XLA."""
  x, y = _values(jnp.int4, (256,), seed=9), _values(jnp.int4, (256,), seed=10)

  def f(a, b):
    return (a * b - 7 * a, lax.shift_right_logical(a, b), lax.div(a, jnp.where(b == 0, jnp.ones_like(b), b)), lax.rem(a, jnp.where(b == 0, jnp.ones_like(b), b)),
            lax.population_count(a.astype(jnp.uint4)), jnp.cumsum(a), jnp.where(a > b, a, b))

  closed = jax.make_jaxpr(f)(x, y)
  legal = lg.legalize(closed.jaxpr, 90)
  for e in jaxpr_util.equations(legal):
    if subbyte.computes(e):
      raise AssertionError(f"{e} computes on sub-byte values after legalization")
  got = jax.core.eval_jaxpr(legal, closed.consts, x, y)
  for g, w in zip(got, f(x, y)):
    _same(g, w)


def bits_of(dtype) -> int:
  return jnp.iinfo(dtype).bits


@pytest.mark.parametrize("dtype", SUB, ids=IDS)
def test_legalized_subbyte_shifts_are_xla_bitwise(dtype):
  """jnp's ``>>`` on uint4 is lax's arithmetic shift, which XLA computes on the signed value of
  the bits (uint4 10 >> 2 is 14); the 32-bit rewrite must agree (found on the GPU: the rewrite
  had shifted the zero-extended value)."""
  x = _values(dtype, (256,), seed=11)
  amount = jnp.asarray(np.arange(256) % bits_of(dtype), dtype)

  def f(a, s):
    return a >> 2, lax.shift_right_arithmetic(a, s), lax.shift_right_logical(a, s), a << s

  closed = jax.make_jaxpr(f)(x, amount)
  legal = lg.legalize(closed.jaxpr, 90)
  got = jax.core.eval_jaxpr(legal, closed.consts, x, amount)
  for g, w in zip(got, f(x, amount)):
    _same(g, w)


def test_popcount_of_signed_subbyte_values_is_refused_on_the_gpu():
  """XLA on the CPU counts the sign-extension bits of an int4 (popcount(-8) is 5 there)."""
  closed = jax.make_jaxpr(lax.population_count)(_values(jnp.int4, (16,)))
  with pytest.raises(NotImplementedError, match="population_count of int4 values on the GPU"):
    lg.legalize(closed.jaxpr, 90)

"""Differential tests: the same kernel sources on pallax and on ``jax.experimental.pallas``
(``interpret=True``), outputs compared.

Each test builds its kernel from a module ``pl`` (pallax or JAX Pallas), runs it on both and
compares. Outputs are compared only where the semantics define them: in-range elements, and
padding only for floats (NaN on both; integer padding is iinfo.min on both, tested in
``tests/test_jax_api_compat.py``).

JAX 0.11 moved masked ``load``/``store`` out of ``jax.experimental.pallas`` into
``jax.experimental.pallas.triton`` (``plgpu.load(ref.at[idx], mask=...)``); the masked test
spells it ``pl.load(ref, idx, mask=...)`` on pallax (the spec's API) and through the Triton
module on JAX, via ``masked_load``/``masked_store`` below.
"""
from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as jpl
from jax.experimental.pallas import triton as jplgpu

import pallax
from helpers import rand_seeded as rand

# (name, module, interpret=) for the pallax runs; JAX Pallas always runs with interpret=True.
PALLAX_MODES = [
    pytest.param(True, id="pallax-interpret"),
    pytest.param(pallax.InterpretParams(parallel=False), id="pallax-sequential"),
]


def masked_load(pl, ref, idx, mask, other):
  if pl is pallax:
    return pl.load(ref, idx, mask=mask, other=other)
  return jplgpu.load(ref.at[idx], mask=mask, other=other)


def masked_store(pl, ref, idx, val, mask):
  if pl is pallax:
    return pl.store(ref, idx, val, mask=mask)
  return jplgpu.store(ref.at[idx], val, mask=mask)


def both(build, args, pallax_interpret, jit=False):
  """Runs ``build(pl, interpret)(*args)`` on pallax and on JAX Pallas."""
  f_px = build(pallax, pallax_interpret)
  f_jx = build(jpl, True)
  if jit:
    f_px, f_jx = jax.jit(f_px), jax.jit(f_jx)
  out_px = jax.tree.map(np.asarray, f_px(*args))
  out_jx = jax.tree.map(np.asarray, f_jx(*args))
  return out_px, out_jx


def assert_same(a, b, rtol=0.0, atol=0.0):
  assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
  if np.issubdtype(a.dtype, np.floating) or a.dtype == jnp.bfloat16:
    np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), rtol=rtol, atol=atol,
                               equal_nan=True)
  else:
    np.testing.assert_array_equal(a, b)


# --- 1. elementwise with partial edge blocks ------------------------------------------------

@pytest.mark.parametrize("interpret", PALLAX_MODES)
@pytest.mark.parametrize("dtype", [np.float32, np.int32, jnp.bfloat16])
def test_elementwise_partial_blocks(interpret, dtype):
  shape, block = (10, 13), (4, 8)
  grid = (3, 2)

  def build(pl, interp):
    def kernel(x_ref, y_ref, o_ref):
      o_ref[...] = x_ref[...] * 2 + y_ref[...]

    spec = pl.BlockSpec(block, lambda i, j: (i, j))
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(shape, dtype), grid=grid,
                          in_specs=[spec, spec], out_specs=spec, interpret=interp)

  x, y = rand(0, shape, dtype), rand(1, shape, dtype)
  a, b = both(build, (x, y), interpret)
  assert_same(a, b)
  np.testing.assert_array_equal(a.astype(np.float32), np.asarray(x * 2 + y).astype(np.float32))


@pytest.mark.parametrize("interpret", PALLAX_MODES)
def test_reversed_blocks_expose_padding(interpret):
  """Output block i gets input block n-1-i: the padded tail of the last (partial) input block
  lands in range of output block 0, where both must show NaN."""
  n, b = 11, 4
  nb = -(-n // b)

  def build(pl, interp):
    def kernel(x_ref, o_ref):
      o_ref[...] = x_ref[...] + 1

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((n,), jnp.float32), grid=(nb,),
                          in_specs=[pl.BlockSpec((b,), lambda i: (nb - 1 - i,))],
                          out_specs=pl.BlockSpec((b,), lambda i: (i,)), interpret=interp)

  a, bb = both(build, (rand(2, (n,)),), interpret)
  assert np.isnan(a[:b]).sum() == nb * b - n
  assert_same(a, bb)


# --- 2. matmul with K-grid accumulation ------------------------------------------------------

@pytest.mark.parametrize("interpret", PALLAX_MODES)
@pytest.mark.parametrize("k_axis", [2, 0])
def test_matmul_k_accumulation(interpret, k_axis):
  M, K, N = 48, 64, 40
  bm, bk, bn = 16, 16, 8

  def build(pl, interp):
    def kernel(x_ref, y_ref, o_ref):
      @pl.when(pl.program_id(k_axis) == 0)
      def _():
        o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)

      # HIGHEST: on a GPU a default-precision float32 dot may round its inputs to tf32
      o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32,
                            precision=jax.lax.Precision.HIGHEST)

    if k_axis == 2:
      grid = (M // bm, N // bn, K // bk)
      ix, iy, io = (lambda i, j, k: (i, k)), (lambda i, j, k: (k, j)), (lambda i, j, k: (i, j))
    else:  # the reduction axis outermost: output blocks are revisited non-consecutively
      grid = (K // bk, M // bm, N // bn)
      ix, iy, io = (lambda k, i, j: (i, k)), (lambda k, i, j: (k, j)), (lambda k, i, j: (i, j))
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((M, N), jnp.float32), grid=grid,
        in_specs=[pl.BlockSpec((bm, bk), ix), pl.BlockSpec((bk, bn), iy)],
        out_specs=pl.BlockSpec((bm, bn), io), interpret=interp)

  x, y = rand(3, (M, K)), rand(4, (K, N))
  a, b = both(build, (x, y), interpret)
  assert_same(a, b, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(a, np.asarray(x) @ np.asarray(y), rtol=1e-4, atol=1e-4)


# --- 3. row-wise softmax --------------------------------------------------------------------

@pytest.mark.parametrize("interpret", PALLAX_MODES)
def test_softmax_rows(interpret):
  R, C, br = 37, 50, 8

  def build(pl, interp):
    def kernel(x_ref, o_ref):
      x = x_ref[...]
      m = jnp.max(x, axis=1, keepdims=True)
      e = jnp.exp(x - m)
      o_ref[...] = e / jnp.sum(e, axis=1, keepdims=True)

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((R, C), jnp.float32),
                          grid=(pl.cdiv(R, br),),
                          in_specs=[pl.BlockSpec((br, C), lambda i: (i, 0))],
                          out_specs=pl.BlockSpec((br, C), lambda i: (i, 0)), interpret=interp)

  x = rand(5, (R, C))
  a, b = both(build, (x,), interpret)
  assert_same(a, b, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(a, jax.nn.softmax(x, axis=1), rtol=1e-5, atol=1e-6)


# --- 4. fori_loop inside the kernel -----------------------------------------------------------

@pytest.mark.parametrize("interpret", PALLAX_MODES)
def test_fori_loop_dynamic_slices(interpret):
  R, C, chunk, bc = 64, 24, 8, 8

  def build(pl, interp):
    def kernel(x_ref, o_ref):
      def body(t, acc):
        rows = x_ref[pl.ds(pl.multiple_of(t * chunk, chunk), chunk), :]
        return acc * 0.5 + rows

      o_ref[...] = lax.fori_loop(0, R // chunk, body, jnp.zeros((chunk, bc), jnp.float32))

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((chunk, C), jnp.float32),
                          grid=(C // bc,),
                          in_specs=[pl.BlockSpec((R, bc), lambda j: (0, j))],
                          out_specs=pl.BlockSpec((chunk, bc), lambda j: (0, j)), interpret=interp)

  x = rand(6, (R, C))
  a, b = both(build, (x,), interpret)
  assert_same(a, b, rtol=1e-6, atol=1e-6)
  ref = np.zeros((chunk, C), np.float32)
  for t in range(R // chunk):
    ref = ref * 0.5 + np.asarray(x)[t * chunk:(t + 1) * chunk]
  np.testing.assert_allclose(a, ref, rtol=1e-6, atol=1e-6)


# --- 5. masked load/store with pl.ds -----------------------------------------------------------

@pytest.mark.parametrize("interpret", PALLAX_MODES)
def test_masked_load_store(interpret):
  n, b = 37, 16

  def build(pl, interp):
    def kernel(x_ref, o_ref):
      i = pl.program_id(0)
      offs = i * b + jnp.arange(b)
      mask = offs < n
      v = masked_load(pl, x_ref, pl.ds(i * b, b), mask, -3.0)
      # The masked-off lanes read `other`; fold their count into the in-range result.
      v = v * 2 + jnp.sum(jnp.where(mask, 0.0, v)) / -3.0
      masked_store(pl, o_ref, pl.ds(i * b, b), v, mask)

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((n,), jnp.float32),
                          grid=(pl.cdiv(n, b),), interpret=interp)

  x = rand(7, (n,))
  a, bb = both(build, (x,), interpret)
  assert_same(a, bb)
  expected = np.asarray(x) * 2
  expected[32:] += 16 - (n - 32)
  np.testing.assert_allclose(a, expected, rtol=1e-6)


@pytest.mark.parametrize("interpret", PALLAX_MODES)
def test_masked_load_store_2d(interpret):
  """2-D masked accesses: columns past the end masked off, two row ranges."""
  R, C, bc = 7, 21, 8
  h = R // 2

  def build(pl, interp):
    def kernel(x_ref, o_ref):
      j = pl.program_id(0)
      for r0, rows, delta in ((0, h, 10.0), (h, R - h, -10.0)):
        cols = j * bc + lax.broadcasted_iota(jnp.int32, (rows, bc), 1)
        mask = cols < C
        idx = (pl.ds(r0, rows), pl.ds(j * bc, bc))
        v = masked_load(pl, x_ref, idx, mask, 0.0)
        masked_store(pl, o_ref, idx, v + delta, mask)

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((R, C), jnp.float32),
                          grid=(pl.cdiv(C, bc),), interpret=interp)

  x = rand(8, (R, C))
  a, b = both(build, (x,), interpret)
  assert_same(a, b)
  expected = np.asarray(x).copy()
  expected[:h] += 10
  expected[h:] -= 10
  np.testing.assert_allclose(a, expected, rtol=1e-6)


@pytest.mark.parametrize("interpret", PALLAX_MODES)
def test_strided_ds_in_block(interpret):
  """Strided pl.ds reads and writes inside a (partial) block."""
  R, C, br, bc = 12, 10, 6, 4

  def build(pl, interp):
    def kernel(x_ref, o_ref):
      even = x_ref[pl.ds(0, br // 2, stride=2), :]
      odd = x_ref[pl.ds(1, br // 2, stride=2), :]
      o_ref[pl.ds(0, br // 2, stride=2), :] = odd
      o_ref[pl.ds(1, br // 2, stride=2), :] = even * 2

    spec = pl.BlockSpec((br, bc), lambda i, j: (i, j))
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((R, C), jnp.float32),
                          grid=(R // br, pl.cdiv(C, bc)), in_specs=[spec], out_specs=spec,
                          interpret=interp)

  x = rand(15, (R, C))
  a, b = both(build, (x,), interpret)
  assert_same(a, b)
  xn = np.asarray(x)
  expected = np.empty_like(xn)
  expected[0::2], expected[1::2] = xn[1::2], xn[0::2] * 2
  np.testing.assert_allclose(a, expected, rtol=1e-6)


# --- 6. squeezed block dimensions --------------------------------------------------------------

@pytest.mark.parametrize("interpret", PALLAX_MODES)
@pytest.mark.parametrize("spelling", ["None", "squeezed"])
def test_squeezed_dims(interpret, spelling):
  B, M, N, bm = 3, 20, 12, 8

  def build(pl, interp):
    sq = None if spelling == "None" else pl.squeezed

    def kernel(x_ref, y_ref, o_ref):
      # x block (bm, N) of batch b; y block (N,) of row b: both with a dimension squeezed.
      o_ref[...] = jnp.sum(x_ref[...] * y_ref[...][None, :], axis=1)

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((B, M), jnp.float32), grid=(B, pl.cdiv(M, bm)),
        in_specs=[pl.BlockSpec((sq, bm, N), lambda b, i: (b, i, 0)),
                  pl.BlockSpec((sq, N), lambda b, i: (b, 0))],
        out_specs=pl.BlockSpec((sq, bm), lambda b, i: (b, i)), interpret=interp)

  x, y = rand(9, (B, M, N)), rand(10, (B, N))
  a, b = both(build, (x, y), interpret)
  assert_same(a, b, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(a, np.einsum("bmn,bn->bm", x, y), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("interpret", PALLAX_MODES)
def test_squeezed_middle_dim_partial(interpret):
  """A squeezed middle dimension with partial blocks on both sides of it."""
  shape, block = (7, 5, 9), (4, None, 4)

  def build(pl, interp):
    def kernel(x_ref, o_ref):
      o_ref[...] = x_ref[...].T * 3

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((5, 9, 7), jnp.float32), grid=(2, 5, 3),
        in_specs=[pl.BlockSpec(block, lambda i, j, k: (i, j, k))],
        out_specs=pl.BlockSpec((None, 4, 4), lambda i, j, k: (j, k, i)), interpret=interp)

  x = rand(11, shape)
  a, b = both(build, (x,), interpret)
  assert_same(a, b)
  np.testing.assert_allclose(a, np.transpose(np.asarray(x), (1, 2, 0)) * 3, rtol=1e-6)


# --- 7. vmap over a pallas_call ----------------------------------------------------------------

@pytest.mark.parametrize("interpret", PALLAX_MODES)
@pytest.mark.parametrize("jit", [False, True])
def test_vmap(interpret, jit):
  shape, block = (10, 13), (4, 8)

  def build(pl, interp):
    def kernel(x_ref, y_ref, o_ref):
      o_ref[...] = x_ref[...] * y_ref[...] + pl.program_id(1).astype(jnp.float32)

    spec = pl.BlockSpec(block, lambda i, j: (i, j))
    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(shape, jnp.float32), grid=(3, 2),
                       in_specs=[spec, spec], out_specs=spec, interpret=interp)
    return jax.vmap(jax.vmap(f, in_axes=(0, None)), in_axes=(1, 0))

  xs, y = rand(12, (10, 3) + shape), rand(13, (3,) + shape)
  a, b = both(build, (xs, y), interpret, jit=jit)
  assert a.shape == (3, 10) + shape
  assert_same(a, b)


# --- 8. iota ------------------------------------------------------------------------------------

@pytest.mark.parametrize("interpret", PALLAX_MODES)
def test_iota(interpret):
  shape, block = (10, 13), (4, 8)

  def build(pl, interp):
    def kernel(o_ref, p_ref):
      i, j = pl.program_id(0), pl.program_id(1)
      r = lax.broadcasted_iota(jnp.int32, block, 0) + i * block[0]
      c = lax.broadcasted_iota(jnp.int32, block, 1) + j * block[1]
      o_ref[...] = r * 100 + c
      p_ref[...] = jnp.arange(block[1], dtype=jnp.int32) + (i * pl.num_programs(1) + j) * 1000

    return pl.pallas_call(
        kernel, out_shape=[jax.ShapeDtypeStruct(shape, jnp.int32),
                           jax.ShapeDtypeStruct((3, 2 * block[1]), jnp.int32)],
        grid=(3, 2), in_specs=[],
        out_specs=[pl.BlockSpec(block, lambda i, j: (i, j)),
                   pl.BlockSpec((None, block[1]), lambda i, j: (i, j))], interpret=interp)

  (a, pa), (b, pb) = both(build, (), interpret)
  assert_same(a, b)
  assert_same(pa, pb)
  r, c = np.meshgrid(np.arange(10), np.arange(13), indexing="ij")
  np.testing.assert_array_equal(a, r * 100 + c)


# --- 9. revisited output: program order and last write wins ------------------------------------

@pytest.mark.parametrize("interpret", PALLAX_MODES)
def test_revisit_last_write_and_accumulate(interpret):
  def build(pl, interp):
    def kernel(x_ref, last_ref, acc_ref):
      i, j = pl.program_id(0), pl.program_id(1)
      last_ref[...] = jnp.full(last_ref.shape, i * 10 + j, jnp.int32)

      @pl.when((i == 0) & (j == 0))
      def _():
        acc_ref[...] = jnp.zeros(acc_ref.shape, acc_ref.dtype)

      acc_ref[...] = acc_ref[...] * 3 + x_ref[...]  # order-sensitive

    return pl.pallas_call(
        kernel, out_shape=[jax.ShapeDtypeStruct((4, 3), jnp.int32),
                           jax.ShapeDtypeStruct((4, 3), jnp.int32)],
        grid=(3, 4), in_specs=[pl.BlockSpec((4, 3), lambda i, j: (j, 3 - i))],
        out_specs=[pl.BlockSpec((4, 3), lambda i, j: (0, 0)),
                   pl.BlockSpec((4, 3), lambda i, j: (0, 0))], interpret=interp)

  x = rand(14, (16, 12), np.int32) % 7
  (la, aa), (lb, ab) = both(build, (x,), interpret)
  assert_same(la, lb)
  assert_same(aa, ab)
  np.testing.assert_array_equal(la, np.full((4, 3), 23))

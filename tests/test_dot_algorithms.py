"""Dot algorithms (gpu/dot_algorithms.py): every ``lax.Precision`` and ``lax.DotAlgorithmPreset``
JAX accepts on a GPU computes what XLA computes for it there.

Each result is compared elementwise with a float64 NumPy product, within the error bound of the
preset: ``|got - exact| <= (e_products + K * 2**-23) * (|A| @ |B|) + e_result * |exact|``, where
``e_products`` is the relative error of one product of the preset's rounded operands (or parts),
``K * 2**-23`` the float32 accumulation (one ulp an addition: tensor cores may truncate), and
``e_result`` the rounding of the sums to a 16-bit accumulator. On a CPU the kernels run in the
interpreter (and lower to PTX for sm_75/80/90, see conftest.py); on a GPU on the Triton backend,
and the tests marked ``gpu`` compare them with XLA's ``jnp.dot(..., precision=preset)`` too.
"""
import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import pallax as pl
import pallax.triton as plgpu
from pallax._src.gpu import dot_algorithms

P = lax.DotAlgorithmPreset
U_BF16, U_F16, U_TF32, U_F32 = 2.0 ** -8, 2.0 ** -11, 2.0 ** -11, 2.0 ** -24


def _split_error(u, parts):
  """Relative error of a product of two operands split into ``parts`` parts of unit roundoff ``u``
  when the products of parts dropped by the X3/X6 schemes are left out (X9: none dropped)."""
  return {2: 3 * u ** 2, 3: 4 * u ** 3}[parts]


# preset -> (relative error of one product, rounding of the sums)
BOUNDS = {
    None: (0.0, 0.0),   # float32 operands in the interpreter; tf32 on a GPU: see _bound
    lax.Precision.HIGHEST: (0.0, 0.0),
    P.DEFAULT: (0.0, 0.0),
    P.F32_F32_F32: (0.0, 0.0),
    P.F64_F64_F64: (0.0, 0.0),
    P.F16_F16_F16: (2 * U_F16 + U_F16 ** 2, U_F16),
    P.F16_F16_F32: (2 * U_F16 + U_F16 ** 2, 0.0),
    P.BF16_BF16_BF16: (2 * U_BF16 + U_BF16 ** 2, U_BF16),
    P.BF16_BF16_F32: (2 * U_BF16 + U_BF16 ** 2, 0.0),
    P.BF16_BF16_F32_X3: (_split_error(U_BF16, 2), 0.0),
    P.BF16_BF16_F32_X6: (_split_error(U_BF16, 3), 0.0),
    P.BF16_BF16_F32_X9: (2 * U_BF16 ** 3, 0.0),
    P.TF32_TF32_F32: (2 * 2 * U_TF32, 0.0),   # the GPU may truncate to tf32 (twice the error)
    P.TF32_TF32_F32_X3: (_split_error(2 * U_TF32, 2), 0.0),
}
PRESETS = [p for p in BOUNDS if isinstance(p, P)]


def _on_gpu() -> bool:
  return jax.devices()[0].platform == "gpu"


def _bound(precision, a, b, exact):
  e_prod, e_out = BOUNDS[precision]
  if precision in (None, P.DEFAULT) and _on_gpu() and a.dtype == np.float32:
    e_prod = 2 * 2 * U_TF32   # a float32 dot of default precision runs on tf32 tensor cores
  k = a.shape[-1]
  size = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
  return (e_prod + k * 2.0 ** -23) * size + e_out * np.abs(exact)


def _normal(key, shape, dtype=jnp.float32):
  return np.array(jax.random.normal(key, shape, jnp.float32).astype(dtype))


def _matmul(precision, out_dtype=jnp.float32, block=(32, 32)):
  """``x @ y`` over blocks of (block[0], K) x (K, block[1]); partial edge blocks where the sizes
  are not multiples of the block."""
  def kernel(x_ref, y_ref, o_ref):
    acc = jnp.float64 if o_ref.dtype == jnp.float64 else jnp.float32
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...], precision=precision,
                         preferred_element_type=acc).astype(o_ref.dtype)

  def f(x, y):
    (m, k), n = x.shape, y.shape[1]
    bm, bn = min(block[0], m), min(block[1], n)
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((m, n), out_dtype), grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)), pl.BlockSpec((k, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)))(x, y)
  return f


def _check(got, x, y, precision):
  exact = x.astype(np.float64) @ y.astype(np.float64)
  got = np.asarray(got).astype(np.float64)
  bound = _bound(precision, x, y, exact)
  np.testing.assert_array_less(np.abs(got - exact), bound + np.finfo(np.float32).tiny,
                               err_msg=f"precision={precision}")
  return float(np.max(np.abs(got - exact) / (np.abs(x.astype(np.float64)) @ np.abs(y.astype(np.float64)))))


# --- every preset, every accepted operand type, edge sizes ------------------------------------

def _float32_cases():
  """Every precision at 64 x 64 x 64 (whole blocks) and 33 x 17 x 70 (partial blocks along M and
  N, an odd K padded inside the dot: the padding that would reach the sums if a preset's passes
  mishandled it); at 40 x 48 x 24 (a block of 24 columns, the whole N) one precision of each
  kind of operand handling: plain float32, one rounding pass, split passes (bf16, tf32) and a
  16-bit accumulator. The presets left out there (X6 and X9 are X3 with more parts; the others
  round like one of those kept) generate the same masking and padding code as the ones kept,
  and each is checked on the two other shapes; this spares CI lowering up to 8 kernels (X6 and
  X9 the costliest) for each of its 3 targets."""
  every = PRESETS + [None, lax.Precision.HIGHEST]
  some = [None, lax.Precision.HIGHEST, P.BF16_BF16_F32, P.BF16_BF16_F32_X3, P.TF32_TF32_F32_X3,
          P.F16_F16_F16]
  shapes = [((64, 64, 64), every), ((40, 48, 24), some), ((33, 17, 70), every)]
  return [pytest.param(*shape, precision, id=f"{'-'.join(map(str, shape))}-{precision}")
          for shape, precisions in shapes for precision in precisions]


@pytest.mark.parametrize("m,k,n,precision", _float32_cases())
def test_float32_operands_within_the_preset_bound(precision, m, k, n):
  kx, ky = jax.random.split(jax.random.key(m * 1000 + k))
  x, y = _normal(kx, (m, k)), _normal(ky, (k, n))
  _check(_matmul(precision)(x, y), x, y, precision)


@pytest.mark.parametrize("dtype,precision", [
    (jnp.bfloat16, None), (jnp.bfloat16, P.BF16_BF16_F32), (jnp.bfloat16, P.F32_F32_F32),
    (jnp.bfloat16, P.BF16_BF16_F32_X3), (jnp.float16, P.F16_F16_F32), (jnp.float16, None),
    (jnp.float16, P.F16_F16_F16), (jnp.bfloat16, P.TF32_TF32_F32)], ids=str)
def test_16_bit_operands(dtype, precision):
  kx, ky = jax.random.split(jax.random.key(7))
  x, y = _normal(kx, (48, 32), dtype), _normal(ky, (32, 40), dtype)
  _check(_matmul(precision)(x, y), x, y, precision)


@pytest.mark.parametrize("precision", [P.BF16_BF16_F32_X6, P.F32_F32_F32, P.TF32_TF32_F32_X3],
                         ids=str)
def test_small_and_single_row_products(precision):
  # Blocks smaller than the tensor cores take (1 x 8 x 5): multiplied and summed elementwise.
  kx, ky = jax.random.split(jax.random.key(3))
  x, y = _normal(kx, (1, 8)), _normal(ky, (8, 5))
  _check(_matmul(precision)(x, y), x, y, precision)


@pytest.mark.parametrize("precision", [P.BF16_BF16_F32_X3, P.TF32_TF32_F32, lax.Precision.HIGHEST],
                         ids=str)
def test_pl_dot_batched_and_transposed(precision):
  kx, ky = jax.random.split(jax.random.key(11))
  x, y = _normal(kx, (2, 32, 24)), _normal(ky, (2, 16, 24))

  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = pl.dot(x_ref[...], y_ref[...], trans_b=True, precision=precision)

  got = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((2, 32, 16), jnp.float32))(x, y)
  for i in range(2):
    _check(np.asarray(got)[i], x[i], y[i].T, precision)


def test_pl_dot_allow_tf32_false_is_float32():
  kx, ky = jax.random.split(jax.random.key(5))
  x, y = _normal(kx, (32, 64)), _normal(ky, (64, 32))

  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = pl.dot(x_ref[...], y_ref[...], allow_tf32=False)

  got = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((32, 32), jnp.float32))(x, y)
  _check(got, x, y, lax.Precision.HIGHEST)


@pytest.mark.parametrize("precision", [P.BF16_BF16_F32_X3, P.BF16_BF16_F32_X9, P.TF32_TF32_F32_X3],
                         ids=str)
def test_infinite_operands_give_the_exact_products_infinities(precision):
  # An infinite operand has NaN low parts: their products are dropped before p0*q0 is added.
  kx, ky = jax.random.split(jax.random.key(13))
  x, y = _normal(kx, (32, 32)), np.abs(_normal(ky, (32, 32)))
  x[3, 5], x[7, 0] = np.inf, -np.inf
  got = np.asarray(_matmul(precision)(x, y))
  exact = x.astype(np.float64) @ y.astype(np.float64)
  assert np.array_equal(np.isinf(got), np.isinf(exact)) and not np.isnan(got).any()
  assert np.array_equal(np.sign(got[np.isinf(got)]), np.sign(exact[np.isinf(exact)]))
  finite = np.isfinite(exact)   # the other rows: within the bound
  bound = _bound(precision, np.where(np.isfinite(x), x, 0), y, np.where(finite, exact, 0))
  assert (np.abs(got[finite] - exact[finite]) <= bound[finite]).all()


def test_split_passes_reach_float32_where_one_bf16_pass_cannot():
  kx, ky = jax.random.split(jax.random.key(17))
  # 64 x 64 x 64: the kernels of test_float32_operands_within_the_preset_bound[64-64-64-*] (the
  # same source), so CI lowers them to PTX once; at K = 64 the errors keep the margins they had
  # at K = 96 (one bf16 pass 2**-9.2, tf32 2**-12.3, X3 2**-18, X6/X9/f32 2**-22.3 or less).
  # (K = 128 takes too much SMEM on sm_75 with X6.)
  x, y = _normal(kx, (64, 64)), _normal(ky, (64, 64))
  err = {p: _check(_matmul(p)(x, y), x, y, p)
         for p in (P.BF16_BF16_F32, P.BF16_BF16_F32_X3, P.BF16_BF16_F32_X6, P.BF16_BF16_F32_X9,
                   P.TF32_TF32_F32, P.TF32_TF32_F32_X3, P.F32_F32_F32)}
  # One bf16 pass rounds the operands (an error of order 2**-9 of |A| @ |B|); three passes leave
  # about 2**-16, six and nine passes and float32 float32's own accumulation error.
  assert err[P.BF16_BF16_F32] > 2.0 ** -12
  assert err[P.TF32_TF32_F32] > 2.0 ** -15
  for p in (P.BF16_BF16_F32_X3, P.TF32_TF32_F32_X3):
    assert err[p] < err[P.BF16_BF16_F32] / 32
  for p in (P.BF16_BF16_F32_X6, P.BF16_BF16_F32_X9, P.F32_F32_F32):
    assert err[p] < 1e-6


# --- the passes themselves, against NumPy ------------------------------------------------------

def _np_parts(x, n, round_):
  parts, rest = [], x.astype(np.float32)
  for _ in range(n):
    parts.append(round_(rest))
    rest = (rest - parts[-1]).astype(np.float32)
  return [p.astype(np.float64) for p in parts]


def _np_tf32(x):
  bits = x.astype(np.float32).view(np.uint32)
  return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


@pytest.mark.interpreter
@pytest.mark.parametrize("precision", [P.BF16_BF16_F32_X3, P.BF16_BF16_F32_X6, P.BF16_BF16_F32_X9,
                                       P.TF32_TF32_F32, P.TF32_TF32_F32_X3], ids=str)
def test_interpreter_computes_the_passes(precision):
  # The same products of parts, summed in float64 by NumPy: only the float32 accumulation differs.
  kx, ky = jax.random.split(jax.random.key(19))
  x, y = _normal(kx, (40, 96)), _normal(ky, (96, 24))
  bf16 = lambda v: v.astype(ml_dtypes.bfloat16).astype(np.float32)
  if precision is P.TF32_TF32_F32:
    want = _np_tf32(x).astype(np.float64) @ _np_tf32(y).astype(np.float64)
  else:
    tf32 = precision is P.TF32_TF32_F32_X3
    passes = dot_algorithms.SPLIT_PASSES[precision] + ((0, 0),)
    n = 1 + max(max(ij) for ij in passes)
    px, py = (_np_parts(v, n, _np_tf32 if tf32 else bf16) for v in (x, y))
    want = sum(px[i] @ py[j] for i, j in passes)
  got = np.asarray(_matmul(precision)(x, y)).astype(np.float64)
  size = np.abs(x.astype(np.float64)) @ np.abs(y.astype(np.float64))
  np.testing.assert_array_less(np.abs(got - want), (x.shape[1] + 2) * U_F32 * size)


@pytest.mark.interpreter
def test_kernels_without_presets_are_left_alone():
  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...], precision=lax.Precision.HIGH)

  x = jax.ShapeDtypeStruct((32, 32), jnp.float32)
  jaxpr = jax.make_jaxpr(pl.pallas_call(kernel, out_shape=x))(x, x)
  params = jaxpr.eqns[0].params["params"]
  assert dot_algorithms.expand(params.jaxpr, tf32_dots=True) is params.jaxpr


# --- what the Triton backend writes --------------------------------------------------------------

def _source(precision, dtype=jnp.float32, cc=90):
  x = jax.ShapeDtypeStruct((64, 64), dtype)
  [art] = plgpu.lower(_matmul(precision, block=(64, 64)), x, x, compute_capability=cc)
  return art.source


@pytest.mark.parametrize("precision,dots,argument", [
    (P.F32_F32_F32, 1, "input_precision='ieee'"), (P.TF32_TF32_F32, 1, "input_precision='tf32'"),
    (P.TF32_TF32_F32_X3, 1, "input_precision='tf32x3'"), (P.BF16_BF16_F32, 1, "tl.bfloat16"),
    (P.BF16_BF16_F32_X3, 3, "tl.bfloat16"), (P.BF16_BF16_F32_X6, 6, "tl.bfloat16"),
    (P.BF16_BF16_F32_X9, 9, "tl.bfloat16"), (P.F16_F16_F32, 1, "tl.float16"),
    (lax.Precision.HIGHEST, 1, "input_precision='ieee'"), (None, 1, "input_precision='tf32'"),
    ((lax.Precision.DEFAULT, lax.Precision.HIGHEST), 1, "input_precision='ieee'")], ids=str)
def test_triton_source(precision, dots, argument):
  src = _source(precision)
  assert src.count("tl.dot(") == dots and argument in src, src


def test_plain_16_bit_dot_has_no_input_precision():
  for dtype in (jnp.bfloat16, jnp.float16):
    src = _source(None, dtype)
    assert src.count("tl.dot(") == 1 and "input_precision" not in src


# --- refusals ------------------------------------------------------------------------------------

def test_float8_preset_on_float32_operands_is_an_error_naming_it_and_the_line():
  kx, ky = jax.random.split(jax.random.key(23))
  x, y = _normal(kx, (32, 32)), _normal(ky, (32, 32))
  with pytest.raises(NotImplementedError, match=r"ANY_F8_ANY_F8_F32 multiplies float8 operands.*"
                     r"test_dot_algorithms.py:\d+"):
    _matmul(P.ANY_F8_ANY_F8_F32)(x, y)
  with pytest.raises(NotImplementedError, match=r"pallas_call kernel: .*ANY_F8_ANY_F8_F32.*"
                     r"test_dot_algorithms.py:\d+"):
    plgpu.lower(_matmul(P.ANY_F8_ANY_F8_F32), x, y, compute_capability=90)


def test_float8_preset_on_float8_operands():
  kx, ky = jax.random.split(jax.random.key(29))
  x = _normal(kx, (32, 64), jnp.float8_e4m3fn)
  y = _normal(ky, (64, 32), jnp.float8_e4m3fn)
  got = _matmul(P.ANY_F8_ANY_F8_F32)(x, y)
  _check(got, x.astype(np.float32), y.astype(np.float32), P.F32_F32_F32)


def test_a_dot_algorithm_that_is_no_preset_is_an_error():
  algorithm = lax.DotAlgorithm(np.float16, np.float16, np.float32)
  kx, ky = jax.random.split(jax.random.key(31))
  x, y = _normal(kx, (32, 32)), _normal(ky, (32, 32))
  with pytest.raises(NotImplementedError, match=r"lax.DotAlgorithmPreset.*test_dot_algorithms.py"):
    _matmul(algorithm)(x, y)


# --- on a GPU: the Triton backend against XLA on the same GPU -----------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("precision", PRESETS + [None, lax.Precision.HIGHEST], ids=str)
def test_triton_matches_xla_on_the_gpu(precision):
  if not _on_gpu():
    pytest.skip("needs an NVIDIA GPU")
  kx, ky = jax.random.split(jax.random.key(37))
  x, y = _normal(kx, (96, 80)), _normal(ky, (80, 72))
  try:
    want = jax.jit(functools.partial(jnp.dot, precision=precision,
                                     preferred_element_type=jnp.float32))(x, y)
  except Exception as e:  # noqa: BLE001
    pytest.skip(f"XLA on this GPU refuses {precision}: {str(e).splitlines()[0][:120]}")
  got = _matmul(precision)(x, y)
  _check(got, x, y, precision)
  exact = x.astype(np.float64) @ y.astype(np.float64)
  bound = _bound(precision, x, y, exact)
  xla_error = np.abs(np.asarray(want, np.float64) - exact)
  if np.any(xla_error > bound):
    # Seen on an H200 (jaxlib 0.11.2) for BF16_BF16_F32_X9: XLA's result is off by ~1e-3 of
    # |A|.|B|, far outside what nine bf16 products promise. pallax was checked against float64
    # above; comparing with XLA here would test XLA.
    pytest.skip(f"XLA on this GPU misses {precision}'s own bound (worst error "
                f"{float(np.max(xla_error / np.maximum(bound, 1e-30))):.0f}x it); pallax checked "
                "against float64 instead")
  # Both within the preset's bound of the exact product: within twice it of each other.
  np.testing.assert_array_less(np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64)),
                               2 * bound + np.finfo(np.float32).tiny)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=str)
def test_float64_preset_with_x64(dtype):
  with jax.enable_x64(True):
    kx, ky = jax.random.split(jax.random.key(41))
    x = np.asarray(jax.random.normal(kx, (32, 48), np.float64)).astype(dtype)
    y = np.asarray(jax.random.normal(ky, (48, 16), np.float64)).astype(dtype)
    got = np.asarray(_matmul(P.F64_F64_F64, out_dtype=jnp.float64, block=(16, 16))(x, y))
  exact = x.astype(np.float64) @ y.astype(np.float64)
  size = np.abs(x.astype(np.float64)) @ np.abs(y.astype(np.float64))
  # float64 products and sums: far below float32's rounding
  np.testing.assert_array_less(np.abs(got - exact), x.shape[1] * 2.0 ** -52 * size + 1e-300)


@pytest.mark.interpreter   # the interpreter's matrix-vector product is one the Triton backend refuses
def test_triton_refuses_a_matrix_vector_product_in_jaxs_words():
  """The interpreter multiplies a matrix by a vector; Triton's tl.dot takes matrices only, and
  JAX's Triton lowering says the operands "must be 2D": pallax says so too, and how to fix it."""
  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...])
  x = jax.random.normal(jax.random.key(3), (32, 48), jnp.float32)
  y = jax.random.normal(jax.random.key(4), (48,), jnp.float32)
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((32,), jnp.float32))
  np.testing.assert_allclose(pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((32,), jnp.float32),
                                            interpret=True)(x, y), x @ y, rtol=1e-5, atol=1e-5)
  with pytest.raises(NotImplementedError, match="must be 2D.*reshape a vector"):
    plgpu.lower(f, x, y, compute_capability=90)

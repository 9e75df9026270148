"""Register values in conditionals and transposes on the Gluon backend.

``lax.cond``/``lax.switch`` results are new variables that every branch assigns: their branches'
values may sit in different layouts (a tile loaded as int8 and one loaded as float32, a row
reduction and a column reduction), which Gluon refuses to merge or to combine later ("Layout
mismatch"). Transposes of register tiles are Gluon permutes. Each kernel runs in the interpreter
against NumPy (the suite's conftest lowers every one to Gluon as well), lowers to sm_90a PTX
here, and on a Hopper GPU runs on Gluon against the interpreter, tiles whose shapes are not
powers of two (padded in Gluon) among them."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax.mosaic_gpu as plgpu
from pallax._src.gluon import layouts as L

F32 = jnp.float32
DTYPES = [jnp.float32, jnp.bfloat16, jnp.int8]
SHAPES = [(64, 32), (24, 40)]
SHAPE_IDS = ["whole", "partial"]


def _on_hopper() -> bool:
  d = jax.devices()[0]
  return d.platform == "gpu" and float(getattr(d, "compute_capability", "0")) >= 9.0


gpu = pytest.mark.skipif(not _on_hopper(), reason="needs a Hopper GPU")


def _random(shape, dtype, seed):
  """Random values (never all zeros): small integers for integer types, normal floats else."""
  rng = np.random.default_rng(seed)
  if jnp.issubdtype(dtype, jnp.integer):
    return jnp.asarray(rng.integers(-40, 40, shape), dtype)
  return jnp.asarray(rng.standard_normal(shape), dtype)


def _check(got, want, dtype):
  """Exact for integer types; float32 to 1e-6 and bfloat16 to 1e-2, relative (one rounding)."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  if jnp.issubdtype(dtype, jnp.integer):
    np.testing.assert_array_equal(got, want)
  else:
    tol = 1e-2 if dtype == jnp.bfloat16 else 1e-6
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def _structs(*arrays):
  return [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]


# --- kernels ------------------------------------------------------------------------------------

def _cond_tile(x_ref, y_ref, o_ref):
  """Program 0 takes the branch computed from x (its layout: x's dtype's), program 1 the branch
  from float32 y; the result is used again after the cond."""
  i = lax.axis_index("i")
  x, y = x_ref[...], y_ref[...]
  r = lax.cond(i == 0, lambda: x.astype(F32) * 2, lambda: y + 1)
  o_ref[i] = r * y


def cond_tile(x, y, interpret=False):
  return plgpu.kernel(_cond_tile, out_type=jax.ShapeDtypeStruct((2, *x.shape), F32), grid=(2,),
                      grid_names=("i",), interpret=interpret)(x, y)


def _switch_on_loaded_index(k_ref, x_ref, y_ref, o_ref):
  """The branch of each program is read from GMEM."""
  i = lax.axis_index("i")
  x, y = x_ref[...], y_ref[...]
  o_ref[i] = lax.switch(k_ref[i], [lambda: x * 2, lambda: x + y, lambda: jnp.zeros_like(x) - y])


def switch_on_loaded_index(k, x, y, interpret=False):
  return plgpu.kernel(_switch_on_loaded_index, out_type=jax.ShapeDtypeStruct((len(k), *x.shape), x.dtype),
                      grid=(len(k),), grid_names=("i",), interpret=interpret)(k, x, y)


def _cond_vector(x_ref, o_ref):
  """A vector from a row reduction or from a column reduction (two slice layouts)."""
  i = lax.axis_index("i")
  x = x_ref[...]
  v = lax.cond(i == 0, lambda: jnp.max(x, axis=1), lambda: jnp.min(x, axis=0))
  o_ref[i] = x + v[:, None]


def cond_vector(x, interpret=False):
  return plgpu.kernel(_cond_vector, out_type=jax.ShapeDtypeStruct((2, *x.shape), x.dtype), grid=(2,),
                      grid_names=("i",), interpret=interpret)(x)


def _cond_scalar(x_ref, o_ref):
  """A scalar from a whole-tile reduction (Gluon reduces narrow types in 32 bits) or a constant."""
  i = lax.axis_index("i")
  x = x_ref[...]
  s = lax.cond(i == 0, lambda: jnp.max(x), lambda: jnp.array(3, x.dtype))
  o_ref[i] = x * s


def cond_scalar(x, interpret=False):
  return plgpu.kernel(_cond_scalar, out_type=jax.ShapeDtypeStruct((2, *x.shape), x.dtype), grid=(2,),
                      grid_names=("i",), interpret=interpret)(x)


def _transpose(x_ref, o_ref):
  o_ref[...] = x_ref[...].T


def _transpose_and_add(x_ref, y_ref, o_ref):
  o_ref[...] = jnp.transpose(x_ref[...]) * 2 + lax.transpose(y_ref[...], (1, 0))


def _transpose_accumulator_layout(x_ref, o_ref):
  """A tile in the wgmma accumulator layout, transposed: converted to a blocked layout first."""
  o_ref[...] = plgpu.layout_cast(x_ref[...], plgpu.Layout.WGMMA).T


def _cond_of_transpose(x_ref, y_ref, o_ref):
  """The branches' values: a permuted layout and a loaded tile's."""
  i = lax.axis_index("i")
  x, y = x_ref[...], y_ref[...]
  o_ref[i] = lax.cond(i == 0, lambda: x.T, lambda: y) + 1


def transposing(body, *args, interpret=False):
  (x, *_), out = args, jax.ShapeDtypeStruct(args[0].shape[::-1], args[0].dtype)
  return plgpu.kernel(body, out_type=out, interpret=interpret)(*args)


def cond_of_transpose(x, y, interpret=False):
  return plgpu.kernel(_cond_of_transpose, out_type=jax.ShapeDtypeStruct((2, *x.shape), x.dtype),
                      grid=(2,), grid_names=("i",), interpret=interpret)(x, y)


# --- the interpreter against NumPy (lowered to Gluon by the conftest) ----------------------------

@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cond_of_tiles_in_two_layouts(dtype, shape):
  x, y = _random(shape, dtype, 1), _random(shape, F32, 2)
  xf, yf = np.asarray(x, np.float32), np.asarray(y)
  _check(cond_tile(x, y), np.stack([xf * 2 * yf, (yf + 1) * yf]), F32)


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_switch_on_an_index_read_from_gmem(dtype, shape):
  x, y = _random(shape, dtype, 3), _random(shape, dtype, 4)
  k = jnp.asarray([2, 0, 1, 0], jnp.int32)
  xn, yn = np.asarray(x), np.asarray(y)
  branches = [xn * 2, xn + yn, np.zeros_like(xn) - yn]
  _check(switch_on_loaded_index(k, x, y), np.stack([branches[j] for j in k]), dtype)


@pytest.mark.parametrize("n", [64, 24], ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cond_of_vectors_in_two_slice_layouts(dtype, n):
  x = _random((n, n), dtype, 5)
  xn = np.asarray(x)
  want = np.stack([xn + xn.max(axis=1)[:, None], xn + xn.min(axis=0)[:, None]])
  _check(cond_vector(x), want, dtype)


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cond_of_scalars(dtype, shape):
  x = _random(shape, dtype, 6)
  xn = np.asarray(x)
  _check(cond_scalar(x), np.stack([xn * xn.max(), xn * np.asarray(3, xn.dtype)]), dtype)


@pytest.mark.parametrize("shape", SHAPES + [(40, 24)], ids=SHAPE_IDS + ["partial_tall"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_transpose_of_a_register_tile(dtype, shape):
  x = _random(shape, dtype, 7)
  np.testing.assert_array_equal(transposing(_transpose, x), np.asarray(x).T)


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_transposes_combined(shape):
  x, y = _random(shape, F32, 8), _random(shape, F32, 9)
  want = np.asarray(x).T * 2 + np.asarray(y).T
  _check(transposing(_transpose_and_add, x, y), want, F32)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_transpose_of_a_tile_in_the_accumulator_layout(dtype):
  x = _random((64, 128), dtype, 10)
  np.testing.assert_array_equal(transposing(_transpose_accumulator_layout, x), np.asarray(x).T)


@pytest.mark.parametrize("n", [32, 24], ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cond_of_a_transpose(dtype, n):
  x, y = _random((n, n), dtype, 11), _random((n, n), dtype, 12)
  one = np.asarray(1, np.asarray(x).dtype)
  _check(cond_of_transpose(x, y), np.stack([np.asarray(x).T + one, np.asarray(y) + one]), dtype)


# --- lowered to sm_90a PTX, what the assignment decided ------------------------------------------

def test_cond_results_take_the_layout_of_the_branch_written_first():
  """``if i == 0: r = x * 2 else: r = y + 1`` (the true branch is written first): the result
  takes the layout of x's branch (int8's blocked layout), and y's branch converts its float32
  value to it where it ends, inside the branch."""
  shape = (24, 40)
  x, y = jax.ShapeDtypeStruct(shape, jnp.int8), jax.ShapeDtypeStruct(shape, F32)
  (k,) = plgpu.lower(cond_tile, x, y)
  assert "ld.global" in k.ptx and "st.global" in k.ptx
  first = k.generated.conversions[0]
  assert (first.source, first.target, first.shape) == (L.blocked(shape, F32), L.blocked(shape, jnp.int8), shape)
  assert "<lambda>" in first.frame


def test_a_transpose_is_a_permute_of_the_blocked_layout():
  """No data moves for the transpose itself: its result is the permuted blocked layout (which
  the store converts to the coalesced layout of the transposed shape)."""
  shape = (24, 40)
  (k,) = plgpu.lower(functools.partial(transposing, _transpose), jax.ShapeDtypeStruct(shape, F32))
  permuted = L.permuted(L.blocked(shape, F32), (1, 0))
  assert [(c.source, c.target) for c in k.generated.conversions] == [
      (permuted, L.blocked(shape[::-1], F32))]
  assert "st.global" in k.ptx


def test_permuted_blocked_layout():
  layout = L.Blocked((1, 4), (2, 16), (4, 1), (1, 0))
  assert L.permuted(layout, (1, 0)) == L.Blocked((4, 1), (16, 2), (1, 4), (0, 1))
  cube = L.Blocked((1, 1, 8), (1, 4, 8), (4, 1, 1), (2, 1, 0))
  assert L.permuted(cube, (2, 0, 1)) == L.Blocked((8, 1, 1), (8, 1, 4), (1, 4, 1), (0, 2, 1))
  assert L.permuted(L.permuted(cube, (2, 0, 1)), (1, 2, 0)) == cube


# --- on a Hopper GPU: Gluon against the interpreter ----------------------------------------------

def _same_as_interpreter(fn, *args, dtype):
  _check(jax.jit(fn)(*args), fn(*args, interpret=True), dtype)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_conds_on_the_gpu_match_the_interpreter(dtype, shape):
  seed = shape[0] + shape[1]
  x, y = _random(shape, dtype, seed), _random(shape, dtype, seed + 1)
  _same_as_interpreter(cond_tile, x, _random(shape, F32, seed + 2), dtype=F32)
  k = jnp.asarray([1, 2, 0, 1, 2], jnp.int32)
  _same_as_interpreter(switch_on_loaded_index, k, x, y, dtype=dtype)
  _same_as_interpreter(cond_scalar, x, dtype=dtype)
  square = _random((shape[1], shape[1]), dtype, seed + 3)
  _same_as_interpreter(cond_vector, square, dtype=dtype)
  _same_as_interpreter(cond_of_transpose, square, _random(square.shape, dtype, seed + 4), dtype=dtype)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("shape", SHAPES + [(40, 24)], ids=SHAPE_IDS + ["partial_tall"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_transposes_on_the_gpu_match_the_interpreter(dtype, shape):
  seed = shape[0] * 3 + shape[1]
  x, y = _random(shape, dtype, seed), _random(shape, dtype, seed + 1)
  _same_as_interpreter(functools.partial(transposing, _transpose), x, dtype=dtype)
  if dtype != jnp.int8:
    _same_as_interpreter(functools.partial(transposing, _transpose_and_add), x, y, dtype=dtype)
  wide = _random((64, 128), dtype, seed + 2)
  if dtype != jnp.int8:
    _same_as_interpreter(functools.partial(transposing, _transpose_accumulator_layout), wide,
                         dtype=dtype)

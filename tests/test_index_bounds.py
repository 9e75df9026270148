"""Index code the Triton backend leaves out where it proves it never fires (``gpu/expr.interval``):
the wrap-around of negative index-array entries and the bounds checks of their coordinates. The
kernels run on whatever backend the machine has (the interpreter here, Triton on a GPU) against
NumPy; the generated source is checked on any machine."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax as pl
import pallax.triton as plgpu
from pallax._src.gpu import expr as ex

S = jax.ShapeDtypeStruct
I32 = np.dtype(np.int32)


def _lit(v):
  return ex.Lit(v, dtype=I32)


def _name(lo, hi):
  return ex.Name("n", dtype=I32, bounds=(lo, hi))


def test_interval_of_index_arithmetic():
  lanes = ex.call("tl.arange", _lit(0), _lit(64), dtype=I32, shape=(64,))
  assert ex.interval(lanes) == (0, 63)
  assert ex.interval(ex.add(ex.mul(_name(0, 3), 64), lanes)) == (0, 255)
  assert ex.interval(ex.binary("-", _lit(3), _name(0, 3))) == (0, 3)
  assert ex.interval(ex.binary("%", _name(0, 99), _lit(8))) == (0, 7)
  assert ex.interval(ex.binary("%", _name(0, 5), _lit(8))) == (0, 5)
  assert ex.interval(ex.binary("//", _name(0, 99), _lit(8))) == (0, 12)
  assert ex.interval(ex.binary("*", _name(-2, 3), _name(-5, 4))) == (-15, 12)


@pytest.mark.parametrize("e", [
    ex.Name("n", dtype=I32),                                # a name with no known bounds
    ex.binary("%", _name(-4, 4), _lit(8)),                  # C's remainder of a negative
    ex.binary("//", _name(0, 9), _name(1, 2)),              # a divisor that is not a constant
    ex.mul(_name(0, 2**20), 2**12),                         # may pass int32's range: it wraps
    ex.binary("&", _name(0, 9), _lit(3)),                   # an operator it does not know
    ex.Lit(1.5, dtype=np.dtype(np.float32)),
    ex.Lit(True, dtype=np.dtype(np.bool_)),
], ids=["unbounded", "negative-remainder", "dynamic-divisor", "overflow", "bitand", "float", "bool"])
def test_interval_unknown(e):
  assert ex.interval(e) is None


def _source(fun, *args) -> str:
  from pallax._src.triton.codegen import PROLOGUE
  [a] = plgpu.lower(fun, *args)
  return a.source[len(PROLOGUE):]


def _row_sums(width, chunk, chunks):
  """Per row, the sum of ``chunks`` column chunks of ``chunk`` (JAX's layer_norm pattern:
  ``x_ref.at[j * chunk + arange(chunk)]`` in a fori_loop, masked at the row's width)."""
  def kernel(x_ref, o_ref):
    def body(j, acc):
      cols = j * chunk + jnp.arange(chunk)
      return acc + plgpu.load(x_ref.at[cols], mask=cols < width, other=0.0)
    o_ref[...] = jax.lax.fori_loop(0, chunks, body, jnp.zeros((chunk,), jnp.float32))
  return lambda x: pl.pallas_call(
      kernel, out_shape=S((x.shape[0], chunk), jnp.float32), grid=(x.shape[0],),
      in_specs=[pl.BlockSpec((None, width), lambda i: (i, 0))],
      out_specs=pl.BlockSpec((None, chunk), lambda i: (i, 0)))(x)


def _expected(x, chunk, chunks):
  padded = np.zeros((x.shape[0], chunk * chunks), np.float32)
  padded[:, :x.shape[1]] = x
  return padded.reshape(x.shape[0], chunks, chunk).sum(1)


def test_columns_proven_inside_the_row_have_no_wrap_and_no_bounds_check():
  # 3 chunks of 128 cover the 384 columns exactly: coordinates are in [0, 383].
  src = _source(_row_sums(384, 128, 3), S((8, 384), jnp.float32))
  assert "tl.where" not in src and ">= 0" not in src and "< 384" in src   # the user's mask only
  assert src.count("< 384") == 1


def test_columns_that_may_pass_the_row_keep_their_bounds_check():
  # 3 chunks of 128 over 300 columns: the last chunk reaches column 383.
  src = _source(_row_sums(300, 128, 3), S((8, 300), jnp.float32))
  assert "tl.where" not in src and ">= 0" not in src
  assert src.count("< 300") == 2   # the user's mask and the row's own bound


@pytest.mark.parametrize("width,chunks", [(384, 3), (300, 3), (1, 1), (130, 2)])
def test_blocked_row_gathers_match_numpy(width, chunks):
  x = np.asarray(jax.random.normal(jax.random.key(width), (5, width), jnp.float32))
  got = np.asarray(_row_sums(width, 128, chunks)(jnp.asarray(x)))
  np.testing.assert_allclose(got, _expected(x, 128, chunks), rtol=1e-6, atol=1e-6)


def test_an_index_loaded_at_run_time_still_counts_from_the_end():
  def kernel(x_ref, i_ref, o_ref):
    o_ref[...] = plgpu.load(x_ref.at[i_ref[...]])
  f = lambda x, i: pl.pallas_call(kernel, out_shape=S((4,), jnp.float32))(x, i)
  assert "tl.where(i < 0, i + 16, i)" in _source(f, S((16,), jnp.float32), S((4,), jnp.int32))
  x = jnp.arange(16, dtype=jnp.float32)
  np.testing.assert_array_equal(np.asarray(f(x, jnp.array([3, -1, 0, -16], jnp.int32))),
                                [3, 15, 0, 0])

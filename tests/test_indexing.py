"""NumPy's integer-array indexing inside kernels: negative entries count from the end; mixed
advanced indices (arrays, integers, strided slices, broadcasting) give NumPy's result, on loads,
stores, Triton-style masked views and atomics; entries outside [-size, size) are out-of-bounds
errors in the interpreter.

Each kernel runs in pallax's interpreter, in JAX Pallas's interpret mode where JAX supports it (the
very same kernel), and is compared with NumPy, elementwise, on fresh random inputs. conftest lowers
every kernel run here to PTX as well; the corpus cases (kernel_corpus.py, "NumPy's integer-array
indexing") run on a GPU against the interpreter in test_triton_gpu.py.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as jpl
from jax.experimental.pallas import triton as jplgpu

import kernel_corpus as kc
import pallax as pl
import pallax.triton as plgpu

S = jax.ShapeDtypeStruct
SEEDS = (1, 2)


def _np(*arrays):
  return [np.asarray(a) for a in arrays]


def _assert_equal_leaves(got, want):
  got, want = jax.tree.leaves(got), jax.tree.leaves(want)
  assert len(got) == len(want)
  for g, w in zip(got, want):
    g, w = np.asarray(g), np.asarray(w)
    assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
    np.testing.assert_array_equal(g, w)


# --- NumPy's answers for the corpus kernels ----------------------------------------------------

def _mixed_gathers_numpy(x2, x3, c, a, b, e):
  x2, x3, c, a, b, e = _np(x2, x3, c, a, b, e)
  return [x2[c, ::3], x3[a, b, :], x3[a, 1::2, e], x3[-1, b, ::2], x3[2, :, e], x3[:, b, -3],
          x3[1:4, a]]


def _mixed_scatters_numpy(x2, x3a, x3b, x3c, rows, cols, last, first, v1, v2, v3):
  x2, x3a, x3b, x3c, rows, cols, last, first, v1, v2, v3 = _np(
      x2, x3a, x3b, x3c, rows, cols, last, first, v1, v2, v3)
  pair, split, neg, integer = x3a.copy(), x3b.copy(), x2.copy(), x3c.copy()
  pair[rows, cols, :] = v1
  split[rows, :, last] = v2
  neg[first, ::3] = v3
  integer[-2, cols, 1::3] = v1[0, :, :2] * 5
  return [pair, split, neg, integer]


def _row_softmax_numpy(x):
  (x,) = _np(x)
  e = np.exp(x - x.max(axis=1, keepdims=True))
  return [e / e.sum(axis=1, keepdims=True)]


NUMPY = {
    "indexing_mixed_gathers_negative_entries": _mixed_gathers_numpy,
    "indexing_mixed_scatters_negative_entries": _mixed_scatters_numpy,
    "indexing_row_softmax_scalar_and_arange_view": _row_softmax_numpy,
}


def test_every_indexing_case_has_a_numpy_answer():
  assert set(NUMPY) == set(kc.INDEXING)


@pytest.mark.parametrize("name", sorted(kc.INDEXING))
def test_corpus_kernel_matches_jax_pallas_and_numpy(name):
  case = kc.by_name(name)
  for seed in SEEDS:
    args = case.args(jax.random.key(seed))
    got = case.build(True)(*args)
    # The same kernel on JAX Pallas: the same XLA operations, so bit for bit.
    _assert_equal_leaves(got, kc.INDEXING[name](jpl, jplgpu, True)(*args))
    want = NUMPY[name](*args)
    for g, w in zip(jax.tree.leaves(got), want):
      assert g.shape == w.shape
      if case.tol:   # float32 exp and sums in XLA's order against NumPy's: a few ulps
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-6, atol=1e-7)
      else:          # gathers and scatters copy values
        np.testing.assert_array_equal(np.asarray(g), w)


def test_corpus_index_arrays_have_negative_entries():
  # The cases above test counting from the end only if their random indices are negative.
  args = kc.by_name("indexing_mixed_gathers_negative_entries").args(jax.random.key(SEEDS[0]))
  assert all((np.asarray(i) < 0).any() for i in args[2:])
  args = kc.by_name("indexing_mixed_scatters_negative_entries").args(jax.random.key(SEEDS[0]))
  assert all((np.asarray(i) < 0).any() for i in args[4:8])


# --- one form at a time, loads and stores, against JAX Pallas and NumPy ----------------------------

X_SHAPE = (5, 6, 7)

# name -> the index, from index arrays a (3, 1) into dim 0, b (4,) into dim 1, e (4,) into dim 2
FORMS = {
    "array_only": lambda a, b, e: (a[:, 0],),
    "negative_array_strided_slice": lambda a, b, e: (a[:, 0], slice(None, None, 3)),
    "two_broadcasting_arrays": lambda a, b, e: (a, b),
    "broadcasting_arrays_around_a_strided_slice": lambda a, b, e: (a, slice(1, None, 2), e),
    "integer_then_array": lambda a, b, e: (2, b),
    "negative_integer_array_strided": lambda a, b, e: (-1, b, slice(None, None, 2)),
    "integer_and_array_around_a_slice": lambda a, b, e: (2, slice(None), e),
    "array_slice_integer": lambda a, b, e: (a[:, 0], slice(None), 3),
    "slice_array_negative_integer": lambda a, b, e: (slice(None), b, -3),
    "slice_then_2d_array": lambda a, b, e: (slice(1, 4), a),
    "three_arrays": lambda a, b, e: (a, b, e),
}


def _form_args(key):
  k = jax.random.split(key, 4)
  x = jax.random.normal(k[0], X_SHAPE, jnp.float32)
  return (x, kc.signed_indices(k[1], (3, 1), 5), kc.signed_indices(k[2], (4,), 6),
          kc.signed_indices(k[3], (4,), 7))


def _load_call(mod, form, out_shape):
  def kernel(x_ref, a_ref, b_ref, e_ref, o_ref):
    o_ref[...] = x_ref[FORMS[form](a_ref[...], b_ref[...], e_ref[...])]
  return mod.pallas_call(kernel, out_shape=S(out_shape, jnp.float32), interpret=True)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_load(form):
  for seed in SEEDS:
    x, a, b, e = _form_args(jax.random.key(seed))
    want = np.asarray(x)[FORMS[form](*_np(a, b, e))]
    got = _load_call(pl, form, want.shape)(x, a, b, e)
    np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(np.asarray(_load_call(jpl, form, want.shape)(x, a, b, e)), want)


def _distinct_form_args(key):
  """Index arrays whose combinations hit distinct elements (a store's duplicates keep an
  unspecified one): a (3, 1), b (4,), e (4,) each without repeats."""
  k = jax.random.split(key, 4)
  x = jax.random.normal(k[0], X_SHAPE, jnp.float32)
  return (x, kc.distinct_indices(k[1], 3, 5)[:, None], kc.distinct_indices(k[2], 4, 6),
          kc.distinct_indices(k[3], 4, 7))


def _store_call(mod, form, value_shape):
  def kernel(x_ref, a_ref, b_ref, e_ref, v_ref, o_ref):
    o_ref[...] = x_ref[...]
    o_ref[FORMS[form](a_ref[...], b_ref[...], e_ref[...])] = v_ref[...]
  return mod.pallas_call(kernel, out_shape=S(X_SHAPE, jnp.float32), interpret=True)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_store(form):
  for seed in SEEDS:
    x, a, b, e = _distinct_form_args(jax.random.key(seed))
    index = FORMS[form](*_np(a, b, e))
    shape = np.asarray(x)[index].shape
    v = jax.random.normal(jax.random.key(seed + 100), shape, jnp.float32)
    want = np.asarray(x).copy()
    want[index] = np.asarray(v)
    got = _store_call(pl, form, shape)(x, a, b, e, v)
    np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(np.asarray(_store_call(jpl, form, shape)(x, a, b, e, v)), want)


def test_the_issue_example_a_constant_array_with_a_negative_entry():
  # A constant array in a kernel: JAX Pallas (and pallax) refuse it ("captures constants")
  # unless JAX traces it as a literal (jax_use_simplified_jaxpr_constants).
  def kernel(x_ref, o_ref):
    c = jnp.array([1, 0, 2, 2, -1, 1])
    o_ref[...] = x_ref[c, ::3]
  x = jax.random.normal(jax.random.key(3), (4, 12), jnp.float32)
  with kc.simplified_constants():
    got = pl.pallas_call(kernel, out_shape=S((6, 4), jnp.float32), interpret=True)(x)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(x)[[1, 0, 2, 2, -1, 1], ::3])


@pytest.mark.parametrize("dtype,size,entries", [
    (jnp.int8, 100, [-1, -100, 5, 99]),
    (jnp.int16, 300, [-300, -1, 150, 3]),
    (jnp.uint8, 100, [99, 0, 255 % 100, 7]),
])
def test_narrow_index_arrays_against_jax_and_numpy(dtype, size, entries):
  x = jax.random.normal(jax.random.key(4), (size, 3), jnp.float32)
  i = jnp.array(entries, dtype)
  def kernel(x_ref, i_ref, o_ref):
    o_ref[...] = x_ref[i_ref[...], :]
  want = np.asarray(x)[np.asarray(i).astype(np.int64)]
  for mod in (pl, jpl):
    got = mod.pallas_call(kernel, out_shape=S((4, 3), jnp.float32), interpret=True)(x, i)
    np.testing.assert_array_equal(np.asarray(got), want)


def test_int8_entries_counting_from_the_end_of_a_long_dimension():
  # -1 + 200 does not fit int8: the entry is widened first. (JAX Pallas fails here: "Python
  # integer 200 out of bounds for int8".)
  x = jax.random.normal(jax.random.key(5), (200, 3), jnp.float32)
  i = jnp.array([-1, -128, 5, 127], jnp.int8)
  def kernel(x_ref, i_ref, o_ref):
    o_ref[...] = x_ref[i_ref[...], :]
  got = pl.pallas_call(kernel, out_shape=S((4, 3), jnp.float32), interpret=True)(x, i)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(x)[[199, 72, 5, 127]])


# --- Triton-style masked views and atomics -------------------------------------------------------

def _masked_gather_kernel(x_ref, i_ref, o_ref, *, pl, plgpu):
  idx = i_ref[...]
  keep = idx < 9   # the entries 9..11 lie past the Ref: masked off (they read `other`)
  o_ref[...] = plgpu.load(x_ref.at[pl.program_id(0), idx], mask=keep, other=-1.0)


def test_masked_view_with_negative_entries_matches_jax_pallas_and_numpy():
  for seed in SEEDS:
    k1, k2 = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(k1, (3, 9), jnp.float32)
    idx = jax.random.randint(k2, (16,), -9, 12, jnp.int32)
    run = lambda mod, gpu: mod.pallas_call(
        functools.partial(_masked_gather_kernel, pl=mod, plgpu=gpu), out_shape=S((3, 16), jnp.float32),
        grid=(3,), out_specs=mod.BlockSpec((None, 16), lambda i: (i, 0)), interpret=True)(x, idx)
    i = np.asarray(idx)
    want = np.where(i < 9, np.asarray(x)[:, np.clip(i, -9, 8)], -1.0).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(run(pl, plgpu)), want)
    np.testing.assert_array_equal(np.asarray(run(jpl, jplgpu)), want)


def _atomics_numpy(idx, vals, mask, cols, o0, masked=True):
  idx, vals, mask, cols, o0 = _np(idx, vals, mask, cols, o0)
  want = o0.copy()
  np.add.at(want[0], idx, vals)
  keep = mask if masked else np.ones_like(mask)
  np.add.at(want[1], idx[keep], vals[keep])
  np.maximum.at(want[2], cols, vals)
  return want


def test_atomics_on_index_array_views_with_repeated_and_negative_indices_follow_numpy():
  case = kc.by_name("indexing_atomics_on_index_array_views")
  for seed in SEEDS:
    args = case.args(jax.random.key(seed))
    assert len(set(np.asarray(args[0]).tolist())) < len(args[0]) and (np.asarray(args[0]) < 0).any()
    np.testing.assert_array_equal(np.asarray(case.build(True)(*args)), _atomics_numpy(*args))


def test_atomics_on_index_array_views_match_jax_pallas_on_distinct_indices():
  # JAX Pallas's interpret mode keeps one update per repeated element and refuses masks; on
  # distinct indices, unmasked, it is NumPy's answer too.
  for seed in SEEDS:
    args = kc._atomic_view_args(jax.random.key(seed), repeated=False)
    want = _atomics_numpy(*args, masked=False)
    got = kc.atomic_views(pl, plgpu, True, masked=False)(*args)
    np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(np.asarray(kc.atomic_views(jpl, jplgpu, True, masked=False)(*args)), want)


def test_views_of_views_indexed_by_arrays_follow_numpy():
  # JAX Pallas 0.11 fails on these (broadcast_in_dim in its discharge of x_ref.at[2].at[idx]).
  case = kc.by_name("indexing_chained_views_gather_and_atomics")
  for seed in SEEDS:
    x, rows, idx, vals, o0 = args = case.args(jax.random.key(seed))
    g, w, o = case.build(True)(*args)
    x, rows, idx, vals, o0 = _np(*args)
    want = o0.copy()
    np.add.at(want[1], idx, vals)
    np.testing.assert_array_equal(np.asarray(g), x[rows][:, 1::2])
    np.testing.assert_array_equal(np.asarray(w), x[2][idx])
    np.testing.assert_array_equal(np.asarray(o), want)


# --- entries outside [-size, size) stay out-of-bounds errors -------------------------------------

def _gather_call(kernel, out_shape):
  return pl.pallas_call(kernel, out_shape=S(out_shape, jnp.float32), interpret=True)


def _load_rows(x_ref, i_ref, o_ref):
  o_ref[...] = x_ref[i_ref[...], ::3]


def _store_rows(x_ref, i_ref, o_ref):
  o_ref[...] = jnp.zeros_like(o_ref)
  o_ref[i_ref[...], ::3] = x_ref[:3, ::3]


def _masked_load_rows(x_ref, i_ref, o_ref):
  idx = i_ref[...]
  o_ref[...] = plgpu.load(x_ref.at[idx, pl.ds(0, 4)], mask=(idx != 0)[:, None], other=0.0)


@pytest.mark.interpreter
@pytest.mark.parametrize("bad", [4, 7, -5, -9])
@pytest.mark.parametrize("kernel,out_shape,verb", [
    (_load_rows, (3, 4), r"read from args\[0\]"),
    (_store_rows, (4, 12), r"write to out\[0\]"),
    (_masked_load_rows, (3, 4), r"read from args\[0\]"),
], ids=["load", "store", "masked_load"])
def test_entries_outside_the_ref_are_out_of_bounds(kernel, out_shape, verb, bad):
  x = jax.random.normal(jax.random.key(6), (4, 12), jnp.float32)
  call = _gather_call(kernel, out_shape)
  jax.block_until_ready(call(x, jnp.array([-4, 1, -1], jnp.int32)))   # in range: no error
  with pytest.raises(IndexError, match=rf"out-of-bounds {verb}.*index {bad} along dimension 0, "
                                       r"which has size 4"):
    jax.block_until_ready(call(x, jnp.array([1, bad, -1], jnp.int32)))


def _rows_below_4(x_ref, i_ref, o_ref):
  idx = i_ref[...]
  o_ref[...] = plgpu.load(x_ref.at[idx, pl.ds(0, 4)], mask=(idx < 4)[:, None], other=-1.0)


@pytest.mark.interpreter
def test_out_of_range_entries_where_the_mask_is_false_are_not_checked():
  x = jax.random.normal(jax.random.key(7), (4, 12), jnp.float32)
  got = _gather_call(_rows_below_4, (3, 4))(x, jnp.array([9, 2, -3], jnp.int32))
  want = np.asarray(x)[[0, 2, -3], :4]
  want[0] = -1.0
  np.testing.assert_array_equal(np.asarray(got), want)
  with pytest.raises(IndexError, match="index -7 along dimension 0"):   # -7 < 4: not masked off
    jax.block_until_ready(_gather_call(_rows_below_4, (3, 4))(x, jnp.array([9, -7, 0], jnp.int32)))


@pytest.mark.interpreter
def test_atomic_on_a_view_out_of_range_is_an_error():
  def kernel(i_ref, o_ref):
    o_ref[...] = jnp.zeros_like(o_ref)
    plgpu.atomic_add(o_ref.at[1, i_ref[...]], (), jnp.ones((3,), jnp.int32))
  call = pl.pallas_call(kernel, out_shape=S((2, 8), jnp.int32), interpret=True)
  np.testing.assert_array_equal(np.asarray(call(jnp.array([-8, 7, 7], jnp.int32)))[1],
                                [1, 0, 0, 0, 0, 0, 0, 2])
  with pytest.raises(IndexError, match=r"out-of-bounds atomic update of out\[0\].*index -9"):
    jax.block_until_ready(call(jnp.array([1, -9, 7], jnp.int32)))


# --- the Triton code ----------------------------------------------------------------------------

def _source(fun, *args) -> str:
  """The generated kernel's own source (without the shared prologue of helper functions)."""
  from pallax._src.triton.codegen import PROLOGUE
  [a] = plgpu.lower(fun, *args)
  assert a.source.startswith(PROLOGUE)
  return a.source[len(PROLOGUE):]


def test_triton_counts_negative_entries_from_the_end():
  f = lambda x, c: pl.pallas_call(_load_rows, out_shape=S((3, 4), jnp.float32))(x, c)
  src = _source(f, S((4, 12), jnp.float32), S((3,), jnp.int32))
  assert "tl.where(i < 0, i + 4, i)" in src


def test_triton_widens_narrow_index_arrays_before_counting_from_the_end():
  def kernel(x_ref, i_ref, o_ref):
    o_ref[...] = x_ref[i_ref[...], :]
  f = lambda x, i: pl.pallas_call(kernel, out_shape=S((4, 3), jnp.float32))(x, i)
  src = _source(f, S((200, 3), jnp.float32), S((4,), jnp.int8))
  assert "i.to(tl.int32) < 0, i.to(tl.int32) + 200" in src
  src = _source(f, S((200, 3), jnp.float32), S((4,), jnp.uint8))
  assert "tl.where" not in src   # unsigned: nothing to count from the end


def test_triton_row_view_loads_stay_vectorized():
  # The view's coordinates go through where(i < 0, ...): Triton proves tl.arange non-negative and
  # the loads keep their 16-byte vectors (as with x_ref.at[row, pl.ds(0, block)]).
  kernel = functools.partial(kc._row_view_softmax_kernel, block=1024, pl=pl, plgpu=plgpu)
  f = lambda x: pl.pallas_call(kernel, out_shape=S(x.shape, x.dtype), grid=(x.shape[0],))(x)
  [a] = plgpu.lower(f, S((64, 1000), jnp.float32))
  assert "ld.global.v4.b32" in a.ptx and "st.global.v4.b32" in a.ptx


def test_triton_refuses_part_of_a_gather_view_naming_the_line():
  def kernel(x_ref, i_ref, o_ref):
    o_ref[...] = x_ref.at[i_ref[...]][:3]
  f = lambda x, i: pl.pallas_call(kernel, out_shape=S((3, 12), jnp.float32))(x, i)
  with pytest.raises(NotImplementedError,
                     match=r"indexing part of a Ref view that was itself indexed with an array "
                           r"\(at .*test_indexing.py:\d+"):
    plgpu.lower(f, S((4, 12), jnp.float32), S((5,), jnp.int32))

"""Defects found in a review of the GPU pipeline, each reproduced here (each test failed before
its fix)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax as pl
import pallax.triton as plgpu

scale = 2.0


def _scaled_kernel(x_ref, o_ref):
  o_ref[...] = x_ref[...] * scale


def test_a_new_pallas_call_sees_changed_globals():
  # A module-global trace cache keyed on the kernel object answered 2.0 twice.
  global scale
  x = jnp.ones(8)
  call = lambda: pl.pallas_call(_scaled_kernel, out_shape=jax.ShapeDtypeStruct((8,), jnp.float32),
                                interpret=True)(x)
  try:
    scale = 2.0
    first = call()
    scale = 3.0
    second = call()
  finally:
    scale = 2.0
  np.testing.assert_array_equal(first, np.full(8, 2.0))
  np.testing.assert_array_equal(second, np.full(8, 3.0))


def _scaled_by(x_ref, o_ref, *, s):
  o_ref[...] = jax.nn.relu(x_ref[...]) * s   # relu: a custom_jvp, with new rules at every trace


def test_identical_traces_share_one_params_object():
  # Tracing at every call must not recompile: the backends' caches key on the Params object,
  # also when each call builds new index-map lambdas, spec lists and partials.
  import functools
  from pallax._src import pallas_call as pcall

  def call(s):
    return pl.pallas_call(functools.partial(_scaled_by, s=s),
                          out_shape=jax.ShapeDtypeStruct((8,), jnp.float32), grid=(2,),
                          in_specs=[pl.BlockSpec((4,), lambda i: (i,))],
                          out_specs=pl.BlockSpec((4,), lambda i: (i,)), interpret=True)

  x = jnp.ones(8)
  seen = [eqn.params["params"] for s in (2.0, 2.0, 3.0) for eqn in
          jax.make_jaxpr(call(s))(x).eqns if eqn.primitive is pcall.pallas_call_p]
  assert len(seen) == 3 and seen[0] is seen[1] and seen[1] is not seen[2]
  np.testing.assert_array_equal(call(3.0)(x), np.full(8, 3.0))


def _computed_minus_one_kernel(x_ref, o_ref):
  i = jnp.zeros((), jnp.int32) - 1
  o_ref[...] = jnp.full((4,), x_ref[i])


def _literal_minus_one_kernel(x_ref, o_ref):
  o_ref[...] = jnp.full((4,), x_ref[-1])


def _call(kernel, interpret):
  return lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((4,), jnp.float32),
                                  interpret=interpret)(x)


@pytest.mark.interpreter
def test_a_computed_negative_index_is_out_of_bounds_on_both_backends():
  # The Triton backend folded the index to the text -1, took it for a literal and read x[3].
  x = jnp.arange(4.0)
  with pytest.raises(IndexError, match=r"out-of-bounds read from args\[0\].*index -1"):
    _call(_computed_minus_one_kernel, True)(x)
  with pytest.raises(IndexError, match=r"out-of-bounds read from args\[0\].*index -1"):
    plgpu.lower(_call(_computed_minus_one_kernel, False), x)


@pytest.mark.interpreter
def test_a_literal_negative_index_counts_from_the_end_on_both_backends():
  x = jnp.arange(4.0)
  np.testing.assert_array_equal(_call(_literal_minus_one_kernel, True)(x), np.full(4, 3.0))
  [a] = plgpu.lower(_call(_literal_minus_one_kernel, False), x)
  assert "x_ref + 3)" in a.source


def test_addresses_past_two_to_the_31_stay_64_bit():
  # A stride of 2**31 was written as an int32 constant, which wraps: program 1 read at -2**31.
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1
  spec = pl.BlockSpec((None, 1024), lambda i: (i, 0))
  f = lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((2, 1024), jnp.int8),
                               grid=(2,), in_specs=[spec], out_specs=spec)(x)
  [a] = plgpu.lower(f, jax.ShapeDtypeStruct((2, 2**31), jnp.int8))
  assert "arith.constant 2147483648 : i64" in a.ttir and "-2147483648 : i64" not in a.ttir


def test_a_typed_constant_that_does_not_fit_is_refused():
  from pallax._src.gpu import expr as ex
  with pytest.raises(ValueError, match="does not fit int32"):
    ex.Renderer()(ex.Lit(2**31, dtype=np.dtype(np.int32)))


def _callback_kernel(s):
  def scaled(v):
    return np.asarray(v * s, np.float32)

  def kernel(x_ref, o_ref):
    o_ref[...] = jax.pure_callback(scaled, jax.ShapeDtypeStruct((4,), jnp.float32), x_ref[...])
  return kernel


def _checked_kernel(message):
  def kernel(x_ref, o_ref):
    pl.debug_check(jnp.all(x_ref[...] > 5), message)
    o_ref[...] = x_ref[...]
  return kernel


@pytest.mark.interpreter
def test_traces_that_print_alike_but_differ_are_not_shared():
  # A callback's closure and a check's message are not in the printed jaxpr: sharing Params by
  # the printed text alone ran the first kernel again.
  x = jnp.ones(4, jnp.float32)
  out = jax.ShapeDtypeStruct((4,), jnp.float32)
  for s in (2.0, 3.0):
    np.testing.assert_array_equal(pl.pallas_call(_callback_kernel(s), out_shape=out,
                                                 interpret=True)(x), np.full(4, s))
  for message in ("first message", "second message"):
    with pl.enable_debug_checks(), pytest.raises(pl.KernelCheckError, match=message):
      pl.pallas_call(_checked_kernel(message), out_shape=out, interpret=True)(x)


def _negative_slice_kernel(x_ref, o_ref):
  o_ref[...] = x_ref[pl.ds(-4, 4)]


def _computed_negative_slice_kernel(x_ref, o_ref):
  o_ref[...] = x_ref[pl.ds(jnp.zeros((), jnp.int32) - 4, 4)]


@pytest.mark.interpreter
@pytest.mark.parametrize("kernel", [_negative_slice_kernel, _computed_negative_slice_kernel])
def test_a_slice_starting_before_the_ref_is_out_of_bounds_on_both_backends(kernel):
  # The interpreter failed inside JAX ("start_indices must be nonnegative") and Triton read the
  # four elements before the array.
  x = jnp.arange(16.0)
  call = lambda interpret: (lambda x: pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((4,), jnp.float32), interpret=interpret)(x))
  with pytest.raises(IndexError, match=r"out-of-bounds read from args\[0\].*index -4"):
    call(True)(x)
  with pytest.raises(IndexError, match=r"out-of-bounds read from args\[0\].*index -4"):
    plgpu.lower(call(False), x)


def test_trace_sharing_survives_a_full_cache(monkeypatch):
  """The cache of shared traces drops its oldest entries when full: a trace made just before
  (the same kernel again) is still shared (clearing the whole cache made this flaky)."""
  from pallax._src import pallas_call as pcall
  monkeypatch.setattr(pcall, "_SAME_TRACE_SIZE", 3)
  def call(s):
    return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(Ellipsis, x_ref[...] * s),
                          out_shape=jax.ShapeDtypeStruct((8,), jnp.float32), interpret=True)
  x = jnp.ones(8)
  for s in (1.0, 2.0, 3.0, 4.0, 5.0):   # fills the cache past its size, repeatedly
    first, again = (e.params["params"] for f in (call(s), call(s))
                    for e in jax.make_jaxpr(f)(x).eqns if e.primitive is pcall.pallas_call_p)
    assert first is again

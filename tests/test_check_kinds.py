"""A failed check's Python error class comes from its kind (data), never from its message's words."""
import inspect
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import pallax as pl
from pallax._src import checks

pytestmark = pytest.mark.interpreter

S = jax.ShapeDtypeStruct
WORDS = "row index out-of-bounds of the table (see the index_map of args[0])"


def line_of(fn, needle):
  lines, start = inspect.getsourcelines(fn)
  for k, l in enumerate(lines):
    if needle in l:
      return f"{inspect.getsourcefile(fn)}:{start + k} ({fn.__name__})"
  raise AssertionError(needle)


def wordy_check_kernel(x_ref, o_ref):
  pl.debug_check(jnp.all(x_ref[...] > 0), WORDS)
  o_ref[...] = x_ref[...]


def _wordy_call():
  return pl.pallas_call(wordy_check_kernel, out_shape=S((8,), jnp.float32))


def test_debug_check_whose_message_reads_like_an_index_error_raises_kernel_check_error():
  x = -np.ones(8, np.float32)
  with pl.enable_debug_checks():
    with pytest.raises(pl.KernelCheckError) as info:
      _wordy_call()(x)
    assert str(info.value) == WORDS
    with pytest.raises(pl.KernelCheckError) as info:   # under jax.jit: the same class and message
      jax.block_until_ready(jax.jit(_wordy_call())(x))
    assert str(info.value).splitlines()[0] == WORDS


def oob_kernel(x_ref, o_ref):
  i = pl.program_id(0)
  o_ref[...] = jnp.broadcast_to(x_ref[i * 5], (2,))     # program 2 reads x_ref[10]


def _oob_call():
  return pl.pallas_call(oob_kernel, out_shape=S((3, 2), jnp.float32), grid=(3,),
                        out_specs=pl.BlockSpec((None, 2), lambda i: (i, 0)))


def test_out_of_bounds_read_raises_index_error_with_the_same_message():
  x = np.zeros(10, np.float32)
  want = (f"pallas_call oob_kernel: out-of-bounds read from args[0] (block shape (10,)) at "
          f"{line_of(oob_kernel, 'x_ref[i * 5]')}: index 10 along dimension 0, which has size 10")
  with pytest.raises(IndexError) as info:
    _oob_call()(x)
  assert str(info.value) == want
  with pytest.raises(IndexError) as info:              # under jax.jit: the same class and message
    jax.block_until_ready(jax.jit(_oob_call())(x))
  assert str(info.value).splitlines()[0] == want


def gather_kernel(p_ref, x_ref, o_ref):
  o_ref[...] = x_ref[...]


def test_index_map_out_of_range_at_run_time_raises_index_error():
  gs = pl.PrefetchScalarGridSpec(
      num_scalar_prefetch=1, grid=(2,), in_specs=[pl.BlockSpec((4,), lambda i, p: (p[i],))],
      out_specs=pl.BlockSpec((4,), lambda i, p: (i,)))
  call = pl.pallas_call(gather_kernel, out_shape=S((8,), jnp.float32), grid_spec=gs)
  x, p = np.arange(8, dtype=np.float32), np.array([1, 7], np.int32)
  want = ("pallas_call gather_kernel: the index_map of args[1] returned 7 along dimension 0, "
          "outside 0..1 (shape (8,), block (4,))")
  with pytest.raises(IndexError) as info:
    call(p, x)
  assert str(info.value) == want
  with pytest.raises(IndexError) as info:              # under jax.jit: the same class and message
    jax.block_until_ready(jax.jit(call)(p, x))
  assert str(info.value).splitlines()[0] == want


def test_race_raises_kernel_check_error():
  def racy_kernel(x_ref, o_ref):
    o_ref[0] = x_ref[pl.program_id(0)]

  call = pl.pallas_call(racy_kernel, out_shape=S((2,), jnp.float32), grid=(4,),
                        interpret=pl.InterpretParams(detect_races=True))
  with pytest.raises(pl.KernelCheckError, match="race on out"):
    call(np.ones(4, np.float32))


def test_kind_of_reads_the_tag_and_defaults_to_kernel_check():
  def tagged(x):
    checks.check(x > 0, "x is {x}", checks.INDEX, x=x)
    return x

  def untagged(x):
    checkify.check(x > 0, "x is {x}", x=x)
    return x

  err, _ = checkify.checkify(tagged)(jnp.int32(-1))
  assert checks.kind_of(err.get_exception()) == checks.INDEX
  assert err.get() == "x is -1 (`check` failed)"   # the tag is not part of the message
  err, _ = checkify.checkify(untagged)(jnp.int32(-1))
  assert checks.kind_of(err.get_exception()) == checks.KERNEL_CHECK
  err, _ = jax.vmap(checkify.checkify(tagged))(jnp.array([1, -2], jnp.int32))
  assert checks.kind_of(err.get_exception()) == checks.INDEX

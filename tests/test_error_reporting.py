"""How errors reach the user (issue 30, points 2, 3 and 7): each mistake, its error class and
the first line of its message.

- Under jax.jit a check fails in a host callback; the exception keeps its class (it also
  subclasses jax.errors.JaxRuntimeError) and its message is pallax's, with one traceback.
- jax.experimental.pallas functions in a pallax kernel, and pallax's in a JAX Pallas kernel.
- Message details: no repeated kernel name, no 'barrier barrier', scratch buffers named by the
  kernel's parameters, 'pallax.KernelCheckError' in tracebacks, a Python if on a traced value.
"""
import functools
import inspect
import logging
import re
import traceback
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu
import helpers

pytestmark = pytest.mark.interpreter

S = jax.ShapeDtypeStruct
rand = functools.partial(helpers.rand, offset=3.0)   # around 3: positive


def at(fn, needle) -> str:
  """A regex of the line of ``fn`` containing ``needle`` as pallax writes it: 'file:line
  (function)', the function by its name or its qualified name."""
  lines, start = inspect.getsourcelines(fn)
  k = next(k for k, l in enumerate(lines) if needle in l)
  return re.escape(f"{inspect.getsourcefile(fn)}:{start + k}") + r" \([\w.<>]+\)"


def first_line(e) -> str:
  return str(e.value).splitlines()[0]


def matches(pattern_parts, text):
  """Whether ``text`` is the concatenation of ``pattern_parts``: plain strings, and regexes
  wrapped in a tuple."""
  rx = "".join(p[0] if isinstance(p, tuple) else re.escape(p) for p in pattern_parts)
  return re.fullmatch(rx, text, re.S) is not None


# --- point 2: checks failing inside jax.jit ------------------------------------------------------

def _gather(x_ref, i_ref, o_ref):
  o_ref[...] = x_ref[pl.ds(i_ref[0], 4)]          # <- dynamic start


def _gather_call():
  return pl.pallas_call(_gather, out_shape=S((4,), jnp.float32), interpret=True)


@pytest.mark.parametrize("calls", [1, 2])   # the second call runs the compiled executable again
def test_out_of_bounds_index_under_jit_is_an_index_error(calls, caplog):
  f = jax.jit(_gather_call())
  x = rand((8,))
  np.testing.assert_allclose(f(x, np.array([3], np.int32)), x[3:7], rtol=0, atol=0)
  for _ in range(calls):
    with caplog.at_level(logging.ERROR), pytest.raises(IndexError) as e:
      jax.block_until_ready(f(x, np.array([6], np.int32)))
  assert isinstance(e.value, jax.errors.JaxRuntimeError)
  assert matches(["pallas_call _gather: out-of-bounds read from args[0] (block shape (8,)) at ",
                  (at(_gather, '<- dynamic start'),),
                  ": index 9 along dimension 0, which has size 8"], first_line(e)), first_line(e)
  assert not [r for r in caplog.records if "callback failed" in r.getMessage()]
  text = "".join(traceback.format_exception(e.value))
  assert text.count("Traceback (most recent call last)") == 1, text
  assert "CpuCallback" not in text


def test_debug_check_under_jit_is_a_kernel_check_error():
  def k(x_ref, o_ref):
    pl.debug_check(jnp.all(x_ref[...] > 0), "x must be positive")
    o_ref[...] = jnp.sqrt(x_ref[...])

  with pl.enable_debug_checks():
    f = jax.jit(pl.pallas_call(k, out_shape=S((8,), jnp.float32), interpret=True))
    x = rand((8,))
    np.testing.assert_allclose(f(x), np.sqrt(x), rtol=1e-6, atol=0)
    with pytest.raises(pl.KernelCheckError) as e:
      jax.block_until_ready(f(-x))
  assert first_line(e) == "x must be positive"
  assert isinstance(e.value, jax.errors.JaxRuntimeError)
  assert traceback.format_exception_only(e.value)[0].startswith(
      "pallax.KernelCheckError: x must be positive")


def test_first_failing_call_under_jit_needs_no_hook():
  """Until a call succeeds, jax.jit runs the function through Python: the class is kept on the
  first call whatever the fast path does later."""
  f = jax.jit(_gather_call())
  with pytest.raises(IndexError) as e:
    jax.block_until_ready(f(rand((8,)), np.array([-1], np.int32)))
  assert isinstance(e.value, jax.errors.JaxRuntimeError)
  assert first_line(e).startswith("pallas_call _gather: out-of-bounds read from args[0]")


def test_mosaic_gpu_check_under_jit_is_a_kernel_check_error():
  x = rand((64, 32))

  def k(x_gmem, o_gmem, x_smem, x_barrier):
    plgpu.copy_gmem_to_smem(x_gmem, x_smem, x_barrier)
    o_gmem[...] = x_smem[...]                        # <- no wait

  run = plgpu.kernel(k, out_shape=S(x.shape, x.dtype), interpret=True,
                     scratch_shapes=[plgpu.SMEM(x.shape, x.dtype), plgpu.Barrier()])
  with pytest.raises(pl.KernelCheckError) as e:
    jax.block_until_ready(jax.jit(run)(x))
  assert matches(["k: the kernel of block (0) at ", (at(k, '<- no wait'),),
                  ": a load reads SMEM x_smem before waiting on the barrier of the "
                  "copy_gmem_to_smem into it (issued at ", (at(k, 'copy_gmem_to_smem('),),
                  "); call plgpu.barrier_wait first"], first_line(e)), first_line(e)


def test_mosaic_gpu_index_error_under_jit():
  x = rand((16,))

  def k(x_gmem, o_gmem):
    start = lax.axis_index("g") * 12                  # 0, then 12: past the end
    o_gmem[pl.ds(start, 8)] = x_gmem[:8]               # <- past the end

  run = plgpu.kernel(k, out_shape=S((16,), jnp.float32), grid=(2,), grid_names=("g",),
                     interpret=True)
  with pytest.raises(IndexError) as e:
    jax.block_until_ready(jax.jit(run)(x))
  assert isinstance(e.value, jax.errors.JaxRuntimeError)
  assert matches(["k: the kernel of block (g=1) at ", (at(k, '<- past the end'),),
                  ": out-of-bounds write to out[0] (shape (16,)): element (16,) of a view of "
                  "shape (8,)"], first_line(e)), first_line(e)


# --- point 3: JAX Pallas and pallax in one kernel -------------------------------------------------

def _jax_pallas():
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from jax.experimental import pallas as jpl
  return jpl


def test_jax_pallas_program_id_in_a_pallax_kernel():
  jpl = _jax_pallas()

  def k(x_ref, o_ref):
    o_ref[...] = x_ref[...] * jpl.program_id(0)      # <- JAX's

  with pytest.raises(ValueError) as e:
    pl.pallas_call(k, out_shape=S((8,), jnp.float32), grid=(2,), interpret=True)(rand((8,)))
  assert matches([
      "pallas_call k: the kernel calls program_id of jax.experimental.pallas at ", (at(k, '<- JAX'),),
      ", inside a pallax kernel (AssertionError from JAX Pallas: no message). JAX Pallas and "
      "pallax primitives do not mix in one kernel: import pallax in its place (import pallax as "
      "pl instead of from jax.experimental import pallas as pl; import pallax.triton as plgpu, "
      "import pallax.mosaic_gpu as plgpu)"], first_line(e)), first_line(e)


def test_jax_pallas_primitive_in_a_pallax_kernel():
  jpl = _jax_pallas()

  def k(x_ref, o_ref):
    i = jpl.multiple_of(pl.program_id(0) * 8, 8)     # <- JAX's
    o_ref[...] = x_ref[...] + i

  with pytest.raises(ValueError) as e:
    pl.pallas_call(k, out_shape=S((8,), jnp.float32), grid=(1,), interpret=True)(rand((8,)))
  assert matches([
      "pallas_call k: the kernel uses multiple_of of jax.experimental.pallas at ", (at(k, '<- JAX'),),
      ", inside a pallax kernel. JAX Pallas and pallax primitives do not mix", (".*",)],
      first_line(e)), first_line(e)


def test_pallax_program_id_in_a_jax_pallas_kernel():
  jpl = _jax_pallas()

  def k(x_ref, o_ref):
    o_ref[...] = x_ref[...] * pl.program_id(0)

  def run():
    call = jpl.pallas_call(k, out_shape=S((8,), jnp.float32), grid=(2,), interpret=True)
    return call(rand((8,)))                           # <- JAX's pallas_call

  with pytest.raises(ValueError) as e:
    run()
  assert matches([
      "pallax's pl.program_id is called inside a kernel that jax.experimental.pallas traces "
      "(its pallas_call is at ", (at(run, '<- JAX'),), "). JAX Pallas and pallax primitives do "
      "not mix in one kernel: run the kernel with pallax (import pallax as pl where pallas_call "
      "is called), or use jax.experimental.pallas's own functions in it"], first_line(e)), \
      first_line(e)


def test_program_id_outside_any_kernel_is_still_a_runtime_error():
  with pytest.raises(RuntimeError, match=r"pl.program_id can only be called inside a kernel body"):
    pl.program_id(0)


# --- point 7: message details ---------------------------------------------------------------------

def test_program_id_past_the_grid_names_the_kernel_once():
  def k(x_ref, o_ref):
    o_ref[...] = x_ref[...] * pl.program_id(5)       # <- axis 5

  with pytest.raises(ValueError) as e:
    pl.pallas_call(k, out_shape=S((8,), jnp.float32), grid=(2,), interpret=True)(rand((8,)))
  assert matches(["pallas_call k at ", (at(k, '<- axis 5'),), ": pl.program_id(5): the grid (2,) "
                  "has 1 axes; use an axis in [0, 1). (x_ref is args[0], o_ref is out[0])"],
                 first_line(e)), first_line(e)


def test_python_if_on_program_id_suggests_when():
  def k(x_ref, o_ref):
    if pl.program_id(0) == 0:                         # <- the if
      o_ref[...] = x_ref[...]

  with pytest.raises(TypeError) as e:
    pl.pallas_call(k, out_shape=S((8,), jnp.float32), grid=(2,), interpret=True)(rand((8,)))
  assert matches([
      "pallas_call k: a Python if, while, and, or or bool() on a traced value at ",
      (at(k, '<- the if'),), ": values computed from pl.program_id, Refs or operands are known "
      "only when the kernel runs. Use @pl.when(condition) for a block that runs conditionally, "
      "jax.lax.cond or jax.lax.fori_loop for control flow, jnp.where for values"],
      first_line(e)), first_line(e)


def test_empty_grid_suggests_cdiv():
  def k(x_ref, o_ref):
    o_ref[...] = x_ref[...]

  n, block = 1000, 1024
  with pytest.raises(ValueError) as e:
    pl.pallas_call(k, out_shape=S((n,), jnp.float32), grid=(n // block,),
                   in_specs=[pl.BlockSpec((block,), lambda i: (i,))],
                   out_specs=pl.BlockSpec((block,), lambda i: (i,)), interpret=True)(rand((n,)))
  assert first_line(e) == (
      "pallas_call k: grid=(0,) runs no program, so no output is written. A size of 0 usually "
      "comes from `n // block` with n < block: `pl.cdiv(n, block)` rounds up and covers the last, "
      "partial block (Pallas masks its out-of-bounds part)"), first_line(e)


def test_negative_grid_is_refused():
  with pytest.raises(ValueError, match=r"grid sizes must be positive, got grid=\(2, -1\)"):
    pl.pallas_call(lambda o_ref: None, out_shape=S((8,), jnp.float32), grid=(2, -1),
                   interpret=True)()


def test_kernel_check_error_prints_as_pallax_kernel_check_error():
  assert pl.KernelCheckError.__module__ == "pallax"
  err = pl.KernelCheckError("boom")
  assert traceback.format_exception_only(err) == ["pallax.KernelCheckError: boom\n"]


def _wait_forever(data_smem, bar, o_ref):
  plgpu.barrier_wait(bar)                           # <- waits forever
  o_ref[...] = data_smem[...]


def test_barrier_is_named_by_the_kernel_parameter():
  def k(o_ref):
    pl.run_scoped(lambda data_smem, bar: _wait_forever(data_smem, bar, o_ref),
                  plgpu.SMEM((8,), jnp.float32), plgpu.Barrier())

  run = plgpu.kernel(k, out_shape=S((8,), jnp.float32), interpret=True)
  with pytest.raises(pl.KernelCheckError) as e:
    run()
  msg = first_line(e)
  assert matches(["k: deadlock in block (0): every thread waits and nothing can arrive: the "
                  "kernel waits for barrier bar (phase 0, 0/1 arrivals) at ",
                  (at(_wait_forever, '<- waits forever'),)], msg), msg


def test_smem_is_named_by_the_kernel_parameter():
  def k(x_gmem, o_gmem, data_smem):
    o_gmem[...] = data_smem[...]

  with pl.enable_debug_checks(), pytest.raises(pl.KernelCheckError) as e:
    plgpu.kernel(k, out_shape=S((8,), jnp.float32), interpret=True,
                 scratch_shapes=[plgpu.SMEM((8,), jnp.float32)])(rand((8,)))
  assert "a load reads SMEM data_smem where nothing wrote it" in first_line(e), first_line(e)


def test_a_barrier_parameter_named_barrier_is_not_doubled():
  def k(o_ref):
    def step(i, _):
      pl.run_scoped(plgpu.barrier_arrive, plgpu.Barrier())   # completes; nobody waits
    lax.fori_loop(0, 2, step, None)
    o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)

  with pytest.raises(pl.KernelCheckError) as e:
    plgpu.kernel(k, out_shape=S((8,), jnp.float32), interpret=True)()
  assert re.search(r": the scope of barrier is entered again, and its last entry left 1 "
                   r"completion\(s\) nobody waited for", first_line(e)), first_line(e)

"""The interpreter's schedule: which axes run together must never change a result."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl

pytestmark = pytest.mark.interpreter


def _scratch_reads_before_write(x_ref, o_ref, s_ref):
  # Every program writes its own output block, so every program is a lane of its own and
  # starts with poisoned (NaN) scratch: axis 0 is evaluated together, axis 1 (which sets a
  # loop's trip count) in order, and neither may leak scratch from one program to the next.
  j = pl.program_id(1)
  first = s_ref[0]
  s_ref[...] = jnp.full(s_ref.shape, 1.0, jnp.float32)
  trips = lax.fori_loop(0, j + 1, lambda k, a: a + 1.0, 0.0)
  o_ref[...] = jnp.full(o_ref.shape, jnp.where(jnp.isnan(first), trips, -1.0))


def _run(params):
  x = jax.random.normal(jax.random.key(0), (2, 4, 8))
  spec = pl.BlockSpec((None, None, 8), lambda i, j: (i, j, 0))
  return pl.pallas_call(
      _scratch_reads_before_write, out_shape=jax.ShapeDtypeStruct((2, 4, 8), jnp.float32),
      grid=(2, 4), in_specs=[spec], out_specs=spec, scratch_shapes=[pl.ANY((8,), jnp.float32)],
      interpret=params)(x)


def test_scratch_starts_poisoned_in_each_lane_even_when_lanes_run_in_order():
  want = np.broadcast_to(np.arange(1, 5, dtype=np.float32)[None, :, None], (2, 4, 8))
  np.testing.assert_array_equal(_run(pl.InterpretParams()), want)
  np.testing.assert_array_equal(_run(pl.InterpretParams(parallel=False)), want)


def test_axes_that_set_trip_counts_run_in_order(capsys):
  def kernel(x_ref, o_ref):
    n = pl.program_id(1) + 1
    o_ref[...] = lax.fori_loop(0, n, lambda k, a: a + x_ref[...], jnp.zeros_like(x_ref))
  x = jax.random.normal(jax.random.key(1), (2, 3, 8))
  out = pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(2, 3),
      in_specs=[pl.BlockSpec((None, None, 8), lambda i, j: (i, j, 0))],
      out_specs=pl.BlockSpec((None, None, 8), lambda i, j: (i, j, 0)), debug=True, interpret=True)(x)
  assert "parallel axes (0,)" in capsys.readouterr().out
  np.testing.assert_allclose(out, x * np.arange(1, 4, dtype=np.float32)[None, :, None], rtol=1e-6)


def test_interpreter_takes_its_schedule_from_the_plan():
  from pallax._src import pallas_call as pcall
  from pallax._src import plan as kplan
  from pallax._src.interpret import interpreter

  def params_for(ip):
    x = jax.ShapeDtypeStruct((2, 3, 8), jnp.float32)
    spec = pl.BlockSpec((None, None, 8), lambda i, j: (i, j, 0))
    call = pl.pallas_call(
        lambda x_ref, o_ref: o_ref.__setitem__(..., lax.fori_loop(
            0, pl.program_id(1) + 1, lambda k, a: a + x_ref[...], jnp.zeros_like(x_ref))),
        out_shape=x, grid=(2, 3), in_specs=[spec], out_specs=spec, interpret=ip)
    jaxpr = jax.make_jaxpr(call)(x)
    return next(e.params["params"] for e in jaxpr.eqns if e.primitive is pcall.pallas_call_p)

  params = params_for(pl.InterpretParams())
  prep = interpreter.prepare(params)
  assert prep.plan is kplan.plan_for(params)
  assert prep.parallel == prep.plan.vectorize == (0,)   # axis 1 sets the loop's trip count
  assert prep.sequential == (1,) and prep.plan.schedule.parallel == (0, 1)
  for ip in (pl.InterpretParams(parallel=False), pl.InterpretParams(detect_races=True)):
    prep = interpreter.prepare(params_for(ip))
    assert prep.parallel == () and prep.sequential == (0, 1)

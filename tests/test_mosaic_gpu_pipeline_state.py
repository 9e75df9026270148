"""``emit_pipeline_warp_specialized``'s newer options (issue 27): ``manual_ready_barriers`` (JAX's
newer name of ``manual_produced_barriers``), ``pipeline_state`` with ``plgpu.PipelinePipeline``
(a sequence of pipelines: pallax runs each whole, which computes the same), its conditions in
JAX's words, and ``plgpu.TryClusterCancelResult`` (a type).

Integer sums are compared exactly, float32 differences with rtol=1e-6. Every plgpu kernel is
also lowered to Gluon for sm_90a here and compared on a GPU (tests/gluon_check.py).
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu

S = jax.ShapeDtypeStruct
# Semantics tests: on a GPU machine they run in the interpreter on the host, and each plgpu kernel
# also runs as Gluon on the GPU, compared with the interpreter (conftest.py, gluon_check.py).
pytestmark = pytest.mark.interpreter
BLK = 64


def _spec():
  return pl.BlockSpec((BLK, BLK), lambda i, j: (i, j))


@pytest.mark.parametrize("ready", ["manual_ready_barriers", "manual_produced_barriers", None])
def test_manual_ready_barriers_hand_the_body_one_barrier_per_input(ready):
  m, n = 128, 192
  x = np.asarray(jax.random.normal(jax.random.key(0), (m, n), jnp.float32)) + 3
  y = np.asarray(jax.random.normal(jax.random.key(1), (m, n), jnp.float32)) - 2

  def step(_, x_smem, y_smem, o_smem, *ready_barriers):
    if ready is not None:   # the body waits for its own inputs
      for b in ready_barriers:
        plgpu.barrier_wait(b)
    o_smem[...] = x_smem[...] - 2.0 * y_smem[...]

  def body(x_ref, y_ref, o_ref):
    kw = {ready: True} if ready else {}
    plgpu.emit_pipeline_warp_specialized(
        step, grid=(m // BLK, n // BLK), memory_registers=40, max_concurrent_steps=2,
        num_compute_wgs=1, wg_axis="wg", in_specs=[_spec(), _spec()], out_specs=[_spec()],
        **kw)(x_ref, y_ref, o_ref)

  f = plgpu.kernel(body, out_type=S((m, n), jnp.float32), num_threads=2, thread_name="wg",
                   interpret=True)
  np.testing.assert_allclose(f(x, y), x - 2 * y, rtol=1e-6)


@pytest.mark.parametrize("traced_state", [False, True])
def test_a_sequence_of_pipelines_sums_as_many_times(traced_state):
  m, n, rounds = 128, 128, 3
  x = np.asarray(jax.random.randint(jax.random.key(2), (m, n), -20, 30, jnp.int32))

  def body(x_ref, o_ref, acc):
    wg = lax.axis_index("wg")
    pl.when(wg == 0)(lambda: acc.__setitem__(..., jnp.zeros_like(acc)))

    def step(_, x_smem):
      acc[...] += x_smem[...]

    pipeline = functools.partial(
        plgpu.emit_pipeline_warp_specialized, step, grid=(m // BLK, n // BLK),
        memory_registers=40, max_concurrent_steps=2, num_compute_wgs=1, wg_axis="wg",
        in_specs=[_spec()])

    def run_all(allocs):
      if traced_state:   # START, STEADY..., STOP chosen in a loop
        @pl.loop(0, rounds)
        def _(i):
          state = jnp.where(i == 0, plgpu.PipelinePipeline.START, plgpu.PipelinePipeline.STEADY)
          state = jnp.where(i == rounds - 1, plgpu.PipelinePipeline.STOP, state)
          pipeline(pipeline_state=state)(x_ref, allocations=allocs)
      else:
        P = plgpu.PipelinePipeline
        for state in [P.START] + [P.STEADY] * (rounds - 2) + [P.STOP]:
          pipeline(pipeline_state=state)(x_ref, allocations=allocs)

    pl.run_scoped(run_all, pipeline().get_allocations(x_ref), collective_axes="wg")
    pl.when(wg == 0)(lambda: o_ref.__setitem__(..., acc[...]))

  f = plgpu.kernel(body, out_type=S((BLK, BLK), jnp.int32), num_threads=2, thread_name="wg",
                   scratch_types=[plgpu.SMEM((BLK, BLK), jnp.int32)], interpret=True)
  want = x.reshape(m // BLK, BLK, n // BLK, BLK).sum((0, 2)) * rounds
  np.testing.assert_array_equal(f(x), want)


def test_pipeline_state_conditions_carry_jaxs_words():
  def make(grid, delay=0):
    spec = plgpu.BlockSpec((BLK, BLK), lambda i, j: (i, j), delay_release=delay)

    def body(x_ref, o_ref):
      plgpu.emit_pipeline_warp_specialized(
          lambda *a: None, grid=grid, memory_registers=40, max_concurrent_steps=2,
          num_compute_wgs=1, wg_axis="wg", in_specs=[spec],
          pipeline_state=plgpu.PipelinePipeline.START)(x_ref)
    f = plgpu.kernel(body, out_type=S((8,), jnp.float32), num_threads=2, thread_name="wg",
                     interpret=True)
    return jax.make_jaxpr(f)(jnp.ones((3 * BLK, BLK), jnp.float32))

  with pytest.raises(NotImplementedError, match=r"only allowed when the number of steps .* "
                                                r"here 3\) is divisible by max_concurrent_steps=2"):
    make((3, 1))
  with pytest.raises(NotImplementedError, match="not supported with delay_release"):
    make((2, 1), delay=1)


def test_try_cluster_cancel_result_is_an_smem_type():
  one, four = plgpu.TryClusterCancelResult(), plgpu.TryClusterCancelResult(4)
  assert (one.shape, four.shape) == ((16,), (4, 16))
  assert one.dtype == jnp.int8 and one.memory_space == plgpu.SMEM
  assert [int(s) for s in plgpu.PipelinePipeline] == [0, 1, 2]

"""The Gluon backend reads a Ref before the barrier arrivals just ahead of the read
(``gluon/order.py``): the kernel's results stay the interpreter's (on a GPU: the
suite's comparison), and the operations the generated kernel makes (``gluon/events.py``)
show the new order on any machine."""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu
from pallax._src.gluon import events as ev
from pallax._src.gluon import order as gluon_order
from pallax._src.mosaic_gpu import primitives as mp

S = jax.ShapeDtypeStruct


def _release_then_read(x_ref, y_ref, o_ref, a_smem, b_smem, full, a_free, b_free):
  """Thread 0 fills a and b; thread 1 reads a, releases it, reads b, releases b (the order of
  JAX's attention backward: delta is read right after dO is released)."""
  t = lax.axis_index("wg")

  @pl.when(t == 0)
  def _():
    for step in range(2):
      if step:
        plgpu.barrier_wait(a_free)
        plgpu.barrier_wait(b_free)
      plgpu.copy_gmem_to_smem(x_ref.at[step], a_smem, full)
      plgpu.copy_gmem_to_smem(y_ref.at[step], b_smem, full)

  @pl.when(t == 1)
  def _():
    for step in range(2):
      plgpu.barrier_wait(full)
      a = a_smem[...]
      plgpu.barrier_arrive(a_free)
      b = b_smem[...]
      plgpu.barrier_arrive(b_free)
      o_ref[step] = a * 2.0 + b


def release_then_read(x, y, interpret=False):
  return plgpu.kernel(
      _release_then_read, out_shape=S(x.shape, x.dtype), num_threads=2, thread_name="wg",
      scratch_shapes=[plgpu.SMEM(x.shape[1:], x.dtype), plgpu.SMEM(y.shape[1:], y.dtype),
                      plgpu.Barrier(num_arrivals=2), plgpu.Barrier(), plgpu.Barrier()],
      interpret=interpret)(x, y)


def _consumer_events() -> list:
  """What thread 1 (the consumer) does, in order: (kind, barrier or SMEM buffer)."""
  x = S((2, 64, 32), jnp.float32)
  (k,) = plgpu.lower(release_then_read, x, x)
  return [(e.kind, e.barrier) if isinstance(e, ev.BarrierOp) else (e.kind, getattr(e.ref, "ref", e.ref))
          for e in k.generated.partitions[1].events]


def test_a_read_moves_above_the_arrivals_before_it():
  # Per step: a wait, then both reads, then both arrivals (the source order was read a,
  # arrive, read b, arrive), then the store of the result.
  step = [("wait", "barrier[0]"), ("load", "smem[0]"), ("load", "smem[1]"),
          ("arrive", "barrier[1]"), ("arrive", "barrier[2]"), ("store", "out[0]")]
  assert _consumer_events() == step * 2


def test_reads_move_above_arrivals_only():
  def kernel(x_ref, o_ref, smem, bar, done):
    plgpu.barrier_arrive(done)
    smem[...] = x_ref[...] + 1.0        # the read of x moves above the arrival, not the write
    plgpu.barrier_arrive(bar)
    o_ref[...] = smem[...]              # the read of smem moves above the arrival, not the write
  x = S((64, 32), jnp.float32)
  f = plgpu.kernel(kernel, out_shape=x, scratch_shapes=[plgpu.SMEM((64, 32), jnp.float32),
                                                         plgpu.Barrier(), plgpu.Barrier()])
  jaxpr = jax.make_jaxpr(f)(x).jaxpr
  (eqn,) = [e for e in jaxpr.eqns if "params" in e.params]
  body = eqn.params["params"].jaxpr
  names = lambda j: [e.primitive.name for e in _innermost(j)]  # noqa: E731
  assert names(body) == ["barrier_arrive", "get", "add", "swap", "barrier_arrive", "get", "swap"]
  assert names(gluon_order.hoist_reads(body)) == [
      "get", "barrier_arrive", "add", "swap", "get", "barrier_arrive", "swap"]


def _innermost(jaxpr):
  """The equations of the deepest sub-jaxpr holding a barrier_arrive."""
  from pallax._src import jaxpr_util
  for e in jaxpr.eqns:
    for sub in jaxpr_util.sub_jaxprs(e.params):
      found = _innermost(sub)
      if found:
        return found
  return jaxpr.eqns if any(e.primitive is mp.barrier_arrive_p for e in jaxpr.eqns) else []


def test_results_match_numpy():
  x = jax.random.normal(jax.random.key(3), (2, 64, 32), jnp.float32)
  y = jax.random.normal(jax.random.key(4), (2, 64, 32), jnp.float32)
  np.testing.assert_allclose(np.asarray(release_then_read(x, y)), np.asarray(x * 2.0 + y),
                             rtol=1e-6, atol=1e-6)

"""Waits for wgmmas in generated Gluon: an accumulator is waited for where it is read only if a
wgmma into it may still be in flight there, followed along loops (a wgmma of one iteration may be
in flight when the next begins) and branches (either branch may have run); a full wait right
after a wgmma replaces the wgmma's own. Checked through the
waits the backend records (``gluon/events.MmaWait``), and on a Hopper GPU against the
interpreter: a wait left out where one is needed reads a half-written accumulator."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu
from pallax._src.gluon import events as ev

T = 64   # one 64x64 tile: a, b and the output


def _kernel(body, named_grid: bool = False):
  """A kernel loading a (T, T) tile of ``a`` and of ``b`` into SMEM, running ``body(acc_ref,
  a_smem, b_smem, o_smem)`` in the scope of an accumulator, and storing ``o_smem``;
  ``named_grid``: in a grid of one program named x (its index known only at run time)."""
  def kernel(a_ref, b_ref, o_ref, a_smem, b_smem, o_smem, bar):
    plgpu.copy_gmem_to_smem(a_ref, a_smem, bar)
    plgpu.copy_gmem_to_smem(b_ref, b_smem, bar)
    plgpu.barrier_wait(bar)
    pl.run_scoped(lambda acc: body(acc, a_smem, b_smem, o_smem), plgpu.ACC((T, T)))
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_smem, o_ref)
    plgpu.wait_smem_to_gmem(0)

  def call(a, b, interpret=False):
    tile = lambda: plgpu.SMEM((T, T), jnp.float16)
    grid = {"grid": (1,), "grid_names": ("x",)} if named_grid else {}
    return plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((T, T), jnp.float32),
                        scratch_types=[tile(), tile(), plgpu.SMEM((T, T), jnp.float32),
                                       plgpu.Barrier(num_arrivals=2)],
                        interpret=interpret, **grid)(a, b)
  return call


def _waited_in_loop(acc, a, b, o):
  """Three wgmmas, each waited for in its iteration: nothing is in flight after the loop."""
  def step(i, _):
    plgpu.wgmma(acc, a, b)
    plgpu.wgmma_wait(0)
  lax.fori_loop(0, 3, step, None)
  o[...] = acc[...]


def _not_waited_in_loop(acc, a, b, o):
  """The last iteration's wgmma may be in flight after the loop: the read waits."""
  def step(i, _):
    plgpu.wgmma(acc, a, b)
  lax.fori_loop(0, 3, step, None)
  o[...] = acc[...]


def _read_in_loop(acc, a, b, o):
  """Each iteration reads what the previous one's wgmma wrote (in flight at the iteration's
  start), then adds another product; the sum of the partial sums read: 0 + P + 2P = 3P, plus
  the final 3P."""
  def step(i, _):
    o[...] = jnp.where(i == 0, 0.0, o[...]) + acc[...]
    plgpu.wgmma(acc, a, b)
  lax.fori_loop(0, 3, step, None)
  o[...] += acc[...]


def _in_a_branch(acc, a, b, o):
  """A wgmma in one branch of a run-time condition: the read after it waits."""
  @pl.when(lax.axis_index("x") == 0)
  def _():
    plgpu.wgmma(acc, a, b)
  o[...] = acc[...]


def _no_wgmma(acc, a, b, o):
  """An accumulator written and read without a wgmma: no wait at all."""
  acc[...] = jnp.full((T, T), 2.0, jnp.float32)
  o[...] = acc[...] + a[...].astype(jnp.float32)


# Each kernel, and the waits its code makes in order (how many wgmmas each lets stay in flight):
# a wgmma is followed by a wait that lets it run on (1), or, where the full wait comes next
# anyway, by the full wait itself (0, in its place).
KERNELS = {
    "waited_in_loop": (_kernel(_waited_in_loop), [0]),
    "not_waited_in_loop": (_kernel(_not_waited_in_loop), [1, 0]),
    "read_in_loop": (_kernel(_read_in_loop), [0, 1, 0]),
    "in_a_branch": (_kernel(_in_a_branch, named_grid=True), [1, 0]),
    "no_wgmma": (_kernel(_no_wgmma), []),
}


def _inputs(seed):
  ka, kb = jax.random.split(jax.random.key(seed))
  return (jax.random.normal(ka, (T, T), jnp.float16), jax.random.normal(kb, (T, T), jnp.float16))


@pytest.mark.parametrize("name", KERNELS)
def test_reads_wait_only_for_wgmmas_that_may_be_in_flight(name):
  fn, waits = KERNELS[name]
  s = jax.ShapeDtypeStruct((T, T), jnp.float16)
  (k,) = plgpu.lower(fn, s, s)
  events = [e for e in k.generated.partitions[0].events if isinstance(e, (ev.MmaWait, ev.Wgmma))]
  assert [e.outstanding for e in events if isinstance(e, ev.MmaWait)] == waits
  # Each wgmma is followed at once by a wait (so that at most it stays in flight).
  for i, e in enumerate(events):
    if isinstance(e, ev.Wgmma):
      assert isinstance(events[i + 1], ev.MmaWait)


@pytest.mark.parametrize("name", KERNELS)
def test_the_interpreter_computes_the_products(name):
  fn, _ = KERNELS[name]
  a, b = _inputs(3)
  p = np.asarray(a, np.float32) @ np.asarray(b, np.float32)
  want = {"waited_in_loop": 3 * p, "not_waited_in_loop": 3 * p, "read_in_loop": 6 * p,
          "in_a_branch": p, "no_wgmma": 2.0 + np.asarray(a, np.float32)}[name]
  got = np.asarray(fn(a, b, interpret=True))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def _on_hopper() -> bool:
  try:
    return any(getattr(d, "compute_capability", "") == "9.0" for d in jax.devices("gpu"))
  except RuntimeError:
    return False


@pytest.mark.gpu
@pytest.mark.skipif(not _on_hopper(), reason="needs a Hopper GPU")
@pytest.mark.parametrize("name", KERNELS)
def test_on_the_gpu_matches_the_interpreter(name):
  fn, _ = KERNELS[name]
  a, b = _inputs(5)
  got = np.asarray(jax.jit(fn)(a, b))
  want = np.asarray(fn(a, b, interpret=True))
  # wgmma sums in float32 in its own order: elementwise, relative to the output's scale.
  np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3 * float(np.abs(want).max()))

"""Kernels with named axes under ``jax_enable_checks`` (JAX's test base class turns it on, and
users debug with it).

With checks on, JAX type-checks every jaxpr it finishes tracing, ``lax.axis_index`` equations
included, and those need their axis names bound. pallax binds a kernel's cluster and thread names
around the whole trace (and around the retrace that ``jax.vmap`` makes), so the check passes.
Each test turns checks on and restores the flag afterwards.

Inputs are random (jax.random, fixed keys, never zeros); copies and integer results are compared
exactly, float32 sums with rtol=1e-6 (only the summation order may differ).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu

S = jax.ShapeDtypeStruct
EXACT = dict(rtol=0, atol=0)


@pytest.fixture
def checks_on():
  old = jax.config.jax_enable_checks
  jax.config.update("jax_enable_checks", True)
  try:
    yield
  finally:
    jax.config.update("jax_enable_checks", old)


def rand(seed, shape, dtype=jnp.float32):
  x = jax.random.normal(jax.random.key(seed), shape, jnp.float32) + 3.0
  return np.asarray(x.astype(dtype))


def _named_axes_kernel(blocks, threads, width):
  """Each (block, thread) writes its row of ``x * 2`` plus a code of its grid, cluster and
  thread indices and the thread axis's size."""
  def body(x_ref, o_ref):
    b, c, t = lax.axis_index("b"), lax.axis_index("c"), lax.axis_index("wg")
    code = 1000 * b + 100 * c + t + 10 * lax.axis_size("wg")
    o_ref[b, t] = x_ref[b, t] * 2.0 + code.astype(jnp.float32)

  return plgpu.kernel(body, out_shape=S((blocks, threads, width), jnp.float32), grid=(blocks,),
                      grid_names=("b",), cluster=(1,), cluster_names=("c",), num_threads=threads,
                      thread_name="wg")


def _named_axes_want(x):
  blocks, threads, _ = x.shape
  code = 1000 * np.arange(blocks)[:, None, None] + np.arange(threads)[None, :, None] + 10 * threads
  return x * 2.0 + code.astype(np.float32)


@pytest.mark.parametrize("blocks,threads,width", [(3, 2, 16), (1, 3, 8), (5, 1, 24)])
def test_thread_and_cluster_axis_index_under_checks(checks_on, blocks, threads, width):
  assert jax.config.jax_enable_checks
  x = rand(1, (blocks, threads, width))
  f = _named_axes_kernel(blocks, threads, width)
  np.testing.assert_allclose(f(x), _named_axes_want(x), **EXACT)


def test_jit_of_a_threaded_kernel_under_checks(checks_on):
  x = rand(2, (3, 2, 16))
  f = jax.jit(_named_axes_kernel(3, 2, 16))
  np.testing.assert_allclose(f(x), _named_axes_want(x), **EXACT)


def test_vmap_of_a_threaded_kernel_under_checks(checks_on):
  xs = rand(3, (3, 2, 2, 16))   # a batch of 3
  f = _named_axes_kernel(2, 2, 16)
  got = jax.vmap(f)(xs)
  np.testing.assert_allclose(got, np.stack([_named_axes_want(x) for x in xs]), **EXACT)


def test_barrier_handoff_between_threads_under_checks(checks_on):
  """Thread 0 copies a block into SMEM; both threads wait on the barrier and write halves."""
  x = rand(4, (3 * 16, 16))

  def body(x_ref, o_ref, smem, bar):
    i, t = lax.axis_index("b"), lax.axis_index("t")

    @pl.when(t == 0)
    def _():
      plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(i * 16, 16)], smem, bar)

    plgpu.barrier_wait(bar)
    o_ref[pl.ds(i * 16 + t * 8, 8)] = smem[pl.ds(t * 8, 8)] + 1.0

  f = plgpu.kernel(body, out_shape=S(x.shape, x.dtype), grid=(3,), grid_names=("b",),
                   num_threads=2, thread_name="t",
                   scratch_shapes=[plgpu.SMEM((16, 16), jnp.float32), plgpu.Barrier()])
  np.testing.assert_allclose(f(x), x + 1.0, **EXACT)


@pytest.mark.parametrize("steps", [1, 5])
def test_warp_specialized_pipeline_under_checks(checks_on, steps):
  """Two compute threads each sum their half of the columns over ``steps`` row blocks; a
  memory thread feeds them (emit_pipeline_warp_specialized names the thread axis)."""
  x = rand(5, (steps * 8, 64))

  def kernel(x_gmem, o_gmem):
    wg = lax.axis_index("wg")
    cols = pl.ds(wg * 32, 32)

    def body(idxs, x_smem, acc):
      return acc + x_smem[:, cols]

    def compute_context(pipeline):
      o_gmem[:, cols] = pipeline(jnp.zeros((8, 32), jnp.float32))

    plgpu.emit_pipeline_warp_specialized(
        body, grid=(steps,), in_specs=[plgpu.BlockSpec((8, 64), lambda k: (k, 0))],
        compute_context=compute_context, memory_registers=40, wg_axis="wg", num_compute_wgs=2,
        max_concurrent_steps=2)(x_gmem)

  f = plgpu.kernel(kernel, out_shape=S((8, 64), jnp.float32), num_threads=3, thread_name="wg")
  want = x.astype(np.float64).reshape(steps, 8, 64).sum(0)
  np.testing.assert_allclose(f(x), want, rtol=1e-6, atol=0)


def test_pl_kernel_named_mesh_axis_index_under_checks(checks_on):
  x = rand(6, (7, 24))   # 7 programs, one row each: not a power of two

  def body(x_ref, o_ref):
    i = lax.axis_index("row")
    o_ref[i] = x_ref[i] + i.astype(jnp.float32)

  f = pl.kernel(body, out_type=S(x.shape, x.dtype), mesh=pl.Mesh((7,), ("row",)))
  np.testing.assert_allclose(f(x), x + np.arange(7, dtype=np.float32)[:, None], **EXACT)

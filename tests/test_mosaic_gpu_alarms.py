"""Interpreter checks against what JAX and the GPU do (issue 27, points 5 and 6).

5. A check that fires where JAX's program is right is a false alarm, fixed here; one that fires
   where JAX's program races is kept, with the evidence:
   - a TMA box over 256 elements: refused only where Mosaic GPU copies with a tiled TMA box
     (its own "Async copies only support copying <=256 elements" error); a contiguous copy it
     makes as one bulk copy (``cp.async.bulk``: stores, and loads with
     ``OOBFillMode.UNDEFINED``/``PROMISE_IN_BOUNDS``) runs, as JAX's test_pipeline_oob_mode does;
   - SMEM written from registers and then stored by TMA without ``commit_smem`` (JAX's
     test_get_swap_with_transforms, test_warp_specialized_transpose): a real race, kept.
6. Copy type errors carry JAX's words ("Expected dtypes to match", "Expected source shape to
   be ...", "Expected shapes to match") before pallax's own.

Copies are compared exactly, on random inputs.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax as pl
import pallax.mosaic_gpu as plgpu
from pallax import KernelCheckError

S = jax.ShapeDtypeStruct
# Semantics tests: on a GPU machine they run in the interpreter on the host, and each plgpu kernel
# also runs as Gluon on the GPU, compared with the interpreter (conftest.py, gluon_check.py).
pytestmark = pytest.mark.interpreter


def ints(seed, shape, dtype=jnp.int32):
  x = jax.random.randint(jax.random.key(seed), shape, -100, 100, jnp.int32)
  return np.asarray(x).astype(dtype)


def one_step_copy(n, dtype, fill):
  def kernel(x_gmem, o_gmem):
    def body(_, x_smem, o_smem):
      o_smem[...] = x_smem[...] * 3
    plgpu.emit_pipeline(
        body, grid=(1,), max_concurrent_steps=1,
        in_specs=[plgpu.BlockSpec((n,), lambda i: (i,), oob_fill_mode=fill)],
        out_specs=[plgpu.BlockSpec((n,), lambda i: (i,))])(x_gmem, o_gmem)
  return plgpu.kernel(kernel, out_type=S((n,), dtype), interpret=True)


@pytest.mark.parametrize("fill", [plgpu.OOBFillMode.UNDEFINED, plgpu.OOBFillMode.PROMISE_IN_BOUNDS])
def test_a_bulk_copy_of_512_bytes_runs(fill):
  x = ints(0, (512,), jnp.int8)
  np.testing.assert_array_equal(one_step_copy(512, jnp.int8, fill)(x), x * 3)


def test_the_same_copy_filling_zeros_is_a_tiled_tma_box_and_refused():
  x = ints(1, (512,), jnp.int8)
  with pytest.raises(KernelCheckError, match=r"copy_gmem_to_smem: TMA copies at most 256 .*"
                     r"\(512,\) \(JAX: Async copies only support copying <=256 elements"):
    one_step_copy(512, jnp.int8, plgpu.OOBFillMode.ZEROS)(x)


def _store(x, smem_types, reduction=None):
  @plgpu.kernel(out_type=S(x.shape, x.dtype), interpret=True, scratch_types=smem_types)
  def store(x_ref, o_ref, smem):
    smem[...] = x_ref[...] + 1
    plgpu.commit_smem()
    if reduction:
      o_ref[...] = x_ref[...]
    plgpu.copy_smem_to_gmem(smem, o_ref, reduction_op=reduction)
    plgpu.wait_smem_to_gmem(0)
  return store(x)


def test_a_contiguous_store_of_512_rows_runs_and_a_reducing_one_is_a_tma_box():
  x = ints(2, (512, 16))
  np.testing.assert_array_equal(_store(x, [plgpu.SMEM((512, 16), jnp.int32)]), x + 1)
  with pytest.raises(KernelCheckError, match=r"TMA copies at most 256 .* \(512, 16\)"):
    _store(x, [plgpu.SMEM((512, 16), jnp.int32)], reduction="add")


def test_a_tiled_buffer_is_never_a_bulk_copy():
  x = ints(3, (512, 32))
  tiled = plgpu.SMEM((512, 32), jnp.int32, transforms=(plgpu.TilingTransform((8, 32)),))
  np.testing.assert_array_equal(_store(x, [tiled]), x + 1)   # tiles of 8 rows: fine
  with pytest.raises(KernelCheckError, match=r"TMA copies at most 256 .* \(1, 1, 1, 512\)"):
    _store(x.reshape(1, 512 * 32)[:, :512], [plgpu.SMEM(
        (1, 512), jnp.int32, transforms=(plgpu.TilingTransform((1, 512)),))])


def test_a_tma_store_of_uncommitted_register_writes_stays_an_error():
  """JAX's test_get_swap_with_transforms writes SMEM from registers and stores it with TMA,
  without commit_smem. Nothing in JAX's lowering orders them: copy_smem_to_gmem's lowering
  (Mosaic GPU's LaunchContext.async_copy) emits no fence, and only plgpu.commit_smem emits
  ``fence.proxy.async.shared::cta`` and a warpgroup barrier (mosaic/gpu/utils.commit_shared).
  The PTX memory model makes writes of the generic proxy visible to the async proxy (TMA) only
  through such a fence, and the TMA is issued by one thread while 127 others may still be
  writing. That it passes on an H100 is timing; the check stays."""
  x = ints(4, (128, 128))

  @plgpu.kernel(out_type=S(x.shape, x.dtype), interpret=True,
                scratch_types=[plgpu.SMEM(x.shape, x.dtype), plgpu.Barrier()])
  def doubled(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    smem[...] = smem[...] * 2
    plgpu.copy_smem_to_gmem(smem, o_ref)
    plgpu.wait_smem_to_gmem(0)

  with pytest.raises(KernelCheckError, match="without plgpu.commit_smem"):
    doubled(x)


# --- 6. JAX's words -----------------------------------------------------------------------------

def _copy(direction, gmem, smem):
  @plgpu.kernel(out_type=S(gmem.shape, gmem.dtype), interpret=True,
                scratch_types=[plgpu.SMEM(smem.shape, smem.dtype), plgpu.Barrier()])
  def k(o_ref, smem_ref, bar):
    if direction == "in":
      plgpu.copy_gmem_to_smem(o_ref, smem_ref, bar)
    else:
      plgpu.copy_smem_to_gmem(smem_ref, o_ref)
  return jax.make_jaxpr(k)()


@pytest.mark.parametrize("direction, gmem, smem, words", [
    ("in", S((128,), jnp.float32), S((256,), jnp.float32),
     r"copy_gmem_to_smem: Expected source shape to be \(256,\), but got \(128,\)"),
    ("out", S((128,), jnp.float32), S((256,), jnp.float32),
     r"copy_smem_to_gmem: Expected shapes to match, but src has shape \(256,\) and dst has shape "
     r"\(128,\)"),
    ("in", S((256,), jnp.bfloat16), S((256,), jnp.float32),
     r"Expected dtypes to match but src had type bfloat16 and dst had type float32"),
    ("out", S((256,), jnp.bfloat16), S((256,), jnp.float32),
     r"Expected dtypes to match but src had type float32 and dst had type bfloat16"),
])
def test_copy_type_errors_carry_jaxs_words(direction, gmem, smem, words):
  with pytest.raises(ValueError, match=words + r".*the source is .* but the destination is"):
    _copy(direction, gmem, smem)


def _k_loop_matmul(wait_in_body: bool):
  m, k, n, bk = 64, 256, 64, 64
  a = np.asarray(jax.random.normal(jax.random.key(5), (m, k), jnp.float16))
  b = np.asarray(jax.random.normal(jax.random.key(6), (k, n), jnp.float16))

  def kernel(a_gmem, b_gmem, o_gmem):
    def scope(acc_ref):
      def step(_, a_smem, b_smem):
        plgpu.wgmma(acc_ref, a_smem, b_smem)
        if wait_in_body:
          plgpu.wgmma_wait(1)   # the previous step's wgmma is done before its slot is refilled
      plgpu.emit_pipeline(
          step, grid=(k // bk,), max_concurrent_steps=2,
          in_specs=[plgpu.BlockSpec((m, bk), lambda i: (0, i), delay_release=1),
                    plgpu.BlockSpec((bk, n), lambda i: (i, 0), delay_release=1)])(a_gmem, b_gmem)
      return acc_ref[...]
    o_gmem[...] = pl.run_scoped(scope, plgpu.ACC((m, n)))

  out = plgpu.kernel(kernel, out_type=S((m, n), jnp.float32), interpret=True)(a, b)
  want = np.dot(a.astype(np.float32), b.astype(np.float32))
  np.testing.assert_allclose(out, want, rtol=1e-3, atol=1e-3)


def test_refilling_the_slot_of_an_unawaited_wgmma_stays_an_error():
  """JAX's ragged_dot (ops/gpu/ragged_dot_mgpu.py) pipelines its K loop with delay_release=1 and
  a body that issues a wgmma and never waits: after step s's body the pipeline refills the slot
  of step s-1, whose wgmma nothing awaited (JAX's wgmma lowering emits wgmma.fence and
  commit_group only; its one wait_group is at the end of the accumulator's run_state). The PTX
  ISA leaves the SMEM operands of a wgmma.mma_async undefined to write until a wgmma.wait_group
  covers it: a real race, which passes on an H100 because the wgmmas of one accumulator finish
  in order, well before the next TMA lands. CUTLASS's Hopper mainloops release a stage only after
  a warpgroup_wait covering the MMA that read it. The check stays; a wgmma_wait(1) in the body makes
  the program right (and pallax's Gluon kernels wait so after every wgmma anyway)."""
  with pytest.raises(KernelCheckError, match="copy_gmem_to_smem overwrites .* while a wgmma"):
    _k_loop_matmul(wait_in_body=False)
  _k_loop_matmul(wait_in_body=True)


@pytest.mark.parametrize("b_shape, b_dtype, words", [
    ((32, 64), jnp.float16, r"Incompatible shapes for matrix multiplication: lhs=\(64, 48\), "
                            r"rhs=\(32, 64\), acc=\(64, 64\)"),
    ((48, 64), jnp.bfloat16, r"Mixed input dtypes for matrix multiplication unsupported: "
                             r"lhs=float16, rhs=bfloat16"),
])
def test_wgmma_type_errors_carry_jaxs_words(b_shape, b_dtype, words):
  @plgpu.kernel(out_type=S((64, 64), jnp.float32), interpret=True,
                scratch_types=[plgpu.SMEM((64, 48), jnp.float16), plgpu.SMEM(b_shape, b_dtype)])
  def k(o_ref, a_smem, b_smem):
    def compute(acc_ref):
      plgpu.wgmma(acc_ref, a_smem, b_smem)
      return acc_ref[...]
    o_ref[...] = pl.run_scoped(compute, plgpu.ACC((64, 64)))

  with pytest.raises(ValueError, match=words):
    jax.make_jaxpr(k)()

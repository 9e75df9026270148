"""JAX Mosaic GPU programs that pallax's interpreter once got wrong or refused (issue 27), each
checked against plain jnp on random inputs."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax as pl
import pallax.mosaic_gpu as plgpu


# --- input_output_aliases: the aliased input and output are one buffer ----------------------

@pytest.mark.parametrize("shape", [(64, 64), (50, 70)], ids=["exact", "odd"])
def test_kernel_writing_the_aliased_input_ref_changes_the_output(shape):
  """JAX's idiom: write through the input's Ref and ignore the output's."""
  x = jax.random.normal(jax.random.key(1), shape, jnp.float32)

  @functools.partial(
      pl.pallas_call, out_shape=jax.ShapeDtypeStruct(shape, jnp.float32),
      in_specs=[plgpu.BlockSpec(memory_space=plgpu.GMEM)],
      out_specs=plgpu.BlockSpec(memory_space=plgpu.GMEM),
      input_output_aliases={0: 0}, compiler_params=plgpu.CompilerParams(), interpret=True)
  def kernel(x_ref, o_ref):
    del o_ref
    x_ref[...] = x_ref[...] * 3.0 - 1.0

  np.testing.assert_allclose(kernel(x), x * 3.0 - 1.0, rtol=1e-6, atol=1e-6)


def test_kernel_writing_both_aliased_refs_is_refused():
  x = jax.random.normal(jax.random.key(2), (8, 128), jnp.float32)

  @functools.partial(pl.pallas_call, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                     input_output_aliases={0: 0}, interpret=True)
  def kernel(x_ref, o_ref):
    x_ref[...] = x_ref[...] + 1.0
    o_ref[...] = x_ref[...] * 2.0

  with pytest.raises(NotImplementedError, match="writes both args"):
    kernel(x)


def test_mosaic_gpu_kernel_writing_the_aliased_input_ref_changes_the_output():
  """The same in a kernel with Mosaic GPU primitives (a TMA copy into SMEM and back)."""
  x = jax.random.normal(jax.random.key(3), (64, 128), jnp.float32)

  @functools.partial(
      pl.pallas_call, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      in_specs=[plgpu.BlockSpec(memory_space=plgpu.GMEM)],
      out_specs=plgpu.BlockSpec(memory_space=plgpu.GMEM),
      input_output_aliases={0: 0}, compiler_params=plgpu.CompilerParams(), interpret=True)
  def kernel(x_ref, o_ref):
    del o_ref
    def body(smem, bar):
      plgpu.copy_gmem_to_smem(x_ref, smem, bar)
      plgpu.barrier_wait(bar)
      smem[...] = jnp.exp(smem[...])
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(smem, x_ref)
      plgpu.wait_smem_to_gmem(0)
    pl.run_scoped(body, plgpu.SMEM(x.shape, x.dtype), plgpu.Barrier())

  np.testing.assert_allclose(kernel(x), jnp.exp(x), rtol=1e-6)


# --- rounding in registers (Gluon: libdevice rint / round) ----------------------------------

@pytest.mark.parametrize("method", [0, 1], ids=["away", "even"])
def test_round_in_a_mosaic_gpu_kernel(method):
  # half-way values included: the two methods differ exactly there
  x = jax.random.uniform(jax.random.key(4), (128,), jnp.float32, -8, 8)
  x = x.at[:8].set(jnp.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.0, -7.5]))

  @functools.partial(plgpu.kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))
  def kernel(x_ref, o_ref):
    o_ref[...] = jax.lax.round(x_ref[...], jax.lax.RoundingMethod(method))

  want = jnp.round(x) if method == 1 else jnp.sign(x) * jnp.floor(jnp.abs(x) + 0.5)
  np.testing.assert_array_equal(kernel(x), want)


# --- reductions over several axes (Gluon: one reduction per axis) ---------------------------

@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_reduction_over_several_axes(op):
  axes = (0, 1)   # the whole tile to a scalar (register accesses of rank-3 GMEM do not lower yet)
  x = jax.random.normal(jax.random.key(5), (64, 128), jnp.float32)
  ref = getattr(jnp, op)
  out_shape = jax.eval_shape(lambda v: ref(v, axis=axes), x)

  @functools.partial(plgpu.kernel, out_shape=out_shape)
  def kernel(x_ref, o_ref):
    o_ref[...] = ref(x_ref[...], axis=axes)

  np.testing.assert_allclose(kernel(x), ref(x, axis=axes), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axes", [(0, 2), (1, 2), (0, 1)])
def test_reduction_over_several_axes_of_a_rank3_tile_from_smem(axes):
  x = jax.random.normal(jax.random.key(6), (2, 16, 128), jnp.float32)
  out_shape = jax.eval_shape(lambda v: jnp.sum(v, axis=axes), x)

  @functools.partial(plgpu.kernel, out_shape=out_shape,
                     scratch_shapes=[plgpu.SMEM(x.shape, x.dtype), plgpu.Barrier()])
  def kernel(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    o_ref[...] = jnp.sum(smem[...], axis=axes)

  np.testing.assert_allclose(kernel(x), jnp.sum(x, axis=axes), rtol=1e-5, atol=1e-4)


# --- a predicated-off TMA load still arrives on its barrier ---------------------------------

def test_predicated_off_copy_still_completes_the_barrier():
  """Block 1's copy is predicated off; its barrier_wait must not hang (Mosaic GPU arrives with
  no bytes), and its SMEM keeps the zeros the kernel wrote."""
  x = jax.random.normal(jax.random.key(7), (256,), jnp.float32)

  @functools.partial(plgpu.kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                     grid=(2,), grid_names=("b",),
                     scratch_shapes=[plgpu.SMEM((128,), jnp.float32), plgpu.Barrier()])
  def kernel(x_ref, o_ref, smem, bar):
    smem[...] = jnp.zeros_like(smem)
    plgpu.commit_smem()
    b = jax.lax.axis_index("b")
    half = pl.ds(b * 128, 128)
    plgpu.copy_gmem_to_smem(x_ref.at[half], smem, bar, predicate=b == 0)
    plgpu.barrier_wait(bar)
    plgpu.copy_smem_to_gmem(smem, o_ref.at[half])
    plgpu.wait_smem_to_gmem(0)

  out = kernel(x)
  np.testing.assert_array_equal(out[:128], x[:128])
  np.testing.assert_array_equal(out[128:], jnp.zeros(128))


@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_reduction_over_several_axes_of_a_padded_int_tile(op):
  """A tile Gluon pads to powers of two: the padding must not join the reduction."""
  x = jax.random.randint(jax.random.key(8), (24, 100), -1000, 1000, jnp.int32)
  ref = getattr(jnp, op)

  @functools.partial(plgpu.kernel, out_shape=jax.ShapeDtypeStruct((), jnp.int32))
  def kernel(x_ref, o_ref):
    o_ref[...] = ref(x_ref[...], axis=(0, 1))

  np.testing.assert_array_equal(kernel(x), ref(x))

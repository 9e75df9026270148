"""Code written for JAX's Mosaic GPU ``pallas_call`` path (``plgpu.BlockSpec`` with transforms,
``plgpu.CompilerParams``) runs on pallax's other backends: the interpreter, and Triton on a GPU
(CI lowers it to PTX), where the transforms are layout hints."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax as pl
import pallax.mosaic_gpu as plgpu


def _add_with_mosaic_specs(x, y):
  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + 2 * y_ref[...]
  transforms = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
  spec = plgpu.BlockSpec((64, 64), lambda i, j: (i, j), transforms=transforms)
  return pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(pl.cdiv(x.shape[0], 64), pl.cdiv(x.shape[1], 64)),
      in_specs=[spec, spec], out_specs=spec,
      compiler_params=plgpu.CompilerParams(max_concurrent_steps=2,
                                           dimension_semantics=("parallel", "parallel")))(x, y)


@pytest.mark.parametrize("shape", [(128, 192), (100, 70)], ids=["exact", "partial_blocks"])
def test_pallas_call_with_mosaic_gpu_specs(shape):
  kx, ky = jax.random.split(jax.random.key(shape[0]))
  x = jax.random.normal(kx, shape, jnp.float16)
  y = jax.random.normal(ky, shape, jnp.float16)
  got = np.asarray(_add_with_mosaic_specs(x, y), np.float32)
  want = np.asarray(x, np.float32) + 2 * np.asarray(y, np.float32)
  np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)


def test_mosaic_gpu_kernel_asks_for_the_interpreter_where_a_gpu_backend_would_run_it(monkeypatch):
  from pallax._src import backends
  fake = backends.Backend("triton", ("cpu",), object, None, lambda: True)
  monkeypatch.setattr(backends, "choose", lambda params, platform: None if params.interpret else fake)
  monkeypatch.setattr(backends, "for_kind", lambda kind, platform: None)   # no Gluon here
  f = plgpu.kernel(lambda o_ref: o_ref.__setitem__(..., jnp.ones(128)),
                   out_type=jax.ShapeDtypeStruct((128,), jnp.float32))
  with pytest.raises(NotImplementedError, match="need the Gluon backend.*pass interpret=True"):
    f()
  g = plgpu.kernel(lambda o_ref: o_ref.__setitem__(..., jnp.ones(128)),
                   out_type=jax.ShapeDtypeStruct((128,), jnp.float32), interpret=True)
  np.testing.assert_array_equal(np.asarray(g()), np.ones(128))


@pytest.mark.interpreter
def test_vmap_of_a_mosaic_gpu_kernel_adds_a_grid_axis():
  from jax import lax

  def body(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(lax.axis_index("x") * 64, 64)], smem, bar)
    plgpu.barrier_wait(bar)
    o_ref[pl.ds(lax.axis_index("x") * 64, 64)] = smem[...] * 3 + lax.axis_index("x").astype(jnp.float32)

  f = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((192,), jnp.float32), grid=(3,),
                   grid_names=("x",), scratch_types=[plgpu.SMEM((64,), jnp.float32), plgpu.Barrier()])
  x = jax.random.normal(jax.random.key(1), (5, 192))
  want = np.asarray(x) * 3 + np.repeat(np.arange(3, dtype=np.float32), 64)
  np.testing.assert_allclose(np.asarray(jax.vmap(f)(x)), want, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(f))(x)), want, rtol=1e-6)


@pytest.mark.interpreter
def test_core_map_over_a_mosaic_gpu_mesh_with_threads():
  from jax import lax
  out = jax.new_ref(jnp.zeros((3, 128), jnp.float32))

  @pl.core_map(plgpu.Mesh(grid=(3,), grid_names=("b",), num_threads=2, thread_name="t"))
  def _():
    t, b = lax.axis_index("t"), lax.axis_index("b")

    @pl.when(t == 1)
    def _():
      out[b] = jnp.full((128,), b * 10 + lax.axis_size("t"), jnp.float32)

  np.testing.assert_array_equal(np.asarray(out[...])[:, 0], [2, 12, 22])


@pytest.mark.interpreter
def test_lax_axis_index_in_pl_kernel_over_a_named_mesh():
  from jax import lax

  @pl.kernel(out_type=jax.ShapeDtypeStruct((4, 8), jnp.float32), mesh=pl.Mesh((4,), ("x",)))
  def k(o_ref):
    i = lax.axis_index("x")
    o_ref[i] = jnp.full((8,), i * 10 + lax.axis_size("x"), jnp.float32)

  np.testing.assert_array_equal(np.asarray(k())[:, 0], [4, 14, 24, 34])
  np.testing.assert_array_equal(np.asarray(jax.jit(k)())[:, 0], [4, 14, 24, 34])

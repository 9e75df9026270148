"""The compile path and launch plan both GPU backends share (pallax/_src/gpu/compile.py, plan.py):
each backend's kernels come back from the disk cache without compiling again, and the kernel
plan decodes program ids in each kernel kind's own order."""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu
from pallax._src import plan as kplan
from helpers import params_of
from pallax._src.gpu import compile as gpu_compile
from pallax._src.triton import codegen, compile as triton_compile

S = jax.ShapeDtypeStruct


def _matmul(x_ref, y_ref, o_ref):
  @pl.when(pl.program_id(2) == 0)
  def _():
    o_ref[...] = jnp.zeros_like(o_ref)
  o_ref[...] += x_ref[...] @ y_ref[...]


def k_in_grid():
  """A matmul whose K loop is grid axis 2 (the output block is revisited along it)."""
  spec = lambda f: pl.BlockSpec((16, 16), f)  # noqa: E731
  return params_of(pl.pallas_call(
      _matmul, out_shape=S((32, 48), jnp.float32), grid=(2, 3, 4),
      in_specs=[spec(lambda i, j, k: (i, k)), spec(lambda i, j, k: (k, j))],
      out_specs=spec(lambda i, j, k: (i, j))), S((32, 64), jnp.float32), S((64, 48), jnp.float32))


def test_each_kind_of_kernel_has_its_launch_order():
  params = k_in_grid()
  pallas = kplan.analyse(params)
  # Pallas (Triton): the K axis, which revisits the output, is a loop; the first axis fastest.
  assert [p.axis for p in pallas.decode] == [0, 1] and pallas.launch.sequential == (2,)
  assert pallas.lanes == 6
  mosaic = kplan.analyse(params, "mosaic_gpu")
  # Mosaic GPU (Gluon): every axis a concurrent program, the last fastest, none reversed.
  assert [p.axis for p in mosaic.decode] == [2, 1, 0] and mosaic.launch.sequential == ()
  assert mosaic.lanes == 24 and not any(p.reversed for p in mosaic.decode)
  assert kplan.plan_for(params, "mosaic_gpu") is kplan.plan_for(params, "mosaic_gpu")
  assert kplan.plan_for(params) is not kplan.plan_for(params, "mosaic_gpu")


def test_the_mosaic_decode_matches_the_program_ids_mosaic_promises():
  """Launch index n of a (2, 3, 4) grid is program (n // 12, n // 4 % 3, n % 4)."""
  mosaic = kplan.analyse(k_in_grid(), "mosaic_gpu")
  for n in range(mosaic.lanes):
    ids, rest = {}, n
    for p in mosaic.decode:
      ids[p.axis], rest = rest % p.size, rest // p.size
    assert (ids[0], ids[1], ids[2]) == (n // 12, n // 4 % 3, n % 4)


def _no_compiler(*_, **__):
  raise AssertionError("compiled again: the disk cache was not used")


def test_triton_kernels_come_back_from_the_disk_cache(monkeypatch):
  ks = codegen.generate(k_in_grid(), 80)
  first = triton_compile.compile_kernel(ks, 80, "k_in_grid")
  gpu_compile.clear_memory_cache()
  monkeypatch.setattr(gpu_compile, "_compile", _no_compiler)
  again = triton_compile.compile_kernel(ks, 80, "k_in_grid")
  assert again == first and ".target sm_80" in again.ptx and "tt.func" in again.ttir


def _scale(x_ref, o_ref, smem, bar):
  i = lax.axis_index("m")
  plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(i * 64, 64)], smem, bar)
  plgpu.barrier_wait(bar)
  smem[...] = smem[...] * 2
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(smem, o_ref.at[pl.ds(i * 64, 64)])
  plgpu.wait_smem_to_gmem(0)


def scale(x):
  return plgpu.kernel(_scale, out_type=S(x.shape, x.dtype), grid=(x.shape[0] // 64,),
                      grid_names=("m",),
                      scratch_types=[plgpu.SMEM((64, x.shape[1]), x.dtype), plgpu.Barrier()])(x)


def test_gluon_kernels_come_back_from_the_disk_cache(monkeypatch):
  x = S((128, 64), jnp.float16)
  (first,) = plgpu.lower(scale, x)
  gpu_compile.clear_memory_cache()
  monkeypatch.setattr(gpu_compile, "_compile", _no_compiler)
  (again,) = plgpu.lower(scale, x)
  assert (again.ptx, again.ttgir, again.shared_mem_bytes, again.num_warps) == \
      (first.ptx, first.ttgir, first.shared_mem_bytes, first.num_warps)
  assert again.tensordesc_meta == first.tensordesc_meta and len(first.tensordesc_meta) == 2
  assert ".target sm_90a" in again.ptx


def test_the_gluon_kernel_runs_in_the_interpreter():
  x = jax.random.normal(jax.random.key(0), (128, 64), jnp.float16)
  np.testing.assert_array_equal(np.asarray(scale(x), np.float32), np.asarray(x * 2, np.float32))


def test_kernels_link_the_libdevice_xla_links(tmp_path, monkeypatch):
  """Both toolchains compile against XLA's libdevice (found where XLA looks, the
  ``--xla_gpu_cuda_data_dir`` flag first), and the cache key follows its content."""
  found = tmp_path / "nvvm" / "libdevice" / "libdevice.10.bc"
  found.parent.mkdir(parents=True)
  found.write_bytes(b"one release")
  monkeypatch.setenv("XLA_FLAGS", f"--xla_gpu_autotune_level=0 --xla_gpu_cuda_data_dir={tmp_path}")
  gpu_compile.xla_libdevice.cache_clear()
  try:
    key = lambda: gpu_compile.cache_key(triton_compile.TOOLCHAIN, "src", {"x": "*fp32"}, 90, {})  # noqa: E731
    first = key()
    assert gpu_compile.xla_libdevice()[0] == str(found)
    assert gpu_compile.compile_options(triton_compile.TOOLCHAIN, {})["extern_libs"] == {"libdevice": str(found)}
    found.write_bytes(b"another release")
    gpu_compile.xla_libdevice.cache_clear()
    assert key() != first
  finally:
    gpu_compile.xla_libdevice.cache_clear()

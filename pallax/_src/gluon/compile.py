"""Gluon source -> PTX (triton 3.6's Gluon front end) through the shared compile path and cache
(``gpu/compile.py``), and the launch inside XLA through jaxlib's Triton kernel call
(``gpu/launch.ffi_kernel_call``: Gluon kernels take host-side TMA descriptors and may need
global scratch for descriptors made in the kernel). Gluon kernels have no TTIR: the launch is
given the TTGIR in its place, and the warp count the compiler reports (warp specialization can
add warps)."""
from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np

from pallax._src import backends
from pallax._src.gluon.codegen import generate
from pallax._src.gluon.writer import GluonSource
from pallax._src.gpu import compile as gpu_compile
from pallax._src.gpu import launch as gpu_launch

TARGET = 90
SHARED_MEMORY_LIMIT = gpu_compile.shared_memory_limit(TARGET)

# libdevice keeps denormals, as XLA does (as in triton/compile.py)
TOOLCHAIN = gpu_compile.Toolchain("gluon", "ttgir", "triton.experimental.gluon._runtime",
                                  "GluonASTSource", (("enable_reflect_ftz", False),))


@dataclasses.dataclass(frozen=True)
class Compiled:
  name: str
  source: str
  ttgir: str
  ptx: str
  shared_mem_bytes: int
  num_warps: int
  global_scratch_size: int
  global_scratch_align: int
  grid: tuple
  host_descriptors: tuple = ()   # per operand: None (a pointer) or (shape, strides)
  tensordesc_meta: tuple = ()    # per host descriptor: its box, swizzle and element type
  generated: GluonSource | None = dataclasses.field(default=None, compare=False)   # its events
  hidden: tuple = ()             # buffers after the outputs: (shape, dtype, zeroed) each


def launchable_kernel(params):
  """(the kernel as a triton CompiledKernel, for Triton's own launcher (``as_torch_kernel``), its
  ``Compiled`` description). Its pointer arguments must be 16-byte aligned."""
  gs = generate(params)
  c = compile_source(gs, params.name)   # checks shared memory
  return gpu_compile.launchable(TOOLCHAIN, gs.name, gs.source, gs.signature, TARGET,
                                {"num_warps": gs.num_warps}), c


def compile_source(gs: GluonSource, kernel_name: str, target: int = TARGET) -> Compiled:
  b = gpu_compile.compile_source(TOOLCHAIN, gs.name, gs.source, gs.signature, target,
                                 {"num_warps": gs.num_warps})
  if b.shared_mem_bytes > SHARED_MEMORY_LIMIT:
    raise ValueError(f"plgpu kernel {kernel_name}: it needs {b.shared_mem_bytes} bytes of shared "
                     f"memory but sm_90 offers {SHARED_MEMORY_LIMIT}; allocate less SMEM")
  return Compiled(gs.name, gs.source, b.ir, b.ptx, b.shared_mem_bytes, b.num_warps,
                  b.global_scratch_size, b.global_scratch_align, gs.grid, gs.host_descriptors,
                  b.tensordesc_meta, gs, gs.hidden)


def compile_params(params, target: int = TARGET) -> Compiled:
  """``target``: 90 (sm_90a, what the GPU path launches) or 100 (sm_100a: Blackwell's tcgen05
  kernels, compiled on any machine, never launched here)."""
  return compile_source(generate(params, target), params.name, target)


LAUNCHES = 0   # how many kernels were lowered to Gluon (tests check the backend ran)


def gluon_lowering(ctx, *args, params):
  """The pallas_call of a Mosaic GPU kernel as a call of its compiled Gluon kernel."""
  global LAUNCHES
  c = compile_params(params)
  k = gpu_launch.Launch(c.name, c.ptx, c.ttgir, TARGET, c.num_warps, c.shared_mem_bytes,
                        c.global_scratch_size, c.global_scratch_align, c.grid, c.hidden)
  LAUNCHES += 1
  aliases = dict(params.input_output_aliases)
  if params.peers is not None:   # the buffers made for its outputs (gpu/peers.py)
    aliases.update(params.peers.aliases())
  return gpu_launch.ffi_kernel_call(ctx, list(args), k, lambda lib: _kernel_params(lib, c),
                                    aliases)


# Triton's element type codes of TMA descriptors -> CUDA's CUtensorMapDataType (they differ for
# three types; triton/backends/nvidia/driver.py keeps the same table).
_TMA_ELEMENT_TYPE = {8: 10, 9: 8, 10: 9}


def _kernel_params(lib, c: Compiled) -> list:
  """One parameter per operand, in order: a pointer, or a host-side TMA descriptor followed by
  the operand's shape (i32) and strides (i64), as Triton's launcher passes them."""
  params, meta = [], iter(c.tensordesc_meta)
  for host in c.host_descriptors:
    if host is None:
      params.append(lib.create_array_parameter(0, 16))
      continue
    shape, strides = host
    m = next(meta)
    elem = _TMA_ELEMENT_TYPE.get(m["elem_type"], m["elem_type"])
    params.append(lib.create_tma_descriptor_parameter(elem, m["swizzle"], list(shape), list(strides),
                                                      list(m["block_size"]), 0))
    params += [lib.create_scalar_parameter(int(n), "i32") for n in shape]
    params += [lib.create_scalar_parameter(int(n), "i64") for n in strides]
  for shape, dtype, zeroed in c.hidden:   # the launch zeroes those that must start at zero
    params.append(lib.create_array_parameter(
        int(np.prod(shape)) * np.dtype(dtype).itemsize if zeroed else 0, 16))
  return params


def lower(fun, *args, compute_capability: int = TARGET, **kwargs) -> list[Compiled]:
  """Traces ``fun(*args)`` (arrays or ``jax.ShapeDtypeStruct``s) and compiles every Mosaic GPU
  kernel in it for sm_90a (``compute_capability=100``: sm_100a, Blackwell): per kernel its Gluon
  source, TTGIR, PTX, shared memory and warp count. Needs no GPU."""
  if compute_capability not in (90, 100):
    raise ValueError(f"plgpu.lower: compute_capability must be 90 (Hopper) or 100 (Blackwell), "
                     f"got {compute_capability}")
  from pallax._src import jaxpr_util
  from pallax._src.call_primitive import pallas_call_p
  closed = jax.make_jaxpr(functools.partial(fun, **kwargs))(*args)
  return [compile_params(e.params["params"], compute_capability)
          for e in jaxpr_util.equations(closed.jaxpr)
          if e.primitive is pallas_call_p and backends.is_mosaic_gpu(e.params["params"])]

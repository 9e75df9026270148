"""Generated Triton source -> PTX, through the shared compile path and cache (``gpu/compile.py``):
Triton's options, its shared-memory retry with fewer pipeline stages, and its ``Compiled``."""
from __future__ import annotations

import dataclasses

from pallax._src.gpu import compile as gpu_compile
from pallax._src.triton.codegen import KernelSource

SHARED_MEMORY_LIMIT = gpu_compile.SHARED_MEMORY_LIMIT

# libdevice's functions keep denormal operands and results, as XLA's do (Triton's default
# flushes them to zero in libdevice: sin(1e-40) = 0).
TOOLCHAIN = gpu_compile.Toolchain("triton", "ttir", "triton.compiler", "ASTSource",
                                  (("enable_reflect_ftz", False),))


@dataclasses.dataclass(frozen=True)
class Compiled:
  name: str
  source: str
  ttir: str
  ptx: str
  shared_mem_bytes: int
  num_warps: int
  num_stages: int
  compute_capability: int
  global_scratch_size: int
  global_scratch_align: int
  grid: tuple[int, int, int]
  hidden: tuple = ()   # extra buffers after the outputs: (shape, dtype, zeroed)


def _options(ks: KernelSource) -> dict:
  return {"num_warps": ks.num_warps, "num_stages": ks.num_stages, "debug": ks.debug}


def compile_kernel(ks: KernelSource, cc: int, kernel_name: str = "") -> Compiled:
  """Compiles (or fetches) a kernel. Unless the user chose ``num_stages``, a kernel that
  needs more shared memory than the GPU has is retried with fewer pipeline stages."""
  while True:
    try:
      return _compile_checked(ks, cc, kernel_name)
    except SharedMemoryError:
      if ks.stages_chosen or ks.num_stages <= 1:
        raise
      ks = dataclasses.replace(ks, num_stages=ks.num_stages - 1)


class SharedMemoryError(ValueError):
  pass


def _compile_checked(ks: KernelSource, cc: int, kernel_name: str) -> Compiled:
  b = gpu_compile.compile_source(TOOLCHAIN, ks.name, ks.source, ks.signature, cc, _options(ks))
  limit = gpu_compile.shared_memory_limit(cc)
  if b.shared_mem_bytes > limit:
    raise SharedMemoryError(
        f"pallas_call {kernel_name or ks.name}: the kernel needs {b.shared_mem_bytes} bytes of "
        f"shared memory but sm_{cc} offers {limit}; use smaller blocks or fewer pipeline stages "
        f"(pallax.triton.CompilerParams(num_stages=...), now {ks.num_stages})")
  return Compiled(ks.name, ks.source, b.ir, b.ptx, b.shared_mem_bytes, ks.num_warps, ks.num_stages,
                  cc, b.global_scratch_size, b.global_scratch_align, ks.grid, ks.hidden)


def launchable_kernel(ks: KernelSource, cc: int, kernel_name: str = ""):
  """The kernel as a triton CompiledKernel, for Triton's own launcher (``k[grid](*args)``; used
  by ``as_torch_kernel``): compiled as ``compile_kernel`` compiles it (the same pipeline stages).
  Its pointer arguments must be 16-byte aligned."""
  c = compile_kernel(ks, cc, kernel_name)
  return gpu_compile.launchable(TOOLCHAIN, ks.name, ks.source, ks.signature, cc,
                                {**_options(ks), "num_stages": c.num_stages})

"""Gluon source -> PTX (triton 3.6's Gluon front end), and the launch inside XLA through jaxlib's
Triton kernel call. Gluon kernels have no TTIR: the launch is given the TTGIR in its place, and
the warp count the compiler reports (warp specialization can add warps)."""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import os
import tempfile
import zlib

import jax

from pallax._src import backends
from pallax._src import jax_internals as ji
from pallax._src.gluon.codegen import generate
from pallax._src.gluon.writer import GluonSource

SHARED_MEMORY_LIMIT = 232448   # sm_90
TARGET = 90


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


def _module_dir() -> str:
  root = os.environ.get("PALLAX_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "pallax"))
  return os.path.join(root, "gluon")


@functools.lru_cache(maxsize=256)
def _compile_source(name: str, source: str, signature: tuple, grid: tuple, num_warps: int,
                    host_descriptors: tuple = (), target: int = TARGET) -> Compiled:
  k = _gluon_compile(name, source, signature, num_warps, target)   # cached: torch launches it as is
  md = k.metadata
  return Compiled(name, source, k.asm["ttgir"], k.asm["ptx"], int(md.shared), int(md.num_warps),
                  int(getattr(md, "global_scratch_size", 0) or 0),
                  int(getattr(md, "global_scratch_align", 1) or 1), grid, host_descriptors,
                  tuple(getattr(md, "tensordesc_meta", None) or ()))


@functools.lru_cache(maxsize=64)
def _gluon_compile(name: str, source: str, signature: tuple, num_warps: int, target: int = TARGET):
  """``triton.compile`` of generated Gluon source: a triton CompiledKernel (Gluon kernels are
  few and large: keeping the last ones saves ``as_torch_kernel`` a second compile)."""
  import triton
  from triton.backends.compiler import GPUTarget
  from triton.experimental.gluon._runtime import GluonASTSource
  # gluon.jit reads the function's source from its file, so the module is written to disk.
  key = hashlib.sha256(source.encode()).hexdigest()[:24]
  os.makedirs(_module_dir(), exist_ok=True)
  path = os.path.join(_module_dir(), f"{name}_{key}.py")
  if not os.path.exists(path):
    fd, tmp = tempfile.mkstemp(dir=_module_dir(), prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
      f.write(source)
    os.replace(tmp, path)
  spec = importlib.util.spec_from_file_location(f"pallax_gluon_{key}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  sig = dict(signature)
  attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(sig.values())   # XLA aligns buffers
           if t.startswith("*")}
  return triton.compile(GluonASTSource(getattr(module, name), sig, {}, attrs),
                        target=GPUTarget("cuda", target, 32),
                        # libdevice keeps denormals, as XLA does (as in triton/compile.py)
                        options={"num_warps": num_warps, "enable_reflect_ftz": False})


def launchable_kernel(params):
  """(the kernel as a triton CompiledKernel, for Triton's own launcher (``as_torch_kernel``), its
  ``Compiled`` description). Its pointer arguments must be 16-byte aligned."""
  gs = generate(params)
  c = compile_source(gs, params.name)   # checks shared memory
  return _gluon_compile(gs.name, gs.source, tuple(gs.signature.items()), gs.num_warps), c


def compile_source(gs: GluonSource, kernel_name: str, target: int = TARGET) -> Compiled:
  c = _compile_source(gs.name, gs.source, tuple(gs.signature.items()), gs.grid, gs.num_warps,
                      gs.host_descriptors, target)
  if c.shared_mem_bytes > SHARED_MEMORY_LIMIT:
    raise ValueError(f"plgpu kernel {kernel_name}: it needs {c.shared_mem_bytes} bytes of shared "
                     f"memory but sm_90 offers {SHARED_MEMORY_LIMIT}; allocate less SMEM")
  return dataclasses.replace(c, generated=gs)


def compile_params(params, target: int = TARGET) -> Compiled:
  """``target``: 90 (sm_90a, what the GPU path launches) or 100 (sm_100a: Blackwell's tcgen05
  kernels, compiled on any machine, never launched here)."""
  return compile_source(generate(params, target), params.name, target)


LAUNCHES = 0   # how many kernels were lowered to Gluon (tests check the backend ran)


def gluon_lowering(ctx, *args, params):
  """The pallas_call of a Mosaic GPU kernel as a call of its compiled Gluon kernel."""
  global LAUNCHES
  lib = ji.gpu_triton()
  c = compile_params(params)
  kernel = lib.TritonKernel(c.name, c.num_warps, 1, c.shared_mem_bytes, c.ptx, c.ttgir, TARGET,
                            c.global_scratch_size, c.global_scratch_align)
  call = lib.TritonKernelCall(kernel, *c.grid, _kernel_params(lib, c))
  LAUNCHES += 1
  rule = jax.ffi.ffi_lowering("triton_kernel_call_ffi", api_version=4,
                              operand_output_aliases=dict(params.input_output_aliases))
  return rule(ctx, *args, opaque=zlib.compress(call.to_proto(c.name, b"")))


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

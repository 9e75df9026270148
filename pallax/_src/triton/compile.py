"""Generated Triton source -> PTX, cached in memory and on disk.

The disk cache (``$PALLAX_CACHE_DIR``, default ``~/.cache/pallax``) is keyed by a hash of
the source, target and options; entries are written to a temporary file and renamed, so
processes sharing the cache never see a partial entry.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import tempfile

from pallax._src.triton.codegen import KernelSource

# Shared memory a block may use, by compute capability (bytes).
SHARED_MEMORY_LIMIT = {70: 98304, 75: 65536, 80: 166912, 86: 101376, 87: 166912, 89: 101376,
                       90: 232448}


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


_memory: dict[str, Compiled] = {}

# Triton options every kernel compiles with. libdevice's functions keep denormal operands and
# results, as XLA's do (Triton's default flushes them to zero in libdevice: sin(1e-40) = 0).
_OPTIONS = {"enable_reflect_ftz": False}


def cache_dir() -> str:
  return os.environ.get("PALLAX_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "pallax"))


def _atomic_write(path: str, text: str):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
  with os.fdopen(fd, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def _key(ks: KernelSource, cc: int) -> str:
  import triton
  h = hashlib.sha256()
  for part in (ks.source, json.dumps(ks.signature, sort_keys=True), str(cc), str(ks.num_warps),
               str(ks.num_stages), str(ks.debug), triton.__version__, json.dumps(_OPTIONS)):
    h.update(part.encode())
    h.update(b"\0")
  return h.hexdigest()[:32]


def compile_kernel(ks: KernelSource, cc: int, kernel_name: str = "") -> Compiled:
  """Compiles (or fetches) a kernel. Unless the user chose ``num_stages``, a kernel that
  needs more shared memory than the GPU has is retried with fewer pipeline stages."""
  while True:
    try:
      return _compile_cached(ks, cc, kernel_name)
    except SharedMemoryError:
      if ks.stages_chosen or ks.num_stages <= 1:
        raise
      ks = dataclasses.replace(ks, num_stages=ks.num_stages - 1)


class SharedMemoryError(ValueError):
  pass


def _compile_cached(ks: KernelSource, cc: int, kernel_name: str) -> Compiled:
  key = _key(ks, cc)
  if key in _memory:
    return _memory[key]
  entry = os.path.join(cache_dir(), "triton", key)
  meta_path = os.path.join(entry, "meta.json")
  if os.path.exists(meta_path):
    with open(meta_path) as f:
      meta = json.load(f)
    with open(os.path.join(entry, "kernel.ptx")) as f:
      ptx = f.read()
    with open(os.path.join(entry, "kernel.ttir")) as f:
      ttir = f.read()
    compiled = Compiled(ks.name, ks.source, ttir, ptx, meta["shared"], ks.num_warps, ks.num_stages,
                        cc, meta["global_scratch_size"], meta["global_scratch_align"], ks.grid,
                        ks.hidden)
  else:
    compiled = _compile(ks, cc, entry)
    _atomic_write(os.path.join(entry, "kernel.ptx"), compiled.ptx)
    _atomic_write(os.path.join(entry, "kernel.ttir"), compiled.ttir)
    _atomic_write(meta_path, json.dumps({"shared": compiled.shared_mem_bytes,
                                         "global_scratch_size": compiled.global_scratch_size,
                                         "global_scratch_align": compiled.global_scratch_align}))
  limit = SHARED_MEMORY_LIMIT.get(cc, 101376)
  if compiled.shared_mem_bytes > limit:
    raise SharedMemoryError(
        f"pallas_call {kernel_name or ks.name}: the kernel needs {compiled.shared_mem_bytes} bytes of "
        f"shared memory but sm_{cc} offers {limit}; use smaller blocks or fewer pipeline stages "
        f"(pallax.triton.CompilerParams(num_stages=...), now {ks.num_stages})")
  _memory[key] = compiled
  return compiled


def _compile(ks: KernelSource, cc: int, entry: str) -> Compiled:
  k = _triton_compile(ks, cc, entry)
  md = k.metadata
  return Compiled(ks.name, ks.source, k.asm["ttir"], k.asm["ptx"], int(md.shared), ks.num_warps,
                  ks.num_stages, cc, int(getattr(md, "global_scratch_size", 0) or 0),
                  int(getattr(md, "global_scratch_align", 1) or 1), ks.grid, ks.hidden)


def _triton_compile(ks: KernelSource, cc: int, entry: str):
  """``triton.compile`` of the generated source: a triton CompiledKernel."""
  import triton
  from triton.backends.compiler import GPUTarget
  from triton.compiler import ASTSource
  # triton.jit reads the function's source from its file, so the module lives in the cache.
  path = os.path.join(entry, f"{ks.name}.py")
  if not os.path.exists(path):
    _atomic_write(path, ks.source)
  spec = importlib.util.spec_from_file_location(f"pallax_generated_{os.path.basename(entry)}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  fn = getattr(module, ks.name)
  # XLA's buffers are 16-byte aligned: tell Triton, so that it can vectorize accesses.
  attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(ks.signature))}
  src = ASTSource(fn, dict(ks.signature), {}, attrs)
  opts = {"num_warps": ks.num_warps, "num_stages": ks.num_stages, "debug": ks.debug, **_OPTIONS}
  return triton.compile(src, target=GPUTarget("cuda", cc, 32), options=opts)


_launchable: dict[str, object] = {}


def launchable_kernel(ks: KernelSource, cc: int, kernel_name: str = ""):
  """The kernel as a triton CompiledKernel, for Triton's own launcher (``k[grid](*args)``; used
  by ``as_torch_kernel``): compiled as ``compile_kernel`` compiles it (the same pipeline stages),
  cached in memory here and on disk by Triton. Its pointer arguments must be 16-byte aligned."""
  c = compile_kernel(ks, cc, kernel_name)
  ks = dataclasses.replace(ks, num_stages=c.num_stages)
  key = _key(ks, cc)
  if key not in _launchable:
    _launchable[key] = _triton_compile(ks, cc, os.path.join(cache_dir(), "triton", key))
  return _launchable[key]

"""Generated GPU source -> PTX, cached in memory and on disk: one path for every GPU backend, each
describing its front end as a ``Toolchain`` (Triton's ``triton.jit``, Gluon's ``gluon.jit``).

The disk cache (``$PALLAX_CACHE_DIR``, default ``~/.cache/pallax``) holds, per toolchain, one
folder per kernel keyed by a hash of the source, signature, target, options and triton's version:
the PTX, the IR the launch carries beside it, and what the launch needs of the compiler's
metadata. Entries are written to a temporary file and renamed, so processes sharing the cache
never see a partial entry. ``triton.jit`` and ``gluon.jit`` read a function's source from its
file, so the generated module lives in the entry too.
"""
from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import importlib
import importlib.util
import json
import os
import shlex
import sysconfig
import tempfile

# Shared memory a block may use, by compute capability (bytes).
SHARED_MEMORY_LIMIT = {70: 98304, 75: 65536, 80: 166912, 86: 101376, 87: 166912, 89: 101376,
                       90: 232448}


def shared_memory_limit(cc: int) -> int:
  return SHARED_MEMORY_LIMIT.get(cc, 101376)


@dataclasses.dataclass(frozen=True)
class Toolchain:
  """How a backend's generated source becomes a triton ``CompiledKernel``."""
  name: str              # "triton", "gluon": the cache folder
  ir: str                # the IR the launch carries beside the PTX: "ttir" (Gluon has none: "ttgir")
  source_module: str     # where the front end's AST source class lives ...
  source_class: str      # ... and its name (triton.compiler.ASTSource, gluon's GluonASTSource)
  options: tuple = ()    # options every kernel compiles with, as (name, value) pairs

  def ast_source(self, fn, signature: dict, attrs: dict):
    cls = getattr(importlib.import_module(self.source_module), self.source_class)
    return cls(fn, signature, {}, attrs)


@dataclasses.dataclass(frozen=True)
class Binary:
  """A compiled kernel as a launch needs it."""
  ptx: str
  ir: str                    # the toolchain's ``ir``
  shared_mem_bytes: int
  num_warps: int             # as compiled (warp specialization may add warps)
  global_scratch_size: int
  global_scratch_align: int
  tensordesc_meta: tuple = ()   # per host-side TMA descriptor parameter: its box, swizzle, type


_memory: dict[str, Binary] = {}
_launchable: dict[str, object] = {}


def clear_memory_cache():
  """Forgets the kernels compiled in this process (the disk cache stays)."""
  _memory.clear()
  _launchable.clear()


def cache_dir() -> str:
  return os.environ.get("PALLAX_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "pallax"))


def atomic_write(path: str, text: str):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
  with os.fdopen(fd, "w") as f:
    f.write(text)
  os.replace(tmp, path)


_LIBDEVICE = os.path.join("nvvm", "libdevice", "libdevice.10.bc")


def _cuda_roots() -> list[str]:
  """Where XLA looks for CUDA's files, in its order: ``--xla_gpu_cuda_data_dir`` in
  ``XLA_FLAGS``, the CUDA wheels beside JAX (``nvidia/cu13``, ``nvidia/cuda_nvcc``),
  ``$CUDA_HOME``, ``$CUDA_PATH``, ``/usr/local/cuda``."""
  roots = [a.split("=", 1)[1] for a in shlex.split(os.environ.get("XLA_FLAGS", ""))
           if a.startswith("--xla_gpu_cuda_data_dir=")]
  site = sysconfig.get_paths()["purelib"]
  roots += sorted(glob.glob(os.path.join(site, "nvidia", "cu1*")), reverse=True)
  roots += [os.path.join(site, "nvidia", "cuda_nvcc")]
  roots += [os.environ[v] for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
  return roots + ["/usr/local/cuda"]


@functools.cache
def xla_libdevice() -> tuple[str, str] | None:
  """(path, content hash) of the libdevice XLA links into its kernels, or None (then Triton's
  own copy). Triton bundles libdevice of another CUDA release, whose float32 ``powf`` is 1 ulp
  from XLA's on a third of random inputs (``benchmarks/probes/libdevice_pow_vs_xla.py``): both
  GPU backends link XLA's, so that a libdevice function gives XLA's bits."""
  for root in _cuda_roots():
    path = os.path.join(root, _LIBDEVICE)
    if os.path.isfile(path):
      with open(path, "rb") as f:
        return path, hashlib.sha256(f.read()).hexdigest()[:16]
  return None


def compile_options(tc: Toolchain, options: dict) -> dict:
  """The options ``triton.compile`` gets: the kernel's, the toolchain's, XLA's libdevice."""
  found = xla_libdevice()
  libdevice = {"extern_libs": {"libdevice": found[0]}} if found else {}
  return {**options, **dict(tc.options), **libdevice}


def cache_key(tc: Toolchain, source: str, signature: dict, cc: int, options: dict) -> str:
  import triton
  h = hashlib.sha256()
  found = xla_libdevice()
  for part in (tc.name, source, json.dumps(list(signature.items())), str(cc),
               json.dumps(compile_options(tc, options), sort_keys=True), triton.__version__,
               found[1] if found else ""):
    h.update(part.encode())
    h.update(b"\0")
  return h.hexdigest()[:32]


def compile_source(tc: Toolchain, name: str, source: str, signature: dict, cc: int,
                   options: dict) -> Binary:
  """The kernel ``name`` of ``source`` compiled for sm_``cc`` (or fetched from the caches)."""
  key = cache_key(tc, source, signature, cc, options)
  if key in _memory:
    return _memory[key]
  entry = os.path.join(cache_dir(), tc.name, key)
  meta_path = os.path.join(entry, "meta.json")
  if os.path.exists(meta_path):
    with open(meta_path) as f:
      meta = json.load(f)
    with open(os.path.join(entry, "kernel.ptx")) as f:
      ptx = f.read()
    with open(os.path.join(entry, f"kernel.{tc.ir}")) as f:
      ir = f.read()
  else:
    k = _compile(tc, name, source, signature, cc, options, entry)
    md = k.metadata
    ptx, ir = k.asm["ptx"], k.asm[tc.ir]
    meta = {"shared": int(md.shared), "num_warps": int(md.num_warps),
            "global_scratch_size": int(getattr(md, "global_scratch_size", 0) or 0),
            "global_scratch_align": int(getattr(md, "global_scratch_align", 1) or 1),
            "tensordesc_meta": list(getattr(md, "tensordesc_meta", None) or ())}
    atomic_write(os.path.join(entry, "kernel.ptx"), ptx)
    atomic_write(os.path.join(entry, f"kernel.{tc.ir}"), ir)
    atomic_write(meta_path, json.dumps(meta))
  binary = Binary(ptx, ir, meta["shared"], meta["num_warps"], meta["global_scratch_size"],
                  meta["global_scratch_align"], tuple(meta["tensordesc_meta"]))
  _memory[key] = binary
  return binary


def launchable(tc: Toolchain, name: str, source: str, signature: dict, cc: int, options: dict):
  """The kernel as a triton ``CompiledKernel``, for Triton's own launcher (``k[grid](*args)``;
  used by ``as_torch_kernel``), cached in memory here and on disk by Triton. Its pointer
  arguments must be 16-byte aligned."""
  key = cache_key(tc, source, signature, cc, options)
  if key not in _launchable:
    _launchable[key] = _compile(tc, name, source, signature, cc, options,
                                os.path.join(cache_dir(), tc.name, key))
  return _launchable[key]


def _compile(tc: Toolchain, name: str, source: str, signature: dict, cc: int, options: dict,
             entry: str):
  """``triton.compile`` of the generated source: a triton CompiledKernel."""
  import triton
  from triton.backends.compiler import GPUTarget
  path = os.path.join(entry, f"{name}.py")
  if not os.path.exists(path):
    atomic_write(path, source)
  spec = importlib.util.spec_from_file_location(f"pallax_{tc.name}_{os.path.basename(entry)}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  # XLA's buffers are 16-byte aligned: tell the compiler, so that it can vectorize accesses.
  attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(signature.values())
           if t.startswith("*")}
  src = tc.ast_source(getattr(module, name), dict(signature), attrs)
  return triton.compile(src, target=GPUTarget("cuda", cc, 32), options=compile_options(tc, options))

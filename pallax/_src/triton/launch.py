"""Launching compiled Triton kernels inside XLA: the target compute capability, and which of the
shared launch mechanisms (``gpu/launch.py``) runs the kernel."""
from __future__ import annotations

import os

from pallax._src import jax_internals as ji
from pallax._src.gpu import launch as gpu_launch
from pallax._src.gpu.device import device_compute_capability
from pallax._src.triton import codegen
from pallax._src.triton.compile import compile_kernel


# The oldest target the official triton package (3.6) still generates code for: Volta. Before
# Ampere, dots run on FMA units (and int8 dots are refused); fp8 needs Ada (8.9).
MIN_COMPUTE_CAPABILITY = 70


def check_compute_capability(cc: int, name: str):
  if cc < MIN_COMPUTE_CAPABILITY:
    major, minor = divmod(cc, 10)
    raise RuntimeError(
        f"pallas_call {name}: the Triton backend needs an NVIDIA GPU of compute capability 7.0 "
        f"(Volta) or newer, but this one has {major}.{minor}. Run the kernel in the interpreter "
        "instead: pallas_call(..., interpret=True) (it runs on this GPU through XLA).")


def target_compute_capability(params) -> int:
  """The GPU's own compute capability, or a lower one asked for (to test or to ship code for
  older GPUs): ``pallax.triton.CompilerParams(compute_capability=75)`` or the environment
  variable ``PALLAX_TRITON_COMPUTE_CAPABILITY``. PTX runs on newer GPUs than its target."""
  device = device_compute_capability()
  asked = getattr(params.compiler_params, "compute_capability", None) or \
      os.environ.get("PALLAX_TRITON_COMPUTE_CAPABILITY")
  if device is None and not asked:
    raise ValueError(
        f"pallas_call {params.name}: lowering for CUDA on a machine without a GPU (jax.export, "
        "lowering_platforms=('cuda',)) needs the target GPU named, because the Triton backend "
        "compiles the kernel to PTX now: pass compiler_params=pallax.triton.CompilerParams("
        "compute_capability=90) (90 for H100/H200, 80 for A100) or set "
        "PALLAX_TRITON_COMPUTE_CAPABILITY=90. The PTX runs on that GPU and newer ones.")
  if not asked:
    return device
  asked = int(asked)
  if device is not None and asked > device:
    raise ValueError(f"pallas_call {params.name}: compute capability {asked} was asked for, but "
                     f"this GPU has {device}; code for a newer GPU cannot run on an older one")
  return asked


LAUNCHES = 0   # how many pallas_calls were lowered to Triton (tests check the backend ran)

# How the compiled kernel is launched inside XLA (``gpu/launch.py`` says more of each):
# - "xla": XLA's own kernel call (custom call ``__gpu$xla.gpu.ptx``), no handler per call;
# - "ffi": jaxlib's Triton kernel call (``triton_kernel_call_ffi``), several microseconds more
#   per call.
LAUNCH_PATHS = ("xla", "ffi")


def launch_path() -> str:
  """``$PALLAX_TRITON_LAUNCH`` (``xla``, the default, or ``ffi``)."""
  path = os.environ.get("PALLAX_TRITON_LAUNCH", "xla")
  if path not in LAUNCH_PATHS:
    raise ValueError(f"PALLAX_TRITON_LAUNCH={path!r}: expected one of {', '.join(LAUNCH_PATHS)}")
  return path


def launch_of(c) -> gpu_launch.Launch:
  """What the launch needs of a compiled Triton kernel (``compile.Compiled``)."""
  return gpu_launch.Launch(c.name, c.ptx, c.ttir, c.compute_capability, c.num_warps,
                           c.shared_mem_bytes, c.global_scratch_size, c.global_scratch_align,
                           c.grid, c.hidden)


def triton_lowering(ctx, *args, params):
  global LAUNCHES
  cc = target_compute_capability(params)
  check_compute_capability(cc, params.name)
  ks = codegen.generate(params, cc)
  c = compile_kernel(ks, cc, params.name)
  LAUNCHES += 1
  # Constant arrays the kernel closed over are operands after the call's own (the compiled
  # kernel is shared by kernels that differ only in their values: they come from ``ks``).
  consts = [ji.mlir.ir_constant(a) for a in ks.constants]
  const_avals = [ji.ShapedArray(a.shape, a.dtype) for a in ks.constants]
  # Under jax.shard_map, the device's mesh coordinates come last (gpu/peers.py), after them.
  n = len(args) - (params.peers is not None)
  ctx = ctx.replace(avals_in=[*ctx.avals_in[:n], *const_avals, *ctx.avals_in[n:]])
  operands = [*args[:n], *consts, *args[n:]]
  aliases, k = dict(params.input_output_aliases), launch_of(c)
  if launch_path() == "xla":
    return gpu_launch.xla_ptx_call(ctx, operands, k, aliases)
  # Every parameter a buffer: the operands, the outputs, the hidden buffers.
  parameters = gpu_launch.buffer_parameters(k, len(operands) + len(ctx.avals_out))
  return gpu_launch.ffi_kernel_call(ctx, operands, k, parameters, aliases)

"""Launching compiled kernels inside XLA through jaxlib's Triton kernel call."""
from __future__ import annotations

import os
import zlib

import jax
import numpy as np

from pallax._src import jax_internals as ji
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
  if not asked:
    return device
  asked = int(asked)
  if asked > device:
    raise ValueError(f"pallas_call {params.name}: compute capability {asked} was asked for, but "
                     f"this GPU has {device}; code for a newer GPU cannot run on an older one")
  return asked


LAUNCHES = 0   # how many pallas_calls were lowered to Triton (tests check the backend ran)


def triton_lowering(ctx, *args, params):
  global LAUNCHES
  gpu_triton = ji.gpu_triton()
  cc = target_compute_capability(params)
  check_compute_capability(cc, params.name)
  ks = codegen.generate(params, cc)
  c = compile_kernel(ks, cc, params.name)
  kernel = gpu_triton.TritonKernel(c.name, c.num_warps, 1, c.shared_mem_bytes, c.ptx, c.ttir, cc,
                                   c.global_scratch_size, c.global_scratch_align)
  # Scratch and pl.get_global buffers are extra outputs of the call, dropped afterwards;
  # the launcher zeroes the ones that must start at zero.
  hidden = [ji.ShapedArray(shape, dtype) for shape, dtype, _ in c.hidden]
  # Constant arrays the kernel closed over are operands after the call's own (the compiled
  # kernel is shared by kernels that differ only in their values: they come from ``ks``).
  consts = [ji.mlir.ir_constant(a) for a in ks.constants]
  sizes = [0] * (len(args) + len(consts) + len(ctx.avals_out)) + [
      int(np.prod(shape)) * np.dtype(dtype).itemsize if zeroed else 0 for shape, dtype, zeroed in c.hidden]
  kernel_params = [gpu_triton.create_array_parameter(n, 16) for n in sizes]
  call = gpu_triton.TritonKernelCall(kernel, *c.grid, kernel_params)
  LAUNCHES += 1
  rule = jax.ffi.ffi_lowering("triton_kernel_call_ffi", api_version=4,
                              operand_output_aliases=dict(params.input_output_aliases))
  n_out = len(ctx.avals_out)
  const_avals = [ji.ShapedArray(a.shape, a.dtype) for a in ks.constants]
  ctx = ctx.replace(avals_in=[*ctx.avals_in, *const_avals], avals_out=[*ctx.avals_out, *hidden])
  results = rule(ctx, *args, *consts, opaque=zlib.compress(call.to_proto(c.name, b"")))
  return results[:n_out]

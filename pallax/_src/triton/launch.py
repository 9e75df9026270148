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

# How the compiled kernel is launched inside XLA:
# - "xla": XLA's own kernel call (custom call ``__gpu$xla.gpu.ptx``). XLA loads the PTX when it
#   loads the executable and launches it as one of its own kernels: no handler runs per call, and
#   the launch can join XLA's command buffers (CUDA graphs) like any fused XLA kernel.
# - "ffi": jaxlib's Triton kernel call (``triton_kernel_call_ffi``), a custom-call handler that
#   launches the kernel on every execution (several microseconds more per call).
LAUNCH_PATHS = ("xla", "ffi")


def launch_path() -> str:
  """``$PALLAX_TRITON_LAUNCH`` (``xla``, the default, or ``ffi``)."""
  path = os.environ.get("PALLAX_TRITON_LAUNCH", "xla")
  if path not in LAUNCH_PATHS:
    raise ValueError(f"PALLAX_TRITON_LAUNCH={path!r}: expected one of {', '.join(LAUNCH_PATHS)}")
  return path


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
  ctx = ctx.replace(avals_in=[*ctx.avals_in, *const_avals])
  call = _xla_kernel_call if launch_path() == "xla" else _jaxlib_kernel_call
  return call(ctx, [*args, *consts], c, dict(params.input_output_aliases))


def _hidden_avals(c):
  """Scratch and pl.get_global buffers: extra outputs of the call, dropped afterwards."""
  return [ji.ShapedArray(shape, dtype) for shape, dtype, _ in c.hidden]


def _jaxlib_kernel_call(ctx, operands, c, aliases):
  gpu_triton = ji.gpu_triton()
  kernel = gpu_triton.TritonKernel(c.name, c.num_warps, 1, c.shared_mem_bytes, c.ptx, c.ttir,
                                   c.compute_capability, c.global_scratch_size,
                                   c.global_scratch_align)
  # The launcher zeroes the hidden buffers that must start at zero.
  sizes = [0] * (len(operands) + len(ctx.avals_out)) + [
      int(np.prod(shape)) * np.dtype(dtype).itemsize if zeroed else 0
      for shape, dtype, zeroed in c.hidden]
  kernel_params = [gpu_triton.create_array_parameter(n, 16) for n in sizes]
  call = gpu_triton.TritonKernelCall(kernel, *c.grid, kernel_params)
  rule = jax.ffi.ffi_lowering("triton_kernel_call_ffi", api_version=4,
                              operand_output_aliases=aliases)
  n_out = len(ctx.avals_out)
  ctx = ctx.replace(avals_out=[*ctx.avals_out, *_hidden_avals(c)])
  results = rule(ctx, *operands, opaque=zlib.compress(call.to_proto(c.name, b"")))
  return results[:n_out]


def _xla_kernel_call(ctx, operands, c, aliases):
  """The kernel's parameters, in the order Triton declares them: the operands, the outputs, the
  hidden buffers, then Triton's own global and profile scratch pointers. XLA fills the slots
  named in ``output_indices`` with the call's results and the others with its operands, in
  order. A hidden buffer that must start at zero is a result aliased to a zero-filled operand;
  those operands come after every declared parameter, where the kernel does not read them."""
  mlir = ji.mlir
  n_in, n_out = len(operands), len(ctx.avals_out)
  in_avals, results = list(ctx.avals_in), [*ctx.avals_out, *_hidden_avals(c)]
  if c.global_scratch_size:   # one slice per program
    results.append(ji.ShapedArray((c.global_scratch_size * int(np.prod(c.grid)),), np.uint8))
  # The scratch pointers the kernel does not use (its profile scratch, and its global scratch if
  # it needs none) get an operand it already has: an extra buffer costs time on every call.
  spare, spare_aval = _spare_operand(operands, in_avals, aliases)
  unused = 1 if c.global_scratch_size else 2
  operands, in_avals = [*operands, *[spare] * unused], [*in_avals, *[spare_aval] * unused]
  aliases = dict(aliases)
  for k, (shape, dtype, zeroed) in enumerate(c.hidden):
    if zeroed:
      aliases[len(operands)] = n_out + k
      in_avals.append(ji.ShapedArray(shape, dtype))
      operands.append(mlir.full_like_aval(ctx, 0, in_avals[-1]))
  # Row-major layouts, or XLA may hand the kernel a transposed buffer it chose to avoid a copy.
  row_major = lambda avals: [list(reversed(range(len(a.shape)))) for a in avals]  # noqa: E731
  op = mlir.custom_call(
      "__gpu$xla.gpu.ptx", operands=operands,
      result_types=[mlir.aval_to_ir_type(ctx.module_context, a) for a in results],
      backend_config=_kernel_config(c, range(n_in, n_in + len(results))), api_version=1,
      operand_output_aliases=aliases or None, operand_layouts=row_major(in_avals),
      result_layouts=row_major(results))
  return op.results[:n_out]


def _spare_operand(operands, avals, aliases):
  """An operand to fill parameter slots the kernel never reads: one not aliased to an output
  (XLA would copy it to keep the alias), else a 1-byte constant."""
  for k, (v, a) in enumerate(zip(operands, avals)):
    if k not in aliases:
      return v, a
  return ji.mlir.ir_constant(np.zeros(1, np.uint8)), ji.ShapedArray((1,), np.uint8)


def _kernel_config(c, output_indices) -> str:
  """XLA's description of a PTX kernel launch (an MLIR dictionary, as text)."""
  ir = ji.ir
  i32 = lambda n: ir.IntegerAttr.get(ir.IntegerType.get_signless(32), n)  # noqa: E731
  config = {
      "name": ir.StringAttr.get(c.name), "kernel_type": ir.StringAttr.get("ptx"),
      "kernel_data": ir.StringAttr.get(c.ptx),
      **{f"grid_{d}": i32(n) for d, n in zip("xyz", c.grid)},
      **{f"block_{d}": i32(n) for d, n in zip("xyz", (32 * c.num_warps, 1, 1))},
      "shared_mem_bytes": i32(c.shared_mem_bytes),
      "output_indices": ir.ArrayAttr.get([i32(i) for i in output_indices]),
  }
  return str(ir.DictAttr.get(config))

"""Launching a compiled GPU kernel inside XLA: the two mechanisms, for every GPU backend.

- ``xla_ptx_call``: XLA's own kernel call (custom call ``__gpu$xla.gpu.ptx``). XLA loads the PTX
  when it loads the executable and launches it as one of its own kernels: no handler runs per
  call, and the launch can join XLA's command buffers (CUDA graphs) like any fused XLA kernel.
  Parameters are buffers only. The Triton backend launches this way by default.
- ``ffi_kernel_call``: jaxlib's Triton kernel call (``triton_kernel_call_ffi``), a custom-call
  handler that launches the kernel on every execution (several microseconds more per call). It
  takes scalar and host-side TMA descriptor parameters and allocates the kernel's global
  scratch. The Gluon backend launches this way (its kernels take descriptors and need global
  scratch for the ones made in the kernel); the Triton backend with ``PALLAX_TRITON_LAUNCH=ffi``.

A backend describes its compiled kernel as a ``Launch`` and passes its own parameters.
"""
from __future__ import annotations

import dataclasses
import zlib

import jax
import numpy as np

from pallax._src import jax_internals as ji


@dataclasses.dataclass(frozen=True)
class Launch:
  """What launching a compiled kernel needs to know of it."""
  name: str
  ptx: str
  ir: str                    # the IR jaxlib's call carries beside the PTX (TTIR; Gluon: TTGIR)
  compute_capability: int
  num_warps: int
  shared_mem_bytes: int
  global_scratch_size: int
  global_scratch_align: int
  grid: tuple[int, int, int]
  hidden: tuple = ()         # buffers after the outputs, results of the call: (shape, dtype, zeroed)


def _hidden_avals(k: Launch):
  """Scratch and pl.get_global buffers: extra outputs of the call, dropped afterwards."""
  return [ji.ShapedArray(shape, dtype) for shape, dtype, _ in k.hidden]


def ffi_kernel_call(ctx, operands, k: Launch, parameters, aliases):
  """jaxlib's Triton kernel call of ``k``; ``parameters(lib)``: the kernel's parameters in
  order, made with ``lib`` (jaxlib's ``gpu_triton``). Returns the call's own results."""
  lib = ji.gpu_triton()
  kernel = lib.TritonKernel(k.name, k.num_warps, 1, k.shared_mem_bytes, k.ptx, k.ir,
                            k.compute_capability, k.global_scratch_size, k.global_scratch_align)
  call = lib.TritonKernelCall(kernel, *k.grid, parameters(lib))
  rule = jax.ffi.ffi_lowering("triton_kernel_call_ffi", api_version=4,
                              operand_output_aliases=aliases)
  n_out = len(ctx.avals_out)
  if k.hidden:
    ctx = ctx.replace(avals_out=[*ctx.avals_out, *_hidden_avals(k)])
  results = rule(ctx, *operands, opaque=zlib.compress(call.to_proto(k.name, b"")))
  return results[:n_out]


def buffer_parameters(k: Launch, n_buffers: int):
  """``parameters`` of ``ffi_kernel_call`` for a kernel whose parameters are the call's
  ``n_buffers`` operands and results, then its hidden buffers (zeroed by the launcher where
  they must start at zero)."""
  sizes = [0] * n_buffers + [int(np.prod(shape)) * np.dtype(dtype).itemsize if zeroed else 0
                             for shape, dtype, zeroed in k.hidden]
  return lambda lib: [lib.create_array_parameter(n, 16) for n in sizes]


def xla_ptx_call(ctx, operands, k: Launch, aliases):
  """The kernel's parameters, in the order Triton declares them: the operands, the outputs, the
  hidden buffers, then Triton's own global and profile scratch pointers. XLA fills the slots
  named in ``output_indices`` with the call's results and the others with its operands, in
  order. A hidden buffer that must start at zero is a result aliased to a zero-filled operand;
  those operands come after every declared parameter, where the kernel does not read them."""
  mlir = ji.mlir
  n_in, n_out = len(operands), len(ctx.avals_out)
  in_avals, results = list(ctx.avals_in), [*ctx.avals_out, *_hidden_avals(k)]
  if k.global_scratch_size:   # one slice per program
    results.append(ji.ShapedArray((k.global_scratch_size * int(np.prod(k.grid)),), np.uint8))
  # The scratch pointers the kernel does not use (its profile scratch, and its global scratch if
  # it needs none) get an operand it already has: an extra buffer costs time on every call.
  spare, spare_aval = spare_operand(operands, in_avals, aliases)
  unused = 1 if k.global_scratch_size else 2
  operands, in_avals = [*operands, *[spare] * unused], [*in_avals, *[spare_aval] * unused]
  aliases = dict(aliases)
  for j, (shape, dtype, zeroed) in enumerate(k.hidden):
    if zeroed:
      aliases[len(operands)] = n_out + j
      in_avals.append(ji.ShapedArray(shape, dtype))
      operands.append(mlir.full_like_aval(ctx, 0, in_avals[-1]))
  # Row-major layouts, or XLA may hand the kernel a transposed buffer it chose to avoid a copy.
  row_major = lambda avals: [list(reversed(range(len(a.shape)))) for a in avals]  # noqa: E731
  op = mlir.custom_call(
      "__gpu$xla.gpu.ptx", operands=operands,
      result_types=[mlir.aval_to_ir_type(ctx.module_context, a) for a in results],
      backend_config=kernel_config(k, range(n_in, n_in + len(results))), api_version=1,
      operand_output_aliases=aliases or None, operand_layouts=row_major(in_avals),
      result_layouts=row_major(results))
  return op.results[:n_out]


def spare_operand(operands, avals, aliases):
  """An operand to fill parameter slots the kernel never reads: one not aliased to an output
  (XLA would copy it to keep the alias), else a 1-byte constant."""
  for j, (v, a) in enumerate(zip(operands, avals)):
    if j not in aliases:
      return v, a
  return ji.mlir.ir_constant(np.zeros(1, np.uint8)), ji.ShapedArray((1,), np.uint8)


def kernel_config(k: Launch, output_indices) -> str:
  """XLA's description of a PTX kernel launch (an MLIR dictionary, as text)."""
  ir = ji.ir
  i32 = lambda n: ir.IntegerAttr.get(ir.IntegerType.get_signless(32), n)  # noqa: E731
  config = {
      "name": ir.StringAttr.get(k.name), "kernel_type": ir.StringAttr.get("ptx"),
      "kernel_data": ir.StringAttr.get(k.ptx),
      **{f"grid_{d}": i32(n) for d, n in zip("xyz", k.grid)},
      **{f"block_{d}": i32(n) for d, n in zip("xyz", (32 * k.num_warps, 1, 1))},
      "shared_mem_bytes": i32(k.shared_mem_bytes),
      "output_indices": ir.ArrayAttr.get([i32(i) for i in output_indices]),
  }
  return str(ir.DictAttr.get(config))

"""One pallas_call launched from torch: compiled by pallax's Triton backend (blocked kernels) or
its Gluon backend (``plgpu`` kernels), loaded on the tensors' GPU, and launched by Triton's C
launcher on torch's current stream, with torch's allocator for outputs and scratch.

The launch calls Triton's C launcher directly, not ``CompiledKernel[grid]``: Triton loads a
kernel's module on whichever GPU is current the first time, and one CompiledKernel serves every
device here, so each device gets its own module."""
from __future__ import annotations

import functools
import typing

from pallax._src import backends
from pallax._src.torch import rules as torch_rules


class Kernel:
  """``eqn`` (a pallas_call) ready to launch on ``device``. Its arguments, in the order of the
  XLA launch: operands, constants (Triton), outputs, hidden buffers (Triton)."""

  def __init__(self, eqn, device):
    torch = torch_rules.import_torch()
    params = eqn.params["params"]
    self.device = device
    self.index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(self.index)
    prepare = _gluon if backends.is_mosaic_gpu(params) else _triton
    compiled, self.grid, self.consts, self.hidden, self.descriptors = \
        prepare(params, major * 10 + minor, device)
    self.outs = [(tuple(v.aval.shape), torch_rules.torch_dtype(v.aval.dtype)) for v in eqn.outvars]
    self.aliased = {o: i for i, o in params.input_output_aliases}   # output -> input
    with torch.cuda.device(self.index):
      compiled._init_handles()   # builds the C launcher; checks shared memory and threads
      self.function = _function(compiled, self.index)
    launcher = compiled.run
    self.launch, self.packed = launcher.launch, compiled.packed_metadata
    self.flags = (launcher.launch_cooperative_grid, launcher.launch_pdl)
    self.scratch = launcher.global_scratch_size * launcher.num_ctas * self.grid[0] * \
        self.grid[1] * self.grid[2]
    self.compiled = compiled
    self.stream = functools.partial(torch._C._cuda_getCurrentRawStream, self.index)
    from triton import knobs
    self.hooks = knobs.runtime   # Triton's launch hooks (its profiler sets them)
    # The launch needs the tensors' GPU current: with several GPUs, make it so per call.
    self.on_device = torch.cuda.device(self.index) if torch.cuda.device_count() > 1 else None

  def __call__(self, ins):
    torch = torch_rules.import_torch()
    ins = [aligned(t) for t in ins]
    outs = [ins[self.aliased[k]].clone() if k in self.aliased else
            torch.empty(shape, dtype=dtype, device=self.device)
            for k, (shape, dtype) in enumerate(self.outs)]
    args = [*ins, *self.consts, *outs]
    for shape, dtype, zeroed in self.hidden:
      args.append((torch.zeros if zeroed else torch.empty)(shape, dtype=dtype, device=self.device))
    for k, (shape, strides) in self.descriptors:
      args[k] = _Descriptor(args[k], shape, strides)
    scratch = (torch.empty(self.scratch, dtype=torch.uint8, device=self.device)
               if self.scratch else None)
    stream = self.stream()
    enter, leave = self.hooks.launch_enter_hook, self.hooks.launch_exit_hook
    meta = None if enter is None else self.compiled.launch_metadata(self.grid, stream, *args)
    if self.on_device is None:
      self.launch(*self.grid, stream, self.function, *self.flags, scratch, None, self.packed, meta,
                  enter, leave, *args)
    else:
      with self.on_device:
        self.launch(*self.grid, stream, self.function, *self.flags, scratch, None, self.packed,
                    meta, enter, leave, *args)
    return outs


def _triton(params, cc, device):
  from pallax._src.triton import codegen, compile as tcompile, launch
  launch.check_compute_capability(cc, params.name)
  ks = codegen.generate(params, cc)
  hidden = [(shape, torch_rules.torch_dtype(dtype), zeroed) for shape, dtype, zeroed in ks.hidden]
  consts = [torch_rules.to_torch(a, device) for a in ks.constants]
  return tcompile.launchable_kernel(ks, cc, params.name), ks.grid, consts, hidden, []


def _gluon(params, cc, device):
  from pallax._src.gluon import backend, compile as gluon_compile
  backend.check_compute_capability(cc, params.name, "call it with CPU tensors")
  compiled, c = gluon_compile.launchable_kernel(params)
  descriptors = [(k, host) for k, host in enumerate(c.host_descriptors) if host is not None]
  hidden = [(shape, torch_rules.torch_dtype(dtype), zeroed) for shape, dtype, zeroed in c.hidden]
  return compiled, c.grid, [], hidden, descriptors


class _Descriptor(typing.NamedTuple):
  """A host-side TMA descriptor's operand as Triton's launcher takes it (it encodes the
  descriptor from the compiled kernel's box and swizzle)."""
  base: object
  shape: tuple
  strides: tuple
  padding: str = "zero"


@functools.cache
def _function(compiled, index: int):
  """The kernel's function handle in a module loaded on GPU ``index`` (current)."""
  from triton.runtime.driver import driver
  _, function, *_ = driver.active.utils.load_binary(
      compiled.name, compiled.kernel, compiled.metadata.shared, index)
  return function


def aligned(t):
  """``t`` contiguous and 16-byte aligned (what the compiled kernel assumes)."""
  if not t.is_contiguous():
    t = t.contiguous()
  return t if t.data_ptr() % 16 == 0 else t.clone()

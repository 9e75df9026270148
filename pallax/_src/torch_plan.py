"""A traced function as a flat list of steps on torch tensors, prepared once per input signature
so that a call does little more than launch: call-like equations (``jit``, ``custom_vjp_call``,
...) are inlined, every pallas_call is compiled and bound to Triton's launcher, every other
equation to its torch rule (``torch_rules.py``), and constants and literals are put on the device
once. Values live in numbered slots."""
from __future__ import annotations

import jax
import numpy as np

from pallax._src import jax_internals as ji
from pallax._src import torch_rules

# Call-like primitives whose inner jaxpr is inlined: (primitive, its jaxpr's key).
CALLS = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr",
         "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr", "checkpoint": "jaxpr",
         "remat": "jaxpr"}
_DROPPED_PARAMS = ("sharding", "accumulation_type", "out_sharding")   # no meaning for torch


class Plan:
  """``closed`` (a traced function) prepared for ``device``: ``plan.run(tensors)`` -> outputs."""

  def __init__(self, closed, device, name: str):
    self.device, self.name = device, name
    self.fixed: list = []   # slot -> a constant or literal tensor, or None (computed per call)
    self.steps: list = []   # (step: list of values -> list of values, input slots, output slots)
    jaxpr = closed.jaxpr
    self.inputs = [self._slot() for _ in jaxpr.invars]
    consts = [self._slot(to_torch(c, device)) for c in closed.consts]
    self.outputs = self._inline(jaxpr, consts, self.inputs, None)

  def run(self, tensors):
    slots = list(self.fixed)
    for s, t in zip(self.inputs, tensors):
      slots[s] = t
    for step, ins, outs in self.steps:
      for s, v in zip(outs, step([slots[i] for i in ins])):
        slots[s] = v
    return [slots[s] for s in self.outputs]

  def _slot(self, value=None) -> int:
    """A new slot; ``value``: its fixed value (a constant), if it has one."""
    self.fixed.append(value)
    return len(self.fixed) - 1

  def _inline(self, jaxpr, const_slots, in_slots, where):
    env = dict(zip(jaxpr.constvars, const_slots))
    env.update(zip(jaxpr.invars, in_slots))
    def read(v):
      if isinstance(v, ji.Literal):   # on the device once: a copy per call would wait for the host
        return self._slot(to_torch(np.asarray(v.val, v.aval.dtype), self.device))
      return env[v]
    for eqn in jaxpr.eqns:
      ins = [read(v) for v in eqn.invars]
      name = eqn.primitive.name
      if name in CALLS:
        inner = eqn.params[CALLS[name]]
        consts = [self._slot(to_torch(c, self.device)) for c in getattr(inner, "consts", ())]
        outs = self._inline(getattr(inner, "jaxpr", inner), consts, ins,
                            ji.user_frame(eqn.source_info) or where)
      else:
        outs = [self._slot() for _ in eqn.outvars]
        self.steps.append((self._step(eqn, where), ins, outs))
      env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]

  def _step(self, eqn, where):
    name = eqn.primitive.name
    if name == "pallas_call":
      from pallax._src.interpret import eager
      if eager.is_mosaic_gpu(eqn.params["params"]):
        raise NotImplementedError(
            f"as_torch_kernel({self.name}): Mosaic GPU kernels (plgpu.kernel) cannot be called "
            "from torch yet; pallas_call kernels on the Triton backend can")
      return Kernel(eqn, self.device)
    rule = torch_rules.RULES.get(name)
    if rule is None:
      where = ji.user_frame(eqn.source_info) or where or "an unknown line"
      raise NotImplementedError(
          f"as_torch_kernel({self.name}): {name} (at {where}) has no torch equivalent in "
          "pallax; move it into a kernel, or outside the function")
    params = {k: v for k, v in eqn.params.items() if k not in _DROPPED_PARAMS}
    if name in torch_rules.MULTIPLE_RESULTS:
      return lambda ins: list(rule(*ins, **params))
    return lambda ins: [rule(*ins, **params)]


class Kernel:
  """One pallas_call, compiled for the device's compute capability and launched by Triton's own
  launcher on torch's current stream. Its arguments, in the order of the XLA launch: operands,
  constants, outputs, hidden buffers."""

  def __init__(self, eqn, device):
    torch = torch_rules._torch()
    from pallax._src.triton import codegen, compile as tcompile, launch
    params = eqn.params["params"]
    major, minor = torch.cuda.get_device_capability(device)
    cc = major * 10 + minor
    launch.check_compute_capability(cc, params.name)
    ks = codegen.generate(params, cc)
    self.run = tcompile.launchable_kernel(ks, cc, params.name)[ks.grid]
    self.device = device
    self.outs = [(tuple(v.aval.shape), torch_rules.torch_dtype(v.aval.dtype)) for v in eqn.outvars]
    self.hidden = [(shape, torch_rules.torch_dtype(dtype), zeroed)
                   for shape, dtype, zeroed in ks.hidden]
    self.consts = [to_torch(a, device) for a in ks.constants]
    self.aliased = {o: i for i, o in params.input_output_aliases}   # output -> input
    # Triton launches on the current device: with several GPUs, make it the tensors' one.
    self.on_device = (lambda: torch.cuda.device(device)) if torch.cuda.device_count() > 1 else None

  def __call__(self, ins):
    torch = torch_rules._torch()
    ins = [aligned(t) for t in ins]
    outs = [ins[self.aliased[k]].clone() if k in self.aliased else
            torch.empty(shape, dtype=dtype, device=self.device)
            for k, (shape, dtype) in enumerate(self.outs)]
    hidden = [(torch.zeros if zeroed else torch.empty)(shape, dtype=dtype, device=self.device)
              for shape, dtype, zeroed in self.hidden]
    if self.on_device is None:
      self.run(*ins, *self.consts, *outs, *hidden)
    else:
      with self.on_device():
        self.run(*ins, *self.consts, *outs, *hidden)
    return outs


def aligned(t):
  """``t`` contiguous and 16-byte aligned (what the compiled kernel assumes)."""
  if not t.is_contiguous():
    t = t.contiguous()
  return t if t.data_ptr() % 16 == 0 else t.clone()


def to_torch(a, device):
  """A NumPy/JAX array (bfloat16 included) as a torch tensor on ``device``."""
  torch = torch_rules._torch()
  a = np.asarray(a)
  if a.dtype == jax.numpy.bfloat16:
    return torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16).to(device)
  return torch.from_numpy(a.copy()).to(device)

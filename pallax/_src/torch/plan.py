"""A traced function as a flat list of steps on torch tensors, prepared once per input signature
so that a call does little more than launch: call-like equations (``jit``, ``custom_vjp_call``,
...) are inlined, every pallas_call is compiled and bound to the device (``launch.py``),
every other equation to its torch rule (``rules.py``), and constants and literals are put
on the device once. Values live in numbered slots."""
from __future__ import annotations

import numpy as np

from pallax._src import jax_internals as ji
from pallax._src.torch import launch as torch_launch
from pallax._src.torch import rules as torch_rules

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
    consts = [self._slot(torch_rules.to_torch(c, device)) for c in closed.consts]
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
        return self._slot(torch_rules.to_torch(np.asarray(v.val, v.aval.dtype), self.device))
      return env[v]
    for eqn in jaxpr.eqns:
      ins = [read(v) for v in eqn.invars]
      name = eqn.primitive.name
      if name in CALLS:
        inner = eqn.params[CALLS[name]]
        consts = [self._slot(torch_rules.to_torch(c, self.device)) for c in getattr(inner, "consts", ())]
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
      return torch_launch.Kernel(eqn, self.device)
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

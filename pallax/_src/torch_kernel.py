"""``as_torch_kernel``: a function of arrays that calls ``pallas_call``, made callable with torch
tensors.

The function is traced once per input signature (shapes, dtypes, device). On a CUDA device each
pallas_call of the trace is compiled by the Triton backend and launched by Triton's own launcher
on torch's current stream, its outputs allocated by torch; the array code between kernels runs
as torch operations (``torch_rules.py``). No JAX arrays, no copies, no host synchronization. On
CPU tensors the function runs in pallax's interpreter, through DLPack.
"""
from __future__ import annotations

import functools
import re

import jax
import numpy as np

from pallax._src import jax_internals as ji
from pallax._src import torch_autograd
from pallax._src import torch_rules

# Call-like primitives whose inner jaxpr is evaluated in place: (primitive, its jaxpr's key).
_CALLS = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr",
          "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr", "checkpoint": "jaxpr",
          "remat": "jaxpr"}


def as_torch_kernel(fn):
  """Makes ``fn`` (a function of arrays calling ``pl.pallas_call``) callable with torch tensors;
  it returns torch tensors, in ``fn``'s output structure. Where an input requires a gradient,
  the call is differentiable through ``torch.autograd`` (``fn`` needs a ``jax.custom_vjp``,
  whose backward may itself call pallas_call). Under ``torch.compile`` it is one custom op
  (``pallax::<name>``) with a shape function, so graphs do not break at it."""
  programs: dict = {}   # (input signature, with gradients) -> _Program or Differentiated

  def run(tensors):
    torch = torch_rules._torch()
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    key = (tuple((tuple(t.shape), t.dtype, t.device) for t in tensors), grad)
    program = programs.get(key)
    if program is None:
      avals, device = _avals(tensors), _device(tensors)
      program = programs[key] = (torch_autograd.Differentiated(fn, avals, device, _Program)
                                 if grad else _Program(fn, avals, device))
    return program(tensors)

  templates: dict = {}  # input signature -> output structure (_output_template), for compile
  op = _custom_op(fn, run, templates)

  @functools.wraps(fn)
  def call(*tensors):
    _check_inputs(fn, tensors)
    torch = torch_rules._torch()
    if not torch.compiler.is_compiling():
      return run(tensors)   # eagerly: no custom-op dispatch on every call
    flat = op(list(tensors))   # torch.compile traces this op; its shape function fills templates
    return _rebuild(templates[_signature(tensors)], flat)
  return call


def _custom_op(fn, run, templates):
  """``run`` as a torch custom op on a list of tensors, with a fake (shape) implementation that
  also records the output structure in ``templates``."""
  torch = torch_rules._torch()
  name = re.sub(r"\W", "_", getattr(fn, "__name__", "fn"))
  name = f"pallax::{name}_{id(run):x}"

  @torch.library.custom_op(name, mutates_args=(), schema="(Tensor[] args) -> Tensor[]")
  def op(args):
    seen = {t.data_ptr() for t in args}
    outs = []
    for t in jax.tree.leaves(run(args)):   # a custom op's outputs alias nothing
      outs.append(t.clone() if t.data_ptr() in seen else t)
      seen.add(t.data_ptr())
    return outs

  @op.register_fake
  def _(args):
    signature = _signature(args)
    template, shapes = _output_template(fn, signature)
    templates[signature] = template
    device = args[0].device if args else torch.device("cuda")
    return [torch.empty(s.shape, dtype=torch_rules.torch_dtype(s.dtype), device=device)
            for s in shapes]
  return op


def _signature(tensors):
  return tuple((tuple(int(d) for d in t.shape), t.dtype) for t in tensors)


def _output_template(fn, signature):
  """(``fn``'s output structure with leaf k replaced by k: nested tuples, lists and dicts of
  ints, plain Python that torch.compile traces, where it cannot trace JAX; the output leaves'
  shapes and dtypes)."""
  avals = [jax.ShapeDtypeStruct(shape, _jax_dtype(dtype)) for shape, dtype in signature]
  leaves, tree = jax.tree.flatten(jax.eval_shape(fn, *avals))
  return jax.tree.unflatten(tree, list(range(len(leaves)))), leaves


def _rebuild(template, flat):
  if isinstance(template, int):
    return flat[template]
  if isinstance(template, dict):
    return {k: _rebuild(v, flat) for k, v in template.items()}
  return type(template)(_rebuild(v, flat) for v in template)


def _device(tensors):
  torch = torch_rules._torch()
  return tensors[0].device if tensors else torch.device("cuda")


def _avals(tensors):
  return [jax.ShapeDtypeStruct(tuple(t.shape), _jax_dtype(t.dtype)) for t in tensors]


def _check_inputs(fn, tensors):
  torch = torch_rules._torch()
  name = getattr(fn, "__name__", "fn")
  for k, t in enumerate(tensors):
    if not isinstance(t, torch.Tensor):
      raise TypeError(f"as_torch_kernel({name}): argument {k} is a {type(t).__name__}, not a "
                      "torch.Tensor")
  devices = {t.device for t in tensors}
  if len(devices) > 1:
    raise ValueError(f"as_torch_kernel({name}): the arguments are on different devices "
                     f"({', '.join(sorted(map(str, devices)))}); move them to one")
  if devices and next(iter(devices)).type not in ("cuda", "cpu"):
    raise ValueError(f"as_torch_kernel({name}): tensors on {next(iter(devices))}; pallax runs "
                     "kernels on CUDA devices (and in its interpreter for CPU tensors)")


class _Program:
  """``fn`` traced for one input signature, and how to run it on that device."""

  def __init__(self, fn, avals, device):
    self.fn = fn
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*avals)
    self.jaxpr = closed.jaxpr
    self.out_tree = jax.tree.structure(out_shape)
    self.device = device
    self.consts = [_to_torch(c, self.device) for c in closed.consts]
    self.kernels: dict = {}   # id of a pallas_call equation -> _Kernel, made on first use
    self.literals: dict = {}  # id of a literal or inner jaxpr -> its value(s) on the device

  def __call__(self, tensors):
    if self.device.type == "cpu":
      return self._interpret(tensors)
    outs = _eval(self, self.jaxpr, self.consts, list(tensors))
    return jax.tree.unflatten(self.out_tree, outs)

  def kernel(self, eqn):
    k = self.kernels.get(id(eqn))
    if k is None:
      from pallax._src.interpret import eager
      if eager.is_mosaic_gpu(eqn.params["params"]):
        raise NotImplementedError(
            f"as_torch_kernel({getattr(self.fn, '__name__', 'fn')}): Mosaic GPU kernels "
            "(plgpu.kernel) cannot be called from torch yet; pallas_call kernels on the Triton "
            "backend can")
      k = self.kernels[id(eqn)] = _Kernel(eqn, self.device)
    return k

  def constants(self, closed):
    """A closed inner jaxpr's constants as tensors on the device (copied there once)."""
    ts = self.literals.get(id(closed))
    if ts is None:
      ts = [_to_torch(c, self.device) for c in getattr(closed, "consts", ())]
      self.literals[id(closed)] = ts
    return ts

  def literal(self, v):
    t = self.literals.get(id(v))
    if t is None:   # made once: a copy to the device on every call would wait for the host
      t = self.literals[id(v)] = _to_torch(np.asarray(v.val, v.aval.dtype), self.device)
    return t

  def _interpret(self, tensors):
    torch = torch_rules._torch()
    args = [jax.dlpack.from_dlpack(t.detach().contiguous()) for t in tensors]
    with jax.default_device(jax.devices("cpu")[0]):
      outs = jax.jit(self.fn)(*args)
    return jax.tree.map(lambda a: torch.from_dlpack(a), outs)


def _eval(program, jaxpr, consts, args, where=None):
  """``jaxpr`` on torch tensors; ``where``: the user's line of the call it is inside, if any."""
  env = {}
  def read(v):
    return program.literal(v) if isinstance(v, ji.Literal) else env[v]
  env.update(zip(jaxpr.constvars, consts))
  env.update(zip(jaxpr.invars, args))
  for eqn in jaxpr.eqns:
    outs = _apply(program, eqn, [read(v) for v in eqn.invars], where)
    env.update(zip(eqn.outvars, outs))
  return [read(v) for v in jaxpr.outvars]


def _apply(program, eqn, ins, where=None):
  name = eqn.primitive.name
  if name == "pallas_call":
    return program.kernel(eqn)(ins)
  if name in _CALLS:
    inner = eqn.params[_CALLS[name]]
    return _eval(program, getattr(inner, "jaxpr", inner), program.constants(inner), ins,
                 ji.user_frame(eqn.source_info) or where)
  rule = torch_rules.RULES.get(name)
  if rule is None:
    where = ji.user_frame(eqn.source_info) or where or "an unknown line"
    raise NotImplementedError(
        f"as_torch_kernel({getattr(program.fn, '__name__', 'fn')}): {name} (at {where}) has no "
        "torch equivalent in pallax; move it into a kernel, or outside the function")
  params = {k: v for k, v in eqn.params.items() if k not in ("sharding", "accumulation_type",
                                                              "out_sharding")}
  out = rule(*ins, **params)
  return list(out) if name in torch_rules.MULTIPLE_RESULTS else [out]


class _Kernel:
  """One pallas_call, compiled for this device's compute capability and launched by Triton."""

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
    self.consts = [_to_torch(a, device) for a in ks.constants]
    self.aliased = {o: i for i, o in params.input_output_aliases}   # output -> input

  def __call__(self, ins):
    torch = torch_rules._torch()
    ins = [_aligned(t) for t in ins]
    outs = [ins[self.aliased[k]].clone() if k in self.aliased else
            torch.empty(shape, dtype=dtype, device=self.device)
            for k, (shape, dtype) in enumerate(self.outs)]
    hidden = [(torch.zeros if zeroed else torch.empty)(shape, dtype=dtype, device=self.device)
              for shape, dtype, zeroed in self.hidden]
    self.run(*ins, *self.consts, *outs, *hidden)
    return outs


def _aligned(t):
  """``t`` contiguous and 16-byte aligned (what the compiled kernel assumes)."""
  if not t.is_contiguous():
    t = t.contiguous()
  return t if t.data_ptr() % 16 == 0 else t.clone()


def _jax_dtype(torch_dtype):
  name = str(torch_dtype).removeprefix("torch.")
  try:
    return jax.numpy.dtype(name)
  except TypeError:
    raise ValueError(f"as_torch_kernel: torch dtype {torch_dtype} has no JAX equivalent") from None


def _to_torch(a, device):
  torch = torch_rules._torch()
  a = np.asarray(a)
  return torch.from_numpy(a.copy()).to(device) if a.dtype != jax.numpy.bfloat16 else \
      torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16).to(device)


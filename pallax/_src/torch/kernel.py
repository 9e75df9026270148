"""``as_torch_kernel``: a function of arrays that calls ``pallas_call``, made callable with torch
tensors.

The function is traced once per input signature (shapes, dtypes, device). On a CUDA device each
pallas_call of the trace is compiled by the Triton backend and launched by Triton's own launcher
on torch's current stream, its outputs allocated by torch; the array code between kernels runs
as torch operations (``rules.py``). No JAX arrays, no copies, no host synchronization. On
CPU tensors the function runs in pallax's interpreter, through DLPack.
"""
from __future__ import annotations

import functools
import re

import jax

from pallax._src.torch import autograd as torch_autograd
from pallax._src.torch import plan as torch_plan
from pallax._src.torch import rules as torch_rules


def as_torch_kernel(fn):
  """Makes ``fn`` (a function of arrays calling ``pl.pallas_call``) callable with torch tensors;
  it returns torch tensors, in ``fn``'s output structure. Where an input requires a gradient,
  the call is differentiable through ``torch.autograd`` (``fn`` needs a ``jax.custom_vjp``,
  whose backward may itself call pallas_call). Under ``torch.compile`` it is one custom op
  (``pallax::<name>``) with a shape function, so graphs do not break at it."""
  torch = torch_rules.import_torch()
  programs: dict = {}   # (input signature, with gradients) -> _Program or Differentiated

  def program_for(tensors, grad: bool):
    key = (tuple((t.shape, t.dtype, t.device) for t in tensors), grad)
    program = programs.get(key)
    if program is None:   # a new signature: the inputs are checked here only
      _check_inputs(fn, tensors)
      _check_64_bit(fn, [t.dtype for t in tensors])
      avals, device = _avals(tensors), _device(tensors)
      program = programs[key] = (torch_autograd.Differentiated(fn, avals, device, _Program)
                                 if grad else _Program(fn, avals, device))
    return program

  def run(tensors):
    try:
      grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    except AttributeError:
      _check_inputs(fn, tensors)   # not tensors: says which
    return program_for(tensors, grad)(tensors)

  templates: dict = {}  # input signature -> output structure (_output_template), for compile
  op = _custom_op(fn, run, templates)
  grad_op = torch_autograd.custom_grad_op(
      fn, program_for, _op_name(fn, run), templates, _signature,
      lambda signature: _output_template(fn, signature), _avals)

  @functools.wraps(fn)
  def call(*tensors):
    if not torch.compiler.is_compiling():
      return run(tensors)   # eagerly: no custom-op dispatch on every call
    _check_inputs(fn, tensors)
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
      flat = grad_op(list(tensors))   # a custom op with a registered backward
    else:
      flat = op(list(tensors))   # torch.compile traces this op; its shape function fills templates
    return _rebuild(templates[_signature(tensors)], flat)
  return call


def _op_name(fn, run) -> str:
  name = re.sub(r"\W", "_", getattr(fn, "__name__", "fn"))
  return f"pallax::{name}_{id(run):x}"


def _custom_op(fn, run, templates):
  """``run`` as a torch custom op on a list of tensors, with a fake (shape) implementation that
  also records the output structure in ``templates``."""
  torch = torch_rules.import_torch()

  @torch.library.custom_op(_op_name(fn, run), mutates_args=(),
                           schema="(Tensor[] args) -> Tensor[]")
  def op(args):
    return torch_autograd.unaliased(args, jax.tree.leaves(run(args)))

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
  _check_64_bit(fn, [dtype for _, dtype in signature])   # under torch.compile: checked here
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
  torch = torch_rules.import_torch()
  return tensors[0].device if tensors else torch.device("cuda")


def _avals(tensors):
  return [jax.ShapeDtypeStruct(tuple(t.shape), _jax_dtype(t.dtype)) for t in tensors]


def _check_64_bit(fn, dtypes):
  """JAX traces 64-bit types as 32-bit ones unless jax_enable_x64 is set: the kernel would then
  read a float64 or int64 tensor as 32-bit data."""
  name = getattr(fn, "__name__", "fn")
  for k, torch_dtype in enumerate(dtypes):
    dtype = _jax_dtype(torch_dtype)
    if jax.dtypes.canonicalize_dtype(dtype) != dtype:
      raise ValueError(
          f"as_torch_kernel({name}): argument {k} is {torch_dtype}, which JAX runs as a 32-bit "
          "type unless 64-bit types are enabled: convert it (.float(), .int()), or enable them "
          "with jax.config.update('jax_enable_x64', True) or the jax.enable_x64(True) context")


def _check_inputs(fn, tensors):
  torch = torch_rules.import_torch()
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
  """``fn`` traced for one input signature, and how to run it on that device: a prepared plan of
  torch steps on a CUDA device (``plan.py``), pallax's interpreter for CPU tensors."""

  def __init__(self, fn, avals, device):
    self.fn = fn
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*avals)
    self.out_tree = jax.tree.structure(out_shape)
    self.single = self.out_tree.num_leaves == 1 and jax.tree_util.treedef_is_leaf(self.out_tree)
    self.device = device
    self.plan = None if device.type == "cpu" else \
        torch_plan.Plan(closed, device, getattr(fn, "__name__", "fn"))
    self.jitted = jax.jit(fn) if self.plan is None else None
    self.x64 = jax.config.jax_enable_x64   # the interpreter traces again: as it was traced here

  def __call__(self, tensors):
    if self.plan is None:
      return self._interpret(tensors)
    outs = self.plan.run(tensors)
    return outs[0] if self.single else jax.tree.unflatten(self.out_tree, outs)

  def _interpret(self, tensors):
    torch = torch_rules.import_torch()
    with jax.default_device(jax.devices("cpu")[0]), jax.enable_x64(self.x64):
      outs = self.jitted(*[jax.dlpack.from_dlpack(t.detach().contiguous()) for t in tensors])
    return jax.tree.map(lambda a: torch.from_dlpack(a), outs)


def _jax_dtype(torch_dtype):
  name = str(torch_dtype).removeprefix("torch.")
  try:
    return jax.numpy.dtype(name)
  except TypeError:
    raise ValueError(f"as_torch_kernel: torch dtype {torch_dtype} has no JAX equivalent") from None

"""Reverse mode for ``as_torch_kernel``: a function's forward and backward passes as two functions
of arrays, which ``torch_kernel`` runs on torch tensors inside a ``torch.autograd.Function``.

``jax.vjp`` decides the split: its pullback is a pytree whose leaves are the residuals, so the
forward pass returns them beside the outputs, torch keeps them, and the backward pass rebuilds the
pullback from them. Where the function has a ``jax.custom_vjp`` (JAX's layer_norm, rms_norm, mha),
the residuals are its forward rule's and the backward pass runs its backward kernels.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallax._src.torch import rules as torch_rules


def vjp_functions(fn, avals):
  """For inputs like ``avals``: ``(forward, backward, output shapes, residual shapes)`` with
  ``forward(*primals) -> (outputs, residuals)`` and ``backward(*residuals, *output cotangents)
  -> input cotangents`` (None for inputs that are not floating point)."""
  name = getattr(fn, "__name__", "fn")
  captured = {}

  def forward(*primals):
    out, pullback = jax.vjp(fn, *primals)
    residuals, captured["tree"] = jax.tree.flatten(pullback)
    return out, residuals

  out_shape, res_shape = jax.eval_shape(forward, *avals)
  for leaf in jax.tree.leaves(out_shape):
    if not jnp.issubdtype(leaf.dtype, jnp.floating):
      raise ValueError(f"as_torch_kernel({name}): gradients need floating-point outputs, but "
                       f"one is {leaf.dtype}; call it under torch.no_grad()")
  pullback_tree, out_tree = captured["tree"], jax.tree.structure(out_shape)
  n_res = len(res_shape)
  differentiable = [jnp.issubdtype(a.dtype, jnp.floating) for a in avals]

  def backward(*flat):
    pullback = jax.tree.unflatten(pullback_tree, flat[:n_res])
    cts = pullback(jax.tree.unflatten(out_tree, flat[n_res:]))
    return [c if d else None for c, d in zip(cts, differentiable)]

  jax.eval_shape(backward, *res_shape, *jax.tree.leaves(out_shape))   # fails now, not in torch
  return forward, backward, out_shape, res_shape


class Differentiated:
  """One input signature's forward and backward programs (``torch_kernel._Program``s)."""

  def __init__(self, fn, avals, device, program):
    forward, backward, out_shape, res_shape = vjp_functions(fn, avals)
    self.device = device
    self.out_tree = jax.tree.structure(out_shape)
    self.out_leaves = jax.tree.leaves(out_shape)
    self.forward = program(forward, avals, device)
    self.backward = program(backward, [*res_shape, *self.out_leaves], device)

  def __call__(self, tensors):
    flat = _function_class().apply(self, *tensors)
    return jax.tree.unflatten(self.out_tree, list(flat))


def custom_grad_op(fn, program_for, name, templates, signature, describe, avals):
  """Gradients under ``torch.compile``: a custom op ``<name>_fwd`` returning ``fn``'s outputs and
  its residuals, whose registered backward is a custom op ``<name>_bwd`` running the backward
  program. Returns a function of the input list -> the output leaves. The shape functions fill
  ``templates`` (output structures) and the output counts, which Dynamo reads back as Python."""
  torch = torch_rules.import_torch()
  counts: dict = {}   # input signature -> number of outputs (the rest are residuals)

  @torch.library.custom_op(f"{name}_fwd", mutates_args=(), schema="(Tensor[] args) -> Tensor[]")
  def forward(args):
    out, residuals = program_for(args, True).forward(args)
    return unaliased(args, [*jax.tree.leaves(out), *residuals])

  @forward.register_fake
  def _(args):
    sig = signature(args)
    templates[sig], out_leaves = describe(sig)
    counts[sig] = len(out_leaves)
    _, _, _, res_shape = vjp_functions(fn, avals(args))
    return [torch.empty(s.shape, dtype=torch_rules.torch_dtype(s.dtype), device=args[0].device)
            for s in [*out_leaves, *res_shape]]

  @torch.library.custom_op(f"{name}_bwd", mutates_args=(),
                           schema="(Tensor[] args, Tensor[] residuals, Tensor[] cts) -> Tensor[]")
  def backward_op(args, residuals, cts):
    grads = program_for(args, True).backward([*residuals, *cts])
    return [g if g is not None else a.new_empty(0) for g, a in zip(grads, args)]

  @backward_op.register_fake
  def _(args, residuals, cts):
    return [torch.empty_like(a) if a.is_floating_point() else a.new_empty(0) for a in args]

  def setup_context(ctx, inputs, output):
    (args,) = inputs
    n_out = counts[signature(args)]
    ctx.n_args, ctx.outs = len(args), [(o.shape, o.dtype) for o in output[:n_out]]
    ctx.save_for_backward(*args, *output[n_out:])

  def backward(ctx, grads):
    saved = ctx.saved_tensors
    args, residuals = saved[:ctx.n_args], saved[ctx.n_args:]
    cts = [g if g is not None else torch.zeros(shape, dtype=dtype, device=args[0].device)
           for g, (shape, dtype) in zip(grads, ctx.outs)]
    in_grads = backward_op(list(args), list(residuals), cts)
    return ([g if a.is_floating_point() else None for g, a in zip(in_grads, args)],)

  forward.register_autograd(backward, setup_context=setup_context)

  def apply(args):
    flat = forward(args)
    return flat[:counts[signature(args)]]
  return apply


def unaliased(args, outs):
  """A custom op's outputs alias neither its inputs nor each other: copies where they would."""
  seen = {t.data_ptr() for t in args}
  result = []
  for t in outs:
    result.append(t.clone() if t.data_ptr() in seen else t)
    seen.add(t.data_ptr())
  return result


@functools.cache
def _function_class():
  torch = torch_rules.import_torch()

  class PallaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, grads, *tensors):
      out, residuals = grads.forward(tensors)
      ctx.grads = grads
      ctx.save_for_backward(*residuals)
      return tuple(jax.tree.leaves(out))

    @staticmethod
    def backward(ctx, *cts):
      grads = ctx.grads
      cts = [c if c is not None else   # an output the loss did not use
             torch.zeros(leaf.shape, dtype=torch_rules.torch_dtype(leaf.dtype), device=grads.device)
             for c, leaf in zip(cts, grads.out_leaves)]
      return (None, *grads.backward([*ctx.saved_tensors, *[c.contiguous() for c in cts]]))

  return PallaxFunction

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


@functools.cache
def _function_class():
  import torch

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
             torch.zeros(leaf.shape, dtype=_torch_dtype(leaf.dtype), device=grads.device)
             for c, leaf in zip(cts, grads.out_leaves)]
      return (None, *grads.backward([*ctx.saved_tensors, *[c.contiguous() for c in cts]]))

  return PallaxFunction


def _torch_dtype(dtype):
  from pallax._src.torch_rules import torch_dtype
  return torch_dtype(dtype)

"""vmap of ``pallas_call``: batching adds a grid axis."""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from pallax._src import jax_internals as ji
from pallax._src.grid_mapping import with_leading_grid_axis
from pallax._src.call_primitive import Params, pallas_call_p


def with_leading_program_id(jaxpr, name: str, axes=()):
  """A kernel jaxpr taking one more program id first (which it ignores); ``axes``: the
  (name, size) pairs its ``lax.axis_index`` equations name (Mosaic GPU threads, clusters)."""
  def new_kernel(b, *args):
    ji.eval_jaxpr(jaxpr, jaxpr.consts, *args)
    return []
  new, _, consts = ji.trace_to_jaxpr(new_kernel, [ji.ShapedArray((), jnp.int32)] + list(jaxpr.in_avals),
                                     name=name, axes=axes)
  return ji.closed(new, consts)


def _batching_rule(args, dims, *, params: Params):
  gm = params.grid_mapping
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
  nidx = gm.num_index_operands
  if any(d is not None for d in dims[:nidx]):
    raise NotImplementedError(f"pallas_call {params.name}: vmap over scalar-prefetch operands "
                              "is not supported")
  args = [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
  batched_in = [d is not None for d in dims]
  # An aliased output is batched; so must its input be.
  for i, o in params.input_output_aliases:
    if not batched_in[i]:
      args[i] = jnp.broadcast_to(args[i], (size,) + jnp.shape(args[i]))   # may be a Python int
      batched_in[i] = True
  new_gm = with_leading_grid_axis(gm, size, batched_in[nidx:] + [True] * gm.num_outputs)
  axes = params.threads.axis_env() if params.threads is not None else ()
  new_params = dataclasses.replace(params, jaxpr=with_leading_program_id(params.jaxpr, params.name, axes),
                                   grid_mapping=new_gm)
  outs = pallas_call_p.bind(*args, params=new_params)
  return outs, [0] * len(outs)


ji.batching.primitive_batchers[pallas_call_p] = _batching_rule

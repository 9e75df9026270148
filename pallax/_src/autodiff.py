"""Forward-mode AD of ``pallas_call``: the JVP of a kernel is a kernel; partial evaluation and transpose."""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from pallax._src import jax_internals as ji
from pallax._src.grid_mapping import BlockMapping
from pallax._src.call_primitive import Params, pallas_call_p


# --- forward-mode AD: the JVP of the kernel is a kernel ----------------------------------------

def _is_float(aval) -> bool:
  return jnp.issubdtype(aval.dtype, jnp.inexact)


def _tangent_block_mapping(bm: BlockMapping) -> BlockMapping:
  return dataclasses.replace(bm, origin=f"tangent of {bm.origin}")


def _jvp_kernel(params: Params, diff_in, diff_out, diff_scratch):
  """The kernel jaxpr of the JVP call: its Refs in the order
  ``ids, index operands, ins, tangent ins, outs, tangent outs, scratch, tangent scratch, globals``;
  the body is JAX's JVP of the kernel (a tangent Ref beside each differentiable one)."""
  gm, jaxpr = params.grid_mapping, params.jaxpr
  n_ids, nidx = len(gm.grid), gm.num_index_operands
  n_in, n_out, n_scr = gm.num_inputs - nidx, gm.num_outputs, len(gm.scratch_avals)
  avals = list(jaxpr.in_avals)
  groups = [n_ids, nidx, n_in, n_out, n_scr, len(avals) - n_ids - nidx - n_in - n_out - n_scr]
  ids, idx, ins, outs, scr, glob = _split(avals, groups)
  diff = ([False] * (n_ids + nidx) + list(diff_in) + list(diff_out) + list(diff_scratch)
          + [False] * len(glob))
  jvp, _ = ji.ad.jvp_jaxpr(jaxpr, diff, [])
  pick = lambda xs, ds: [x for x, d in zip(xs, ds) if d]
  new_avals = (ids + idx + ins + pick(ins, diff_in) + outs + pick(outs, diff_out) + scr
               + pick(scr, diff_scratch) + glob)

  def kernel(*args):
    a_ids, a_idx, a_in, t_in, a_out, t_out, a_scr, t_scr, a_glob = _split(
        list(args), [n_ids, nidx, n_in, sum(diff_in), n_out, sum(diff_out), n_scr,
                     sum(diff_scratch), len(glob)])
    ji.eval_jaxpr(jvp, jvp.consts, *a_ids, *a_idx, *a_in, *a_out, *a_scr, *a_glob,
                  *t_in, *t_out, *t_scr)
    return []

  new, _, consts = ji.trace_to_jaxpr(kernel, new_avals, name=params.name)
  return ji.closed(new, consts)


def _split(xs, sizes):
  out, at = [], 0
  for n in sizes:
    out.append(xs[at:at + n])
    at += n
  return out


def _jvp(primals, tangents, *, params: Params):
  """Forward-mode differentiation, as in JAX Pallas: one pallas_call computes the outputs and
  their tangents; every float operand gets a tangent operand with the same block spec."""
  gm = params.grid_mapping
  nidx = gm.num_index_operands
  in_bms, out_bms = gm.block_mappings[:gm.num_inputs - nidx], gm.block_mappings[gm.num_inputs - nidx:]
  diff_in = [_is_float(bm.array_aval) for bm in in_bms]
  diff_out = [_is_float(bm.array_aval) for bm in out_bms]
  diff_scratch = [_is_float(a.inner_aval) for a in gm.scratch_avals]
  t_in = [ji.ad.instantiate_zeros(t) for t, d in zip(tangents[nidx:], diff_in) if d]
  pick = lambda xs, ds: [x for x, d in zip(xs, ds) if d]
  n_in = gm.num_inputs - nidx
  new_gm = gm.replace(
      block_mappings=(*in_bms, *map(_tangent_block_mapping, pick(in_bms, diff_in)), *out_bms,
                      *map(_tangent_block_mapping, pick(out_bms, diff_out))),
      num_inputs=gm.num_inputs + sum(diff_in), num_outputs=gm.num_outputs + sum(diff_out),
      scratch_avals=(*gm.scratch_avals, *pick(gm.scratch_avals, diff_scratch)),
      scratch_zeroed=(*(gm.scratch_zeroed or (False,) * len(gm.scratch_avals)),
                      *[False] * sum(diff_scratch)))
  # An aliased output starts as its input; its tangent starts as the input's tangent.
  tin_pos = {i: k for k, i in enumerate(i for i, d in enumerate(diff_in) if d)}
  tout_pos = {o: k for k, o in enumerate(o for o, d in enumerate(diff_out) if d)}
  aliases = list(params.input_output_aliases)
  for i, o in params.input_output_aliases:
    if (i - nidx) in tin_pos and o in tout_pos:
      aliases.append((nidx + n_in + tin_pos[i - nidx], gm.num_outputs + tout_pos[o]))
  names = list(params.arg_names)
  if names:   # tangent Refs are named after their primals (x_ref_dot)
    idx, ins, outs, scr = _split(names, [nidx, n_in, gm.num_outputs, len(gm.scratch_avals)])
    dot = lambda ns, ds: [f"{n}_dot" for n, d in zip(ns, ds) if d]
    names = (idx + ins + dot(ins, diff_in) + outs + dot(outs, diff_out) + scr
             + dot(scr, diff_scratch) + names[len(idx + ins + outs + scr):])
  new_params = dataclasses.replace(
      params, jaxpr=_jvp_kernel(params, diff_in, diff_out, diff_scratch), grid_mapping=new_gm,
      input_output_aliases=tuple(sorted(aliases)), jvp_of=(params, len(primals)),
      arg_names=tuple(names))
  outs = pallas_call_p.bind(*primals, *t_in, params=new_params)
  primal_out, tangent_out = outs[:gm.num_outputs], iter(outs[gm.num_outputs:])
  tangent_out = [next(tangent_out) if d else ji.ad.Zero(bm.array_aval.to_tangent_aval())
                 for bm, d in zip(out_bms, diff_out)]
  return primal_out, tangent_out


ji.ad.primitive_jvps[pallas_call_p] = _jvp


def _partial_eval(trace, *tracers, params: Params):
  """``jax.linearize``: with the primals known and the tangents not, the primal outputs come from
  the primal call now, and the JVP call is staged for the tangents."""
  if params.jvp_of is not None:
    primal, n = params.jvp_of
    known = [t.pval.get_known() for t in tracers]
    if all(k is not None for k in known[:n]) and any(k is None for k in known[n:]):
      outs = pallas_call_p.bind_with_trace(trace.parent_trace, known[:n],
                                           tuple(t.aval for t in tracers[:n]), {"params": primal})
      staged = trace.default_process_primitive(pallas_call_p, tracers, {"params": params})
      return [trace.new_const(o) for o in outs] + staged[len(outs):]
  return trace.default_process_primitive(pallas_call_p, tracers, {"params": params})


ji.pe.custom_partial_eval_rules[pallas_call_p] = _partial_eval


class ReverseModeError(NotImplementedError, ValueError):
  """No transpose for a kernel. A ValueError too: JAX Pallas fails the same programs with a
  ValueError ("Linearization failed ..."), which JAX users catch."""


def _transpose(*args, params: Params, **_):
  raise ReverseModeError(
      f"pallas_call {params.name}: reverse-mode differentiation (jax.grad, jax.vjp) of a kernel is "
      "not defined, in pallax as in JAX Pallas (where it stops with \"Linearization failed\"): "
      "pallax differentiates kernels forward (jax.jvp) only. Wrap the function that calls "
      "pallas_call in jax.custom_vjp and write its backward pass, usually as another pallas_call.")


ji.ad.primitive_transposes[pallas_call_p] = _transpose

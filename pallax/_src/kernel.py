"""``pl.kernel`` and ``pl.core_map``: a body run once per point of a mesh, on whole arrays.

Both become one ``pallas_call`` per (body, mesh) whose grid is the mesh and whose
operands are unblocked. JAX Refs passed in or closed over are read and written
in place: each becomes an input aliased to an output that is written back.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from pallax._src import captured
from pallax._src import core as pc
from pallax._src import jax_internals as ji
from pallax._src import grid_mapping
from pallax._src import pallas_call as pcall
from pallax._src import tracing
from pallax._src import primitives as prims
from pallax._src import semaphores


class _NotSpecified:
  pass


_NS = _NotSpecified()


def _is_ref(x) -> bool:
  try:
    return ji.is_ref_aval(jax.typeof(x))
  except TypeError:
    return False


def _run_one(body, mesh: pc.Mesh, operands, out_avals, scratch, name, interpret, debug,
             compiler_params, cost_estimate, kernel_args=None, threads=None):
  """Runs ``body`` over ``mesh``; returns (outputs, new values of Ref operands)."""
  rank = len(mesh.grid)
  op_avals = [ji.ShapedArray(jax.typeof(x).shape, jax.typeof(x).dtype) for x in operands]
  ref_ops = [i for i, x in enumerate(operands) if _is_ref(x)]
  scratch_avals = [grid_mapping.scratch_aval(s, name) for s in scratch]
  probe_avals = [ji.ref_aval(a.shape, a.dtype) for a in op_avals + list(out_avals)] + scratch_avals
  probe, globals_avals = tracing.trace_kernel(body, name, mesh.grid, probe_avals,
                                [f"args[{i}]" for i in range(len(operands))]
                                + [f"out[{i}]" for i in range(len(out_avals))], mesh.grid_names,
                                kernel_args, closure="kernel",
                                extra_axes=threads.axis_env() if threads is not None else ())
  closed_refs = [c for c in probe.consts if _is_ref(c)]
  # A Mosaic GPU kernel's pl.get_global buffers are operands too: zeros in GMEM, which every
  # block sees (in other kernels they are the pallas_call's own, see pl.get_global).
  glob_ops = [jnp.zeros(a.shape, a.dtype) for a in globals_avals] if threads is not None else []
  n_ops, n_out, n_closed, n_glob = len(operands), len(out_avals), len(closed_refs), len(glob_ops)
  # pallas_call operands: operand values, then closed-over Ref values, then globals.
  call_args = ([x[...] if _is_ref(x) else x for x in operands] + [r[...] for r in closed_refs]
               + glob_ops)
  call_outs = (list(out_avals) + [op_avals[i] for i in ref_ops] + [jax.typeof(r) for r in closed_refs]
               + [jax.typeof(g) for g in glob_ops])
  call_outs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in
               [getattr(a, "inner_aval", a) for a in call_outs]]
  aliases = {i: n_out + k for k, i in enumerate(ref_ops)}
  aliases.update({n_ops + k: n_out + len(ref_ops) + k for k in range(n_closed + n_glob)})
  if n_glob:
    first = n_out + len(ref_ops) + n_closed
    threads = threads.with_global_outputs(tuple(range(first, first + n_glob)))

  def replay(*refs):
    n_in = n_ops + n_closed + n_glob
    ins, outs, scr = refs[:n_in], refs[n_in:n_in + len(call_outs)], refs[n_in + len(call_outs):]
    body_ops = [outs[n_out + ref_ops.index(i)] if i in ref_ops else ins[i] for i in range(n_ops)]
    closed_it = iter(outs[n_out + len(ref_ops):])
    consts = [next(closed_it) if _is_ref(c) else captured.as_literal(c) for c in probe.consts]
    ids = [prims.program_id(a) for a in range(rank)]
    glob = (list(outs[len(outs) - n_glob:]) if n_glob else
            [semaphores.get_global(jax.ShapeDtypeStruct(a.shape, a.dtype)) for a in globals_avals])
    ji.eval_jaxpr(probe, consts, *ids, *body_ops, *outs[:n_out], *scr, *glob)

  results = pcall.pallas_call(
      replay, out_shape=call_outs, grid=mesh.grid, scratch_shapes=tuple(scratch),
      input_output_aliases=aliases, interpret=interpret, debug=debug, name=name,
      compiler_params=compiler_params, cost_estimate=cost_estimate,
      _grid_names=mesh.grid_names, _threads=threads)(*call_args)
  outs = results[:n_out]
  for k, i in enumerate(ref_ops):
    operands[i][...] = results[n_out + k]
  for k, r in enumerate(closed_refs):
    r[...] = results[n_out + len(ref_ops) + k]
  return outs


def kernel(body=_NS, out_type=(), *, mesh, scratch_types=(), compiler_params=None,
           interpret=False, cost_estimate=None, debug=False, name=None, metadata=None,
           _threads=None):
  """Runs ``body(*operand_refs, *out_refs, *scratch_refs)`` once per point of ``mesh``.

  ``pl.program_id(axis)`` (an index or a mesh axis name) gives the position. A list
  of bodies with a list of meshes runs each body over its mesh, in list order.
  """
  del metadata
  if isinstance(body, _NotSpecified):
    return lambda b: kernel(b, out_type, mesh=mesh, scratch_types=scratch_types,
                            compiler_params=compiler_params, interpret=interpret,
                            cost_estimate=cost_estimate, debug=debug, name=name, _threads=_threads)
  if hasattr(mesh, "run_per_warp"):   # plgpu.WarpMesh: per-warp code inside a plgpu kernel
    return mesh.run_per_warp(body, out_type, scratch_types)
  bodies = list(body) if isinstance(body, (list, tuple)) else [body]
  meshes = list(mesh) if isinstance(mesh, (list, tuple)) else [mesh]
  if len(bodies) != len(meshes):
    raise ValueError(f"pl.kernel: {len(bodies)} bodies but {len(meshes)} meshes; pass one mesh per body")
  for i, m in enumerate(meshes):
    if hasattr(m, "as_pallas_mesh"):   # plgpu.Mesh: a grid plus cluster and thread axes
      meshes[i], _threads = m.as_pallas_mesh()
    elif not isinstance(m, pc.Mesh):
      raise TypeError(f"pl.kernel: mesh must be a pl.Mesh(grid=..., grid_names=...), got {m!r}")
  kname = name or getattr(bodies[0], "__name__", "kernel")
  flat_types, out_tree = jax.tree.flatten(out_type, is_leaf=lambda s: hasattr(s, "dtype"))
  out_avals = [pcall.out_aval(s, i, kname) for i, s in enumerate(flat_types)]
  scratch = jax.tree.leaves(scratch_types, is_leaf=lambda s: hasattr(s, "get_ref_aval"))

  def call(*operands):
    flat_ops, in_tree = jax.tree.flatten(operands, is_leaf=_is_ref)
    kargs = tracing.kernel_args(in_tree, out_tree, scratch_types)
    outs = None
    for b, m in zip(bodies, meshes):
      if outs is None:
        outs = _run_one(b, m, flat_ops, out_avals, scratch, kname, interpret, debug,
                        compiler_params, cost_estimate, kargs, _threads)
      else:
        # Later bodies see the earlier bodies' outputs: run them on Refs holding those.
        out_refs = [jax.new_ref(o) for o in outs]
        _run_one(lambda *refs, b=b: b(*refs), m, flat_ops + out_refs, [], scratch, kname,
                 interpret, debug, compiler_params, cost_estimate)
        outs = [r[...] for r in out_refs]
    return jax.tree.unflatten(out_tree, list(outs))

  return call


def core_map(mesh, *, compiler_params=None, interpret=False, debug=False, cost_estimate=None,
             name=None, metadata=None):
  """``@pl.core_map(mesh)`` runs the decorated no-argument function once per mesh point now;
  it communicates through the Refs it closes over."""
  del metadata
  def decorator(f):
    kernel(lambda: f(), (), mesh=mesh, compiler_params=compiler_params, interpret=interpret,
           cost_estimate=cost_estimate, debug=debug, name=name or getattr(f, "__name__", "core_map"))()
    return None
  return decorator

"""The interpreter for kernels whose sizes are symbolic (``jax.export``'s shape polymorphism):
a grid like ``(pl.cdiv(x.shape[0], 8),)`` over arrays of symbolic shape, with static blocks.

The plan (``plan.py``) analyses a grid point by point, which a symbolic grid does not allow, so
these kernels take a plainer path, the one JAX's own interpreter takes: the programs run one
after another in row-major grid order in a ``lax.fori_loop`` (a trip count that is a symbolic
expression), each reading its blocks out of operands padded to whole blocks with
``dynamic_slice`` and writing its output blocks back. The results are those of the same kernel
at concrete sizes. What is not here: the run-time checks (they report through host callbacks,
which ``jax.export`` cannot serialize: bounds, races, uninitialized reads; as for concrete sizes,
a call that asks for them is refused and says how to turn them off), scratch poisoned at each
new lane of programs (scratch carries from program to program), ``pl.Element`` blocks,
``pl.get_global`` and Mosaic GPU kernels; those are refused by name."""
from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from pallax._src import core as pc
from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src import primitives as prims
from pallax._src.gpu import dot_algorithms
from pallax._src.interpret import uninit


def symbolic(params) -> bool:
  """Whether the call has symbolic sizes (its grid or an operand's shape)."""
  gm = params.grid_mapping
  return any(ji.is_symbolic_dim(d) for d in gm.grid) or any(
      ji.is_symbolic_dim(d) for bm in gm.block_mappings for d in bm.array_aval.shape)


def _refuse(params, what: str):
  raise NotImplementedError(
      f"pallas_call {params.name}: {what} with symbolic sizes (jax.export's shape polymorphism) "
      "is not supported by pallax's interpreter yet; export the kernel for concrete shapes")


def checks_requested(params) -> bool:
  """Whether the call's interpreter parameters ask for run-time checks (bounds, races,
  uninitialized reads, ``pl.debug_check``), which report through host callbacks."""
  ip = params.interpret if isinstance(params.interpret, pc.InterpretParams) else pc.InterpretParams()
  return (ip.check_bounds or ip.detect_races or uninit.enabled(params)
          or jaxpr_util.uses(params.jaxpr, (ji.check_p,)))


def _check_supported(params):
  gm = params.grid_mapping
  if params.threads is not None or params.backend == "mosaic_gpu":
    _refuse(params, "a Mosaic GPU kernel")
  if params.globals_avals:
    _refuse(params, "pl.get_global")
  for bm in gm.block_mappings:
    if bm.has_element_dims:
      _refuse(params, f"a pl.Element block ({bm.origin})")


def _padded(x, bm):
  """``x`` padded at the end of each dimension to whole blocks (with poison: reads of the
  padding are reads past the array, as in the interpreter's other path)."""
  hi = [-(-s // b) * b - s for s, b in zip(x.shape, bm.full_block_shape)]
  if all(isinstance(h, int) and h == 0 for h in hi):
    return x
  return lax.pad(x, prims.poison((), x.dtype), [(0, h, 0) for h in hi])


def _starts(bm, ids, index_vals):
  jx = bm.index_map_jaxpr
  if index_vals:   # index maps read the scalar-prefetch Refs: evaluate them on values
    jx = ji.discharge_state(jx)
  idx = ji.eval_jaxpr(jx, jx.consts, *ids, *index_vals)[:len(bm.block_shape)]
  return [jnp.asarray(i, jnp.int32) * b for i, b in zip(idx, bm.full_block_shape)]


def run(*args, params):
  """The kernel's outputs (see the module docstring)."""
  _check_supported(params)
  gm = params.grid_mapping
  nidx, nin = gm.num_index_operands, gm.num_inputs
  try:
    kernel = dot_algorithms.expand(params.jaxpr, tf32_dots=False)
  except NotImplementedError as e:
    raise NotImplementedError(f"pallas_call {params.name}: {e}") from None
  pure = ji.discharge_state(kernel)
  index_vals = list(args[:nidx])
  ins = [_padded(x, bm) for x, bm in zip(args[nidx:nidx + nin], gm.block_mappings)]
  aliased = {o: i for i, o in params.input_output_aliases}
  outs = [_padded(args[aliased[k]], bm) if k in aliased else
          _padded(prims.poison(bm.array_aval.shape, bm.array_aval.dtype), bm)
          for k, bm in enumerate(gm.block_mappings_output)]
  zeroed = gm.scratch_zeroed or (False,) * len(gm.scratch_avals)
  scratch = [(jnp.zeros if z else prims.poison)(a.shape, a.dtype)
             for a, z in zip(gm.scratch_avals, zeroed)]
  grid = tuple(gm.grid)

  def program(t, state):
    index_vals, ins, outs, scratch = state
    ids = list(jnp.unravel_index(t, grid)) if grid else []
    starts = [_starts(bm, ids, index_vals) for bm in gm.block_mappings]
    blocks = [lax.dynamic_slice(x, s, bm.full_block_shape).reshape(bm.ref_aval.shape)
              for x, bm, s in zip([*ins, *outs], gm.block_mappings, starts)]
    res = ji.eval_jaxpr(pure, pure.consts, *ids, *index_vals, *blocks, *scratch)
    index_vals = list(res[:nidx])
    new = res[nidx:nidx + len(blocks)]
    bufs = [lax.dynamic_update_slice(x, b.reshape(bm.full_block_shape), s)
            for x, b, bm, s in zip([*ins, *outs], new, gm.block_mappings, starts)]
    return index_vals, bufs[:nin], bufs[nin:], list(res[nidx + len(blocks):])

  steps = math.prod(grid) if grid else 1
  _, _, outs, _ = lax.fori_loop(0, steps, program, (index_vals, ins, outs, scratch))
  return [x[tuple(slice(0, s) for s in bm.array_aval.shape)]
          for x, bm in zip(outs, gm.block_mappings_output)]


def refuse_on_gpu(params, backend: str):
  """A GPU backend and symbolic sizes: JAX's GPU lowerings refuse them too (with these words)."""
  raise NotImplementedError(
      f"pallas_call {params.name}: dynamic grid bounds not supported in the {backend} backend "
      "(the grid or an operand has symbolic sizes, jax.export's shape polymorphism); pallax's "
      "interpreter runs such kernels (interpret=True), or export for concrete shapes")


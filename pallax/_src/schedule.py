"""Which grid axes the interpreter may evaluate together without changing the result.

The reference semantics run programs one at a time in row-major grid order. Lanes
(grid points that differ along the parallel axes P) may run together when no two
lanes touch the same output block: then each output block sees exactly the
sequence of programs it would see sequentially, in the same order. Programs
within a lane (along the remaining axes L, which revisit output blocks) run in
order. This is computed from the index maps, evaluated at every grid point.
"""
from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from pallax._src import core as pc
from pallax._src import jax_internals as ji


@dataclasses.dataclass(frozen=True)
class Schedule:
  parallel: tuple[int, ...]     # axes evaluated together (vmapped)
  sequential: tuple[int, ...]   # axes looped over, in row-major order
  reason: str                   # why the schedule is what it is (for debug=True)


def _reads_prefetch(bm) -> bool:
  return any(isinstance(e, ji.effects.JaxprInputEffect) for e in bm.index_map_jaxpr.effects)


def block_index_tables(gm, partial: bool = False) -> list[np.ndarray | None] | None:
  """Block indices of every operand at every grid point, shape (*grid, ndim); None if
  an index map depends on run-time values (scalar-prefetch operands), or with ``partial``
  None for just those operands."""
  if not partial and any(_reads_prefetch(bm) for bm in gm.block_mappings):
    return None
  points = np.stack(np.meshgrid(*[np.arange(g, dtype=np.int32) for g in gm.grid], indexing="ij"),
                    axis=-1).reshape(-1, len(gm.grid)) if gm.grid else np.zeros((1, 0), np.int32)
  dummies = [jnp.zeros(a.shape, a.dtype) for a in gm.index_map_avals[len(gm.grid):]]
  rank = len(gm.grid)
  tables = []
  with jax.ensure_compile_time_eval():
    for bm in gm.block_mappings:
      if _reads_prefetch(bm):
        tables.append(None)
        continue
      jx = bm.index_map_jaxpr
      def at(p, jx=jx):
        outs = ji.eval_jaxpr(jx, jx.consts, *[p[i] for i in range(rank)], *dummies)
        return jnp.stack(outs) if outs else jnp.zeros((0,), jnp.int32)
      vals = np.asarray(jax.vmap(at)(jnp.asarray(points)))
      tables.append(vals.reshape(*gm.grid, len(bm.block_shape)))
  return tables


def _lane_codes(grid, axes) -> np.ndarray:
  """An int per grid point identifying its coordinates along ``axes``."""
  if not axes:
    return np.zeros(grid, np.int64)
  coords = np.meshgrid(*[np.arange(g) for g in grid], indexing="ij")
  code = np.zeros(grid, np.int64)
  for a in axes:
    code = code * grid[a] + coords[a]
  return code


def lanes_disjoint(table: np.ndarray, grid, axes) -> bool:
  """True when grid points that differ along ``axes`` never map to the same block."""
  keys = table.reshape(-1, table.shape[-1])
  lanes = _lane_codes(grid, axes).reshape(-1)
  _, block_ids = np.unique(keys, axis=0, return_inverse=True)
  block_ids = block_ids.reshape(-1)
  pairs = np.unique(np.stack([block_ids, lanes], axis=1), axis=0)
  return len(pairs) == len(np.unique(block_ids))


def choose(gm, tables, outputs=None) -> Schedule:
  """The largest set of parallel axes whose lanes write disjoint blocks of ``outputs``
  (indices among the outputs; all of them by default)."""
  rank = len(gm.grid)
  every = tuple(range(rank))
  if tables is None:
    return Schedule((), every, "index maps read scalar-prefetch operands")
  outputs = range(gm.num_outputs) if outputs is None else outputs
  outs = [gm.block_mappings_output[k] for k in outputs]
  if any(bm.has_element_dims for bm in outs):
    return Schedule((), every, "an output uses pl.Element blocks (windows may overlap)")
  out_tables = [tables[gm.num_inputs + k] for k in outputs]
  best, best_size = (), 1
  for k in range(rank, 0, -1):
    for axes in itertools.combinations(every, k):
      size = int(np.prod([gm.grid[a] for a in axes]))
      if size <= best_size:
        continue
      if all(lanes_disjoint(t, gm.grid, axes) for t in out_tables):
        best, best_size = axes, size
  seq = tuple(a for a in every if a not in best)
  return Schedule(best, seq, "output blocks are revisited along the sequential axes"
                  if seq else "every program writes its own output blocks")


def check_block_ranges(gm, tables, name: str) -> None:
  """Index maps must return blocks inside the array (a clear error, not a clamp)."""
  for bm, table in zip(gm.block_mappings, tables):
    if table is None:
      continue
    for d, (bd, size) in enumerate(zip(bm.block_shape, bm.array_aval.shape)):
      col = table[..., d]
      if isinstance(bd, pc.Element):
        hi = size + bd.padding[0] + bd.padding[1] - bd.block_size
        what = "element offset"
      else:
        hi = max(0, -(-size // bd.block_size) - 1)
        what = "block index"
      bad = np.argwhere((col < 0) | (col > hi))
      if len(bad):
        point = tuple(int(i) for i in bad[0])
        raise IndexError(
            f"pallas_call {name}: the index_map of {bm.origin} returns {what} "
            f"{int(col[point])} along dimension {d} at grid point {point}, but {bm.origin} "
            f"(shape {bm.array_aval.shape}, block {bm.full_block_shape}) allows 0..{hi}; "
            "fix the index_map or the grid")


def sub_jaxprs(params):
  """The jaxprs in an equation's params (closed ones unwrapped: cond branches, loop bodies)."""
  for v in params.values():
    for j in (v if isinstance(v, (tuple, list)) else (v,)):
      j = getattr(j, "jaxpr", j)
      if isinstance(j, ji.Jaxpr):
        yield j


def _has_loop(jaxpr) -> bool:
  return any(e.primitive.name == "while" or any(_has_loop(j) for j in sub_jaxprs(e.params))
             for e in jaxpr.eqns)


def loop_count_axes(jaxpr, rank: int) -> set[int]:
  """Grid axes that the trip count of some while loop in the kernel may depend on.

  A forward dependency analysis from the grid-index inputs (the first ``rank`` invars);
  equations with sub-jaxprs are treated as depending on all their operands.
  """
  deps = {v: {a} for a, v in enumerate(jaxpr.invars[:rank])}
  found: set[int] = set()
  for eqn in jaxpr.eqns:
    d = set().union(*[deps.get(v, set()) for v in eqn.invars if isinstance(v, ji.Var)])
    if eqn.primitive.name == "while" or any(_has_loop(j) for j in sub_jaxprs(eqn.params)):
      found |= d
    for v in eqn.outvars:
      deps[v] = d
  return found

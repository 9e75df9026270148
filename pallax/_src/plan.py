"""The kernel plan: what every backend needs to know about a pallas_call's grid, computed once.

From the kernel jaxpr and its GridMapping: the block index of every operand at every grid point
(and the check that they lie inside the arrays); which grid axes' programs write disjoint output
blocks; from that one analysis two schedules -- the semantic one (lanes that may run in any order:
scratch resets, race scope, the interpreter's batched evaluation) and the GPU's (which axes run
as concurrent programs, which as loops inside a program) -- and how a launch index decodes into
program ids; each block operand's view (its edge masks and padding); the hidden buffers; and the
kernel Refs that are read and written.

The grid analysis is vectorized NumPy: a block-index row becomes one int64 key (mixed radix),
and the programs sharing a block are compared with a representative of the block per axis.
"""
from __future__ import annotations

import dataclasses
import math
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pallax._src import core as pc
from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src import primitives as prims
from pallax._src import ref_access


@dataclasses.dataclass(frozen=True)
class Schedule:
  parallel: tuple[int, ...]     # axes whose programs may run together (in any order)
  sequential: tuple[int, ...]   # axes run in order, as loops
  reason: str                   # why the schedule is what it is (for debug=True)


@dataclasses.dataclass(frozen=True)
class ProgramAxis:
  """One parallel grid axis of a GPU launch, in decode order (the first varies fastest between
  neighbouring launch indices)."""
  axis: int
  size: int
  reversed: bool   # indices run from size - 1 down: the programs with the longest loops first


@dataclasses.dataclass(frozen=True)
class LaunchOrder:
  """How a kind of kernel puts its grid on a GPU launch (data per kernel kind, ``LAUNCH_ORDERS``).
  The launch is one dimension; its index decodes into program ids, the fastest axis first."""
  all_concurrent: bool   # every grid axis runs as concurrent programs (no loops inside one);
                         # otherwise the schedule analysis decides (``launch_schedule``)
  last_axis_fastest: bool   # the kernel's own axes from the last (else from the first); the
                            # axes vmap added come after them, innermost first
  longest_first: bool    # along axes that set a loop's trip count, programs with the longest
                         # loops launch first (indices run from size - 1 down)


LAUNCH_ORDERS = {
    # Pallas kernels (the Triton backend): as JAX Pallas launches them, the first axis fastest;
    # axes that revisit output blocks the kernel reads back become loops inside each program.
    "pallas": LaunchOrder(all_concurrent=False, last_axis_fastest=False, longest_first=True),
    # Mosaic GPU kernels (the Gluon backend): every block concurrent, the last axis fastest, as
    # Mosaic GPU promises (blocks may wait on each other, so none may become a loop).
    "mosaic_gpu": LaunchOrder(all_concurrent=True, last_axis_fastest=True, longest_first=False),
}


@dataclasses.dataclass(frozen=True)
class BlockView:
  """How one block operand's blocks sit in its array (per array dimension)."""
  origin: str                              # 'args[1]', 'out[0]'
  array_shape: tuple[int, ...]
  block_shape: tuple[int, ...]             # squeezed dimensions count 1
  squeezed: tuple[bool, ...]               # dropped inside the kernel
  element: tuple[bool, ...]                # pl.Element: the index map returns element offsets
  padding: tuple[tuple[int, int], ...]     # pl.Element's (low, high) padding; (0, 0) elsewhere
  masked: tuple[bool, ...]                 # a block may run past the array (partial edge block
                                           # or a pl.Element window): accesses need a mask

  @property
  def exact(self) -> tuple[bool, ...]:
    """Every coordinate of every block lies inside the array (no mask needed)."""
    return tuple(not m for m in self.masked)

  @property
  def low(self) -> tuple[bool, ...]:
    """A block may start before the array (pl.Element with low padding): starts can be < 0."""
    return tuple(e and p[0] > 0 for e, p in zip(self.element, self.padding))

  @property
  def max_index(self) -> tuple[int, ...]:
    """The largest block index (element offset for pl.Element) an index map may return."""
    return tuple(s + lo + hi - b if e else max(0, -(-s // b) - 1) for s, b, e, (lo, hi)
                 in zip(self.array_shape, self.block_shape, self.element, self.padding))

  @property
  def array_padding(self) -> tuple[tuple[int, int], ...]:
    """(low, high) padding of the array inside which every block lies whole."""
    return tuple((lo, max(hi, b - s - lo, 0)) if e else (0, -(-s // b) * b - s)
                 for s, b, e, (lo, hi)
                 in zip(self.array_shape, self.block_shape, self.element, self.padding))


@dataclasses.dataclass(frozen=True)
class HiddenBuffer:
  """A buffer the kernel sees but the caller does not pass: scratch, or pl.get_global."""
  origin: str                  # 'scratch[0]', 'get_global[0]'
  shape: tuple[int, ...]
  dtype: Any
  copies: int                  # one slice per concurrent GPU program; 1 when shared
  zeroed: bool                 # starts at zero (semaphores, pl.get_global)
  shared: bool                 # one buffer for all programs (pl.get_global)


@dataclasses.dataclass(frozen=True, eq=False)
class KernelPlan:
  """The analysis of one pallas_call, shared by every backend (see the module docstring)."""
  tables: tuple[np.ndarray | None, ...]   # per block operand: block indices, (*grid, ndim);
                                          # None where the index map reads scalar prefetch
  schedule: Schedule                      # the semantic lanes
  launch: Schedule                        # the GPU's concurrent programs and in-program loops
  loop_count_axes: tuple[int, ...]       # axes some while loop's trip count may depend on
  decode: tuple[ProgramAxis, ...]         # launch index -> program ids (launch.parallel)
  lanes: int                              # concurrent GPU programs (product of decode sizes)
  vectorize: tuple[int, ...]              # the axes the interpreter evaluates together
  blocks: tuple[BlockView, ...]           # per block operand (inputs, then outputs)
  scratch: tuple[HiddenBuffer, ...]
  globals: tuple[HiddenBuffer, ...]
  written: tuple[int, ...]                # kernel Ref positions (after the grid indices) written
  read: tuple[int, ...]                   # ... and read (an accumulation reads and writes)

  @property
  def tables_known(self) -> bool:
    return all(t is not None for t in self.tables)


# --- the cache --------------------------------------------------------------------------------

class PerParams:
  """A cache of one value per ``Params`` object, dropped when that object is collected. Values
  must not refer to their Params (or it never is)."""

  def __init__(self):
    self._values: dict[int, object] = {}

  def get(self, params, make):
    value = self._values.get(id(params))
    if value is None:
      value = make(params)
      self._values[id(params)] = value
      weakref.finalize(params, self._values.pop, id(params), None)
    return value


_plans = PerParams()   # of Pallas kernels
_plans_of_kind = {kind: PerParams() for kind in LAUNCH_ORDERS if kind != "pallas"}


def plan_for(params, kind: str = "pallas") -> KernelPlan:
  """The plan of a pallas_call (its ``Params``) for a kernel of ``kind`` (a key of
  ``LAUNCH_ORDERS``: the backend compiling it knows), computed on first use."""
  if kind == "pallas":
    return _plans.get(params, analyse)
  return _plans_of_kind[kind].get(params, lambda p: analyse(p, kind))


def analyse(params, kind: str = "pallas") -> KernelPlan:
  """The plan, computed (uncached). Raises IndexError for index maps outside their arrays."""
  gm, jaxpr = params.grid_mapping, params.jaxpr
  order = LAUNCH_ORDERS[kind]
  blocks = tuple(block_view(bm) for bm in gm.block_mappings)
  tables = tuple(block_index_tables(gm, partial=True))
  check_block_ranges(gm, tables, params.name)
  for t in tables:
    if t is not None:
      t.flags.writeable = False   # the plan is shared by every backend: read-only
  if order.all_concurrent:
    schedule = launch = Schedule(tuple(range(len(gm.grid))), (), f"{kind} kernels run every "
                                 "program concurrently")
  else:
    disjoint = _Disjoint(gm, tables, blocks)
    schedule = (Schedule((), tuple(range(len(gm.grid))), "index maps read scalar-prefetch operands")
                if any(t is None for t in tables) else disjoint.choose(range(gm.num_outputs)))
    launch = launch_schedule(params, tables, disjoint.choose)
  loops = tuple(sorted(loop_count_axes(jaxpr, len(gm.grid))))
  decode = tuple(ProgramAxis(a, gm.grid[a], order.longest_first and a in loops)
                 for a in decode_order(launch.parallel, gm.vmapped_dims, order))
  lanes = math.prod(p.size for p in decode)
  written, read = ref_effects(jaxpr, len(gm.grid))
  return KernelPlan(tables, schedule, launch, loops, decode, lanes,
                    _vectorize(params, schedule, loops, written), blocks,
                    _scratch(gm, lanes), _globals(params), written, read)


def decode_order(parallel, vmapped, order: LaunchOrder = LAUNCH_ORDERS["pallas"]) -> list[int]:
  """The parallel axes from fastest to slowest between neighbouring programs: the kernel's own
  axes (from the first, or from the last as ``order`` says), then the axes vmap added, innermost
  first. So the programs of one batch element run side by side, as its data lies in memory (and
  as JAX Pallas and Mosaic GPU launch them)."""
  own = [a for a in parallel if a not in vmapped]
  return ((own[::-1] if order.last_axis_fastest else own)
          + [a for a in reversed(vmapped) if a in parallel])


def _vectorize(params, schedule, loops, written) -> tuple[int, ...]:
  """The semantic parallel axes the interpreter can batch: batched programs would all run the
  longest trip count of a loop (and JAX cannot check a batched while loop); prints and checks
  must keep program order; pl.get_global buffers and written inputs are shared by programs."""
  gm, jaxpr = params.grid_mapping, params.jaxpr
  has_debug = any(not isinstance(e, ji.effects.JaxprInputEffect) for e in jaxpr.effects)
  writes_inputs = any(w < gm.num_index_operands + gm.num_inputs for w in written)
  if has_debug or params.globals_avals or writes_inputs:
    return ()
  return tuple(a for a in schedule.parallel if a not in loops)


def _scratch(gm, lanes) -> tuple[HiddenBuffer, ...]:
  zeroed = gm.scratch_zeroed or (False,) * len(gm.scratch_avals)
  return tuple(HiddenBuffer(f"scratch[{k}]", tuple(a.inner_aval.shape), a.inner_aval.dtype,
                            lanes, bool(z), False)
               for k, (a, z) in enumerate(zip(gm.scratch_avals, zeroed)))


def _globals(params) -> tuple[HiddenBuffer, ...]:
  return tuple(HiddenBuffer(f"get_global[{k}]", tuple(a.shape), a.dtype, 1, True, True)
               for k, a in enumerate(params.globals_avals))


# --- block operands ----------------------------------------------------------------------------

def block_view(bm) -> BlockView:
  shape = tuple(bm.array_aval.shape)
  element = tuple(isinstance(d, pc.Element) for d in bm.block_shape)
  padding = tuple(tuple(d.padding) if e else (0, 0) for d, e in zip(bm.block_shape, element))
  masked = tuple(e or s % d.block_size != 0 for d, e, s in zip(bm.block_shape, element, shape))
  return BlockView(bm.origin, shape, bm.full_block_shape,
                   tuple(isinstance(d, pc.Squeezed) for d in bm.block_shape), element, padding,
                   masked)


def reads_prefetch(bm) -> bool:
  return any(isinstance(e, ji.effects.JaxprInputEffect) for e in bm.index_map_jaxpr.effects)


def block_index_tables(gm, partial: bool = False) -> list[np.ndarray | None] | None:
  """Block indices of every operand at every grid point, shape (*grid, ndim); None if an index
  map depends on run-time values (scalar-prefetch operands), or with ``partial`` None for just
  those operands."""
  if not partial and any(reads_prefetch(bm) for bm in gm.block_mappings):
    return None
  return [None if reads_prefetch(bm) else _index_table(gm, bm) for bm in gm.block_mappings]


def _index_table(gm, bm) -> np.ndarray:
  grid, nd = gm.grid, len(bm.block_shape)
  jx = bm.index_map_jaxpr
  dummies = [jnp.zeros(a.shape, a.dtype) for a in gm.index_map_avals[len(grid):]]

  def at(*ids):
    outs = ji.eval_jaxpr(jx, jx.consts, *ids, *dummies)
    return jnp.stack(outs) if outs else jnp.zeros((0,), jnp.int32)

  # One vmap per axis (the last innermost): the table comes out in grid order, and an index
  # computed from some axes only is not materialized over the others until the end.
  fn = at
  for a in reversed(range(len(grid))):
    fn = jax.vmap(fn, in_axes=tuple(0 if b == a else None for b in range(len(grid))))
  with jax.ensure_compile_time_eval():
    table = np.asarray(fn(*[jnp.arange(g, dtype=jnp.int32) for g in grid]))
  return table.reshape(*grid, nd)


def check_block_ranges(gm, tables, name: str) -> None:
  """Index maps must return blocks inside the array (a clear error, not a clamp)."""
  for bm, table in zip(gm.block_mappings, tables):
    if table is None:
      continue
    view = block_view(bm)
    for d, hi in enumerate(view.max_index):
      col = table[..., d]
      bad = (col < 0) | (col > hi)
      if not bad.any():
        continue
      point = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), bad.shape))
      what = "element offset" if view.element[d] else "block index"
      raise IndexError(
          f"pallas_call {name}: the index_map of {bm.origin} returns {what} "
          f"{int(col[point])} along dimension {d} at grid point {point}, but {bm.origin} "
          f"(shape {bm.array_aval.shape}, block {bm.full_block_shape}) allows 0..{hi}; "
          "fix the index_map or the grid")


# --- which axes' programs write disjoint blocks -------------------------------------------------

def _block_keys(table: np.ndarray, n: int, max_index) -> np.ndarray:
  """One int64 per grid point (``n`` of them) naming its block (mixed radix over the block-index
  columns, which lie in 0..max_index after ``check_block_ranges``)."""
  rows = table.reshape(n, len(max_index)).astype(np.int64)
  radix = [int(h) + 1 for h in max_index]
  if math.prod(radix) >= 2 ** 62:   # too many blocks for one int64: number the distinct rows
    return np.unique(rows, axis=0, return_inverse=True)[1].reshape(-1)
  key = np.zeros(rows.shape[0], np.int64)
  for d, r in enumerate(radix):
    key = key * r + rows[:, d]
  return key


def disjoint_axes(table: np.ndarray, grid, max_index) -> tuple[bool, ...]:
  """Per grid axis: whether all programs that share a block of ``table`` agree along it.

  A set of axes may run concurrently when programs sharing a block agree on every axis of the
  set (then no two concurrent programs meet in a block), a condition that holds for the set
  exactly when it holds for each of its axes: single axes suffice. Each block gets a
  representative program; an axis qualifies when every program agrees with its block's
  representative along it."""
  n = math.prod(grid)
  key = _block_keys(table, n, max_index)
  if key.size and int(key.max()) >= 4 * n + 1024:   # sparse keys: number the distinct blocks
    key = np.unique(key, return_inverse=True)[1].reshape(-1)
  rep = np.zeros(int(key.max()) + 1 if key.size else 1, np.int64)
  rep[key] = np.arange(n, dtype=np.int64)   # one program per block (whichever write lands)
  point = np.nonzero(rep[key] != np.arange(n))[0]   # programs sharing a block with another
  other = rep[key[point]]
  strides = [math.prod(grid[a + 1:]) for a in range(len(grid))]
  return tuple(bool(np.array_equal(point // s % g, other // s % g))
               for s, g in zip(strides, grid))


class _Disjoint:
  """``disjoint_axes`` of each output, computed on first use, and schedules chosen from them."""

  def __init__(self, gm, tables, blocks):
    self.gm, self.tables, self.blocks = gm, tables, blocks
    self.memo: dict[int, tuple[bool, ...]] = {}

  def of_output(self, k: int) -> tuple[bool, ...]:
    if k not in self.memo:
      i = self.gm.num_inputs + k
      self.memo[k] = disjoint_axes(self.tables[i], self.gm.grid, self.blocks[i].max_index)
    return self.memo[k]

  def choose(self, outputs) -> Schedule:
    """The largest set of parallel axes whose lanes write disjoint blocks of ``outputs``
    (indices among the outputs; their tables must be known)."""
    gm, every = self.gm, tuple(range(len(self.gm.grid)))
    outputs = list(outputs)
    if any(any(self.blocks[gm.num_inputs + k].element) for k in outputs):
      return Schedule((), every, "an output uses pl.Element blocks (windows may overlap)")
    par = tuple(a for a in every if all(self.of_output(k)[a] for k in outputs))
    if math.prod(gm.grid[a] for a in par) <= 1:   # nothing to gain: run in order
      par = ()
    seq = tuple(a for a in every if a not in par)
    return Schedule(par, seq, "output blocks are revisited along the sequential axes"
                    if seq else "every program writes its own output blocks")


def choose(gm, tables, outputs=None) -> Schedule:
  """The largest set of parallel axes whose lanes write disjoint blocks of ``outputs`` (indices
  among the outputs; all of them by default); all sequential when ``tables`` is None."""
  if tables is None:
    return Schedule((), tuple(range(len(gm.grid))), "index maps read scalar-prefetch operands")
  blocks = tuple(block_view(bm) for bm in gm.block_mappings)
  return _Disjoint(gm, tables, blocks).choose(range(gm.num_outputs) if outputs is None else outputs)


# --- the GPU's schedule ---------------------------------------------------------------------------

def launch_schedule(params, tables, choose_for) -> Schedule:
  """Loops inside a program along the axes that revisit output blocks the kernel reads back or
  writes at fixed indices; parallel programs along all others. ``choose_for(outputs)`` picks
  the parallel axes for those outputs."""
  gm, jaxpr = params.grid_mapping, params.jaxpr
  rank = len(gm.grid)
  invars = list(jaxpr.invars)
  _, read = ref_effects(jaxpr, rank)
  base = gm.num_index_operands + gm.num_inputs
  # An output that is neither read back nor written at fixed indices may be revisited by
  # parallel programs: Triton-style kernels (whole-array Refs, each program storing its own
  # slice through program_id-dependent indices or masks) work that way.
  read_outs = [k for k in range(gm.num_outputs)
               if base + k in read or fixed_store(jaxpr, invars[rank + base + k])]
  if gm.scratch_avals:
    # Scratch carries values along the axes that revisit output blocks (the interpreter's
    # sequential axes), whether or not the kernel reads the outputs back.
    read_outs = list(range(gm.num_outputs))
  every = tuple(range(rank))
  if params.globals_avals:
    return Schedule((), every, "pl.get_global buffers are shared by all programs")
  if any(tables[gm.num_inputs + k] is None for k in read_outs):
    return Schedule((), every, "an output read back has an index map that reads "
                    "scalar-prefetch operands")
  return choose_for(read_outs)


_STORES = (ji.swap_p, prims.masked_swap_p)


def fixed_store(jaxpr, ref) -> bool:
  """Whether the kernel stores to ``ref`` at indices that are all constants, with no mask: every
  program running that store writes the same elements, so the last one must win."""
  for e in jaxpr.eqns:
    if e.primitive in _STORES and e.invars[0] is ref:
      leaves = e.invars[ref_access.leaf_span(e)]
      if ref_access.split(e, e.invars).mask is None and all(isinstance(v, ji.Literal) for v in leaves):
        return True
      continue
    if not any(v is ref for v in e.invars):
      continue
    for sub in jaxpr_util.sub_jaxprs(e.params):
      # Operands line up with a sub-jaxpr's last parameters (cond, loops, calls) or its first
      # (run_scoped, whose extra parameters are the scratch Refs).
      n, m = len(e.invars), len(sub.invars)
      inner = sub.invars[m - n:] if m <= n else sub.invars[:n]
      outer = e.invars[n - m:] if m <= n else e.invars
      if any(o is ref and fixed_store(sub, i) for o, i in zip(outer, inner)):
        return True
  return False


# --- facts of the kernel jaxpr ------------------------------------------------------------------

def loop_count_axes(jaxpr, rank: int) -> set[int]:
  """Grid axes that the trip count of some while loop in the kernel may depend on.

  A forward dependency analysis from the grid-index inputs (the first ``rank`` invars);
  equations with sub-jaxprs are treated as depending on all their operands.
  """
  deps = {v: {a} for a, v in enumerate(jaxpr.invars[:rank])}
  found: set[int] = set()
  for eqn in jaxpr.eqns:
    d = set().union(*[deps.get(v, set()) for v in eqn.invars if isinstance(v, ji.Var)])
    if eqn.primitive is ji.while_p or any(
        jaxpr_util.uses(j, (ji.while_p,)) for j in jaxpr_util.sub_jaxprs(eqn.params)):
      found |= d
    for v in eqn.outvars:
      deps[v] = d
  return found


def ref_effects(jaxpr, rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """(written, read): kernel Ref positions (counted after the ``rank`` grid indices) that the
  kernel writes and reads; an accumulation (``+=``) does both."""
  written, read = set(), set()
  invars = list(jaxpr.invars)
  for eff in jaxpr.effects:
    if isinstance(eff, (ji.WriteEffect, ji.AccumEffect, ji.ReadEffect)) and eff.input in invars:
      pos = invars.index(eff.input) - rank
      if pos < 0:
        continue
      (read if isinstance(eff, ji.ReadEffect) else written).add(pos)
      if isinstance(eff, ji.AccumEffect):
        read.add(pos)
  return tuple(sorted(written)), tuple(sorted(read))

"""Runs a pallas_call by evaluating its kernel jaxpr with JAX, program by program.

Semantics: programs run one at a time in row-major grid order. Each program sees
its blocks of the inputs and outputs (partial edge blocks padded with poison on
read, their out-of-range part dropped on write) and the scratch buffers.
Scratch keeps its contents from one program to the next only along the
sequential axes of the schedule (the axes along which output blocks are
revisited); each new lane starts with poisoned scratch, as on a GPU where those
programs run concurrently.

Speed: the grid axes of ``schedule.choose`` are evaluated together with nested
``jax.vmap`` (one vmap per axis, so an operand whose block does not move along
an axis is not copied along it); the other axes run in a loop.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import weakref

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import checkify

from pallax._src import checks
from pallax._src import core as pc
from pallax._src import jax_internals as ji
from pallax._src import primitives as prims
from pallax._src import schedule as sched


@dataclasses.dataclass(frozen=True)
class Plan:
  pure: ji.Jaxpr                # the discharged (and bounds-checked) kernel
  schedule: sched.Schedule      # the semantic lanes (scratch resets, race scope)
  parallel: tuple[int, ...]     # the axes actually evaluated together
  written: tuple[int, ...]      # kernel Ref positions that the kernel writes
  read: tuple[int, ...]         # kernel Ref positions that the kernel reads
  tables_known: bool
  checked: bool
  detect_races: bool


def _ref_effects(jaxpr):
  written, read = set(), set()
  invars = list(jaxpr.invars)
  for eff in jaxpr.effects:
    if isinstance(eff, (ji.WriteEffect, ji.AccumEffect, ji.ReadEffect)) and eff.input in invars:
      pos = invars.index(eff.input)
      (read if isinstance(eff, ji.ReadEffect) else written).add(pos)
      if isinstance(eff, ji.AccumEffect):
        read.add(pos)
  return written, read


_plans: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def plan_for(params) -> Plan:
  """Analyses a pallas_call once (cached on its jaxpr)."""
  cached = _plans.get(params.jaxpr)
  if cached is not None and cached[0] is params:
    return cached[1]
  gm, jaxpr = params.grid_mapping, params.jaxpr
  ip = params.interpret if isinstance(params.interpret, pc.InterpretParams) else pc.InterpretParams()
  rank = len(gm.grid)
  tables = sched.block_index_tables(gm)
  if tables is not None:
    sched.check_block_ranges(gm, tables, params.name)
  schedule = sched.choose(gm, tables)
  written, read = _ref_effects(jaxpr)
  written = {w - rank for w in written if w >= rank}
  read = {r - rank for r in read if r >= rank}
  nidx, nin = gm.num_index_operands, gm.num_inputs
  has_debug = any(not isinstance(e, ji.effects.JaxprInputEffect) for e in jaxpr.effects)
  writes_inputs = any(w < nidx + nin for w in written)
  # Loops whose trip count depends on an axis would make batched programs run the longest
  # trip count; such axes run in order instead.
  divergent = sched.loop_count_axes(jaxpr, rank)
  parallel = tuple(a for a in schedule.parallel if a not in divergent)
  if (not ip.parallel or has_debug or params.globals_avals or writes_inputs or ip.detect_races):
    parallel = ()
  names = [f"args[{i}]" for i in range(nidx)] + [bm.origin for bm in gm.block_mappings] + \
      [f"scratch[{i}]" for i in range(len(gm.scratch_avals))] + \
      [f"get_global[{i}]" for i in range(len(params.globals_avals))]
  checked_jaxpr = checks.instrument(
      jaxpr, dict(zip(jaxpr.invars[rank:], names)), params.name, ip.check_bounds)
  pure = ji.discharge_state(checked_jaxpr)
  has_checks = ip.check_bounds or ip.detect_races or tables is None or any(
      "Error" in type(e).__name__ for e in checked_jaxpr.effects) or _has_checks(jaxpr)
  plan = Plan(pure, schedule, parallel, tuple(sorted(written)), tuple(sorted(read)),
              tables is not None, has_checks, ip.detect_races)
  if params.debug:
    print(f"pallax interpreter schedule for {params.name}: parallel axes {parallel}, sequential "
          f"axes {tuple(a for a in range(rank) if a not in parallel)} ({schedule.reason})")
  _plans[params.jaxpr] = (params, plan)
  return plan


def _has_checks(jaxpr) -> bool:
  for eqn in jaxpr.eqns:
    if "check" in eqn.primitive.name:
      return True
    for _, v in checks._sub_jaxprs(eqn.params):
      if any(_has_checks(j) for j in (v if isinstance(v, tuple) else (v,))):
        return True
  return False


# --- buffers --------------------------------------------------------------------------

def _padding(bm) -> list[tuple[int, int]]:
  pads = []
  for bd, size in zip(bm.block_shape, bm.array_aval.shape):
    if isinstance(bd, pc.Element):
      lo, hi = bd.padding
      pads.append((lo, max(hi, bd.block_size - size - lo, 0)))
    else:
      pads.append((0, -(-size // bd.block_size) * bd.block_size - size))
  return pads


def _pad(x, bm):
  pads = _padding(bm)
  if not any(p != (0, 0) for p in pads):
    return x
  fill = prims.poison((), x.dtype)
  return lax.pad(x, fill, [(lo, hi, 0) for lo, hi in pads])


def _unpad(x, bm):
  pads = _padding(bm)
  if not any(p != (0, 0) for p in pads):
    return x
  return x[tuple(slice(lo, lo + s) for (lo, _), s in zip(pads, bm.array_aval.shape))]


def _starts(bm, ids, index_vals, check: bool, name: str):
  """Element offsets of the block at grid point ``ids`` (in padded coordinates)."""
  jx = bm.index_map_jaxpr
  if index_vals:   # index maps read the scalar-prefetch Refs: evaluate them on values
    jx = ji.discharge_state(jx)
  idx = ji.eval_jaxpr(jx, jx.consts, *ids, *index_vals)[:len(bm.block_shape)]
  starts = []
  for d, (i, bd, size) in enumerate(zip(idx, bm.block_shape, bm.array_aval.shape)):
    i = jnp.asarray(i, jnp.int32)
    element = isinstance(bd, pc.Element)
    hi = size + sum(bd.padding) - bd.block_size if element else max(0, -(-size // bd.block_size) - 1)
    if check:   # the index was not validated ahead of time: check it, then keep it in range
      checkify.check((i >= 0) & (i <= hi),
                     f"pallas_call {name}: the index_map of {bm.origin} returned {{index}} along "
                     f"dimension {d}, outside 0..{hi} (shape {bm.array_aval.shape}, block "
                     f"{bm.full_block_shape})", index=i)
      i = jnp.clip(i, 0, hi)
    starts.append(i if element else i * bd.block_size)
  return starts


def _read_block(buf, bm, starts):
  blk = lax.dynamic_slice(buf, starts, bm.full_block_shape) if starts else buf
  return blk.reshape(bm.ref_aval.shape)


def _write_lanes(buf, bm, blocks, starts, lanes: int):
  """Writes one block per lane (lanes never share a block) into ``buf``."""
  full = bm.full_block_shape
  if lanes == 0:
    return lax.dynamic_update_slice(buf, blocks.reshape(full), starts) if starts else blocks.reshape(full)
  nd = len(full)
  upd = blocks.reshape((-1,) + full)
  idx = jnp.stack(starts, axis=-1).reshape(-1, nd)
  dnums = lax.ScatterDimensionNumbers(update_window_dims=tuple(range(1, nd + 1)),
                                      inserted_window_dims=(), scatter_dims_to_operand_dims=tuple(range(nd)))
  return lax.scatter(buf, idx, upd, dnums, indices_are_sorted=True, unique_indices=True,
                     mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS)


def _unravel(t, sizes):
  coords = []
  for s in reversed(sizes):
    coords.append(t % s)
    t = t // s
  return list(reversed(coords))


def _differs(a, b):
  """Elementwise 'bit patterns differ'."""
  if jnp.issubdtype(a.dtype, jnp.floating):
    it = {2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64, 1: jnp.uint8}[a.dtype.itemsize]
    return lax.bitcast_convert_type(a, it) != lax.bitcast_convert_type(b, it)
  return a != b


def _other_value(x):
  """A value that differs from ``x`` in every element's bit pattern."""
  if x.dtype == jnp.bool_:
    return ~x
  if jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.complexfloating):
    it = {2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64, 1: jnp.uint8}[x.dtype.itemsize]
    return lax.bitcast_convert_type(~lax.bitcast_convert_type(x, it), x.dtype)
  return ~x


# --- the grid loop ---------------------------------------------------------------------

def _interpret(*args, params, plan: Plan):
  gm = params.grid_mapping
  grid, rank = gm.grid, len(gm.grid)
  nidx, nin, nout = gm.num_index_operands, gm.num_inputs, gm.num_outputs
  bms = gm.block_mappings
  index_vals = list(args[:nidx])
  ins = [_pad(x, bm) for x, bm in zip(args[nidx:], bms[:nin])]
  aliased = {o: i for i, o in params.input_output_aliases}
  outs = [_pad(args[aliased[k]], bm) if k in aliased else prims.poison(_padding_shape(bm), bm.array_aval.dtype)
          for k, bm in enumerate(bms[nin:])]
  par = plan.parallel
  seq = tuple(a for a in range(rank) if a not in par)
  lane_sizes = tuple(grid[a] for a in par)
  sem_par = plan.schedule.parallel
  scratch_avals = [a.inner_aval for a in gm.scratch_avals]
  zeroed = gm.scratch_zeroed or (False,) * len(scratch_avals)
  scratch = [(jnp.zeros if z else prims.poison)(lane_sizes + tuple(a.shape), a.dtype)
             for a, z in zip(scratch_avals, zeroed)]
  glob = [jnp.zeros(a.shape, a.dtype) for a in params.globals_avals]
  # Operands carried through the loop: the outputs, and any index/input the kernel writes.
  carried_pos = [p for p in plan.written if p < nidx + nin]       # kernel Ref positions
  carried = [index_vals[p] if p < nidx else ins[p - nidx] for p in carried_pos]
  race_out = [k for k in range(nout) if plan.detect_races and (nidx + nin + k) not in plan.read]
  writers = [jnp.full(outs[k].shape, -1, jnp.int32) for k in race_out]
  check_maps = not plan.tables_known
  name = params.name

  def run_kernel(*args):
    return ji.eval_jaxpr(plan.pure, plan.pure.consts, *args)

  # Checks are made into values per program, before programs are batched: JAX cannot
  # check a batched while loop (a loop whose trip count differs between programs).
  checked_kernel = checkify.checkify(run_kernel, errors=checkify.user_checks)

  def program(ids, index_vals, in_blocks, out_blocks, scratch_vals, glob_vals):
    args = (*ids, *index_vals, *in_blocks, *out_blocks, *scratch_vals, *glob_vals)
    if not plan.checked:
      return run_kernel(*args)
    err, res = checked_kernel(*args)
    checkify.check_error(err)
    return res

  def step(t, state):
    outs, carried, scratch, glob, writers = state
    l_coords = _unravel(t, [grid[a] for a in seq]) if seq else []
    cur_index = list(index_vals)
    cur_ins = list(ins)
    for p, v in zip(carried_pos, carried):
      if p < nidx:
        cur_index[p] = v
      else:
        cur_ins[p - nidx] = v
    # Scratch starts poisoned in each new semantic lane (its first program along the sequential axes).
    lane_start = functools.reduce(jnp.logical_and, [l_coords[seq.index(a)] == 0 for a in seq
                                                    if a not in sem_par], jnp.bool_(True))
    if scratch and any(a in sem_par for a in seq):   # lanes that run in a loop here
      scratch = [jnp.where(lane_start, (jnp.zeros if z else prims.poison)(s.shape, s.dtype), s)
                 for s, z in zip(scratch, zeroed)]

    def lane(*p_and_scratch):
      p_ids, scr = p_and_scratch[:len(par)], p_and_scratch[len(par):]
      ids = [None] * rank
      for a, v in zip(par, p_ids):
        ids[a] = v
      for a, v in zip(seq, l_coords):
        ids[a] = v
      ids = [jnp.asarray(i, jnp.int32) for i in ids]
      starts = [_starts(bm, ids, cur_index, check_maps, name) for bm in bms]
      in_blocks = [_read_block(x, bm, s) for x, bm, s in zip(cur_ins, bms[:nin], starts[:nin])]
      out_blocks = [_read_block(x, bm, s) for x, bm, s in zip(outs, bms[nin:], starts[nin:])]
      res = program(ids, cur_index, in_blocks, out_blocks, scr, glob)
      if race_out:
        alt = list(out_blocks)
        for k in race_out:
          alt[k] = _other_value(out_blocks[k])
        res2 = program(ids, cur_index, in_blocks, alt, scr, glob)
        written = [~_differs(res[nidx + nin + k], res2[nidx + nin + k]) for k in race_out]
      else:
        written = []
      return res, starts, written, ids

    if par:
      fn = lane
      for level in reversed(range(len(par))):
        axes = [None] * len(par) + [0] * len(scratch)
        axes[level] = 0
        fn = jax.vmap(fn, in_axes=tuple(axes))
      res, starts, written, ids = fn(*[jnp.arange(grid[a], dtype=jnp.int32) for a in par], *scratch)
    else:
      res, starts, written, ids = lane(*scratch)
    nlanes = math.prod(lane_sizes) if par else 0
    new_outs = []
    for k, bm in enumerate(bms[nin:]):
      pos = nidx + nin + k
      new_outs.append(_write_lanes(outs[k], bm, res[pos], starts[nin + k], nlanes)
                      if pos in plan.written else outs[k])
    new_carried = []
    for p, v in zip(carried_pos, carried):
      if p < nidx:
        new_carried.append(res[p])
      else:
        bm = bms[p - nidx]
        new_carried.append(_write_lanes(v, bm, res[p], starts[p - nidx], nlanes))
    base = nidx + nin + nout
    new_scratch = list(res[base:base + len(scratch)])
    new_glob = list(res[base + len(scratch):])
    new_writers = []
    for j, k in enumerate(race_out):
      bm = bms[nin + k]
      me = _linear(ids, grid)
      w = _read_block(writers[j], bm, starts[nin + k])
      clash = written[j] & (w >= 0) & (w != me)
      first = jnp.argmax(clash.reshape(-1))
      other = w.reshape(-1)[first]
      checkify.check(~jnp.any(clash),
                     f"pallas_call {name}: race on {bm.origin}: programs {{a}} and {{b}} (linear "
                     f"indices in the grid {grid}) both write its element at block offset "
                     f"{{e}}; on a GPU they run concurrently and the result depends on their order",
                     a=other, b=me, e=first)
      new_writers.append(_write_lanes(writers[j], bm, jnp.where(written[j], me, w), starts[nin + k], 0))
    return new_outs, new_carried, new_scratch, new_glob, new_writers

  state = (outs, carried, scratch, glob, writers)
  n_steps = math.prod(grid[a] for a in seq)
  if n_steps == 1:
    state = step(jnp.int32(0), state)
  else:
    state = lax.fori_loop(0, n_steps, step, state)
  return [_unpad(o, bm) for o, bm in zip(state[0], bms[nin:])]


def _linear(ids, grid):
  q = jnp.int32(0)
  for i, g in zip(ids, grid):
    q = q * g + i
  return q


def _padding_shape(bm):
  return tuple(s + lo + hi for s, (lo, hi) in zip(bm.array_aval.shape, _padding(bm)))


# --- entry points ----------------------------------------------------------------------

class KernelCheckError(RuntimeError):
  """A check inside a kernel failed in the interpreter (pl.debug_check, races, semaphores)."""


def _raise(err):
  msg = err.get()
  if msg is None:
    return
  msg = msg.replace(" (`check` failed)", "")
  if "out-of-bounds" in msg or "the index_map of" in msg:
    raise IndexError(msg)
  raise KernelCheckError(msg)


def _checked(params, plan):
  fn = functools.partial(_interpret, params=params, plan=plan)
  return checkify.checkify(fn, errors=checkify.user_checks)


def run(*args, params, raise_errors: str = "callback"):
  """The interpreter inside a trace (used as the lowering of pallas_call)."""
  plan = plan_for(params)
  if not plan.checked:
    return _interpret(*args, params=params, plan=plan)
  err, outs = _checked(params, plan)(*args)
  jax.debug.callback(_raise, err)
  return outs


_eager_cache: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def run_eager(*args, params):
  """Eager calls: compiled once per pallas_call; failed checks raise Python errors here."""
  entry = _eager_cache.get(params.jaxpr)
  if entry is None or entry[0] is not params:
    plan = plan_for(params)
    if plan.checked:
      fn = jax.jit(_checked(params, plan))
    else:
      inner = jax.jit(functools.partial(_interpret, params=params, plan=plan))
      fn = lambda *a: (None, inner(*a))
    entry = (params, fn)
    _eager_cache[params.jaxpr] = entry
  err, outs = entry[1](*args)
  if err is not None:
    _raise(err)
  return outs

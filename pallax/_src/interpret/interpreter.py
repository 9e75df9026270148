"""Runs a pallas_call by evaluating its kernel jaxpr with JAX, program by program.

Semantics: programs run one at a time in row-major grid order. Each program sees
its blocks of the inputs and outputs (partial edge blocks padded with poison on
read, their out-of-range part dropped on write) and the scratch buffers.
Scratch keeps its contents from one program to the next only along the
sequential axes of the plan's semantic schedule (the axes along which output
blocks are revisited); each new lane starts with poisoned scratch, as on a GPU
where those programs run concurrently.

Speed: the axes of the plan's ``vectorize`` are evaluated together with nested
``jax.vmap`` (one vmap per axis, so an operand whose block does not move along
an axis is not copied along it); the other axes run in a loop. Each step of the
loop reads the blocks, runs the programs, writes the blocks back and checks for
races.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import weakref
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import checkify

from pallax._src import checks
from pallax._src import core as pc
from pallax._src import errors
from pallax._src.errors import KernelCheckError
from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src import plan as kplan
from pallax._src import primitives as prims
from pallax._src.gpu import dot_algorithms
from pallax._src.interpret import uninit


@dataclasses.dataclass(frozen=True, eq=False)
class Prepared:
  """What the interpreter derives from a pallas_call besides the plan."""
  plan: kplan.KernelPlan
  pure: ji.Jaxpr                # the discharged (and bounds-checked) kernel
  pure_second: ji.Jaxpr | None  # the same, its pl.run_scoped scratch on uninit's second fill
  parallel: tuple[int, ...]     # the axes evaluated together
  sequential: tuple[int, ...]   # the axes looped over, in row-major order
  checked: bool                 # whether the kernel can fail a check
  detect_races: bool
  map_lanes: bool               # lanes run one after another (lax.map), not batched (vmap)
  uninit: bool                  # track written elements (uninit.py): programs run twice
  reads: str                    # where the kernel reads outputs and scratch (for uninit's errors)


def _prepare(params) -> Prepared:
  gm, jaxpr, plan = params.grid_mapping, params.jaxpr, kplan.plan_for(params)
  ip = params.interpret if isinstance(params.interpret, pc.InterpretParams) else pc.InterpretParams()
  rank = len(gm.grid)
  parallel = plan.vectorize if ip.parallel and not ip.detect_races else ()
  sequential = tuple(a for a in range(rank) if a not in parallel)
  names = [f"args[{i}]" for i in range(gm.num_index_operands)] + \
      [b.origin for b in plan.blocks] + [h.origin for h in plan.scratch + plan.globals]
  try:   # what a GPU computes for each dot algorithm (XLA on a CPU ignores or refuses them)
    jaxpr = dot_algorithms.expand(jaxpr, tf32_dots=False)
  except NotImplementedError as e:
    raise NotImplementedError(f"pallas_call {params.name}: {e}") from None
  checked_jaxpr = checks.instrument(
      jaxpr, dict(zip(jaxpr.invars[rank:], names)), params.name, ip.check_bounds)
  track = uninit.enabled(params)
  if track:
    uninit.check_coverage(params, plan)
  checked = ip.check_bounds or ip.detect_races or track or not plan.tables_known or \
      jaxpr_util.uses(checked_jaxpr, (ji.check_p,))
  if params.debug:
    print(f"pallax interpreter schedule for {params.name}: parallel axes {parallel}, sequential "
          f"axes {sequential} ({plan.schedule.reason})")
  # JAX cannot check a while loop whose trip count differs between batched lanes.
  map_lanes = checked and jaxpr_util.uses(checked_jaxpr, (ji.while_p,))
  first = gm.num_index_operands + gm.num_inputs
  tracked = dict(list(zip(jaxpr.invars[rank:], names))[first:first + gm.num_outputs + len(plan.scratch)])
  reads = uninit.read_lines(jaxpr, tracked) if track else ""
  second = ji.discharge_state(uninit.scratch_second_fill(checked_jaxpr)) if track else None
  return Prepared(plan, ji.discharge_state(checked_jaxpr), second, parallel, sequential, checked,
                  ip.detect_races, map_lanes, track, reads)


_prepared = kplan.PerParams()


def prepare(params) -> Prepared:
  """The interpreter's analysis of a pallas_call (cached per Params)."""
  return _prepared.get(params, _prepare)


# --- buffers --------------------------------------------------------------------------

def _pad(x, view: kplan.BlockView):
  pads = view.array_padding
  if not any(p != (0, 0) for p in pads):
    return x
  fill = prims.poison((), x.dtype)
  return lax.pad(x, fill, [(lo, hi, 0) for lo, hi in pads])


def _unpad(x, view: kplan.BlockView):
  pads = view.array_padding
  if not any(p != (0, 0) for p in pads):
    return x
  return x[tuple(slice(lo, lo + s) for (lo, _), s in zip(pads, view.array_shape))]


def _padded_shape(view: kplan.BlockView):
  return tuple(s + lo + hi for s, (lo, hi) in zip(view.array_shape, view.array_padding))


def _starts(bm, view: kplan.BlockView, ids, index_vals, check: bool, name: str):
  """Element offsets of the block at grid point ``ids`` (in padded coordinates)."""
  jx = bm.index_map_jaxpr
  if index_vals:   # index maps read the scalar-prefetch Refs: evaluate them on values
    jx = ji.discharge_state(jx)
  idx = ji.eval_jaxpr(jx, jx.consts, *ids, *index_vals)[:len(bm.block_shape)]
  starts = []
  for d, (i, b, hi) in enumerate(zip(idx, view.block_shape, view.max_index)):
    i = jnp.asarray(i, jnp.int32)
    if check:   # the index was not validated ahead of time: check it, then keep it in range
      checks.check((i >= 0) & (i <= hi),
                   f"pallas_call {name}: the index_map of {view.origin} returned {{index}} along "
                   f"dimension {d}, outside 0..{hi} (shape {view.array_shape}, block "
                   f"{view.block_shape})", checks.INDEX, index=i)
      i = jnp.clip(i, 0, hi)
    starts.append(i if view.element[d] else i * b)
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


def _linear(ids, grid):
  q = jnp.int32(0)
  for i, g in zip(ids, grid):
    q = q * g + i
  return q


def _bits(x):
  it = {2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64, 1: jnp.uint8}[x.dtype.itemsize]
  return lax.bitcast_convert_type(x, it)


def _differs(a, b):
  """Elementwise 'bit patterns differ'."""
  if jnp.issubdtype(a.dtype, jnp.floating):
    return _bits(a) != _bits(b)
  return a != b


def _other_value(x):
  """A value that differs from ``x`` in every element's bit pattern."""
  if x.dtype == jnp.bool_:
    return ~x
  if jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.complexfloating):
    return lax.bitcast_convert_type(~_bits(x), x.dtype)
  return ~x


# --- the grid loop ---------------------------------------------------------------------

class State(NamedTuple):
  """What the grid loop carries from one step to the next."""
  outs: list       # the padded output buffers
  carried: list    # the index operands and inputs that the kernel writes (Call.carried_pos)
  scratch: list    # scratch buffers, one slice per lane evaluated together
  glob: list       # pl.get_global buffers
  writers: list    # per race-checked output: the program that last wrote each element, or -1
  init_outs: list  # with uninit checks: per output, its initialized elements (padded shape)
  init_scratch: list  # ... and per scratch buffer (one slice per lane, as ``scratch``)


@dataclasses.dataclass(frozen=True, eq=False)
class Call:
  """One run of the grid: what every step reads besides the State."""
  params: Any
  prep: Prepared
  index_vals: tuple               # the scalar-prefetch operands as passed
  ins: tuple                      # the padded inputs as passed
  carried_pos: tuple[int, ...]    # kernel Ref positions of the index operands / inputs written
  race_out: tuple[int, ...]       # outputs checked for races (written and never read)

  @property
  def gm(self):
    return self.params.grid_mapping

  def operands(self, carried):
    """The index operands and padded inputs as of this step (with the kernel's writes)."""
    index_vals, ins = list(self.index_vals), list(self.ins)
    nidx = self.gm.num_index_operands
    for p, v in zip(self.carried_pos, carried):
      if p < nidx:
        index_vals[p] = v
      else:
        ins[p - nidx] = v
    return index_vals, ins


def _begin(args, params, prep: Prepared) -> tuple[Call, State]:
  """The run's constants and the loop's first state: padded operands, poisoned outputs (or the
  aliased inputs), fresh scratch and globals."""
  gm, plan = params.grid_mapping, prep.plan
  nidx, nin = gm.num_index_operands, gm.num_inputs
  views = plan.blocks
  index_vals = tuple(args[gm.slice_index_ops])
  ins = tuple(_pad(x, v) for x, v in zip(args[nidx:], views[:nin]))
  aliased = {o: i for i, o in params.input_output_aliases}
  outs = [_pad(args[aliased[k]], v) if k in aliased else
          prims.poison(_padded_shape(v), bm.array_aval.dtype)
          for k, (bm, v) in enumerate(zip(gm.block_mappings_output, views[nin:]))]
  lanes = tuple(gm.grid[a] for a in prep.parallel)
  scratch = [(jnp.zeros if h.zeroed else prims.poison)(lanes + h.shape, h.dtype)
             for h in plan.scratch]
  glob = [jnp.zeros(h.shape, h.dtype) for h in plan.globals]
  carried_pos = tuple(p for p in plan.written if p < nidx + nin)
  carried = [index_vals[p] if p < nidx else ins[p - nidx] for p in carried_pos]
  race_out = tuple(k for k in range(gm.num_outputs)
                   if prep.detect_races and nidx + nin + k not in plan.read)
  writers = [jnp.full(outs[k].shape, -1, jnp.int32) for k in race_out]
  init_outs = [jnp.full(o.shape, k in aliased) for k, o in enumerate(outs)] if prep.uninit else []
  init_scratch = [jnp.full(s.shape, h.zeroed) for s, h in zip(scratch, plan.scratch)] \
      if prep.uninit else []
  call = Call(params, prep, index_vals, ins, carried_pos, race_out)
  return call, State(outs, carried, scratch, glob, writers, init_outs, init_scratch)


def _step(call: Call, t, state: State) -> State:
  """Step ``t`` of the loop over the sequential axes: all parallel lanes at those coordinates."""
  prep, grid = call.prep, call.gm.grid
  seq_coords = _unravel(t, [grid[a] for a in prep.sequential]) if prep.sequential else []
  state = state._replace(scratch=_reset_scratch(call, seq_coords, state.scratch),
                         init_scratch=_reset_scratch(call, seq_coords, state.init_scratch, True))
  res, starts, written, ids, inits = _run_programs(call, seq_coords, state)
  lanes = math.prod(grid[a] for a in prep.parallel) if prep.parallel else 0
  state = _write_blocks(call, state, res, starts, lanes, inits)
  return _check_races(call, state, written, starts, ids)


def _reset_scratch(call: Call, seq_coords, scratch, masks: bool = False):
  """Scratch starts poisoned (zeroed for semaphores) in each new semantic lane, that is at its
  first program along the sequential axes, when such lanes run in this loop. With ``masks``:
  the scratch's init masks, which start False (True for semaphores)."""
  seq, lanes_par = call.prep.sequential, call.prep.plan.schedule.parallel
  if not scratch or not any(a in lanes_par for a in seq):
    return scratch
  lane_start = functools.reduce(jnp.logical_and, [seq_coords[seq.index(a)] == 0 for a in seq
                                                  if a not in lanes_par], jnp.bool_(True))
  fresh = (lambda h, s: jnp.full(s.shape, h.zeroed)) if masks else \
      (lambda h, s: (jnp.zeros if h.zeroed else prims.poison)(s.shape, s.dtype))
  return [jnp.where(lane_start, fresh(h, s), s) for s, h in zip(scratch, call.prep.plan.scratch)]


def _run_programs(call: Call, seq_coords, state: State):
  """Every lane of the parallel axes at ``seq_coords``: one nested vmap per parallel axis, so an
  operand whose block does not move along an axis is not copied along it. Returns the kernel's
  final Ref values, the block starts, the race-checked elements written, and the grid ids."""
  par, grid = call.prep.parallel, call.gm.grid
  index_vals, ins = call.operands(state.carried)
  lane = functools.partial(_program_at, call, seq_coords, index_vals, ins, state.outs, state.glob,
                           state.init_outs)
  per_lane = [*state.scratch, *state.init_scratch]
  if not par:
    return lane(*per_lane)
  if call.prep.map_lanes:
    return _map_lanes(lane, [grid[a] for a in par], per_lane)
  fn = lane
  for level in reversed(range(len(par))):
    axes = [None] * len(par) + [0] * len(per_lane)
    axes[level] = 0
    fn = jax.vmap(fn, in_axes=tuple(axes))
  return fn(*[jnp.arange(grid[a], dtype=jnp.int32) for a in par], *per_lane)


def _map_lanes(lane, sizes, scratch):
  """The lanes one after another, with results stacked as the nested vmaps stack them: checks
  inside a while loop then see one lane's trip count."""
  n = math.prod(sizes)
  ids = _unravel(jnp.arange(n, dtype=jnp.int32), sizes)
  flat = [s.reshape((n,) + s.shape[len(sizes):]) for s in scratch]
  res = lax.map(lambda a: lane(*a), (*ids, *flat))
  return jax.tree.map(lambda x: x.reshape(tuple(sizes) + x.shape[1:]), res)


def _program_at(call: Call, seq_coords, index_vals, ins, outs, glob, init_outs,
                *par_ids_and_scratch):
  """One program: reads its blocks and runs the kernel (twice when checking races: a second
  run on changed output blocks shows which elements it writes; twice when checking for
  uninitialized data, see uninit.py). Returns the Refs' final values, the block starts, the
  race-checked elements written, the grid ids, and the init masks of outputs and scratch."""
  gm, prep = call.gm, call.prep
  npar = len(prep.parallel)
  par_ids, scratch = par_ids_and_scratch[:npar], par_ids_and_scratch[npar:]
  scratch, init_scratch = scratch[:len(prep.plan.scratch)], scratch[len(prep.plan.scratch):]
  ids = [None] * len(gm.grid)
  for a, v in zip(prep.parallel, par_ids):
    ids[a] = v
  for a, v in zip(prep.sequential, seq_coords):
    ids[a] = v
  ids = [jnp.asarray(i, jnp.int32) for i in ids]
  starts = [_starts(bm, view, ids, index_vals, table is None, call.params.name)
            for bm, view, table in zip(gm.block_mappings, prep.plan.blocks, prep.plan.tables)]
  nin = gm.num_inputs
  in_blocks = [_read_block(x, bm, s) for x, bm, s in zip(ins, gm.block_mappings, starts)]
  out_blocks = [_read_block(x, bm, s)
                for x, bm, s in zip(outs, gm.block_mappings_output, starts[nin:])]
  inits = ()
  if prep.uninit:
    init_blocks = [_read_block(x, bm, s)
                   for x, bm, s in zip(init_outs, gm.block_mappings_output, starts[nin:])]
    out_blocks, scratch, res, inits = _run_twice(call, ids, index_vals, in_blocks, out_blocks,
                                                 init_blocks, scratch, init_scratch, glob)
  else:
    res = _run_kernel(prep, ids, index_vals, in_blocks, out_blocks, scratch, glob)
  written = []
  if call.race_out:
    alt = list(out_blocks)
    for k in call.race_out:
      alt[k] = _other_value(out_blocks[k])
    res2 = _run_kernel(prep, ids, index_vals, in_blocks, alt, scratch, glob)
    out0 = gm.slice_block_ops.start + nin   # out[0] among the kernel's Refs
    written = [~_differs(res[out0 + k], res2[out0 + k]) for k in call.race_out]
  return res, starts, written, ids, inits


def _run_twice(call: Call, ids, index_vals, in_blocks, out_blocks, init_blocks, scratch,
               init_scratch, glob):
  """Runs the program with uninitialized output and scratch elements set to a second fill and
  compares with the run on the poison (``uninit.check_program``). Returns the blocks run on
  (uninitialized elements poisoned), that run's results, and the init masks after it."""
  gm, prep = call.gm, call.prep
  outs_a = [uninit.filled(b, m, False) for b, m in zip(out_blocks, init_blocks)]
  outs_b = [uninit.filled(b, m, True) for b, m in zip(out_blocks, init_blocks)]
  scr_a = [uninit.filled(b, m, False) for b, m in zip(scratch, init_scratch)]
  scr_b = [uninit.filled(b, m, True) for b, m in zip(scratch, init_scratch)]
  res_a = _run_kernel(prep, ids, index_vals, in_blocks, outs_a, scr_a, glob)
  res_b = _run_kernel(prep, ids, index_vals, in_blocks, outs_b, scr_b, glob, second=True)
  names = [f"args[{i}]" for i in range(gm.num_index_operands)] + \
      [b.origin for b in prep.plan.blocks] + [h.origin for h in prep.plan.scratch + prep.plan.globals]
  masks = [None] * (gm.num_index_operands + gm.num_inputs) + list(init_blocks) + \
      list(init_scratch) + [None] * len(prep.plan.globals)
  refs = [(n, a, b, m) for p, (n, a, b, m) in enumerate(zip(names, res_a, res_b, masks))
          if m is not None or p in prep.plan.written or p >= gm.slice_scratch_ops.stop]
  after = uninit.check_program(call.params.name, ids, refs, prep.reads)
  after = [m for m in after if m is not None]
  return outs_a, scr_a, res_a, (after[:gm.num_outputs], after[gm.num_outputs:])


def _run_kernel(prep: Prepared, ids, *refs, second: bool = False):
  """The discharged kernel on one program's Ref values; returns their final values. Checks are
  made into values per program, before programs are batched: JAX cannot check a batched while
  loop (a loop whose trip count differs between programs). ``second``: uninit's second run."""
  args = (*ids, *[x for group in refs for x in group])
  pure = prep.pure_second if second else prep.pure
  run = lambda *a: ji.eval_jaxpr(pure, pure.consts, *a)
  if not prep.checked:
    return run(*args)
  err, res = checkify.checkify(run, errors=checkify.user_checks)(*args)
  checkify.check_error(err)
  return res


def _write_blocks(call: Call, state: State, res, starts, lanes: int, inits) -> State:
  """The programs' blocks written back (outputs, and the index operands and inputs they write),
  and their scratch and globals kept; with uninit checks, the init masks too."""
  gm, written = call.gm, call.prep.plan.written
  nidx, nin = gm.num_index_operands, gm.num_inputs
  if inits:
    state = state._replace(
        init_outs=[_write_lanes(o, bm, m, starts[nin + k], lanes) for k, (o, bm, m)
                   in enumerate(zip(state.init_outs, gm.block_mappings_output, inits[0]))],
        init_scratch=list(inits[1]))
  blocks = res[gm.slice_block_ops]
  outs = [_write_lanes(o, bm, blocks[nin + k], starts[nin + k], lanes)
          if nidx + nin + k in written else o
          for k, (o, bm) in enumerate(zip(state.outs, gm.block_mappings_output))]
  carried = [res[p] if p < nidx else
             _write_lanes(v, gm.block_mappings[p - nidx], res[p], starts[p - nidx], lanes)
             for p, v in zip(call.carried_pos, state.carried)]
  return state._replace(outs=outs, carried=carried, scratch=list(res[gm.slice_scratch_ops]),
                        glob=list(res[gm.slice_scratch_ops.stop:]))


def _check_races(call: Call, state: State, written, starts, ids) -> State:
  """Fails when this program writes an element another program wrote (programs run one at a
  time when races are checked); records it as the writer of the elements it writes."""
  gm, grid, name = call.gm, call.gm.grid, call.params.name
  writers = []
  for j, k in enumerate(call.race_out):
    bm, s = gm.block_mappings_output[k], starts[gm.num_inputs + k]
    me = _linear(ids, grid)
    w = _read_block(state.writers[j], bm, s)
    clash = written[j] & (w >= 0) & (w != me)
    first = jnp.argmax(clash.reshape(-1))
    other = w.reshape(-1)[first]
    checks.check(~jnp.any(clash),
                 f"pallas_call {name}: race on {bm.origin}: programs {{a}} and {{b}} (linear "
                 f"indices in the grid {grid}) both write its element at block offset "
                 f"{{e}}; on a GPU they run concurrently and the result depends on their order",
                 a=other, b=me, e=first)
    writers.append(_write_lanes(state.writers[j], bm, jnp.where(written[j], me, w), s, 0))
  return state._replace(writers=writers)


def _interpret(*args, params, prep: Prepared):
  call, state = _begin(args, params, prep)
  n_steps = math.prod(call.gm.grid[a] for a in prep.sequential)
  step = functools.partial(_step, call)
  state = step(jnp.int32(0), state) if n_steps == 1 else lax.fori_loop(0, n_steps, step, state)
  views = prep.plan.blocks[call.gm.num_inputs:]
  aliased = {o for _, o in params.input_output_aliases}
  for k, (m, v) in enumerate(zip(state.init_outs, views)):
    if k not in aliased:
      uninit.check_all_written(params.name, v.origin, _unpad(m, v))
  return _aliased_writes(call, state, [_unpad(o, v) for o, v in zip(state.outs, views)])


def _aliased_writes(call: Call, state: State, outs: list) -> list:
  """An output aliased to an input is one buffer with it: what the kernel wrote through the
  input's Ref is the output (JAX's kernels write the aliased input and leave the output alone)."""
  gm, nidx = call.gm, call.gm.num_index_operands
  written = call.prep.plan.written
  for i, o in call.params.input_output_aliases:
    if i not in call.carried_pos:
      continue
    if nidx + gm.num_inputs + o in written:
      raise NotImplementedError(
          f"pallas_call {call.params.name}: the kernel writes both args[{i}] and out[{o}], which "
          "input_output_aliases makes one buffer; pallax's interpreter does not merge the two "
          "yet: write through one of the two Refs only")
    final = state.carried[call.carried_pos.index(i)]
    outs[o] = final if i < nidx else _unpad(final, call.prep.plan.blocks[i - nidx])
  return outs


# --- entry points ----------------------------------------------------------------------

def _raise(err):
  exc = err.get_exception()
  if exc is None:
    return
  msg = str(exc).replace(" (`check` failed)", "")
  # The class comes from the check's kind (data), never from the message's words.
  raise (IndexError if checks.kind_of(exc) == checks.INDEX else KernelCheckError)(msg)


def _checked(params, prep):
  fn = functools.partial(_interpret, params=params, prep=prep)
  return checkify.checkify(fn, errors=checkify.user_checks)


def run(*args, params, raise_errors: str = "callback"):
  """The interpreter inside a trace (used as the lowering of pallas_call)."""
  prep = prepare(params)
  if not prep.checked:
    return _interpret(*args, params=params, prep=prep)
  err, outs = _checked(params, prep)(*args)
  leaves, tree = jax.tree.flatten(err)

  def report(*values):
    _raise(jax.tree.unflatten(tree, values))
    return ()

  ji.host_callback(errors.reporting(report), (), *leaves)
  return outs


def _eager_fn(params):
  """A compiled function (args -> (error or None, outputs)). It holds its Params weakly (a
  trace happens only in a call, which holds it), so that the cache entry can be dropped."""
  prep, ref = prepare(params), weakref.ref(params)
  body = lambda *a: _interpret(*a, params=ref(), prep=prep)
  if prep.checked:
    return jax.jit(checkify.checkify(body, errors=checkify.user_checks))
  inner = jax.jit(body)
  return lambda *a: (None, inner(*a))


_eager = kplan.PerParams()


def run_eager(*args, params):
  """Eager calls: compiled once per pallas_call; failed checks raise Python errors here."""
  err, outs = _eager.get(params, _eager_fn)(*args)
  if err is not None:
    _raise(err)
  return outs

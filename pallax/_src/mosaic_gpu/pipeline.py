"""``emit_pipeline`` and ``emit_pipeline_warp_specialized``: pallax's own pipelining library code
over the Mosaic GPU primitives, with the API and the behaviour of the pipelines of JAX's Mosaic
GPU module.

A pipeline runs ``body`` once per step of a sequential ``grid`` (row-major, the last axis fastest).
Each input block is copied GMEM->SMEM by TMA into one of ``max_concurrent_steps`` SMEM slots (step
``t`` uses slot ``t % max_concurrent_steps``) ahead of the step that reads it; every copy of a
step arrives on that slot's barrier, which the reading thread waits on. Output blocks are written
in SMEM by ``body`` and copied back to GMEM with ``copy_smem_to_gmem``.

A slot is refilled once the step that used it has *released* it: at the end of that step, or
``delay_release`` steps later (for bodies that leave asynchronous ``wgmma``s reading their inputs
in flight). In ``emit_pipeline`` one thread does everything; in
``emit_pipeline_warp_specialized`` a memory thread issues the copies and compute threads run
``body``, releasing slots by arriving on "consumed" barriers.

Output blocks follow JAX's rules: a block whose index depends on the grid is written back at the
first step of each run of consecutive steps that map to it (and, in ``emit_pipeline``, at the
last step too); outputs are meant to move to a new block every step. A block the grid does not
move is written once, after the last step, from the last step's slot.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pallax._src import core as pc
from pallax._src import jax_internals as ji
from pallax._src import primitives as prims
from pallax._src.mosaic_gpu import core as mc
from pallax._src.mosaic_gpu import primitives as mp
from pallax._src.mosaic_gpu.pipeline_state import check_pipeline_state


# --- specs -----------------------------------------------------------------------------------

def _gpu_spec(spec) -> mc.BlockSpec:
  """Any ``BlockSpec`` as a ``plgpu.BlockSpec`` (a plain one has no transforms and no delay)."""
  if isinstance(spec, mc.BlockSpec):
    gspec = spec
  elif isinstance(spec, pc.BlockSpec):
    gspec = mc.BlockSpec(spec.block_shape, spec.index_map, spec.memory_space, spec.pipeline_mode)
  else:
    raise TypeError(f"pipeline specs must be pl.BlockSpec or plgpu.BlockSpec, got {spec!r}")
  if gspec.pipeline_mode is not None:
    raise NotImplementedError("pl.BlockSpec with pipeline_mode= is not supported")
  return gspec


def _in_smem(spec) -> bool:
  """Blocks are staged in SMEM unless the spec keeps the operand in GMEM."""
  return spec.memory_space in (None, pc.MemorySpace.DEFAULT, mc.SMEM)


def _block_dims(spec, shape) -> tuple | None:
  """The spec's block dimensions (``pl.Blocked``/``pl.Element``/``pl.squeezed``); ``None`` for
  the whole array."""
  if spec.block_shape is None:
    return None
  dims = tuple(pc.canonical_block_dim(d) for d in spec.block_shape)
  if len(dims) != len(shape):
    raise ValueError(f"block_shape {tuple(spec.block_shape)} does not have the rank of the "
                     f"operand of shape {tuple(shape)}")
  for d in dims:
    if isinstance(d, pc.Element) and tuple(d.padding) != (0, 0):
      raise NotImplementedError("pl.Element block dimensions with padding are not supported")
  return dims


def _smem_shape(dims, shape) -> tuple[int, ...]:
  """A block's shape in SMEM: squeezed dimensions are dropped."""
  if dims is None:
    return tuple(shape)
  return tuple(d.block_size for d in dims if not isinstance(d, pc.Squeezed))


def _with_slot_dim(transform):
  """An SMEM transform of a block, for the buffer with a leading slot dimension."""
  if isinstance(transform, mc.TransposeTransform):
    return mc.TransposeTransform((0, *(p + 1 for p in transform.permutation)))
  return transform   # tiling and swizzling act on the trailing dimensions


def _smem_type(spec, gmem_ref, slots: int):
  dims = _block_dims(spec, gmem_ref.shape)
  return mc.SMEM((slots, *_smem_shape(dims, gmem_ref.shape)), gmem_ref.dtype,
                 transforms=tuple(_with_slot_dim(t) for t in spec.transforms))


def _varies_with_grid(spec, rank: int) -> bool:
  """Whether the block index depends on the grid indices (else the block never moves)."""
  if spec.index_map is None or spec.block_shape is None or rank == 0:
    return False
  scalar = ji.ShapedArray((), jnp.int32)
  jaxpr, _, _ = ji.trace_to_jaxpr(lambda *idx: jax.tree.leaves(spec.index_map(*idx)),
                                  [scalar] * rank, name="index_map")
  # Which variables the outputs depend on: a walk back from the outputs.
  live = {v for v in jaxpr.outvars if not isinstance(v, ji.Literal)}
  for eqn in reversed(jaxpr.eqns):
    if any(v in live for v in eqn.outvars):
      live.update(v for v in eqn.invars if not isinstance(v, ji.Literal))
  return any(v in live for v in jaxpr.invars)


# --- steps and grids -------------------------------------------------------------------------

def _check_grid(grid) -> tuple:
  """The grid, its static sizes as Python ints (dynamic sizes are int32 scalars)."""
  grid = tuple(int(g) if isinstance(g, (int, np.integer)) else g for g in grid)
  if any(isinstance(g, int) and g <= 0 for g in grid):
    raise ValueError(f"All elements in the grid must be strictly positive, but got grid={grid}")
  return grid


def _num_steps(grid):
  """The number of steps: a Python int for a static grid, an int32 scalar otherwise."""
  if all(isinstance(g, int) for g in grid):
    return math.prod(grid)
  return functools.reduce(lambda a, b: a * b, [jnp.asarray(g, jnp.int32) for g in grid],
                          jnp.int32(1))


def _nonneg_mod(a, n):
  """``a % n`` for ``a >= 0``: lax's truncating rem (no sign fix-up), ``n`` a literal if static."""
  if isinstance(a, int) and isinstance(n, int):
    return a % n
  return lax.rem(jnp.asarray(a, jnp.int32), np.int32(n) if isinstance(n, int) else jnp.asarray(n, jnp.int32))


def _nonneg_div(a, n):
  return lax.div(jnp.asarray(a, jnp.int32), np.int32(n) if isinstance(n, int) else jnp.asarray(n, jnp.int32))


def _grid_index(step, grid) -> tuple:
  """The grid indices of pipeline step ``step`` (row-major: the last axis moves fastest)."""
  step = jnp.asarray(step, jnp.int32)
  index = []
  for size in reversed(grid):
    index.append(_nonneg_mod(step, size))
    step = _nonneg_div(step, size)
  return tuple(reversed(index))


def _is_ref(x) -> bool:
  if isinstance(x, ji.TransformedRef):
    return True
  try:
    return ji.is_ref_aval(jax.typeof(x))
  except TypeError:
    return False


def _loop(lower, upper, step_fn, carry):
  """``lax.fori_loop`` over steps whose carry may hold Refs (an accumulator, say): loops cannot
  carry Refs, so those stay the same Refs and only the values go around the loop."""
  leaves, tree = jax.tree.flatten(carry)
  refs = [_is_ref(x) for x in leaves]

  def merge(values):
    it = iter(values)
    return jax.tree.unflatten(tree, [x if r else next(it) for x, r in zip(leaves, refs)])

  def body(step, values):
    out = step_fn(jnp.asarray(step, jnp.int32), merge(values))
    out_leaves, out_tree = jax.tree.flatten(out)
    if out_tree != tree:
      raise ValueError(f"the pipeline body must return a carry of the structure of the initial "
                       f"carry, {tree}, but returned {out_tree}")
    return [y for y, r in zip(out_leaves, refs) if not r]

  return merge(lax.fori_loop(lower, upper, body, [x for x, r in zip(leaves, refs) if not r]))


def _slots(max_concurrent_steps: int, num_steps) -> int:
  """SMEM slots per input: no more than the steps of a static grid (extra ones go unused)."""
  if isinstance(num_steps, int):
    return min(max_concurrent_steps, num_steps)
  return max_concurrent_steps


def _min(a, b):
  return min(a, b) if isinstance(a, int) and isinstance(b, int) else jnp.minimum(a, b)


# --- one operand of a pipeline ---------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Operand:
  """A GMEM operand of a pipeline and its SMEM slots (``None``: the body reads GMEM)."""
  spec: mc.BlockSpec
  gmem: Any
  smem: Any
  varies: bool              # the block index depends on the grid

  @property
  def staged(self) -> bool:
    return self.smem is not None

  def block_index(self, index) -> tuple:
    block = self.spec.index_map(*index)
    return tuple(block) if isinstance(block, (tuple, list)) else (block,)

  def block(self, index):
    """The GMEM view of the block at grid index ``index``."""
    dims = _block_dims(self.spec, self.gmem.shape)
    if dims is None:
      return self.gmem
    if self.spec.index_map is None:
      block = (0,) * len(dims)
    else:
      block = self.block_index(index)
    if len(block) != len(dims):
      raise ValueError(f"the index_map returns {len(block)} block indices for a block_shape of "
                       f"rank {len(dims)}")
    window = []
    for b, d in zip(block, dims):
      if isinstance(d, pc.Squeezed):
        window.append(b)
      elif isinstance(d, pc.Element):     # the index map gives an element offset
        window.append(prims.ds(b, d.block_size))
      else:
        window.append(prims.ds(b * d.block_size, d.block_size))
    return self.gmem.at[tuple(window)]

  def ref_for(self, slot):
    """What the body gets: the slot's SMEM block, or the GMEM operand itself."""
    return self.smem.at[slot] if self.staged else self.gmem

  def fetch(self, slot, index, barriers):
    """Copies the block at ``index`` into ``slot``: one arrival on ``barriers[slot]``."""
    if self.staged:
      mp.copy_gmem_to_smem(self.block(index), self.smem.at[slot], barriers.at[slot],
                           oob_mode=self.spec.oob_fill_mode,
                           collective_axes=getattr(self.spec, "collective_axes", None) or None)

  def store(self, slot, index, predicate=None):
    if self.staged:
      mp.copy_smem_to_gmem(self.smem.at[slot], self.block(index), predicate=predicate,
                           commit_group=False)

  def moved(self, step, grid):
    """Whether step ``step`` maps to another block than the step before (step 0 always does)."""
    now = self.block_index(_grid_index(step, grid))
    before = self.block_index(_grid_index(jnp.maximum(step - 1, 0), grid))
    changed = functools.reduce(jnp.logical_or, [jnp.asarray(a) != jnp.asarray(b)
                                                for a, b in zip(now, before)], jnp.bool_(False))
    return jnp.logical_or(step == 0, changed)


def _store_outputs(outs, slot, step, grid, last_step_too: bool, num_steps):
  """Writes back the outputs whose block moves with the grid (one group of copies per step)."""
  for op in outs:
    if op.staged and op.varies:
      first = op.moved(step, grid)
      if last_step_too:
        first = jnp.logical_or(first, step == num_steps - 1)
      op.store(slot, _grid_index(step, grid), predicate=first)
  mp.commit_smem_to_gmem_group()


def _store_fixed_outputs(outs, slot, grid, num_steps):
  """Writes back, once, the outputs whose block never moves (after the last step)."""
  fixed = [op for op in outs if op.staged and not op.varies]
  if fixed:
    mp.commit_smem()
    for op in fixed:
      op.store(slot, _grid_index(num_steps - 1, grid))
    mp.commit_smem_to_gmem_group()


# --- emit_pipeline ---------------------------------------------------------------------------

def emit_pipeline(body: Callable[..., Any], *, grid, in_specs=(), out_specs=(),
                  max_concurrent_steps: int = 1, init_carry=None):
  """A pipeline over ``grid`` run by the calling thread: ``pipeline(*in_gmem, *out_gmem)`` calls
  ``body(indices, *in_smem, *out_smem)`` (plus ``carry``, returning the next one, when
  ``init_carry`` is given) once per step, and returns the last carry (or ``None``).

  Up to ``max_concurrent_steps`` steps' inputs are in SMEM at once. An input's slot is refilled
  right after the step that read it, or ``spec.delay_release`` steps later."""
  grid = _check_grid(grid)
  in_specs = tuple(map(_gpu_spec, in_specs))
  out_specs = tuple(map(_gpu_spec, out_specs))
  if any(s.collective_axes for s in in_specs + out_specs):
    raise NotImplementedError("pl.BlockSpec with collective_axes= is not supported")
  delays = sorted({s.delay_release for s in in_specs} or {0})
  if max_concurrent_steps <= delays[-1]:
    raise ValueError("max_concurrent_steps must be greater than all delay_release values, but "
                     f"max_concurrent_steps={max_concurrent_steps} and delay_release={delays}")
  num_steps = _num_steps(grid)
  slots = _slots(max_concurrent_steps, num_steps)

  def pipeline(*gmem_refs):
    if len(gmem_refs) != len(in_specs) + len(out_specs):
      raise ValueError(f"the pipeline takes {len(in_specs)} inputs and {len(out_specs)} outputs, "
                       f"but got {len(gmem_refs)} Refs")
    specs = in_specs + out_specs
    smem = [_smem_type(s, r, slots) if _in_smem(s) else None for s, r in zip(specs, gmem_refs)]
    copies = sum(map(_in_smem, in_specs))
    barrier = mc.Barrier(num_arrivals=copies, num_barriers=slots) if copies else None

    def scoped(smem_refs, barrier_ref):
      ops = [_Operand(s, g, m, _varies_with_grid(s, len(grid)))
             for s, g, m in zip(specs, gmem_refs, smem_refs)]
      return _run_pipeline(body, grid, num_steps, slots, delays, ops[:len(in_specs)],
                           ops[len(in_specs):], barrier_ref, init_carry)

    return prims.run_scoped(scoped, smem, barrier)

  return pipeline


def _run_pipeline(body, grid, num_steps, slots, delays, ins, outs, barrier, init_carry):
  has_carry = init_carry is not None
  stores_in_loop = any(op.staged and op.varies for op in outs)

  def fetch(step, delay=None):
    """Issues the copies of ``step``'s input blocks (those released with ``delay``, or all)."""
    slot, index = _nonneg_mod(step, slots), _grid_index(step, grid)
    for op in ins:
      if delay is None or op.spec.delay_release == delay:
        op.fetch(slot, index, barrier)

  # Prologue: the first `slots` steps' inputs, before anything is released.
  lax.fori_loop(0, _min(slots, num_steps), lambda step, _: fetch(step), None)

  def step_fn(step, carry):
    slot, index = _nonneg_mod(step, slots), _grid_index(step, grid)
    if barrier is not None:
      mp.barrier_wait(barrier.at[slot])          # this step's inputs have landed
    if stores_in_loop:
      # The store of this slot's previous use (slots steps ago) must have read it.
      mp.wait_smem_to_gmem(slots - 1, wait_read_only=True)
    refs = [op.ref_for(slot) for op in ins + outs]
    if has_carry:
      carry = body(index, *refs, carry)
    else:
      body(index, *refs)
    if stores_in_loop:
      mp.commit_smem()
      _store_outputs(outs, slot, step, grid, True, num_steps)
    # Refill the slot released now: the one read `delay` steps ago, with the step `slots` later.
    for delay in delays:
      later = step + slots - delay

      @prims.when(jnp.logical_and(step >= delay, later < num_steps))
      def _():
        fetch(later, delay)
    return carry

  carry = _loop(0, num_steps, step_fn, init_carry)
  _store_fixed_outputs(outs, _nonneg_mod(num_steps - 1, slots), grid, num_steps)
  if any(op.staged for op in outs):
    mp.wait_smem_to_gmem(0)
  return carry if has_carry else None


# --- emit_pipeline_warp_specialized ----------------------------------------------------------

def _compute_registers(memory_registers: int, num_compute_wgs: int) -> int:
  """Registers per lane for each compute thread: what the memory thread leaves of a 512-register
  budget (one warpgroup's share of the register file), split evenly, at most 256, rounded down
  to a multiple of 8 (``set_max_registers``' granularity)."""
  share = min(256, (512 - memory_registers) // num_compute_wgs)
  return share // 8 * 8


def _common_delay(in_specs) -> int:
  delays = {s.delay_release for s in in_specs}
  if len(delays) > 1:
    raise NotImplementedError(f"All inputs must have the same delay_release, but got "
                              f"{sorted(delays)}")
  return delays.pop() if delays else 0


def emit_pipeline_warp_specialized(body: Callable[..., Any], *, grid, memory_registers: int,
                                   in_specs=(), out_specs=(), max_concurrent_steps: int = 2,
                                   wg_axis: str, num_compute_wgs: int, pipeline_state=None,
                                   manual_produced_barriers: bool = False,
                                   manual_consumed_barriers: bool = False,
                                   compute_context=None, memory_thread_idx: int | None = None,
                                   manual_ready_barriers: bool = False):
  """A pipeline over ``grid`` split between threads of the ``wg_axis`` axis: the memory thread
  (the last, ``num_compute_wgs``) issues every GMEM->SMEM copy, and each of the
  ``num_compute_wgs`` compute threads calls ``body(indices, *in_smem, *out_smem,
  *produced_barriers, *consumed_barriers, carry)`` once per step (the barriers only with
  ``manual_produced_barriers``/``manual_consumed_barriers``, the carry only with
  ``compute_context``). Specs may be pytrees; each top-level entry is one argument of ``body``.

  A slot is refilled once every compute thread released it: automatically after ``body``
  (``delay_release`` steps later with that option), or, with ``manual_consumed_barriers``, when
  each compute thread arrived on the consumed barrier that ``body`` gets for each input.
  ``compute_context(pipeline)`` runs in the compute threads only: it calls
  ``pipeline(init_carry)`` once, which returns the last carry.

  ``pipeline(*gmem_refs, allocations=None)``; ``pipeline.get_allocations(*gmem_refs)`` gives the
  scratch to allocate with ``pl.run_scoped(..., collective_axes=wg_axis)`` and pass back as
  ``allocations`` (to share one allocation between several calls). ``manual_ready_barriers``
  is JAX's newer name of ``manual_produced_barriers``; ``pipeline_state``: see pipeline_state.py."""
  manual_produced_barriers = manual_produced_barriers or manual_ready_barriers
  grid = _check_grid(grid)
  (flat_in, in_tree), (flat_out, out_tree) = _flat_specs(in_specs), _flat_specs(out_specs)
  delay = _check_warp_specialized(flat_in, flat_out, grid, max_concurrent_steps, memory_thread_idx,
                                  num_compute_wgs)
  memory_thread_idx = num_compute_wgs
  out_varies = [_varies_with_grid(s, len(grid)) for s in flat_out]
  num_steps = _num_steps(grid)
  check_pipeline_state(pipeline_state, num_steps, max_concurrent_steps, delay)
  slots = _slots(max_concurrent_steps, num_steps)
  flat_gmem = functools.partial(_flat_gmem, in_tree=in_tree, out_tree=out_tree)

  def get_allocations(*gmem_refs):
    flat_i, flat_o = flat_gmem(gmem_refs)
    return _allocations(flat_in, flat_out, flat_i, flat_o, slots, out_varies, num_compute_wgs,
                        manual_produced_barriers, manual_consumed_barriers)

  def pipeline(*gmem_refs, allocations=None):
    flat_i, flat_o = flat_gmem(gmem_refs)
    if allocations is None:
      return prims.run_scoped(lambda allocs: pipeline(*gmem_refs, allocations=allocs),
                              get_allocations(*gmem_refs), collective_axes=wg_axis)
    ins = [_Operand(s, g, m, True) for s, g, m in zip(flat_in, flat_i, allocations["in_smem"])]
    outs = [_Operand(s, g, m, v)
            for s, g, m, v in zip(flat_out, flat_o, allocations["out_smem"], out_varies)]
    ws = _WarpSpecialized(body, grid, num_steps, slots, delay, ins, outs, in_tree, out_tree,
                          allocations["produced"], allocations["consumed"],
                          manual_produced_barriers, manual_consumed_barriers, num_compute_wgs)
    is_compute = lax.axis_index(wg_axis) != memory_thread_idx
    prims.when(is_compute)(lambda: ws.compute(memory_registers, compute_context))
    prims.when(jnp.logical_not(is_compute))(lambda: ws.memory(memory_registers))

  pipeline.get_allocations = get_allocations
  return pipeline


def _flat_specs(specs):
  """(the flat GPU BlockSpecs, their tree): each top-level entry is one argument of ``body``."""
  specs = tuple(specs) if isinstance(specs, (list, tuple)) else (specs,)
  flat, tree = jax.tree.flatten(specs)
  return tuple(map(_gpu_spec, flat)), tree


def _flat_gmem(gmem_refs, *, in_tree, out_tree):
  """The pipeline's GMEM Refs, flat, checked against the specs' structure."""
  n_in = len(in_tree.children())
  flat_i, tree_i = jax.tree.flatten(tuple(gmem_refs[:n_in]))
  flat_o, tree_o = jax.tree.flatten(tuple(gmem_refs[n_in:]))
  if tree_i != in_tree or tree_o != out_tree:
    raise ValueError("the GMEM Refs must have the pytree structure of in_specs and out_specs: "
                     f"{in_tree} and {out_tree}, got {tree_i} and {tree_o}")
  return flat_i, flat_o


def _check_warp_specialized(flat_in, flat_out, grid, max_concurrent_steps, memory_thread_idx,
                            num_compute_wgs) -> int:
  """Refuses what the warp-specialized pipeline cannot do; returns the inputs' delay_release."""
  if any(s.collective_axes and len(s.collective_axes) > 1 for s in flat_in):
    raise ValueError("Only a single collective axis supported in input BlockSpecs")
  if any(s.collective_axes for s in flat_out):
    raise ValueError("Output BlockSpecs cannot have collective_axes")
  if not all(map(_in_smem, flat_in + flat_out)):
    raise NotImplementedError("emit_pipeline_warp_specialized: every block must be staged in "
                              "SMEM (memory_space=plgpu.SMEM or unset)")
  delay = _common_delay(flat_in)
  if max_concurrent_steps <= delay:
    raise ValueError("max_concurrent_steps must be greater than delay_release, but "
                     f"max_concurrent_steps={max_concurrent_steps}, delay_release={delay}")
  if memory_thread_idx is not None and memory_thread_idx != num_compute_wgs:
    raise NotImplementedError("Memory thread must be the last thread.")
  if not all(_varies_with_grid(s, len(grid)) for s in flat_in):
    raise NotImplementedError("Only inputs with a dependency on the grid are supported.")
  return delay


def _allocations(flat_in, flat_out, flat_i, flat_o, slots, out_varies, num_compute_wgs,
                 manual_produced, manual_consumed) -> dict:
  """The scratch of a warp-specialized pipeline: SMEM slots and the produced/consumed barriers."""
  # Multicast inputs (BlockSpec(collective_axes=...)) land in every block of the group: a slot
  # is refilled once the compute threads of all those blocks released it.
  axes = tuple(dict.fromkeys(a for s in flat_in for a in (s.collective_axes or ())))
  consumed = (mc.ClusterBarrier(num_arrivals=num_compute_wgs, num_barriers=slots,
                                collective_axes=axes) if axes
              else mc.Barrier(num_arrivals=num_compute_wgs, num_barriers=slots))
  return dict(
      in_smem=[_smem_type(s, r, slots) for s, r in zip(flat_in, flat_i)],
      out_smem=[_smem_type(s, r, slots if v else 1) for s, r, v in zip(flat_out, flat_o, out_varies)],
      # Automatic barriers: one per slot for all inputs; manual ones: one per input.
      produced=([mc.Barrier(num_barriers=slots) for _ in flat_in] if manual_produced
                else [mc.Barrier(num_arrivals=len(flat_in), num_barriers=slots)]),
      consumed=[consumed] * (len(flat_in) if manual_consumed else 1))


@dataclasses.dataclass(frozen=True)
class _WarpSpecialized:
  """The two roles of a warp-specialized pipeline, over its operands and barriers."""
  body: Callable[..., Any]
  grid: tuple
  num_steps: Any
  slots: int
  delay: int
  ins: list
  outs: list
  in_tree: Any
  out_tree: Any
  produced: list
  consumed: list
  manual_produced: bool
  manual_consumed: bool
  num_compute_wgs: int

  def compute(self, memory_registers, compute_context):
    mp.set_max_registers(_compute_registers(memory_registers, self.num_compute_wgs),
                         action="increase")
    if any(op.staged for op in self.outs) and self.num_compute_wgs > 1:
      # Every compute thread would store the same blocks, unsynchronized with the others.
      raise NotImplementedError("SMEM outputs are not supported with multiple compute warpgroups")
    if compute_context is None:
      _loop(0, self.num_steps, lambda s, c: self.step(s, c, False), None)
    else:
      calls = []

      def run(init_carry):
        if calls:
          raise ValueError("Cannot call pipeline more than once in `compute_context`")
        calls.append(True)
        return _loop(0, self.num_steps, lambda s, c: self.step(s, c, True), init_carry)

      compute_context(run)
      if not calls:
        raise ValueError("Pipeline was not called in `compute_context`")
    _store_fixed_outputs(self.outs, 0, self.grid, self.num_steps)
    if any(op.staged for op in self.outs):
      mp.wait_smem_to_gmem(0)

  def step(self, step, carry, has_carry):
    step = jnp.asarray(step, jnp.int32)
    slot, index = _nonneg_mod(step, self.slots), _grid_index(step, self.grid)
    released = (step - self.delay) % self.slots    # the slot this step releases
    stores_in_loop = any(op.staged and op.varies for op in self.outs)
    if not self.manual_produced:
      mp.barrier_wait(self.produced[0].at[slot])
    if stores_in_loop:
      mp.wait_smem_to_gmem(self.slots - 1, wait_read_only=True)
    args = [*jax.tree.unflatten(self.in_tree, [op.ref_for(slot) for op in self.ins]),
            *jax.tree.unflatten(self.out_tree,
                                [op.ref_for(slot if op.varies else 0) for op in self.outs])]
    if self.manual_produced:
      args += jax.tree.unflatten(self.in_tree, [b.at[slot] for b in self.produced])
    if self.manual_consumed:
      args += jax.tree.unflatten(self.in_tree, [b.at[released] for b in self.consumed])
    if has_carry:
      carry = self.body(index, *args, carry)
    else:
      self.body(index, *args)
    if not self.manual_consumed:
      # The first `delay` steps release nothing: their slots are released `delay` steps later.
      prims.when(step >= self.delay)(lambda: mp.barrier_arrive(self.consumed[0].at[released]))
    if stores_in_loop:
      mp.commit_smem()
    _store_outputs(self.outs, slot, step, self.grid, False, self.num_steps)
    return carry

  def memory(self, memory_registers):
    mp.set_max_registers(memory_registers, action="decrease")
    n = len(self.ins)
    producers = self.produced if self.manual_produced else self.produced * n
    # Before each input's copy into a slot, the barrier saying the slot was released (the
    # automatic one covers all inputs at once).
    releases = self.consumed if self.manual_consumed else self.consumed + [None] * (n - 1)
    prologue = _min(self.slots, self.num_steps)

    def fetch(step, wait_released):
      step = jnp.asarray(step, jnp.int32)
      slot, index = _nonneg_mod(step, self.slots), _grid_index(step, self.grid)
      for op, produced, released in zip(self.ins, producers, releases):
        if wait_released and released is not None:
          mp.barrier_wait(released.at[slot])
        op.fetch(slot, index, produced)

    # The first `slots` steps fill free slots; every later step waits until its slot, used
    # `slots` steps before, is released by all compute threads.
    lax.fori_loop(0, prologue, lambda s, _: fetch(s, False), None)
    lax.fori_loop(prologue, self.num_steps, lambda s, _: fetch(s, True), None)

    # Wait for the releases nobody waited for yet (all but the last `delay` steps'), so that the
    # consumed barriers end in the phase the next use of these allocations expects.
    def drain(step, _):
      for b in self.consumed:
        mp.barrier_wait(b.at[_nonneg_mod(step, self.slots)])
    lax.fori_loop(self.num_steps - prologue, self.num_steps - self.delay, drain, None)

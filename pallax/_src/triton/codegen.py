"""Kernel jaxpr + GridMapping -> the source of one ``@triton.jit`` function.

The pipeline: tile block products too large for one program (``gpu/tiling.py``), legalize lax's
semantics (``gpu/legalize.py``), then write the statements with the rule table of this package
(``rules``, ``shapes``, ``reductions``, ``memory``, ``movement``, ``control``, and the Triton
module's own primitives in ``api``). Generated code is meant to be read: one statement a line,
names from the kernel's parameters, and a comment with the user's source line above the code
it produced.

Grid: the axes along which programs may run concurrently become Triton's launch grid (flattened
into axis 0); axes along which a block the kernel reads back is revisited run as loops inside
each program, in order, as in the interpreter.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from pallax._src import core as pc
from pallax._src import jax_internals as ji
from pallax._src import primitives as prims
from pallax._src import schedule as sched
from pallax._src.gpu import expr as ex
from pallax._src.gpu import legalize, tiling
from pallax._src.gpu.source import Unsupported, identifier
from pallax._src.triton import control, movement, reductions, rules, shapes  # noqa: F401  (rules)
from pallax._src.triton import lang as tl
from pallax._src.triton import memory
from pallax._src.triton.writer import Writer

PROLOGUE = '''import triton
import triton.language as tl
from triton.language.extra import libdevice

INF = tl.constexpr(float("inf"))
NAN = tl.constexpr(float("nan"))


@triton.jit
def _and(a, b):
    return a & b


@triton.jit
def _or(a, b):
    return a | b


@triton.jit
def _mul(a, b):
    return a * b


@triton.jit
def _exp2(x):
    # The GPU's ex2 without the fix-up for denormal results (which are flushed to 0): 7% faster
    # flash attention on an H100. Its accuracy is otherwise that of tl.exp2.
    return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                     is_pure=True, pack=1)


@triton.jit
def _max(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _min(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
'''


@dataclasses.dataclass
class KernelSource:
  name: str
  source: str
  signature: dict[str, str]
  grid: tuple[int, int, int]
  num_warps: int
  num_stages: int
  debug: bool
  stages_chosen: bool = False   # the user set num_stages (no automatic retry with fewer)
  # Global-memory buffers the launcher allocates after the outputs: (shape, dtype, zeroed),
  # for scratch (a slice per concurrent program) and pl.get_global (shared, zeroed).
  hidden: tuple = ()


# Values beyond this many elements spill out of a program's registers (ptxas then takes
# minutes and gigabytes, and the kernel would crawl): refuse them with a clear message.
MAX_VALUE_ELEMENTS = 128 * 512

SIGNATURE = {
    "float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64",
    "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5", "int8": "i8", "int16": "i16",
    "int32": "i32", "int64": "i64", "uint8": "u8", "uint16": "u16", "uint32": "u32",
    "uint64": "u64", "bool": "i1",
}


# --- the schedule ------------------------------------------------------------------------------

def gpu_schedule(params, tables) -> sched.Schedule:
  """Loops inside a program along the axes that revisit output blocks the kernel reads back or
  writes at fixed indices; parallel programs along all others."""
  gm, jaxpr = params.grid_mapping, params.jaxpr
  rank = len(gm.grid)
  invars = list(jaxpr.invars)
  base = rank + gm.num_index_operands + gm.num_inputs
  # An output that is neither read back nor written at fixed indices may be revisited by
  # parallel programs: Triton-style kernels (whole-array Refs, each program storing its own
  # slice through program_id-dependent indices or masks) work that way.
  read_outs = [k for k in range(gm.num_outputs)
               if any(isinstance(e, (ji.ReadEffect, ji.AccumEffect)) and e.input is invars[base + k]
                      for e in jaxpr.effects) or _fixed_store(jaxpr, invars[base + k])]
  if gm.scratch_avals:
    # Scratch carries values along the axes that revisit output blocks (the interpreter's
    # sequential axes), whether or not the kernel reads the outputs back.
    read_outs = list(range(gm.num_outputs))
  every = tuple(range(rank))
  if params.globals_avals:
    return sched.Schedule((), every, "pl.get_global buffers are shared by all programs")
  if any(tables[gm.num_inputs + k] is None for k in read_outs):
    return sched.Schedule((), every, "an output read back has an index map that reads "
                          "scalar-prefetch operands")
  return sched.choose(gm, tables, outputs=read_outs)


def _fixed_store(jaxpr, ref) -> bool:
  """Whether the kernel stores to ``ref`` at indices that are all constants, with no mask: every
  program running that store writes the same elements, so the last one must win."""
  for e in jaxpr.eqns:
    if e.primitive in (ji.swap_p, prims.masked_swap_p) and e.invars[0] is ref:
      leaves = e.invars[2:2 + e.params["tree"].num_leaves]
      if not e.params.get("has_mask") and all(isinstance(v, ji.Literal) for v in leaves):
        return True
      continue
    if not any(v is ref for v in e.invars):
      continue
    for sub in sched.sub_jaxprs(e.params):
      # Operands line up with a sub-jaxpr's last parameters (cond, loops, calls) or its first
      # (run_scoped, whose extra parameters are the scratch Refs).
      n, m = len(e.invars), len(sub.invars)
      inner = sub.invars[m - n:] if m <= n else sub.invars[:n]
      outer = e.invars[n - m:] if m <= n else e.invars
      if any(o is ref and _fixed_store(sub, i) for o, i in zip(outer, inner)):
        return True
  return False


# --- the kernel -------------------------------------------------------------------------------

def prepare(params, compute_capability: int):
  """(params with large products tiled and lax semantics legalized, their schedule)."""
  gm = params.grid_mapping
  tables = sched.block_index_tables(gm, partial=True)
  sched.check_block_ranges(gm, tables, params.name)
  schedule = gpu_schedule(params, tables)
  tiled = tiling.rewrite(params, bool(schedule.sequential))
  if tiled.grid_mapping is not gm:   # a new first grid axis over output tiles
    schedule = gpu_schedule(tiled, sched.block_index_tables(tiled.grid_mapping, partial=True))
  try:
    jaxpr = legalize.legalize(tiled.jaxpr, compute_capability)
    maps = tuple(bm.replace(index_map_jaxpr=legalize.legalize(bm.index_map_jaxpr, compute_capability))
                 for bm in tiled.grid_mapping.block_mappings)
  except NotImplementedError as e:
    raise Unsupported(f"pallas_call {params.name}: {e}; the Triton backend cannot express this: "
                      "run it with interpret=True") from None
  gm = tiled.grid_mapping.replace(block_mappings=maps)
  return dataclasses.replace(tiled, jaxpr=jaxpr, grid_mapping=gm), schedule


def _kernel_name(params) -> str:
  name = identifier(params.name)
  return name if name.strip("_") else "kernel"   # PTX has no identifier "_" (`def _():`)


def _check_supported(params, compute_capability: int):
  gm = params.grid_mapping
  if any(gm.scratch_zeroed):
    raise Unsupported(f"pallas_call {params.name}: semaphores are not supported by the Triton "
                      "backend; run it with interpret=True")
  rank = len(gm.grid)
  avals = [a for a in gm.index_map_avals[rank:]] + [bm.array_aval for bm in gm.block_mappings]
  if compute_capability < 89 and any(a.dtype == np.dtype("float8_e4m3fn") for a in avals):
    raise Unsupported(f"pallas_call {params.name}: float8_e4m3fn arrays need compute capability "
                      f"8.9 or newer (this target is sm_{compute_capability})")


def generate(params, compute_capability: int = 90) -> KernelSource:
  _check_supported(params, compute_capability)
  params, schedule = prepare(params, compute_capability)
  gm, jaxpr = params.grid_mapping, params.jaxpr
  gen = Writer(params.name, compute_capability)
  ptrs = _pointers(gen, params)
  par, seq = schedule.parallel, schedule.sequential
  gen.emit(f"# grid {gm.grid}: axes {par} run as parallel programs"
           + (f", axes {seq} as loops inside each program" if seq else ""))
  ids = _program_ids(gen, gm, jaxpr, par, seq)
  refs = _operand_refs(gen, params, ids, ptrs)
  _note_read_back(gen, jaxpr, refs, len(gm.grid))
  gen.lower_jaxpr(jaxpr, ids + refs)
  if gen.max_numel > MAX_VALUE_ELEMENTS:
    raise Unsupported(
        f"pallas_call {params.name}: a value of {gen.max_numel} elements is too large for one "
        f"Triton program (at most {MAX_VALUE_ELEMENTS} fit its registers); use smaller blocks")
  return _source(gen, params, ptrs, math.prod(gm.grid[a] for a in par))


def _source(gen, params, ptrs, launch: int) -> KernelSource:
  name = _kernel_name(params)
  names = [p.name for p in ptrs] + [h[0] for h in gen.hidden]
  dtypes = [p.dtype for p in ptrs] + [h[2] for h in gen.hidden]
  signature = {n: "*" + SIGNATURE[np.dtype(d).name] for n, d in zip(names, dtypes)}
  warps, stages, chosen = _default_warps_stages(params, gen)
  header = f"@triton.jit\ndef {name}({', '.join(names)}):"
  source = PROLOGUE + "\n\n" + header + "\n" + "\n".join(gen.lines) + "\n"
  hidden = tuple((shape, dtype, zeroed) for _, shape, dtype, zeroed in gen.hidden)
  return KernelSource(name, source, signature, (launch, 1, 1), warps, stages, gen.has_checks,
                      chosen, hidden)


def _pointers(gen, params) -> list[ex.Name]:
  """One pointer parameter per scalar-prefetch, input and output operand."""
  gm = params.grid_mapping
  rank, n = len(gm.grid), gm.num_index_operands + gm.num_inputs + gm.num_outputs
  names = list(params.arg_names) or [f"ref{i}" for i in range(n)]
  avals = list(gm.index_map_avals[rank:]) + [bm.array_aval for bm in gm.block_mappings]
  return [ex.Name(gen.fresh(nm), dtype=np.dtype(a.dtype)) for nm, a in zip(names[:n], avals)]


def _note_read_back(gen, jaxpr, refs, rank: int):
  """Refs the kernel reads (after writing): their stores are followed by a barrier."""
  invars = list(jaxpr.invars)
  for eff in jaxpr.effects:
    if isinstance(eff, (ji.ReadEffect, ji.AccumEffect)) and eff.input in invars:
      k = invars.index(eff.input) - rank
      if 0 <= k < len(refs):
        gen.read_back.add(refs[k].ptr.name)


def _program_ids(gen, gm, jaxpr, par, seq) -> list[ex.Name]:
  """Emits the grid indices of this program: the parallel axes decoded from the launch index,
  the sequential axes as loops. Returns one name per grid axis."""
  rank = len(gm.grid)
  ids: list = [None] * rank
  if par:
    pid = gen.fresh_name("pid", np.int32, ())
    gen.emit(f"{pid.name} = tl.program_id(0)")
    gen.lane, gen.lanes = pid, math.prod(gm.grid[a] for a in par)
    rest = pid
    # As in Pallas on Triton, the first grid axis varies fastest between neighbouring programs.
    # Along axes that set a loop's trip count (causal attention's query blocks), programs are
    # launched from the last index down: the longest programs start first, which shortens the
    # tail of the launch. Only the order changes, never a result.
    longest_first = sched.loop_count_axes(jaxpr, rank)
    for k, a in enumerate(par):
      last = k == len(par) - 1
      idx = rest if last else ex.binary("%", rest, tl.i32(gm.grid[a]))
      if a in longest_first:
        idx = ex.binary("-", tl.i32(gm.grid[a] - 1), idx)
      ids[a] = gen.fresh_name(f"i{a}", np.int32, ())
      gen.emit(f"{ids[a].name} = {gen.render(idx)}")
      if not last:
        rest = gen.bind(ex.binary("//", rest, tl.i32(gm.grid[a])), "rest")
  for a in seq:
    ids[a] = gen.fresh_name(f"i{a}", np.int32, ())
    gen.emit(f"for {ids[a].name} in range(0, {gm.grid[a]}):")
    gen.depth += 1
  return ids


def _block_dims(gen, bm, idx, ptr) -> tuple:
  """The dimensions of an operand's block for this program, from its index map's results."""
  dims = []
  shape = bm.array_aval.shape
  for d, (bd, size) in enumerate(zip(bm.block_shape, shape)):
    element = isinstance(bd, pc.Element)
    if element:
      start = ex.add(idx[d], tl.i32(-bd.padding[0])) if bd.padding[0] else idx[d]
    else:
      start = ex.mul(idx[d], bd.block_size)
    if not isinstance(start, (ex.Name, ex.Lit)):
      start = gen.bind(start, f"{ptr.name}_start{d}")
    exact = (not element) and (size % bd.block_size == 0)
    dims.append(memory.RefDim(start, bd.block_size, size, memory.stride(shape, d),
                              kept=not isinstance(bd, pc.Squeezed), exact=exact,
                              low=element and bd.padding[0] > 0))
  return tuple(dims)


def _operand_refs(gen, params, ids, ptrs) -> list:
  """The kernel's Refs: index operands whole, block operands where their index maps put them
  for this program, then scratch and pl.get_global buffers."""
  gm = params.grid_mapping
  rank, nidx = len(gm.grid), gm.num_index_operands
  names = list(params.arg_names)
  refs = [memory.whole(ptrs[k], a.dtype, a.shape, f"args[{k}]")
          for k, a in enumerate(gm.index_map_avals[rank:])]
  for k, bm in enumerate(gm.block_mappings):
    jx = bm.index_map_jaxpr
    idx = gen.lower_jaxpr(jx, ids + refs[:nidx]) if bm.block_shape else []
    ptr = ptrs[nidx + k]
    refs.append(memory.RefVal(ptr, np.dtype(bm.array_aval.dtype), _block_dims(gen, bm, idx, ptr),
                              bm.origin))
  for k, aval in enumerate(gm.scratch_avals):
    name = names[len(refs)] if len(refs) < len(names) else f"scratch{k}"
    refs.append(memory.scratch_ref(gen, aval.inner_aval, name))
  for k, aval in enumerate(params.globals_avals):
    refs.append(memory.scratch_ref(gen, aval.inner_aval, f"global{k}", zeroed=True, shared=True))
  return refs


def _default_warps_stages(params, gen) -> tuple[int, int, bool]:
  cp = params.compiler_params
  warps = getattr(cp, "num_warps", None)
  stages = getattr(cp, "num_stages", None)
  if isinstance(cp, tuple):   # the {"triton": {...}} dict form, frozen
    d = dict(cp)
    t = dict(d.get("triton", ())) if "triton" in d else d
    warps, stages = t.get("num_warps", warps), t.get("num_stages", stages)
  chosen = stages is not None
  if warps is None:
    warps = max(1, min(8, ex.pow2(gen.max_numel // 256)))
  if stages is None:
    stages = 3
  return int(warps), int(stages), chosen

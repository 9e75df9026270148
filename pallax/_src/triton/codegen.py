"""Kernel jaxpr + GridMapping -> the source of one ``@triton.jit`` function.

The pipeline: tile block values too large for one program (``gpu/tiling.py``), write out the
dot algorithms (``gpu/dot_algorithms.py``), legalize lax's semantics (``gpu/legalize.py``), then
write the statements with the rule table of this package (``rules``, ``shapes``, ``reductions``,
``memory``, ``movement``, ``control``, and the Triton module's own primitives in ``api``).
Generated code is meant to be read: one statement a line, names from the kernel's parameters,
and a comment with the user's source line above the code it produced.

Grid: the axes along which programs may run concurrently become Triton's launch grid (flattened
into axis 0); axes along which a block the kernel reads back is revisited run as loops inside
each program, in order, as in the interpreter.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src.plan import plan_for
from pallax._src.gpu import expr as ex
from pallax._src.gpu import dot_algorithms, legalize, tiling
from pallax._src.gpu import subbyte as gpu_subbyte
from pallax._src.gpu.source import Unsupported, kernel_identifier
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
def _max(a, b):
    # .to: Triton computes bf16 maxima in f32, and a reduction's combine must keep its type
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL).to(a.dtype)


@triton.jit
def _min(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL).to(a.dtype)
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
  accesses: tuple = ()   # every load and store with its mask (writer.Access), for tests
  constants: tuple = ()  # constant arrays the kernel reads: operands after the call's own
  math: tuple = ()       # (primitive name, math_functions.Fn) of each math call, for tests


# Values beyond this many elements spill out of a program's registers (ptxas then takes
# minutes and gigabytes, and the kernel would crawl): refuse them with a clear message.
MAX_VALUE_ELEMENTS = 128 * 512



# --- the kernel -------------------------------------------------------------------------------

def prepare(params, compute_capability: int):
  """(params with large products tiled, dot algorithms written out and lax semantics legalized,
  their plan)."""
  tiled = tiling.rewrite(params, bool(plan_for(params).launch.sequential))
  try:
    expanded = dot_algorithms.expand(tiled.jaxpr, tf32_dots=True)   # tl.dot has tf32, tf32x3
    jaxpr = legalize.legalize(expanded, compute_capability)
    maps = tuple(bm.replace(index_map_jaxpr=legalize.legalize(bm.index_map_jaxpr, compute_capability))
                 for bm in tiled.grid_mapping.block_mappings)
  except NotImplementedError as e:
    raise Unsupported(f"pallas_call {params.name}: {e}; the Triton backend cannot express this: "
                      "run it with interpret=True") from None
  gm = tiled.grid_mapping.replace(block_mappings=maps)
  # The plan of the tiled kernel: legalization changes no fact the plan holds.
  return dataclasses.replace(tiled, jaxpr=jaxpr, grid_mapping=gm), plan_for(tiled)


def _kernel_name(params) -> str:
  return kernel_identifier(params.name)


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
  written = params
  mesh_axes = params.peers.axes if params.peers is not None else ()
  with ji.extend_axis_env_nd(mesh_axes):   # (legalizing retraces lax.axis_index)
    params, plan = prepare(params, compute_capability)
  gm, jaxpr = params.grid_mapping, params.jaxpr
  gen = Writer(params.name, compute_capability, memory.load_constant)
  gen.approx_math = bool(_option(params.compiler_params, "approx_math", False))
  ptrs = _pointers(gen, params)
  mesh_coordinates(gen, params)
  par, seq = plan.launch.parallel, plan.launch.sequential
  gen.emit(f"# grid {gm.grid}: axes {par} run as parallel programs"
           + (f", axes {seq} as loops inside each program" if seq else ""))
  ids = _program_ids(gen, gm, plan)
  refs = _operand_refs(gen, params, plan, ids, ptrs)
  gen.read_back |= {refs[k].ptr.name for k in plan.read if k < len(refs)}
  gen.lower_jaxpr(jaxpr, ids + refs)
  if gen.max_numel > MAX_VALUE_ELEMENTS:
    why = tiling.refusal(written.jaxpr)
    raise Unsupported(
        f"pallas_call {params.name}: a value of {gen.max_numel} elements is too large for one "
        f"Triton program (at most {MAX_VALUE_ELEMENTS} fit its registers)"
        + (f", and pallax cannot split it into tiles: {why}" if why else "")
        + "; use smaller blocks (a grid over BlockSpecs), or run it with interpret=True")
  return _source(gen, params, ptrs, math.prod(gm.grid[a] for a in par))


def _source(gen, params, ptrs, launch: int) -> KernelSource:
  """The kernel function. Its parameters follow the launch's buffers: the operands (the call's,
  then the constant arrays), the outputs, then the hidden buffers (scratch, pl.get_global)."""
  name = _kernel_name(params)
  gm = params.grid_mapping
  n_in = gm.num_index_operands + gm.num_inputs
  consts = [ex.Name(n, dtype=a.dtype) for n, a in gen.constants]
  if params.peers is not None:   # the device's mesh coordinates, after the constants
    consts.append(ex.Name("mesh_coords", dtype=np.dtype(np.int32)))
  ptrs = ptrs[:n_in] + consts + ptrs[n_in:]
  names = [p.name for p in ptrs] + [h[0] for h in gen.hidden]
  dtypes = [p.dtype for p in ptrs] + [h[2] for h in gen.hidden]
  # sub-byte arrays are packed bytes in memory (triton/subbyte.py)
  signature = {n: "*" + ex.SIGNATURE.get(np.dtype(d).name, "u8") for n, d in zip(names, dtypes)}
  warps, stages, chosen = _default_warps_stages(params, gen)
  header = f"@triton.jit\ndef {name}({', '.join(names)}):"
  # ``pass``: a kernel whose body writes nothing has no statement of its own.
  source = PROLOGUE + "\n\n" + header + "\n" + "\n".join(gen.lines) + "\n    pass\n"
  hidden = tuple((shape, dtype, zeroed) for _, shape, dtype, zeroed in gen.hidden)
  return KernelSource(name, source, signature, (launch, 1, 1), warps, stages, gen.has_checks,
                      chosen, hidden, tuple(gen.accesses), tuple(a for _, a in gen.constants),
                      tuple(gen.math_calls))


def _pointers(gen, params) -> list[ex.Name]:
  """One pointer parameter per scalar-prefetch, input and output operand."""
  gm = params.grid_mapping
  rank, n = len(gm.grid), gm.num_index_operands + gm.num_inputs + gm.num_outputs
  names = list(params.arg_names) or [f"ref{i}" for i in range(n)]
  avals = list(gm.index_map_avals[rank:]) + [bm.array_aval for bm in gm.block_mappings]
  return [ex.Name(gen.fresh(nm), dtype=np.dtype(a.dtype)) for nm, a in zip(names[:n], avals)]


def mesh_coordinates(gen, params) -> None:
  """Under ``jax.shard_map``, the coordinates of the kernel's device along the mesh axes its
  ``lax.axis_index`` reads, loaded at its start from the operand ``gpu/peers.py`` adds."""
  if params.peers is None:
    return
  read = {e.params["axis_name"] for e in jaxpr_util.equations(params.jaxpr)
          if e.primitive is ji.axis_index_p}
  for k, (a, _) in enumerate(params.peers.axes):
    if a in read:
      coord = ex.binary("+", ex.Name("mesh_coords", dtype=np.dtype(np.int32)), tl.i32(k))
      gen.mesh[a] = gen.bind(ex.call("tl.load", coord, dtype=np.dtype(np.int32)), f"mesh_{a}")


def _program_ids(gen, gm, plan) -> list[ex.Name]:
  """Emits the grid indices of this program: the parallel axes decoded from the launch index
  (the plan's order: the first grid axis varies fastest between neighbouring programs, axes that
  vmap added slowest; along axes that set a loop's trip count the longest programs launch first,
  which shortens the launch's tail), the sequential axes as loops. Returns one name per grid
  axis."""
  pid, decoded = gen.program_ids(plan.decode, plan.lanes)
  if pid is not None:
    gen.lane, gen.lanes = pid, plan.lanes
  ids: list = [decoded.get(a) for a in range(len(gm.grid))]
  for a in plan.launch.sequential:
    ids[a] = gen.fresh_name(f"i{a}", np.int32, (), bounds=(0, gm.grid[a] - 1))
    gen.emit(f"for {ids[a].name} in range(0, {gm.grid[a]}):")
    gen.depth += 1
  return ids


def _block_dims(gen, bm, view, idx, ptr) -> tuple:
  """The dimensions of an operand's block for this program, from its index map's results."""
  dims = []
  for d, size in enumerate(view.array_shape):
    block, low = view.block_shape[d], view.padding[d][0]
    if view.element[d]:
      start = ex.add(idx[d], tl.i32(-low)) if low else idx[d]
    else:
      start = ex.mul(idx[d], block)
    # (kept as an expression for packed sub-byte arrays: stores see that it is a multiple of
    # the values per byte, triton/subbyte.py)
    if not isinstance(start, (ex.Name, ex.Lit)) and not gpu_subbyte.is_subbyte(bm.array_aval.dtype):
      start = gen.bind(start, f"{ptr.name}_start{d}")
    dims.append(memory.RefDim(start, block, size, memory.stride(view.array_shape, d),
                              kept=not view.squeezed[d], exact=view.exact[d], low=view.low[d]))
  return tuple(dims)


def _operand_refs(gen, params, plan, ids, ptrs) -> list:
  """The kernel's Refs: index operands whole, block operands where their index maps put them
  for this program, then scratch and pl.get_global buffers."""
  gm = params.grid_mapping
  rank, nidx = len(gm.grid), gm.num_index_operands
  names = list(params.arg_names)
  refs = [memory.whole(ptrs[k], a.dtype, a.shape, f"args[{k}]")
          for k, a in enumerate(gm.index_map_avals[rank:])]
  for k, (bm, view) in enumerate(zip(gm.block_mappings, plan.blocks)):
    jx = bm.index_map_jaxpr
    idx = gen.lower_jaxpr(jx, ids + refs[:nidx]) if bm.block_shape else []
    ptr = ptrs[nidx + k]
    refs.append(memory.RefVal(ptr, np.dtype(bm.array_aval.dtype),
                              _block_dims(gen, bm, view, idx, ptr), bm.origin))
  for k, aval in enumerate(gm.scratch_avals):
    name = names[len(refs)] if len(refs) < len(names) else f"scratch{k}"
    refs.append(memory.scratch_ref(gen, aval.inner_aval, name))
  for k, aval in enumerate(params.globals_avals):
    refs.append(memory.scratch_ref(gen, aval.inner_aval, f"global{k}", zeroed=True, shared=True))
  return refs


def _option(cp, name: str, default):
  """A field of the kernel's compiler parameters: ``pallax.triton.CompilerParams``, or JAX's
  dict form (``{"triton": {...}}`` or the bare fields, frozen to a tuple of pairs)."""
  if isinstance(cp, tuple):
    d = dict(cp)
    d = dict(d.get("triton", ())) if "triton" in d else d
    return d.get(name, default)
  return getattr(cp, name, default)


def _default_warps_stages(params, gen) -> tuple[int, int, bool]:
  cp = params.compiler_params
  warps, stages = _option(cp, "num_warps", None), _option(cp, "num_stages", None)
  chosen = stages is not None
  if warps is None:
    warps = max(1, min(8, ex.pow2(gen.max_numel // 256)))
  if stages is None:
    stages = 3
  return int(warps), int(stages), chosen

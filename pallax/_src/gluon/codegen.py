"""A Mosaic GPU kernel as ``@gluon.jit`` source for Hopper (sm_90a).

The kernel jaxpr (legalized as for Triton, then reordered by ``order.py``) is first analysed by
the layout assignment (``assign.py``: the layout of every value, loop carry and SMEM buffer),
then walked once by the ``Writer`` (``writer.py``), which renders what the assignment decided,
with the Gluon rule table, whose rules live by topic: ``elementwise``,
``shapes``, ``control``, ``allocation``, ``memory`` (views, register loads and stores), ``mma``
(wgmma), ``copies`` (TMA and barriers), ``threads`` (warp specialization). Refs become objects the
rules understand: GMEM operands (a pointer and a TMA descriptor per box shape, made in the
prologue), SMEM buffers (a shared-memory descriptor and its views: ``.index``, ``.permute``),
barriers (mbarriers with a phase bitfield per allocation, which Gluon carries through loops like
any variable) and wgmma accumulators (a register variable that wgmmas reassign). The grid is
flattened onto launch axis 0 and decoded as the kernel plan says (``plan.py``: the last axis
fastest, as Mosaic promises).
"""
from __future__ import annotations

import numpy as np

from pallax._src import core as pc
from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src.plan import ProgramAxis, plan_for
from pallax._src.gluon import control, elementwise, mma, shapes  # noqa: F401 (their rules register)
from pallax._src.gluon import copies, memory, mma_sync, warps  # noqa: F401 (their rules register)
from pallax._src.gluon import atomics, reshapes  # noqa: F401 (their rules register)
from pallax._src.gluon import blackwell, clusters, scheduling, tmem_copies
from pallax._src.gluon import layouts as L
from pallax._src.gluon import order, peers, profile, scales, subbyte
from pallax._src.gluon import threads as warp_specialize
from pallax._src.gluon.allocation import allocate, allocate_layouts, hoist_nested
from pallax._src.gluon.assign import Assigner, Assignment, Gmem, Val
from pallax._src.gluon.events import Partition
from pallax._src.gluon.writer import GluonSource, GmemRef, Writer
from pallax._src.gpu import expr as ex
from pallax._src.gpu import source as src
from pallax._src.gpu.legalize import legalize
from pallax._src.gpu.scans import scans_over_scratch
from pallax._src.mosaic_gpu import core as mc
from pallax._src.mosaic_gpu import primitives as mp
from pallax._src.mosaic_gpu import tcgen05
from pallax._src.mosaic_gpu.warps import warp_map_p


def _launch_ids(gen: Writer, plan, gm, info) -> tuple[list[ex.Expr], tuple, int]:
  """(ids, names, blocks launched): the coordinates of every launch axis from launch axis 0.
  The grid's decode as the kernel plan says for Mosaic GPU kernels (``plan.LAUNCH_ORDERS``: every
  axis concurrent, the last fastest); clusters run as independent blocks (``clusters.py``), their
  axes of more than one block faster still, the last fastest."""
  sizes, names = clusters.launch_axes(gm, info)
  n = len(gm.grid)
  cluster = [ProgramAxis(a, sizes[a], False) for a in reversed(range(n, len(sizes)))]
  lanes = plan.lanes * clusters.size(info)
  _, ids = gen.program_ids((*cluster, *plan.decode), lanes, hint="id")
  return [ids[a] for a in range(len(sizes))], names, lanes


def _refuse_unplaced_buffers(params):
  """Buffers whose Mosaic GPU type the GridMapping does not keep (as the interpreter refuses them)."""
  if params.grid_mapping.scratch_avals:
    raise NotImplementedError(
        f"pallas_call {params.name}: scratch_shapes of a pallas_call whose kernel uses Mosaic GPU "
        "primitives are not supported by pallax's Gluon backend yet; pass them to "
        "plgpu.kernel(..., scratch_shapes=...) or allocate them in the kernel with pl.run_scoped")
  if params.globals_avals:
    raise NotImplementedError(
        f"pallas_call {params.name}: pl.get_global in a pallas_call whose kernel uses Mosaic GPU "
        "primitives is not supported by pallax's Gluon backend yet; use plgpu.kernel")


def _refuse_blackwell(params, target: int):
  """Blackwell's operations (tcgen05, TMEM, dynamic scheduling): for sm_90a none; for sm_100a
  those ``gluon/blackwell.py`` writes."""
  names = {p.name: f"plgpu.{p.name}" for p in tcgen05.BLACKWELL_PRIMITIVES}
  names.update(claim_work="plgpu.dynamic_scheduling_loop")
  allowed = (blackwell.WRITTEN + tmem_copies.WRITTEN + scheduling.WRITTEN) if target >= 100 else ()
  for eqn in jaxpr_util.equations(params.jaxpr):
    tmem = any(getattr(t, "memory_space", None) is tcgen05.TMEM
               for t in eqn.params.get("scratch_types") or ())
    if (eqn.primitive.name in names and eqn.primitive not in allowed) or (tmem and target < 100):
      line = ji.user_frame(eqn.source_info)
      what = "plgpu.TMEM scratch" if tmem and target < 100 else names[eqn.primitive.name]
      raise src.Unsupported(
          f"pallas_call {params.name}: {what}{f' (at {line})' if line else ''} is Blackwell's "
          f"(sm_100a), and pallax's Gluon backend {_REFUSAL[target >= 100]}: run the kernel in "
          "the interpreter (plgpu.kernel(..., interpret=True))")


_REFUSAL = ("compiles Mosaic GPU kernels for Hopper (sm_90a) only so far (plgpu.lower(..., "
            "compute_capability=100) compiles tcgen05 MMAs and TMEM loads for sm_100a)",
            "does not write it for sm_100a yet")


def _refuse_unknown_operands(params):
  """Operands of types that have no Triton pointer type (sub-byte types are passed as their
  bytes: ``subbyte.py``)."""
  for bm in params.grid_mapping.block_mappings:
    dtype = np.dtype(bm.array_aval.dtype)
    if dtype.name not in ex.SIGNATURE and not subbyte.in_bytes(dtype) and not scales.is_bits(dtype):
      raise NotImplementedError(
          f"pallas_call {params.name}: {bm.origin} is {dtype.name}, which pallax's Gluon "
          "backend does not read or write; convert it outside the kernel, or run it in the "
          "interpreter")


def generate(params, target: int = 90) -> GluonSource:
  """The Gluon source of ``params``' kernel (threads: see ``threads.py``) for sm_90a, or
  (``target=100``) for sm_100a."""
  info = params.threads
  gm = params.grid_mapping
  _refuse_unplaced_buffers(params)
  _refuse_blackwell(params, target)
  _refuse_unknown_operands(params)
  scales.refuse_scale_math(params)
  name = src.kernel_identifier(params.name)
  gen = Writer(name)
  gen.target = target
  # plgpu.CompilerParams(approx_math=True): the GPU's fast math instructions (gpu/math_functions.py)
  gen.approx_math = bool(getattr(params.compiler_params, "approx_math", False))
  names = tuple(gm.grid_names or ())
  axes = [(n, g) for n, g in zip(names, gm.grid)] + list(info.axis_env() if info else ())
  axes += [a for a in (params.peers.axes if params.peers is not None else ())
           if a[0] not in dict(axes)]
  with ji.extend_axis_env_nd(axes):   # legalizing retraces lax.axis_index
    jaxpr = scans_over_scratch(legalize(params.jaxpr, min(target, 90)), mc.SMEM)
    jaxpr = order.hoist_reads(jaxpr)
    jaxpr = warp_specialize.unroll_barrier_scopes(jaxpr, info.thread_name if info else None)
  gen.mma_bits, gen.wgmma = _mma_bits(jaxpr)
  mesh_axes = params.peers.axes if params.peers is not None else ()
  gen.assignment = _assign(gen, jaxpr, gm, info, mesh_axes)
  gen.scope = gen.assignment.top
  plan = plan_for(params, kind="mosaic_gpu")
  launch_ids, launch_names, lanes = _launch_ids(gen, plan, gm, info)
  gen.axes = {**dict(zip(launch_names, launch_ids)), **_fixed_axes(info)}
  ids = launch_ids[:len(gm.grid)]
  refs = []
  for k, bm in enumerate(gm.block_mappings):
    ptr = src.identifier(f"{'in' if bm.origin.startswith('args') else 'out'}{k}_ptr")
    refs.append(GmemRef(ptr, tuple(bm.array_aval.shape), np.dtype(bm.array_aval.dtype), bm.origin,
                        _block_indexer(gen, bm, ids)))
  gen.profile = profile.recording(params, refs, lanes)
  gen.blocks = lanes
  if params.peers is not None:
    peers.start(gen, params.peers, refs, jaxpr)
  main, parts, split = _lower_kernel(gen, jaxpr, [*ids, *refs], info, target)
  _check(gen, params.name)
  clusters.refuse(params, gen, parts)
  signature, host = _signature(gen, refs)
  if params.peers is not None:
    signature, host = peers.parameters(signature, host, params.peers)
  signature.update((ptr, "*i32") for ptr, _ in gen.block_semaphores)   # after the outputs
  if split:
    source = _threaded_module(gen, name, list(signature), main, parts, launch_ids)
  else:
    source = _module(gen, name, list(signature), parts[0])
  if params.debug:
    print(layout_report(gen, params.name))
  return GluonSource(name, source, signature, (lanes, 1, 1), host_descriptors=host,
                     partitions=tuple(parts), buffers=tuple(gen.assignment.buffers),
                     layouts=tuple(gen.constexprs), conversions=tuple(gen.assignment.conversions),
                     program_ids=tuple(ids),
                     hidden=tuple((shape, np.dtype(np.int32), True) for _, shape in gen.block_semaphores))


def _lower_kernel(gen, jaxpr, args, info, target) -> tuple[Partition, list[Partition], bool]:
  """(the kernel's own statements, its partitions, whether they are split among warps by
  ``gl.warp_specialize``): one per thread; for sm_100a, a kernel of one thread whose per-warp
  code makes partitions of one warp (``threads.warp_partitions``) is split too."""
  if info is not None and info.num_threads > 1:
    gen.thread_name = info.thread_name
    warp_specialize.hoist(jaxpr, info.thread_name,
                          lambda kind, aval: allocate(gen, kind, aval, phases=False), gen.hoisted)
    main = _kernel_statements(gen)
    return main, warp_specialize.partitions(gen, jaxpr, args, info), True
  if _warp_split(jaxpr, target):
    allocate_now = lambda kind, aval: allocate(gen, kind, aval, phases=False)   # noqa: E731
    hoist_nested(jaxpr, allocate_now, gen.hoisted)
    warp_specialize.hoist(jaxpr, None, allocate_now, gen.hoisted, every=True)
    main = _kernel_statements(gen)
    parts = warp_specialize.warp_partitions(gen, jaxpr, args)
    if len(parts) > 1:
      return main, parts, True
    whole = Partition(main.lines + parts[0].lines, None, L.WARPS, parts[0].events,
                      main.layouts | parts[0].layouts)
    gen.lines = whole.lines
    return whole, [whole], False
  hoist_nested(jaxpr, lambda kind, aval: allocate(gen, kind, aval), gen.hoisted, smem=False)
  profile.start_thread(gen, 0)
  gen.lower_jaxpr(jaxpr, args)
  profile.end_thread(gen)
  whole = _kernel_statements(gen, gen.events)
  return whole, [whole], False


def _kernel_statements(gen, events=()) -> Partition:
  """The statements written so far, with the layouts they name."""
  gen.claim()
  return Partition(gen.lines, None, L.WARPS, list(events), gen.used_layouts)


def _warp_split(jaxpr, target) -> bool:
  """Whether a kernel of one thread may have its ``warp_map`` warps as partitions (sm_100a:
  Blackwell's kernels issue copies and MMAs from warps; its scratch is then allocated first)."""
  return target >= 100 and jaxpr_util.uses(jaxpr, (warp_map_p,))


def _fixed_axes(info) -> dict:
  """Axes whose index is known when the code is written: cluster axes of size one, the thread
  axis (each thread's partition sets its own)."""
  zero = ex.Lit(0, dtype=np.dtype(np.int32))
  axes = {n: zero for n in clusters.fixed_axes(info)}
  if info is not None and info.thread_name is not None:
    axes[info.thread_name] = zero
  return axes


def _assign(gen: Writer, jaxpr, gm, info, mesh_axes=()) -> Assignment:
  """The layout assignment of the kernel: the jaxprs ``generate`` lowers, analysed in the
  same order (index maps, then the body, once per thread)."""
  a = Assigner(gen)
  launch, launch_names = clusters.launch_axes(gm, info)
  ids = [Val((), np.dtype(np.int32)) for _ in launch]
  mesh = {n: Val((), np.dtype(np.int32)) for n, _ in mesh_axes}
  a.axes = {**mesh, **dict(zip(launch_names, ids)), **_fixed_axes(info)}
  ids = ids[:len(gm.grid)]
  refs = []
  for bm in gm.block_mappings:
    lead = _squeezed_lead(bm)
    pre = ()
    if lead:
      idx = a.lower(bm.index_map_jaxpr, list(ids))
      shape = tuple(bm.array_aval.shape)
      pre = (ji.NDIndexer(tuple(idx[:lead]) + tuple(ji.Slice(0, n, 1) for n in shape[lead:]), shape, ()),)
    refs.append(Gmem(tuple(bm.array_aval.shape), np.dtype(bm.array_aval.dtype), pre))
  allocate_now = lambda kind, aval: allocate_layouts(a, kind, aval)
  if info is not None and info.num_threads > 1:
    a.thread_name = info.thread_name
    warp_specialize.hoist(jaxpr, info.thread_name, allocate_now, a.hoisted)
    for t in range(info.num_threads):
      a.axes[info.thread_name] = ex.Lit(t, dtype=np.dtype(np.int32))
      a.lower(jaxpr, [*ids, *refs])
  else:
    split = _warp_split(jaxpr, gen.target)   # (then all scratch is allocated first, as generate does)
    hoist_nested(jaxpr, allocate_now, a.hoisted, smem=split)
    if split:
      warp_specialize.hoist(jaxpr, None, allocate_now, a.hoisted, every=True)
    a.lower(jaxpr, [*ids, *refs])
  return a.result()


def _signature(gen: Writer, refs) -> tuple[dict, tuple]:
  """The kernel's parameters: an operand that the kernel reaches through one TMA descriptor
  only is passed as that descriptor, made on the host at launch (no descriptor to build in every
  block, no scratch memory for it); the others as pointers."""
  signature, host = {}, []
  boxes = {}
  for d in gen.descriptors.values():
    boxes.setdefault(d.ptr, []).append(d)
  for ref in refs:
    dtype = subbyte.signature_type(ref.dtype) if subbyte.in_bytes(ref.dtype) else \
        scales.signature_type(ref.dtype) if scales.is_bits(ref.dtype) else ex.SIGNATURE[ref.dtype.name]
    uses = boxes.get(ref.ptr, [])
    if len(uses) != 1 or ref.ptr in gen.pointer_uses:
      signature[ref.ptr] = "*" + dtype
      host.append(None)
      continue
    (d,) = uses
    if subbyte.in_bytes(ref.dtype):   # a descriptor of the packed bytes (copies._gmem_bytes)
      dtype = ex.SIGNATURE[subbyte.BYTES.name]
    signature[d.name] = f"tensordesc<{dtype}[{', '.join(map(str, d.box))}],{d.layout.text(module='')}>"
    host.append((d.shape, d.strides))
  return signature, tuple(host)


def _kernel_made(gen: Writer, signature: dict, part: Partition) -> list[str]:
  """The statements that make the descriptors not passed as parameters (in ``part``'s
  function: the layouts they name are its)."""
  outer, gen.used_layouts = gen.used_layouts, part.layouts
  try:
    lines = peers.kernel_start(gen) + [
        f"    {d.line(gen)}" for d in gen.descriptors.values() if d.name not in signature]
    gen.claim()
    return lines
  finally:
    gen.used_layouts = outer


def _squeezed_lead(bm) -> int | None:
  """How many squeezed leading dimensions the operand's block indexes (``jax.vmap`` of a kernel
  adds them; 0: the block is the whole array; None: a block the backend does not take)."""
  shape = tuple(bm.array_aval.shape)
  if tuple(bm.ref_aval.shape) == shape:
    return 0
  lead = len(shape) - len(bm.ref_aval.shape)
  if tuple(bm.ref_aval.shape) != shape[lead:] or not all(
      isinstance(d, pc.Squeezed) for d in bm.block_shape[:lead]):
    return None
  return lead


def _block_indexer(gen: Writer, bm, ids) -> tuple:
  """The operand's block as a view of the whole array: squeezed leading dimensions indexed by
  the index map; every other dimension whole."""
  shape, lead = tuple(bm.array_aval.shape), _squeezed_lead(bm)
  if lead == 0:
    return ()
  if lead is None:
    gen.unsupported(f"the blocked operand {bm.origin} (blocks other than squeezed leading "
                    "dimensions of whole arrays)")
  idx = gen.lower_jaxpr(bm.index_map_jaxpr, list(ids))
  indices = tuple(idx[:lead]) + tuple(ji.Slice(0, n, 1) for n in shape[lead:])
  return (ji.NDIndexer(indices, shape, ()),)


def _check(gen: Writer, kernel: str):
  """What only the whole kernel tells: whether one layout serves every view of each SMEM buffer;
  and that the code written made exactly the conversions the layout assignment found."""
  for buffer in gen.assignment.buffers:
    if buffer.problem():
      raise src.Unsupported(f"pallas_call {kernel}: {buffer.problem()}: not supported by the "
                            "Gluon backend yet; run it with interpret=True")
  found = [(c.source, c.target, c.shape) for c in gen.assignment.conversions]
  if found != [c[:3] for c in gen.conversions]:
    raise AssertionError(f"internal error in the Gluon backend, kernel {kernel}: the layout "
                         "assignment and the code written disagree on the layout conversions")


def layout_report(gen: Writer, kernel: str) -> str:
  """The layouts chosen (``debug=True``) and each conversion between them, with its line (from
  the layout assignment)."""
  lines = [f"Gluon layouts of {kernel}:"]
  lines += [f"  {n} = {gen.layout_text(layout)}" for layout, n in gen.constexprs.items()]
  for c in gen.assignment.conversions:
    source, target = gen.constexprs.get(c.source), gen.constexprs.get(c.target)
    lines.append(f"  convert_layout {source} -> {target} of a {list(c.shape)} tile at "
                 f"{c.frame or 'library code'} (may cost a round trip through shared memory)")
  if not gen.assignment.conversions:
    lines.append("  no layout conversions")
  return "\n".join(lines)


def _mma_bits(jaxpr) -> tuple[int, bool]:
  """(the operand width of the kernel's wgmmas, whether it has any): the width fixes the
  accumulators' layout (their instruction shape), which must not change inside the loops that
  accumulate."""
  bits = set()
  for e in jaxpr_util.equations(jaxpr):
    if e.primitive is mp.wgmma_p:
      refs, rest = mp.split_refs(e.invars, e.params["trees"])
      a = rest[0] if refs[1] is None else refs[1][0]
      dtype = a.aval.inner_aval.dtype if hasattr(a.aval, "inner_aval") else a.aval.dtype
      bits.add(np.dtype(dtype).itemsize * 8)
  return (min(bits) if len(bits) == 1 else 16), bool(bits)


_HEADER = """from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

INF = gl.constexpr(float("inf"))
NAN = gl.constexpr(float("nan"))
"""


def _function(gen: Writer, name: str, params: list[str], body: list[str], layouts) -> list[str]:
  """``@gluon.jit def name(params):``, the layouts its body names, and its body."""
  return (["@gluon.jit", f"def {name}({', '.join(params)}):"]
          + [f"    {line}" for line in gen.declarations(layouts)] + body)


def _module(gen: Writer, name: str, params: list[str], part: Partition) -> str:
  header = _HEADER + (blackwell.HEADER if getattr(gen, "blackwell", False) else "")
  made = _kernel_made(gen, params, part)
  ((body, layouts),) = gen.live([(made + gen.lines, part.layouts)])
  if all(not line.strip() or line.lstrip().startswith("#") for line in body):
    body.append("    pass")   # a kernel that does nothing (a warp_map whose warps do nothing)
  return "\n".join([header] + _function(gen, name, params, body, layouts)) + "\n"


def _threaded_module(gen: Writer, name: str, params: list[str], main: Partition, parts, ids) -> str:
  """One function per thread, and the kernel: descriptors, collective scratch, the split."""
  shared = list(dict.fromkeys(
      params + [d.name for d in gen.descriptors.values()] + [i.name for i in ids if isinstance(i, ex.Name)]
      + gen.hoisted_names() + peers.shared_names(gen)))
  lines = [_HEADER + (blackwell.HEADER if getattr(gen, "blackwell", False) else "")]
  made = _kernel_made(gen, params, main)
  *threads, (body, layouts) = gen.live([(p.lines, p.layouts) for p in parts] +
                                       [(made + main.lines, main.layouts)])
  for t, (lines_t, layouts_t) in enumerate(threads):
    lines += _function(gen, f"{name}_t{t}", shared, lines_t + ["    pass"], layouts_t) + [""]
    # (``pass``: a thread may have nothing to do)
  body += warp_specialize.split(name, shared, parts)
  lines += _function(gen, name, params, body, layouts)
  return "\n".join(lines) + "\n"

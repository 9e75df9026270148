"""``pallas_call``: tracing a kernel, the primitive, and its rules (abstract eval, vmap, AD, lowering)."""
from __future__ import annotations

import collections
import dataclasses
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pallax._src import core as pc
from pallax._src import jax_internals as ji
from pallax._src import backends
from pallax._src import checks
from pallax._src import jaxpr_util
from pallax._src.grid_mapping import BlockMapping, GridMapping


def _kernel_name(kernel, name):
  if name:
    return name
  return getattr(kernel, "__name__", None) or getattr(getattr(kernel, "func", None), "__name__", "kernel")


def _user_frame_of(exc: BaseException) -> str | None:
  tb, frame = exc.__traceback__, None
  while tb is not None:
    f = tb.tb_frame.f_code.co_filename
    if not ji.is_library_file(f):
      frame = f"{f}:{tb.tb_lineno} ({tb.tb_frame.f_code.co_name})"
    tb = tb.tb_next
  return frame


def _refs_on_line(frame: str | None, ref_names: dict[str, str]) -> str:
  """' (x_ref is args[0], o_ref is out[0])' for the kernel parameters named on that line."""
  import linecache
  import re
  if not frame or not ref_names:
    return ""
  m = re.match(r"(.*):(\d+) \(", frame)
  line = linecache.getline(m.group(1), int(m.group(2))) if m else ""
  found = [f"{p} is {o}" for p, o in ref_names.items() if re.search(rf"\b{re.escape(p)}\b", line)]
  return f" ({', '.join(found)})" if found else ""


def _reraise(exc: Exception, prefix: str, ref_names: dict[str, str] | None = None):
  """Re-raises ``exc`` with the kernel's name, the user's source line and the Refs on it."""
  frame = _user_frame_of(exc)
  msg = str(exc).split("\n--------------------")[0] + _refs_on_line(frame, ref_names or {})
  where = f" at {frame}" if frame and frame not in msg else ""
  cls = type(exc)
  if cls is ValueError and "Out of bound" in msg:
    cls = IndexError
  if cls not in (ValueError, TypeError, IndexError, NotImplementedError, RuntimeError):
    raise exc
  raise cls(f"{prefix}{where}: {msg}") from exc


def _binds(fn, n: int, kw_names=()) -> bool:
  """Whether ``fn`` accepts ``n`` positional and the named keyword arguments (True when its
  signature cannot be read)."""
  try:
    sig = inspect.signature(fn)
  except (TypeError, ValueError):
    return True
  try:
    sig.bind(*range(n), **{k: 0 for k in kw_names})
  except TypeError:
    return False
  return True


def _defined_at(fn) -> str | None:
  """'file:line' of a function's definition (through partials), or None."""
  while isinstance(fn, functools.partial):
    fn = fn.func
  code = getattr(fn, "__code__", None)
  return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else None


def _label(name: str, kernel) -> str:
  """'k (kernel at file:line)': how the errors of a call's specification name its kernel."""
  where = _defined_at(kernel)
  return f"{name} (kernel at {where})" if where else name


def _signature(fn) -> str:
  try:
    return str(inspect.signature(fn))
  except (TypeError, ValueError):
    return "(...)"


# --- building the GridMapping ------------------------------------------------------------

def _as_tuple_grid(grid, name) -> tuple[int, ...]:
  if grid is None:
    grid = ()
  if isinstance(grid, (int, np.integer)):
    grid = (grid,)
  try:
    grid = tuple(grid)
  except TypeError:
    raise TypeError(f"pallas_call {name}: grid must be an int or a tuple of ints, got {grid!r}") from None
  for g in grid:
    if isinstance(g, tuple):
      raise TypeError(f"pallas_call {name}: grid {grid!r} mixes named and unnamed axes; name "
                      "every axis, grid=((\"i\", 2), (\"j\", 4)), or none")
    if not isinstance(g, (int, np.integer)):
      raise TypeError(f"pallas_call {name}: grid sizes must be static Python ints, got {grid!r}; "
                      "dynamic grids are not supported")
  if any(g <= 0 for g in grid):
    raise ValueError(f"pallas_call {name}: grid sizes must be positive, got grid={tuple(grid)}")
  return tuple(int(g) for g in grid)


def _flatten_specs(specs, tree, what: str, count: int, name: str):
  """One BlockSpec (or None) per operand. in_specs is a list or tuple (as in JAX Pallas) whose
  entries may be prefixes of the inputs' pytrees; out_specs may be a single spec."""
  if specs is pc.no_block_spec:
    return [None] * count
  if what == "in_specs" and not isinstance(specs, (list, tuple)):
    # As JAX Pallas: a lone BlockSpec is not spread over the inputs.
    got = "a single BlockSpec" if isinstance(specs, pc.BlockSpec) else repr(specs)
    raise ValueError(f"pallas_call {name}: in_specs must be a tuple or a list with one entry "
                     f"per input, got {got}; wrap it: in_specs=[spec] (or [spec] * {count})")
  is_leaf = lambda s: s is None or isinstance(s, (pc.BlockSpec, pc.NoBlockSpec))
  if isinstance(specs, (list, tuple)) and tree.num_leaves == count and tree.num_nodes == count + 1 \
      and len(specs) != count and all(is_leaf(s) for s in specs):
    raise ValueError(f"pallas_call {name}: {what} has {len(specs)} entries but there are "
                     f"{count} {'inputs' if what == 'in_specs' else 'outputs'}; pass one BlockSpec "
                     "(or None for the whole array) per operand")
  full = jax.tree.unflatten(tree, [0] * count)
  # Pallas accepts lists and tuples interchangeably at the top level.
  full = tuple(full) if isinstance(full, list) else full
  specs = tuple(specs) if isinstance(specs, list) else specs
  try:
    flat = ji.tree_util.broadcast_prefix(specs, full, is_leaf=is_leaf)
  except (ValueError, TypeError) as e:
    operands = "inputs" if what == "in_specs" else "outputs"
    raise ValueError(f"pallas_call {name}: the structure of {what} does not match the "
                     f"{operands} ({tree}); pass one BlockSpec (or None) per operand. "
                     f"{_prefix_error(specs, full, is_leaf, what, operands) or e}") from None
  return [None if isinstance(s, pc.NoBlockSpec) else s for s in flat]


def _prefix_error(specs, full, is_leaf, what: str, operands: str) -> str | None:
  """Where ``specs`` stops being a prefix of ``full``, with the key path named after ``what``
  (one line)."""
  errors = ji.tree_util.prefix_errors(specs, full, is_leaf=is_leaf)
  if not errors:
    return None
  return " ".join(str(errors[0](what)).split()).replace("the full pytree has",
                                                        f"the {operands} have")


def _block_shape(spec: pc.BlockSpec | None, shape: tuple, origin: str, name: str) -> tuple:
  """The spec's block shape in canonical form (the whole array without a spec)."""
  if spec is None or spec.block_shape is None:
    return tuple(pc.Blocked(d) if d > 0 else pc.Blocked(1) for d in shape)
  if isinstance(spec.block_shape, (int, np.integer)) or not isinstance(spec.block_shape, Sequence):
    raise TypeError(f"pallas_call {name}: block_shape of {origin} must be a tuple, got {spec.block_shape!r}")
  if len(spec.block_shape) != len(shape):
    raise ValueError(
        f"pallas_call {name}: {origin} has rank {len(shape)} (shape {shape}) but its block_shape "
        f"{tuple(spec.block_shape)} has rank {len(spec.block_shape)}; give one block size per "
        "dimension (None to squeeze a dimension)")
  try:
    block_shape = tuple(pc.canonical_block_dim(d) for d in spec.block_shape)
  except TypeError as e:
    raise TypeError(f"pallas_call {name}: {origin}: {e}") from None
  for d in block_shape:
    if d.block_size <= 0:
      raise ValueError(f"pallas_call {name}: block sizes must be positive; {origin} has block_shape "
                       f"{tuple(spec.block_shape)}")
  return block_shape


def _block_mapping(spec: pc.BlockSpec | None, aval, origin: str, grid, index_avals,
                   name: str, debug: bool) -> BlockMapping:
  shape = tuple(aval.shape)
  block_shape = _block_shape(spec, shape, origin, name)
  index_map = None if spec is None else spec.index_map
  nd = len(shape)
  if index_map is None:
    index_map = lambda *_: (0,) * nd
  else:
    if not _binds(index_map, len(index_avals)):
      extra = len(index_avals) - len(grid)
      raise TypeError(
          f"pallas_call {name}: the index_map of {origin} cannot take {len(index_avals)} positional "
          f"arguments (one per grid axis of grid {grid}"
          + (f" plus {extra} scalar-prefetch operands" if extra else "")
          + f"); its signature is {_signature(index_map)}")

  the_map = f"the index_map of {origin}" + (f" (at {_defined_at(index_map)})"
                                             if _defined_at(index_map) else "")

  def flat_index_map(*args):
    out = index_map(*args)
    out = tuple(out) if isinstance(out, list) else out
    if not isinstance(out, tuple):
      out = (out,) if nd == 1 else out
    if not isinstance(out, tuple) or len(out) != nd:
      n = len(out) if isinstance(out, (tuple, list)) else 1
      raise ValueError(f"{the_map} returned {n} indices but {origin} has rank {nd}; return "
                       "one block index per dimension")
    for k, i in enumerate(out):
      _check_block_index(i, k, the_map)
    return [jnp.asarray(i, jnp.int32) for i in out]

  try:
    jaxpr, _, consts = ji.trace_to_jaxpr(flat_index_map, index_avals, name=f"index_map of {origin}")
  except (ValueError, TypeError) as e:
    _reraise(e, f"pallas_call {name}")
  if any(isinstance(c, jax.core.Tracer) for c in consts):
    raise ValueError(f"pallas_call {name}: {the_map} closes over a traced value; "
                     "pass it as a scalar-prefetch operand instead")
  if consts:
    # As JAX Pallas: an index map computes block indices from the grid indices alone.
    raise ValueError(
        f"pallas_call {name}: {the_map} captures constants "
        f"[{', '.join(jax.typeof(c).str_short() for c in consts)}]; compute the block index from "
        "the grid indices, or pass the table as a scalar-prefetch operand (PrefetchScalarGridSpec)")
  kernel_shape = tuple(d.block_size for d in block_shape if not isinstance(d, pc.Squeezed))
  ref = ji.ref_aval(kernel_shape, aval.dtype, getattr(spec, "memory_space", None))
  return BlockMapping(block_shape, ref, ji.closed(jaxpr, consts), None, ji.ShapedArray(shape, aval.dtype),
                      origin, pipeline_mode=getattr(spec, "pipeline_mode", None), debug=debug)


def _check_block_index(i, k: int, the_map: str):
  """An index map's output ``k`` must be an integer scalar (as in JAX Pallas)."""
  if isinstance(i, (int, np.integer)) and not isinstance(i, bool):
    return
  dtype = getattr(i, "dtype", None)
  if getattr(i, "shape", None) == () and dtype is not None and jnp.issubdtype(dtype, jnp.integer):
    return
  what = jax.typeof(i).str_short() if dtype is not None else f"a {type(i).__name__}"
  raise ValueError(f"{the_map} returned {what} at position {k}; index maps return integer "
                   "scalars, one block index per dimension")


def _scratch_aval(s, name):
  if hasattr(s, "get_ref_aval"):
    return s.get_ref_aval()
  if isinstance(s, jax.ShapeDtypeStruct):
    return ji.ref_aval(s.shape, s.dtype)
  raise TypeError(f"pallas_call {name}: scratch_shapes entries must be scratch types such as "
                  f"pl.ANY((8, 128), jnp.float32), got {s!r}")


def make_grid_mapping(name, grid_spec: pc.GridSpec, in_avals, in_tree, out_avals, out_tree,
                      debug=False, kernel=None) -> GridMapping:
  grid = _as_tuple_grid(grid_spec.grid, name)
  label = _label(name, kernel)
  nidx = grid_spec.num_scalar_prefetch
  index_avals = [ji.ref_aval(a.shape, a.dtype, pc.MemorySpace.INDEX) for a in in_avals[:nidx]]
  grid_avals = [ji.ShapedArray((), jnp.int32)] * len(grid)
  map_avals = grid_avals + index_avals
  ins = in_avals[nidx:]
  in_specs = _flatten_specs(grid_spec.in_specs, in_tree, "in_specs", len(ins), label) \
      if nidx == 0 else _flatten_specs(grid_spec.in_specs, jax.tree.structure([0] * len(ins)),
                                       "in_specs", len(ins), label)
  out_specs = _flatten_specs(grid_spec.out_specs, out_tree, "out_specs", len(out_avals), label)
  bms = [_block_mapping(s, a, f"args[{nidx + i}]", grid, map_avals, name, debug)
         for i, (s, a) in enumerate(zip(in_specs, ins))]
  bms += [_block_mapping(s, a, f"out[{i}]", grid, map_avals, name, debug)
          for i, (s, a) in enumerate(zip(out_specs, out_avals))]
  scratch = jax.tree.leaves(grid_spec.scratch_shapes, is_leaf=lambda s: hasattr(s, "get_ref_aval"))
  gm = GridMapping(
      grid=grid, grid_names=None, block_mappings=tuple(bms),
      index_map_tree=jax.tree.structure((tuple(map_avals), {})),
      index_map_avals=tuple(map_avals), vmapped_dims=(),
      scratch_avals=tuple(_scratch_aval(s, name) for s in scratch),
      scratch_zeroed=tuple(getattr(s, "memory_space", None) is pc.MemorySpace.SEMAPHORE for s in scratch),
      num_index_operands=nidx, num_inputs=len(ins), num_outputs=len(out_avals), debug=debug)
  gm.check_invariants()
  return gm


# --- tracing the kernel --------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class KernelArgs:
  """How flat Refs become the kernel's arguments: pytrees of positional Refs, scratch
  passed positionally or (from a dict of scratch shapes) by keyword."""
  positional: Any           # treedef of the tuple of positional arguments
  keyword: Any = None       # treedef of the keyword arguments (or None)

  @staticmethod
  def flat(n: int) -> "KernelArgs":
    return KernelArgs(jax.tree.structure(tuple(range(n))))

  def call(self, kernel, refs):
    n = self.positional.num_leaves
    args = jax.tree.unflatten(self.positional, refs[:n])
    kwargs = jax.tree.unflatten(self.keyword, refs[n:]) if self.keyword is not None else {}
    return kernel(*args, **kwargs)

  def names(self, kernel) -> tuple[str, ...]:
    """A readable name per flat Ref: the kernel's parameter name (with an index when a
    parameter holds several Refs)."""
    try:
      params = [p.name for p in inspect.signature(kernel).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
      params = []
    args = jax.tree.unflatten(self.positional, list(range(self.positional.num_leaves)))
    names = []
    for k, a in enumerate(args):
      base = params[k] if k < len(params) else f"ref{k}"
      leaves = jax.tree.leaves(a)
      names += [base] if len(leaves) == 1 else [f"{base}_{j}" for j in range(len(leaves))]
    if self.keyword is not None:
      kw = jax.tree.unflatten(self.keyword, list(range(self.keyword.num_leaves)))
      for key, a in kw.items():
        leaves = jax.tree.leaves(a)
        names += [str(key)] if len(leaves) == 1 else [f"{key}_{j}" for j in range(len(leaves))]
    return tuple(names)


def _check_signature(kernel, name, kernel_args: KernelArgs, ref_names):
  n_pos = len(jax.tree.unflatten(kernel_args.positional, [0] * kernel_args.positional.num_leaves))
  kw_names = () if kernel_args.keyword is None else tuple(
      jax.tree.unflatten(kernel_args.keyword, [0] * kernel_args.keyword.num_leaves))
  if not _binds(kernel, n_pos, kw_names):
    raise TypeError(
        f"pallas_call {name}: the kernel {name}{_signature(kernel)} cannot take {n_pos} Ref arguments"
        + (f" and keyword Refs {list(kw_names)}" if kw_names else "")
        + f" (the Refs are {', '.join(ref_names)}); give the kernel one parameter per input, "
        "output and scratch buffer")


def trace_kernel(kernel, name, grid: tuple[int, ...], ref_avals, ref_names, grid_names=(),
                 kernel_args: KernelArgs | None = None, allow_ref_consts: bool = False,
                 extra_axes=()):
  """Traces the kernel on Refs into a jaxpr whose invars are ``*grid_indices, *refs, *globals``.

  Named grid axes and ``extra_axes`` ((name, size) pairs: a Mosaic GPU kernel's cluster and
  thread axes) are in scope for ``lax.axis_index``/``lax.axis_size``.

  Returns (closed jaxpr, global scratch avals). ``pl.get_global`` requests make a
  second trace with those Refs appended.
  """
  kernel_args = kernel_args or KernelArgs.flat(len(ref_avals))
  _check_signature(kernel, name, kernel_args, ref_names)
  requested: list[Any] = []

  def run(global_refs, *args):
    ids, refs = args[:len(grid)], args[len(grid):]
    next_global = iter(global_refs)

    def get_global(what):
      if global_refs:
        return next(next_global)
      requested.append(what)
      return jax.new_ref(jnp.zeros(what.shape, what.dtype))

    env = pc.GridEnv(name, tuple(ids), grid, tuple(grid_names), get_global)
    named = [(n, s) for n, s in zip(grid_names, grid) if n is not None] + list(extra_axes)
    with pc.grid_env(env), ji.extend_axis_env_nd(named):
      out = kernel_args.call(kernel, list(refs))
    if out is not None:   # even () or 0, as in JAX Pallas
      where = _defined_at(kernel)
      raise ValueError(f"the kernel {name}{f' (at {where})' if where else ''} returned "
                       f"{_describe(out)}; kernels write their results into output Refs and "
                       "return None")
    return []

  in_avals = [ji.ShapedArray((), jnp.int32)] * len(grid) + list(ref_avals)
  try:
    jaxpr, _, consts = ji.trace_to_jaxpr(lambda *a: run((), *a), in_avals, name=name)
    globals_avals = [_scratch_aval(w, name) for w in requested]
    if requested:
      n = len(in_avals)
      jaxpr, _, consts = ji.trace_to_jaxpr(lambda *a: run(a[n:], *a[:n]), in_avals + globals_avals,
                                           name=name)
  except (ValueError, TypeError, IndexError, NotImplementedError, RuntimeError) as e:
    names = dict(zip(kernel_args.names(kernel), ref_names)) if ref_names else {}
    _reraise(e, f"pallas_call {name}", names)
  for c in consts:
    if isinstance(c, jax.core.Tracer) and not (allow_ref_consts and ji.is_ref_aval(jax.typeof(c))):
      raise ValueError(
          f"pallas_call {name}: the kernel closes over a traced value of type {jax.typeof(c)}; "
          "pass it to pallas_call as an operand instead")
  closed = ji.closed(jaxpr, consts)
  checks.check_static_indices(closed, name, ref_names)
  return closed, tuple(globals_avals)


def _describe(x) -> str:
  """What a kernel returned, short: '()', '0', 'float32[8]', 'a tuple'."""
  leaves = jax.tree.leaves(x)
  if not leaves:
    return repr(x)
  return f"a {type(x).__name__}" if len(leaves) > 1 else (
      jax.typeof(leaves[0]).str_short() if hasattr(leaves[0], "dtype") else repr(leaves[0]))


def _axis_index_staging(trace, source_info, *, axis_name):
  """``lax.axis_index(name)`` of a named grid axis, while a kernel is traced, is that axis's
  program id (what ``pl.program_id`` gives): the kernel jaxpr holds an ordinary program id,
  which the interpreter vectorizes and the GPU backends lower, also after vmap prepends an axis.
  Other names (Mosaic GPU threads, axes bound inside the kernel) stay ``axis_index``."""
  env = pc.innermost_grid_env()
  if env is not None and axis_name is not None and axis_name in env.names:
    return trace.to_jaxpr_tracer(env.ids[env.names.index(axis_name)], source_info)
  return trace.default_process_primitive(ji.axis_index_p, (), {"axis_name": axis_name},
                                         source_info)


ji.pe.custom_staging_rules[ji.axis_index_p] = _axis_index_staging


def _kernel_args(in_tree, out_tree, scratch_shapes) -> KernelArgs:
  """Pallas passes Refs in the structure of the operands, then of out_shape (a tuple or
  list of outputs is spread into positional arguments), then the scratch buffers."""
  ins = jax.tree.unflatten(in_tree, list(range(in_tree.num_leaves)))
  outs = jax.tree.unflatten(out_tree, list(range(out_tree.num_leaves)))
  outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
  is_leaf = lambda s: hasattr(s, "get_ref_aval") or isinstance(s, jax.ShapeDtypeStruct)
  if isinstance(scratch_shapes, dict):
    scratch_pos, scratch_kw = (), scratch_shapes
  else:
    scratch_pos, scratch_kw = tuple(scratch_shapes or ()), None
  pos = jax.tree.structure((*ins, *outs, *scratch_pos), is_leaf=is_leaf)
  kw = None if scratch_kw is None else jax.tree.structure(scratch_kw, is_leaf=is_leaf)
  return KernelArgs(pos, kw)


# --- the primitive ---------------------------------------------------------------------------

pallas_call_p = ji.Primitive("pallas_call")
pallas_call_p.multiple_results = True


@dataclasses.dataclass(frozen=True)
class Params:
  """Everything a backend needs besides the operands (hashable: jaxprs hash by identity)."""
  jaxpr: Any
  grid_mapping: GridMapping
  name: str
  interpret: Any
  debug: bool
  input_output_aliases: tuple[tuple[int, int], ...]
  compiler_params: Any
  cost_estimate: Any
  backend: str | None
  globals_avals: tuple = ()
  arg_names: tuple[str, ...] = ()   # the kernel's parameter names (for generated code)
  threads: Any = None   # a Mosaic GPU kernel's cluster and thread axes (mosaic_gpu.core.ThreadInfo)
  jvp_of: Any = None    # a JVP call: (the primal call's Params, its operand count), for linearize

  @property
  def out_avals(self):
    return tuple(bm.array_aval for bm in self.grid_mapping.block_mappings_output)


def _abstract_eval(*avals, params: Params):
  return list(params.out_avals)


pallas_call_p.def_abstract_eval(_abstract_eval)
pallas_call_p.def_impl(functools.partial(ji.dispatch.apply_primitive, pallas_call_p))


# --- forward-mode AD: the JVP of the kernel is a kernel ----------------------------------------

def _is_float(aval) -> bool:
  return jnp.issubdtype(aval.dtype, jnp.inexact)


def _tangent_block_mapping(bm: BlockMapping) -> BlockMapping:
  return dataclasses.replace(bm, origin=f"tangent of {bm.origin}")


def _jvp_kernel(params: Params, diff_in, diff_out, diff_scratch):
  """The kernel jaxpr of the JVP call: its Refs in the order
  ``ids, index operands, ins, tangent ins, outs, tangent outs, scratch, tangent scratch, globals``;
  the body is JAX's JVP of the kernel (a tangent Ref beside each differentiable one)."""
  gm, jaxpr = params.grid_mapping, params.jaxpr
  n_ids, nidx = len(gm.grid), gm.num_index_operands
  n_in, n_out, n_scr = gm.num_inputs - nidx, gm.num_outputs, len(gm.scratch_avals)
  avals = list(jaxpr.in_avals)
  groups = [n_ids, nidx, n_in, n_out, n_scr, len(avals) - n_ids - nidx - n_in - n_out - n_scr]
  ids, idx, ins, outs, scr, glob = _split(avals, groups)
  diff = ([False] * (n_ids + nidx) + list(diff_in) + list(diff_out) + list(diff_scratch)
          + [False] * len(glob))
  jvp, _ = ji.ad.jvp_jaxpr(jaxpr, diff, [])
  pick = lambda xs, ds: [x for x, d in zip(xs, ds) if d]
  new_avals = (ids + idx + ins + pick(ins, diff_in) + outs + pick(outs, diff_out) + scr
               + pick(scr, diff_scratch) + glob)

  def kernel(*args):
    a_ids, a_idx, a_in, t_in, a_out, t_out, a_scr, t_scr, a_glob = _split(
        list(args), [n_ids, nidx, n_in, sum(diff_in), n_out, sum(diff_out), n_scr,
                     sum(diff_scratch), len(glob)])
    ji.eval_jaxpr(jvp, jvp.consts, *a_ids, *a_idx, *a_in, *a_out, *a_scr, *a_glob,
                  *t_in, *t_out, *t_scr)
    return []

  new, _, consts = ji.trace_to_jaxpr(kernel, new_avals, name=params.name)
  return ji.closed(new, consts)


def _split(xs, sizes):
  out, at = [], 0
  for n in sizes:
    out.append(xs[at:at + n])
    at += n
  return out


def _jvp(primals, tangents, *, params: Params):
  """Forward-mode differentiation, as in JAX Pallas: one pallas_call computes the outputs and
  their tangents; every float operand gets a tangent operand with the same block spec."""
  gm = params.grid_mapping
  nidx = gm.num_index_operands
  in_bms, out_bms = gm.block_mappings[:gm.num_inputs - nidx], gm.block_mappings[gm.num_inputs - nidx:]
  diff_in = [_is_float(bm.array_aval) for bm in in_bms]
  diff_out = [_is_float(bm.array_aval) for bm in out_bms]
  diff_scratch = [_is_float(a.inner_aval) for a in gm.scratch_avals]
  t_in = [ji.ad.instantiate_zeros(t) for t, d in zip(tangents[nidx:], diff_in) if d]
  pick = lambda xs, ds: [x for x, d in zip(xs, ds) if d]
  n_in = gm.num_inputs - nidx
  new_gm = gm.replace(
      block_mappings=(*in_bms, *map(_tangent_block_mapping, pick(in_bms, diff_in)), *out_bms,
                      *map(_tangent_block_mapping, pick(out_bms, diff_out))),
      num_inputs=gm.num_inputs + sum(diff_in), num_outputs=gm.num_outputs + sum(diff_out),
      scratch_avals=(*gm.scratch_avals, *pick(gm.scratch_avals, diff_scratch)),
      scratch_zeroed=(*(gm.scratch_zeroed or (False,) * len(gm.scratch_avals)),
                      *[False] * sum(diff_scratch)))
  # An aliased output starts as its input; its tangent starts as the input's tangent.
  tin_pos = {i: k for k, i in enumerate(i for i, d in enumerate(diff_in) if d)}
  tout_pos = {o: k for k, o in enumerate(o for o, d in enumerate(diff_out) if d)}
  aliases = list(params.input_output_aliases)
  for i, o in params.input_output_aliases:
    if (i - nidx) in tin_pos and o in tout_pos:
      aliases.append((nidx + n_in + tin_pos[i - nidx], gm.num_outputs + tout_pos[o]))
  names = list(params.arg_names)
  if names:   # tangent Refs are named after their primals (x_ref_dot)
    idx, ins, outs, scr = _split(names, [nidx, n_in, gm.num_outputs, len(gm.scratch_avals)])
    dot = lambda ns, ds: [f"{n}_dot" for n, d in zip(ns, ds) if d]
    names = (idx + ins + dot(ins, diff_in) + outs + dot(outs, diff_out) + scr
             + dot(scr, diff_scratch) + names[len(idx + ins + outs + scr):])
  new_params = dataclasses.replace(
      params, jaxpr=_jvp_kernel(params, diff_in, diff_out, diff_scratch), grid_mapping=new_gm,
      input_output_aliases=tuple(sorted(aliases)), jvp_of=(params, len(primals)),
      arg_names=tuple(names))
  outs = pallas_call_p.bind(*primals, *t_in, params=new_params)
  primal_out, tangent_out = outs[:gm.num_outputs], iter(outs[gm.num_outputs:])
  tangent_out = [next(tangent_out) if d else ji.ad.Zero(bm.array_aval.to_tangent_aval())
                 for bm, d in zip(out_bms, diff_out)]
  return primal_out, tangent_out


ji.ad.primitive_jvps[pallas_call_p] = _jvp


def _partial_eval(trace, *tracers, params: Params):
  """``jax.linearize``: with the primals known and the tangents not, the primal outputs come from
  the primal call now, and the JVP call is staged for the tangents."""
  if params.jvp_of is not None:
    primal, n = params.jvp_of
    known = [t.pval.get_known() for t in tracers]
    if all(k is not None for k in known[:n]) and any(k is None for k in known[n:]):
      outs = pallas_call_p.bind_with_trace(trace.parent_trace, known[:n],
                                           tuple(t.aval for t in tracers[:n]), {"params": primal})
      staged = trace.default_process_primitive(pallas_call_p, tracers, {"params": params})
      return [trace.new_const(o) for o in outs] + staged[len(outs):]
  return trace.default_process_primitive(pallas_call_p, tracers, {"params": params})


ji.pe.custom_partial_eval_rules[pallas_call_p] = _partial_eval


def _transpose(*args, params: Params, **_):
  raise NotImplementedError(
      f"pallas_call {params.name}: reverse-mode differentiation (jax.grad, jax.vjp) of a kernel is "
      "not defined, in pallax as in JAX Pallas: pallax differentiates kernels forward (jax.jvp) "
      "only. Wrap the function that calls pallas_call in jax.custom_vjp and write its backward "
      "pass, usually as another pallas_call.")


ji.ad.primitive_transposes[pallas_call_p] = _transpose


def _lowering(ctx, *args, params: Params, platform: str):
  backend = backends.choose(params, platform)
  from pallax._src.interpret import eager
  if backend is None and eager.applies(params):
    return ji.mlir.lower_fun(functools.partial(eager.run_traced, params=params),
                             multiple_results=True)(ctx, *args)
  if backend is not None and eager.is_mosaic_gpu(params):
    return _mosaic_backend(params, platform).lowering(ctx, *args, params=params)
  if backend is not None:
    return backend.lowering(ctx, *args, params=params)
  from pallax._src.interpret import interpreter
  fn = functools.partial(interpreter.run, params=params, raise_errors="callback")
  return ji.mlir.lower_fun(fn, multiple_results=True)(ctx, *args)


for _platform in ("cpu", "cuda", "rocm", "tpu"):
  ji.mlir.register_lowering(pallas_call_p, functools.partial(_lowering, platform=_platform),
                            platform=_platform)


def _impl(*args, params: Params):
  """Eager calls: checked interpretation raises Python errors directly."""
  from pallax._src.interpret import interpreter
  platform = jax.devices()[0].platform
  from pallax._src.interpret import eager
  backend = backends.choose(params, platform)
  if eager.applies(params) and backend is None and not any(isinstance(a, jax.core.Tracer) for a in args):
    return eager.run_now(*args, params=params)
  if backend is not None or any(isinstance(a, jax.core.Tracer) for a in args):
    return ji.dispatch.apply_primitive(pallas_call_p, *args, params=params)
  return interpreter.run_eager(*args, params=params)


def _mosaic_backend(params: Params, platform: str):
  backend = backends.for_kind("mosaic_gpu", platform)
  if backend is None:
    raise NotImplementedError(
        f"pallas_call {params.name}: Mosaic GPU kernels (threads, barriers, TMA copies, wgmma) need "
        f"the Gluon backend, which is not available on platform {platform!r} here; pass "
        "interpret=True to run them in pallax's interpreter")
  return backend


pallas_call_p.def_impl(_impl)


# --- vmap: batching adds a grid axis -------------------------------------------------------

def _batch_block_mapping(bm: BlockMapping, batched: bool, size: int) -> BlockMapping:
  old = bm.index_map_jaxpr
  def new_map(b, *args):
    idx = ji.eval_jaxpr(old, old.consts, *args)
    return ([b] if batched else []) + list(idx)
  jaxpr, _, consts = ji.trace_to_jaxpr(new_map, [ji.ShapedArray((), jnp.int32)] + list(old.in_avals))
  if not batched:
    return dataclasses.replace(bm, index_map_jaxpr=ji.closed(jaxpr, consts))
  return dataclasses.replace(
      bm, block_shape=(pc.squeezed,) + bm.block_shape, index_map_jaxpr=ji.closed(jaxpr, consts),
      array_aval=ji.ShapedArray((size,) + bm.array_aval.shape, bm.array_aval.dtype))


def with_leading_grid_axis(gm: GridMapping, size: int, batched, vmapped=True) -> GridMapping:
  """``gm`` with a new first grid axis of ``size``; each block operand k with ``batched[k]`` gets
  a new leading array dimension of that size, indexed by the new axis (the others ignore it).
  ``vmapped``: the axis is a batch axis that vmap added (GPU launches run it slowest)."""
  bms = tuple(_batch_block_mapping(bm, b, size) for bm, b in zip(gm.block_mappings, batched))
  map_avals = (ji.ShapedArray((), jnp.int32),) + tuple(gm.index_map_avals)
  return gm.replace(
      grid=(size,) + gm.grid, block_mappings=bms,
      index_map_tree=jax.tree.structure((map_avals, {})), index_map_avals=map_avals,
      vmapped_dims=(0,) * vmapped + tuple(d + 1 for d in gm.vmapped_dims),
      grid_names=None if gm.grid_names is None else ("vmap",) + tuple(gm.grid_names))


def with_leading_program_id(jaxpr, name: str):
  """A kernel jaxpr taking one more program id first (which it ignores)."""
  def new_kernel(b, *args):
    ji.eval_jaxpr(jaxpr, jaxpr.consts, *args)
    return []
  new, _, consts = ji.trace_to_jaxpr(new_kernel, [ji.ShapedArray((), jnp.int32)] + list(jaxpr.in_avals),
                                     name=name)
  return ji.closed(new, consts)


def _batching_rule(args, dims, *, params: Params):
  gm = params.grid_mapping
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
  nidx = gm.num_index_operands
  if any(d is not None for d in dims[:nidx]):
    raise NotImplementedError(f"pallas_call {params.name}: vmap over scalar-prefetch operands "
                              "is not supported")
  args = [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
  batched_in = [d is not None for d in dims]
  # An aliased output is batched; so must its input be.
  for i, o in params.input_output_aliases:
    if not batched_in[i]:
      args[i] = jnp.broadcast_to(args[i], (size,) + args[i].shape)
      batched_in[i] = True
  new_gm = with_leading_grid_axis(gm, size, batched_in[nidx:] + [True] * gm.num_outputs)
  new_params = dataclasses.replace(params, jaxpr=with_leading_program_id(params.jaxpr, params.name),
                                   grid_mapping=new_gm)
  outs = pallas_call_p.bind(*args, params=new_params)
  return outs, [0] * len(outs)


ji.batching.primitive_batchers[pallas_call_p] = _batching_rule


# --- the user-facing entry point -----------------------------------------------------------

def _check_operand(x, i: int, name: str):
  if isinstance(x, str) or (isinstance(x, (list, tuple)) and x and all(
      isinstance(v, (int, float, bool, complex)) for v in jax.tree.leaves(x))):
    raise TypeError(f"pallas_call {name}: operands must be arrays, but args[{i}] is a "
                    f"{type(x).__name__} of Python values; convert it with jnp.asarray")


def _operand_aval(x, where: str, name: str):
  if isinstance(x, (jax.Array, np.ndarray, np.generic, jax.core.Tracer, int, float, bool, complex)):
    return jax.typeof(jnp.asarray(x) if isinstance(x, (int, float, bool, complex)) else x)
  if isinstance(x, jax.ShapeDtypeStruct):
    raise TypeError(f"pallas_call {name}: {where} is a ShapeDtypeStruct; pass an array "
                    "(ShapeDtypeStructs belong in out_shape)")
  raise TypeError(f"pallas_call {name}: operands must be arrays, but {where} is "
                  f"{type(x).__name__}; convert it with jnp.asarray")


def _out_aval(s, i, name):
  if isinstance(s, (jax.ShapeDtypeStruct, jax.Array, np.ndarray)) or (
      hasattr(s, "shape") and hasattr(s, "dtype") and not callable(getattr(s, "shape"))):
    return ji.ShapedArray(tuple(s.shape), jnp.dtype(s.dtype))
  raise TypeError(f"pallas_call {name}: out_shape must be a jax.ShapeDtypeStruct (or a pytree of "
                  f"them), but out_shape[{i}] is {s!r}; use jax.ShapeDtypeStruct(shape, dtype)")


# (call, content of its trace) -> Params. Kernels are traced at every call, as in JAX Pallas: a
# kernel may read Python globals that changed since. Traces with the same content share one
# Params object, so that the backends' caches (compiled kernels, plans) still hit.
_SAME_TRACE: collections.OrderedDict = collections.OrderedDict()   # least recently used first
_SAME_TRACE_SIZE = 512


def _const_key(c):
  try:
    a = np.asarray(c)
    return (a.shape, str(a.dtype), a.tobytes()) if a.dtype != object else ("id", id(c))
  except Exception:  # noqa: BLE001  (a Ref or another object: never equal to a new one)
    return ("id", id(c))


def _param_key(v):
  """An equation parameter as part of a trace's identity. Printed jaxprs leave things out (a
  callback's closure, a check's message): such values count by equality where they hash, and
  by identity otherwise (a new closure is a new kernel)."""
  if isinstance(v, ji.Jaxpr):
    return None                                   # in str(jaxpr), with its own equations
  if isinstance(v, (tuple, list)):
    return tuple(_param_key(x) for x in v)
  try:
    hash(v)
    return v
  except TypeError:
    return ("id", id(v))


# A kernel evaluates these calls' jaxprs and never differentiates them: their derivative rules
# (new function objects at every trace) are not part of what it computes.
_RULES_UNUSED = (ji.custom_jvp_call_p, ji.custom_vjp_call_p)


def _params_key(jaxpr) -> tuple:
  return tuple(() if e.primitive in _RULES_UNUSED else
               tuple((k, _param_key(v)) for k, v in sorted(e.params.items()))
               for e in jaxpr_util.equations(jaxpr))


def _content_key(params: Params):
  """What determines a trace's meaning: the kernel and index-map jaxprs with their constants
  and the parameters of their equations."""
  gm = params.grid_mapping
  maps = tuple((str(bm.index_map_jaxpr), tuple(map(_const_key, bm.index_map_jaxpr.consts)),
                bm.block_shape, bm.array_aval) for bm in gm.block_mappings)
  return (str(params.jaxpr), tuple(map(_const_key, params.jaxpr.consts)), _params_key(params.jaxpr),
          maps, gm.grid,
          gm.num_index_operands, tuple(map(str, gm.scratch_avals)), gm.scratch_zeroed,
          tuple(map(str, params.globals_avals)), params.arg_names, params.threads)


def _deduplicated(call_key, params: Params) -> Params:
  if call_key is None:
    return params
  key = (call_key, _content_key(params))
  found = _SAME_TRACE.get(key)
  if found is not None:
    _SAME_TRACE.move_to_end(key)
    return found
  _SAME_TRACE[key] = params
  if len(_SAME_TRACE) > _SAME_TRACE_SIZE:   # the oldest goes: a trace just made stays shared
    _SAME_TRACE.popitem(last=False)
  return params


@dataclasses.dataclass(frozen=True)
class _Call:
  """What ``pallas_call(kernel, ...)`` was given, before the operands are known."""
  kernel: Any
  name: str
  grid_spec: pc.GridSpec
  out_tree: Any
  out_avals: tuple
  aliases: tuple
  interpret: Any
  debug: bool
  compiler_params: Any
  cost_estimate: Any
  backend: str | None
  grid_names: tuple
  threads: Any = None

  def key(self):
    """What identifies the call besides its trace's content (None if not hashable). The grid
    spec is left out: the trace's GridMapping holds what it means (its index-map lambdas are new
    objects at every pallas_call(...))."""
    k = tuple(getattr(self, f.name) for f in dataclasses.fields(self))
    k = (_code_of(self.kernel), self.name, repr(self.out_tree)) + k[4:]
    try:
      hash(k)
      return k
    except TypeError:
      return None


def _code_of(fn):
  """The code a kernel runs (a new closure or partial of the same function has the same)."""
  while isinstance(fn, functools.partial):
    fn = fn.func
  return getattr(fn, "__code__", type(fn))


def _check_aliases(call: _Call, in_avals):
  label = _label(call.name, call.kernel)
  for i, o in call.aliases:
    for what, k, n in (("input", i, len(in_avals)), ("output", o, len(call.out_avals))):
      if not (isinstance(k, (int, np.integer)) and 0 <= k < n):
        counted = " (flattened, scalar-prefetch operands included)" if what == "input" else ""
        raise ValueError(
            f"pallas_call {label}: input_output_aliases {{{i}: {o}}} names {what} {k!r}, outside "
            f"the range [0, {n}) of the call's {n} {what}s{counted}")
    a, b = in_avals[i], call.out_avals[o]
    if a.shape != b.shape or a.dtype != b.dtype:
      raise ValueError(f"pallas_call {call.name}: input_output_aliases {{{i}: {o}}}: args[{i}] is "
                       f"{a.str_short()} but out[{o}] is {b.str_short()}; aliased operands must "
                       "have the same shape and dtype")


def _trace(call: _Call, in_tree, in_avals) -> Params:
  """Traces the kernel for operands of ``in_avals``: the Params of one pallas_call equation."""
  _check_aliases(call, in_avals)
  nidx, name = call.grid_spec.num_scalar_prefetch, call.name
  ins_tree = in_tree if nidx == 0 else jax.tree.structure([0] * (len(in_avals) - nidx))
  gm = make_grid_mapping(name, call.grid_spec, in_avals, ins_tree, list(call.out_avals),
                         call.out_tree, call.debug, call.kernel)
  if call.grid_names:
    gm = dataclasses.replace(gm, grid_names=tuple(call.grid_names))
  ref_avals = ([ji.ref_aval(a.shape, a.dtype, pc.MemorySpace.INDEX) for a in in_avals[:nidx]]
               + [bm.ref_aval for bm in gm.block_mappings] + list(gm.scratch_avals))
  ref_names = ([f"args[{i}]" for i in range(nidx)] + [bm.origin for bm in gm.block_mappings]
               + [f"scratch[{i}]" for i in range(len(gm.scratch_avals))])
  kargs = _kernel_args(in_tree, call.out_tree, call.grid_spec.scratch_shapes)
  extra_axes = call.threads.axis_env() if call.threads is not None else ()
  jaxpr, globals_avals = trace_kernel(call.kernel, name, gm.grid, ref_avals, ref_names,
                                      call.grid_names, kargs, extra_axes=extra_axes)
  params = Params(jaxpr, gm, name, call.interpret, call.debug, call.aliases, call.compiler_params,
                  call.cost_estimate, call.backend, globals_avals, kargs.names(call.kernel),
                  call.threads)
  if call.debug:
    print(f"The kernel jaxpr of pallas_call {name}:\n{jaxpr}\n{gm}")
  return params


def _check_grid_names(names, name: str):
  if len(set(names)) != len(names) or any(n is None for n in names):
    raise ValueError(f"pallas_call {name}: the names of a named grid must be distinct and not "
                     f"None, got {names}")


def pallas_call(kernel: Callable[..., None], out_shape: Any, *, grid_spec: pc.GridSpec | None = None,
                grid=(), in_specs=pc.no_block_spec, out_specs=pc.no_block_spec, scratch_shapes=(),
                input_output_aliases: dict[int, int] | None = None, debug: bool = False,
                interpret: Any = False, name: str | None = None, compiler_params: Any = None,
                cost_estimate: pc.CostEstimate | None = None, backend: str | None = None,
                metadata: dict[str, str] | None = None, _grid_names=(), _threads=None):
  """Returns a function that runs ``kernel`` once per point of ``grid`` on blocks of its operands.

  Same semantics as JAX Pallas's ``pallas_call``. The kernel is traced at every call (it may
  read Python values that changed since), as in JAX Pallas.
  """
  del metadata
  name = _kernel_name(kernel, name)
  if isinstance(out_shape, list):   # as JAX Pallas: the results come back as a tuple
    out_shape = tuple(out_shape)
  if grid_spec is None:
    grid_spec = pc.GridSpec(grid, in_specs, out_specs, scratch_shapes)
  elif grid != () or in_specs is not pc.no_block_spec or out_specs is not pc.no_block_spec \
      or scratch_shapes != ():
    raise ValueError(f"pallas_call {name}: pass either grid_spec or grid/in_specs/out_specs/"
                     "scratch_shapes, not both")
  flat_out_shapes, out_tree = jax.tree.flatten(
      out_shape, is_leaf=lambda s: s is None or hasattr(s, "dtype"))
  out_avals = tuple(_out_aval(s, i, name) for i, s in enumerate(flat_out_shapes))
  if isinstance(compiler_params, dict):
    compiler_params = tuple(sorted((k, tuple(sorted(v.items())) if isinstance(v, dict) else v)
                                   for k, v in compiler_params.items()))
  grid_names = tuple(_grid_names) or tuple(grid_spec.grid_names or ())
  _check_grid_names(grid_names, name)
  call = _Call(kernel, name, grid_spec, out_tree, out_avals,
               tuple(sorted((input_output_aliases or {}).items())), interpret, debug,
               compiler_params, cost_estimate, backend, grid_names, _threads)
  call_key = call.key()

  @functools.wraps(kernel)
  def wrapped(*args):
    for i, a in enumerate(args):
      _check_operand(a, i, name)
    flat_args, in_tree = jax.tree.flatten(args)
    in_avals = [_operand_aval(x, f"args[{i}]", name) for i, x in enumerate(flat_args)]
    key = None if call_key is None else (call_key, in_tree, tuple(in_avals),
                                         pc.debug_checks_enabled())
    params = _deduplicated(key, _trace(call, in_tree, in_avals))
    outs = pallas_call_p.bind(*flat_args, params=params)
    return jax.tree.unflatten(out_tree, outs)

  return wrapped

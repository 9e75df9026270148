"""``pallas_call``: the user-facing entry point (operands, out_shape, grid spec), tracing at every
call, and the cache that lets identical traces share one ``Params``."""
from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pallax._src import core as pc
from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src import autodiff, batching, dispatch  # noqa: F401 (the primitive's rules register)
from pallax._src import hi_types, kernel_errors, tracing
from pallax._src.call_primitive import Params, pallas_call_p
from pallax._src.grid_mapping import make_grid_mapping, operand_specs
from pallax._src.mosaic_gpu import profiler


# --- the user-facing entry point -----------------------------------------------------------

def _check_operand(x, i: int, name: str):
  if isinstance(x, str) or (isinstance(x, (list, tuple)) and x and all(
      isinstance(v, (int, float, bool, complex)) for v in jax.tree.leaves(x))):
    raise TypeError(f"pallas_call {name}: operands must be arrays, but args[{i}] is a "
                    f"{type(x).__name__} of Python values; convert it with jnp.asarray")


def _operand_aval(x, where: str, name: str):
  if isinstance(x, (jax.Array, np.ndarray, np.generic, jax.core.Tracer, int, float, bool, complex)):
    return jax.typeof(jnp.asarray(x) if isinstance(x, (int, float, bool, complex)) else x)
  try:
    aval = jax.typeof(x)
  except (TypeError, ValueError, AttributeError):   # not a JAX type at all: said below
    aval = None
  if hi_types.is_hi(aval):   # a value of a type registered with jax.experimental.hijax
    return aval
  if isinstance(x, jax.ShapeDtypeStruct):
    raise TypeError(f"pallas_call {name}: {where} is a ShapeDtypeStruct; pass an array "
                    "(ShapeDtypeStructs belong in out_shape)")
  raise TypeError(f"pallas_call {name}: operands must be arrays, but {where} is "
                  f"{type(x).__name__}; convert it with jnp.asarray")


def out_aval(s, i, name):
  if hi_types.is_hi(s):   # a type registered with jax.experimental.hijax: its components
    return s
  if isinstance(s, (jax.ShapeDtypeStruct, jax.Array, np.ndarray)) or (
      hasattr(s, "shape") and hasattr(s, "dtype") and not callable(getattr(s, "shape"))):
    return ji.ShapedArray(tuple(s.shape), jnp.dtype(s.dtype))
  raise TypeError(f"pallas_call {name}: out_shape must be a jax.ShapeDtypeStruct (or a pytree of "
                  f"them), but out_shape[{i}] is {s!r}; use jax.ShapeDtypeStruct(shape, dtype)")


# (call, content of its trace) -> Params. Each function pallas_call returns traces its kernel once
# per operand types (as JAX Pallas's jit does); a new pallas_call(...) traces again, seeing the
# Python globals as they are then. Traces with the same content share one Params object, so that
# the backends' caches (compiled kernels, plans) still hit.
_SAME_TRACE: collections.OrderedDict = collections.OrderedDict()   # least recently used first
_SAME_TRACE_SIZE = 512
_TRACES_PER_CALL = 64   # operand types a function pallas_call returned keeps its trace for


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
  label = kernel_errors.label(call.name, call.kernel)
  for i, o in call.aliases:
    for what, k, n in (("input", i, len(in_avals)), ("output", o, len(call.out_avals))):
      if not (isinstance(k, (int, np.integer)) and 0 <= k < n):
        counted = " (flattened, scalar-prefetch operands included)" if what == "input" else ""
        raise ValueError(   # JAX's words first: users match them
            f"pallas_call {label}: input_output_aliases contains the mapping '{i}:{o}' with "
            f"{what} index {k!r} outside the range [0, {n}) of the call's {n} {what}s{counted}")
    a, b = in_avals[i], call.out_avals[o]
    los_a, los_b = hi_types.lo_avals(a), hi_types.lo_avals(b)
    if len(los_a) != len(los_b) or any(x.shape != y.shape or x.dtype != y.dtype
                                       for x, y in zip(los_a, los_b)):
      show = lambda t: str(t) if hi_types.is_hi(t) else t.str_short()
      raise ValueError(   # JAX's words first: users match them
          f"pallas_call {call.name}: input_output_aliases contains the mapping '{i}:{o}' referring "
          f"to input[{i}] with abstract value {show(a)} and to output[{o}] with a different "
          f"abstract value {show(b)}; aliased operands (args[{i}], out[{o}]) must have the same "
          "shape and dtype" + (" (component by component)" if hi_types.is_hi(a) else ""))


def _hi_kernel_types(call: _Call, ins_tree, in_avals) -> tuple:
  """The hi type (JAX's hijax) of each positional Ref the kernel takes (None: an array's Ref),
  after the scalar-prefetch operands none; () when no operand or output is of a hi type."""
  nidx, name = call.grid_spec.num_scalar_prefetch, call.name
  for i, a in enumerate(in_avals[:nidx]):
    if hi_types.is_hi(a):
      raise NotImplementedError(
          f"pallas_call {name}: args[{i}] is a scalar-prefetch operand of the hi type {a}; "
          "pallax takes arrays only there: pass its component arrays (lower_val) instead")
  ins, outs = in_avals[nidx:], call.out_avals
  if not any(map(hi_types.is_hi, [*ins, *outs])):
    return ()
  in_specs, out_specs = operand_specs(call.grid_spec, ins_tree, len(ins), call.out_tree,
                                      len(outs), kernel_errors.label(name, call.kernel))
  return tuple([None] * nidx
               + [hi_types.block_type(s, a, f"args[{nidx + i}]", name)
                  for i, (s, a) in enumerate(zip(in_specs, ins))]
               + [hi_types.block_type(s, a, f"out[{i}]", name)
                  for i, (s, a) in enumerate(zip(out_specs, outs))])


def _trace(call: _Call, in_tree, in_avals) -> Params:
  """Traces the kernel for operands of ``in_avals``: the Params of one pallas_call equation.
  Operands and outputs of hi types are their component arrays from here on."""
  _check_aliases(call, in_avals)
  nidx, name = call.grid_spec.num_scalar_prefetch, call.name
  ins_tree = in_tree if nidx == 0 else jax.tree.structure([0] * (len(in_avals) - nidx))
  gm = make_grid_mapping(name, call.grid_spec, in_avals, ins_tree, list(call.out_avals),
                         call.out_tree, call.debug, call.kernel)
  hi = _hi_kernel_types(call, ins_tree, in_avals)
  if call.grid_names:
    gm = dataclasses.replace(gm, grid_names=tuple(call.grid_names))
  ref_avals = ([ji.ref_aval(a.shape, a.dtype, pc.MemorySpace.INDEX) for a in in_avals[:nidx]]
               + [bm.ref_aval for bm in gm.block_mappings] + list(gm.scratch_avals))
  ref_names = ([f"args[{i}]" for i in range(nidx)] + [bm.origin for bm in gm.block_mappings]
               + [f"scratch[{i}]" for i in range(len(gm.scratch_avals))])
  kargs = dataclasses.replace(
      tracing.kernel_args(in_tree, call.out_tree, call.grid_spec.scratch_shapes), hi=hi)
  extra_axes = call.threads.axis_env() if call.threads is not None else ()
  # What JAX Pallas prints for a block Ref's memory space ('Ref<default>{f32[8]}'), for errors
  spaces = ([None] * nidx + [_space_label(bm.memory_space) for bm in gm.block_mappings]
            + [None] * len(gm.scratch_avals))
  jaxpr, globals_avals = tracing.trace_kernel(call.kernel, name, gm.grid, ref_avals, ref_names,
                                      call.grid_names, kargs, extra_axes=extra_axes,
                                      ref_spaces=spaces)
  aliases = hi_types.lo_aliases(call.aliases, in_avals, call.out_avals) if hi else call.aliases
  params = Params(jaxpr, gm, name, call.interpret, call.debug, aliases, call.compiler_params,
                  call.cost_estimate, call.backend, globals_avals, kargs.names(call.kernel),
                  call.threads)
  for check in tracing.KERNEL_CHECKS:
    check(params)
  if call.debug:
    print(f"The kernel jaxpr of pallas_call {name}:\n{jaxpr}\n{gm}")
  return params


class _HiCall(ji.HiPrim):
  """A call with operands or outputs of hi types (JAX's hijax): staged as one operation on the
  hi values (under a jit that has not split them yet); split into a call on their components
  when JAX lowers it (or at once, outside any trace)."""

  def __init__(self, params: Params, in_avals, out_avals):
    self.in_avals, self.out_aval, self.params = tuple(in_avals), tuple(out_avals), {}
    self.call_params = params
    lo_in = [lo for a in in_avals for lo in hi_types.lo_avals(a)]
    self.effects = frozenset(pallas_call_p.abstract_eval(*lo_in, params=params)[1])
    super().__init__()

  def expand(self, *args):
    lo = [v for a, x in zip(self.in_avals, args) for v in hi_types.lower_value(a, x)]
    outs = pallas_call_p.bind(*lo, params=self.call_params)
    return tuple(hi_types.raise_values(self.out_aval, outs))

  def _unsupported(self, what: str):
    raise NotImplementedError(
        f"pallas_call {self.call_params.name}: {what} of a call with operands or outputs of hi "
        "types (jax.experimental.hijax) is not supported; apply it to a call on the component "
        "arrays")

  def batch(self, axis_data, args, dims):
    self._unsupported("vmap")

  def jvp(self, primals, tangents):
    self._unsupported("differentiation")

  def vjp_fwd(self, nzs_in, /, *args):
    self._unsupported("differentiation")

  def __hash__(self):
    return hash((id(self.call_params), self.in_avals, self.out_aval))

  def __eq__(self, other):
    return (type(other) is _HiCall and other.call_params is self.call_params
            and other.in_avals == self.in_avals and other.out_aval == self.out_aval)

  def __repr__(self):
    return f"pallas_call[{self.call_params.name}, hi types]"


def _bind(params: Params, flat_args, in_avals, out_avals):
  """The call's results: the pallas_call primitive on arrays; with operands or outputs of hi
  types, the call on their components, the results raised to the hi types."""
  if not any(map(hi_types.is_hi, [*in_avals, *out_avals])):
    return pallas_call_p.bind(*flat_args, params=params)
  hi_call = _HiCall(params, in_avals, out_avals)
  # A hi value traced as one (under a jit that splits it later) needs the call staged as one
  # operation; hi values at hand (Python objects of arrays or tracers) split here.
  traced = any(isinstance(x, jax.core.Tracer) and hi_types.is_hi(a)
               for x, a in zip(flat_args, in_avals))
  return hi_call(*flat_args) if traced else hi_call.expand(*flat_args)


def _space_label(space) -> str | None:
  if space is None:
    return str(pc.MemorySpace.DEFAULT)
  return str(space) if isinstance(space, pc.MemorySpace) else None


def _check_grid_names(names, name: str):
  if len(set(names)) != len(names) or any(n is None for n in names):
    raise ValueError(f"pallas_call {name}: the names of a named grid must be distinct and not "
                     f"None, got {names}")


def _own_grid_spec(gs) -> pc.GridSpec:
  """A grid spec made by JAX Pallas (``pltpu.PrefetchScalarGridSpec`` in code written for TPUs)
  as pallax's: the same fields; JAX's "no block spec" marker becomes pallax's."""
  if not all(hasattr(gs, f) for f in ("grid", "in_specs", "out_specs")):
    raise TypeError(f"grid_spec must be a pl.GridSpec or pl.PrefetchScalarGridSpec, got {gs!r}")
  own = lambda s: pc.no_block_spec if type(s).__name__ == "NoBlockSpec" else s
  return pc.GridSpec(gs.grid, own(gs.in_specs), own(gs.out_specs),
                     tuple(getattr(gs, "scratch_shapes", ()) or ()),
                     int(getattr(gs, "num_scalar_prefetch", 0) or 0))


def _grid_spec_of(name, grid_spec, grid, in_specs, out_specs, scratch_shapes) -> pc.GridSpec:
  """The call's grid spec: ``grid_spec``, or one of the other arguments (never both)."""
  if grid_spec is None:
    grid_spec = pc.GridSpec(grid, in_specs, out_specs, scratch_shapes)
  elif grid != () or in_specs is not pc.no_block_spec or out_specs is not pc.no_block_spec \
      or scratch_shapes != ():
    raise ValueError(f"pallas_call {name}: pass either grid_spec or grid/in_specs/out_specs/"
                     "scratch_shapes, not both")
  elif not isinstance(grid_spec, pc.GridSpec):
    grid_spec = _own_grid_spec(grid_spec)
  if isinstance(grid_spec.in_specs, pc.BlockSpec):   # as JAX Pallas, before any call
    raise ValueError(f"pallas_call {name}: `in_specs` must be a tuple or a list with one entry "
                     "per input, got a single BlockSpec; wrap it: in_specs=[spec]")
  return grid_spec


def _hashable(compiler_params):
  """Compiler params given as a dict (JAX's older spelling) as a tuple of items."""
  if isinstance(compiler_params, dict):
    return tuple(sorted((k, tuple(sorted(v.items())) if isinstance(v, dict) else v)
                        for k, v in compiler_params.items()))
  return compiler_params


def pallas_call(kernel: Callable[..., None], out_shape: Any, *, grid_spec: pc.GridSpec | None = None,
                grid=(), in_specs=pc.no_block_spec, out_specs=pc.no_block_spec, scratch_shapes=(),
                input_output_aliases: dict[int, int] | None = None, debug: bool = False,
                interpret: Any = False, name: str | None = None, compiler_params: Any = None,
                cost_estimate: pc.CostEstimate | None = None, backend: str | None = None,
                metadata: dict[str, str] | None = None, _grid_names=(), _threads=None):
  """Returns a function that runs ``kernel`` once per point of ``grid`` on blocks of its operands.

  Same semantics as JAX Pallas's ``pallas_call``: the returned function traces the kernel once
  per operand types and configuration (a jax.jit in JAX Pallas); calling ``pallas_call`` again
  traces it again, with the Python values it reads as they are then.
  """
  del metadata
  name = kernel_errors.kernel_name(kernel, name)
  if isinstance(out_shape, list):   # as JAX Pallas: the results come back as a tuple
    out_shape = tuple(out_shape)
  grid_spec = _grid_spec_of(name, grid_spec, grid, in_specs, out_specs, scratch_shapes)
  # plgpu.CompilerParams(profile_space=...): the profile is one more output (profiler.py)
  profile, without_record, out_shape, grid_spec, _threads = profiler.augment(
      name, compiler_params, grid_spec, out_shape, _threads)
  if profile is not None:
    kernel = without_record(kernel)
  flat_out_shapes, out_tree = jax.tree.flatten(
      out_shape, is_leaf=lambda s: s is None or hasattr(s, "dtype"))
  out_avals = tuple(out_aval(s, i, name) for i, s in enumerate(flat_out_shapes))
  compiler_params = _hashable(compiler_params)
  grid_names = tuple(_grid_names) or tuple(grid_spec.grid_names or ())
  _check_grid_names(grid_names, name)
  call = _Call(kernel, name, grid_spec, out_tree, out_avals,
               tuple(sorted((input_output_aliases or {}).items())), interpret, debug,
               compiler_params, cost_estimate, backend, grid_names, _threads)
  call_key = call.key()
  # As JAX Pallas (whose call is a jax.jit): a function pallas_call returned traces its kernel
  # once per operand types and configuration, however often it is called.
  traces: collections.OrderedDict = collections.OrderedDict()

  @functools.wraps(kernel)
  def wrapped(*args):
    for i, a in enumerate(args):
      _check_operand(a, i, name)
    flat_args, in_tree = jax.tree.flatten(args)
    in_avals = [_operand_aval(x, f"args[{i}]", name) for i, x in enumerate(flat_args)]
    trace_key = (in_tree, tuple(in_avals), pc.debug_checks_enabled(), ji.trace_context())
    params = traces.get(trace_key)
    if params is None:
      key = None if call_key is None else (call_key, *trace_key[:3])
      params = traces[trace_key] = _deduplicated(key, _trace(call, in_tree, in_avals))
      if len(traces) > _TRACES_PER_CALL:
        traces.popitem(last=False)
    outs = _bind(params, flat_args, in_avals, out_avals)
    if profile is not None:
      return profile.results(params, jax.tree.unflatten(out_tree, outs))
    return jax.tree.unflatten(out_tree, outs)

  return wrapped

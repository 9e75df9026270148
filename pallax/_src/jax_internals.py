"""The one module that imports ``jax._src`` (pinned: jax 0.11.2).

Everything pallax needs from JAX's internals is re-exported here under a
stable name, so that a JAX upgrade touches one file.
"""
import functools
import os

import jax

from jax._src import ad_checkpoint
from jax._src import ad_util
from jax._src import api_util
from jax._src import checkify as checkify_internals
from jax._src import config as jax_config
from jax._src import core
from jax._src import custom_derivatives
from jax._src import dispatch
from jax._src import effects
from jax._src import hijax
from jax._src import linear_util
from jax._src import source_info_util
from jax._src import tree_util
from jax._src.debugging import debug_effect
from jax._src.interpreters import ad
from jax._src.interpreters import batching
from jax._src.interpreters import mlir
from jax._src.lib.mlir import ir
from jax._src.interpreters import partial_eval as pe
from jax._src.lax import lax as lax_internals
from jax._src.lax import parallel as lax_parallel
from jax._src.lax.control_flow import conditionals
from jax._src.lax.control_flow import loops
from jax._src import pjit
from jax._src.state import discharge as state_discharge
from jax._src.state import indexing
from jax._src.state import primitives as state_primitives
from jax._src.state import types as state_types

Jaxpr = core.Jaxpr
Var = core.Var
Literal = core.Literal
ShapedArray = core.ShapedArray
Primitive = core.Primitive
eval_jaxpr = core.eval_jaxpr

AbstractRef = state_types.AbstractRef
TransformedRef = state_types.TransformedRef
ReadEffect = state_types.ReadEffect
WriteEffect = state_types.WriteEffect
AccumEffect = state_types.AccumEffect
NDIndexer = indexing.NDIndexer
Slice = indexing.Slice
ds = indexing.ds

get_p = state_primitives.get_p
swap_p = state_primitives.swap_p
addupdate_p = state_primitives.addupdate_p
broadcast_to_p = state_primitives.broadcast_to_p   # JAX Pallas's equal-rank broadcast
# Control flow and call primitives (JAX exports none of these objects publicly): rules are keyed
# on the objects, never on primitive names.
scan_p = loops.scan_p
while_p = loops.while_p
cond_p = conditionals.cond_p
jit_p = pjit.jit_p
closed_call_p = core.closed_call_p
custom_jvp_call_p = custom_derivatives.custom_jvp_call_p
custom_vjp_call_p = custom_derivatives.custom_vjp_call_p
remat_p = ad_checkpoint.remat_p
check_p = checkify_internals.check_p
copy_p = lax_internals.copy_p
add_p = lax_internals.add_p
add_any_p = ad_util.add_jaxvals_p   # the sum of two tangents in JVP jaxprs
one_minus_square_p = lax_internals.one_minus_square_p   # tanh's derivative in JVP jaxprs
optimization_barrier_p = lax_internals.optimization_barrier_p
# Equations whose sub-jaxpr runs once, in place, on the equation's operands.
CALL_PRIMITIVES = (jit_p, closed_call_p, custom_jvp_call_p, custom_vjp_call_p, remat_p)

# Named axes (grid, cluster and thread names of Mosaic GPU kernels) and run_state.
axis_index_p = lax_parallel.axis_index_p
# shard_map's casts of a value's varying mesh axes (check_vma): identities on the value itself
vma_casts = (core.pvary_p, core.reduced_vary_cast_p)
# What sharding adds to values traced under a mesh (shard_map's vma casts, explicit sharding's
# reshard): inside one kernel program each is the value itself.
sharding_marks = (*vma_casts, pjit.reshard_p)
psum_p = lax_parallel.psum_p
extend_axis_env_nd = core.extend_axis_env_nd
run_state = state_discharge.run_state
run_state_p = state_discharge.run_state_p
uninitialized = state_types.uninitialized
Transform = state_types.Transform   # the base of Ref transforms (plgpu.Transform)
TransposeRef = state_types.TransposeTransform
ReshapeRef = state_types.ReshapeTransform
BitcastRef = state_types.BitcastTransform


def register_ref_type(cls, to_aval_and_value):
  """Lets ``pl.run_state`` take instances of ``cls`` (e.g. ``plgpu.ACC.init(x)``):
  ``to_aval_and_value(x)`` gives the Ref type and the initial value."""
  state_types._ref_type_aval_mappings[cls] = to_aval_and_value


def allow_effect_in_control_flow(effect_type):
  """Effects of Mosaic GPU primitives may appear inside loops, conds and custom rules."""
  for allowed in (effects.control_flow_allowed_effects, effects.custom_derivatives_allowed_effects,
                  effects.remat_allowed_effects):
    allowed.add_type(effect_type)


discharge_state = state_discharge.discharge_state
register_discharge_rule = state_discharge.register_discharge_rule


def gpu_triton():
  """jaxlib's Triton kernel call (from the CUDA plugin: present on GPU machines only)."""
  from jax._src.lib import gpu_triton as lib
  if not hasattr(lib, "TritonKernel"):   # a jaxlib without the CUDA plugin: a stub module
    raise RuntimeError(
        "this kernel is launched through jaxlib's Triton kernel call, which comes with JAX's "
        "CUDA plugin (pip install 'jax[cuda12]'); it is not installed here. Lowering such a "
        "kernel for CUDA ahead of time (jax.export, lowering_platforms=('cuda',)) needs the "
        "plugin even on a machine without a GPU")
  return lib


def trace_to_jaxpr(fun, in_avals, name="kernel", arg_names=None, axes=(), lower=False):
  """Traces ``fun(*in_avals)`` to a jaxpr; returns (jaxpr, out_avals, consts).

  ``axes``: (name, size) pairs in scope for ``lax.axis_index``/``lax.axis_size`` (a Mosaic GPU
  kernel's cluster and thread axes), bound around the whole trace: with ``jax_enable_checks``
  JAX type-checks the finished jaxpr, whose ``axis_index`` equations need their names bound.
  ``lower``: operations on hi values (JAX's hijax types) are lowered to their components as they
  are traced (their ``to_lojax`` rules), so the jaxpr holds arrays only."""
  dbg = api_util.debug_info(name, fun, tuple(range(len(in_avals))), {})
  if arg_names is not None:
    dbg = dbg._replace(arg_names=tuple(arg_names))
  # As JAX Pallas traces kernels: a loop body may return a Ref it closes over (or was passed).
  with core.extend_axis_env_nd(list(axes)), jax_config.mutable_array_checks(False):
    return pe.trace_to_jaxpr_dynamic(
        linear_util.wrap_init(fun, debug_info=dbg), list(in_avals), lower=lower)


# JAX's hi types (jax.experimental.hijax): a primitive on hi values whose rule splits them.
HiPrim = hijax.HiPrim


def hi_ref(ty, lo_refs):
  """A Ref of the hi type ``ty`` made of the component Refs ``lo_refs`` (JAX's hi Refs): reading
  it gives ``ty``'s value raised from the components' reads, writing a value writes its
  components; ``ref._refs`` is the hi value of the component Refs."""
  return core.Ref(AbstractRef(ty), ty.raise_val(*lo_refs))


def is_symbolic_dim(d) -> bool:
  """Whether ``d`` is a symbolic dimension of ``jax.export``'s shape polymorphism."""
  return core.is_symbolic_dim(d)


def dce(jaxpr):
  """``jaxpr`` without the equations none of its outputs or effects need (as JAX Pallas prunes
  a traced kernel)."""
  return pe.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars), instantiate=True)[0]


def closed(jaxpr, consts):
  """A jaxpr with ``consts`` attached (JAX 0.11 merged Jaxpr and ClosedJaxpr)."""
  return core.ClosedJaxpr(jaxpr, list(consts))


def is_ref_aval(aval) -> bool:
  return isinstance(aval, AbstractRef)


def ref_aval(shape, dtype, memory_space=None):
  # pallax's memory spaces are not JAX's: jnp.zeros_like(ref) would reject them,
  # so the Ref type carries none (backends read memory spaces from the specs).
  del memory_space
  return AbstractRef(ShapedArray(tuple(shape), dtype))


_JAX_KERNELS = os.path.join("jax", "experimental", "pallas", "ops", "")
_PALLAX_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


_STDLIB_DIR = os.path.dirname(os.path.abspath(os.__file__)) + os.sep


def is_library_file(f: str) -> bool:
  """Frames of JAX, jaxlib, pallax itself, Python's standard library (contextlib) or generated
  code: not the user's source line."""
  if _JAX_KERNELS in f:   # JAX's shipped kernels are user code when pallax runs them
    return False
  stdlib = f.startswith(_STDLIB_DIR) and f"{os.sep}site-packages{os.sep}" not in f
  return (f.startswith(_PALLAX_DIR) or f.startswith("<") or f"{os.sep}jax{os.sep}" in f
          or f"{os.sep}jaxlib{os.sep}" in f or stdlib)


def user_location(source_info) -> tuple[str, int, str] | None:
  """(file, line, function) of the first frame outside jax and pallax, or None."""
  tb = getattr(source_info, "traceback", None)
  if tb is None:
    return None
  for frame in tb.frames:
    if not is_library_file(frame.file_name):
      return frame.file_name, frame.line_num, frame.function_name
  return None


def user_frame(source_info):
  """'file:line (function)' of the first frame outside jax and pallax, or None."""
  where = user_location(source_info)
  return None if where is None else f"{where[0]}:{where[1]} ({where[2]})"


def named_scopes(source_info) -> tuple[str, ...]:
  """The ``jax.named_scope`` names an equation was traced in, outermost first (relative to the
  jaxpr holding it: a sub-jaxpr's equations leave out the scopes of the equation holding it)."""
  return tuple(s.name for s in source_info.name_stack.stack
               if isinstance(s, source_info_util.Scope))


def current_user_frame():
  """Like ``user_frame`` for the code running now (at trace time)."""
  return user_frame(source_info_util.current())


def mesh_axis_sizes() -> dict:
  """The mesh axes in scope where a kernel call is lowered inside ``jax.shard_map`` (in the
  mesh's order) and their sizes; ``vmap``'s named axes are not among them."""
  from jax._src import mesh as mesh_lib
  env = core.get_axis_env().axis_sizes
  manual = mesh_lib.get_abstract_mesh().manual_axes
  return {k: env[k] for k in mesh_lib.get_abstract_mesh().axis_names if k in manual and k in env}


def stage_axis_index_with(rule):
  """The one place pallax changes a table of JAX's: ``lax.axis_index`` is staged into jaxprs by
  ``rule(trace, source_info, *, axis_name)`` (JAX's custom staging rule). JAX offers no other
  hook for an axis name that a kernel's grid binds while it is traced; ``rule`` falls back to
  JAX's default staging for every other name, so programs outside kernels see no change."""
  pe.custom_staging_rules[axis_index_p] = rule



# --- host callbacks whose errors reach the user ---------------------------------------------------
# jax.debug.callback and jax.pure_callback log a failing callback's traceback before XLA wraps it;
# pallax's checks raise on purpose, so they call back through this primitive instead (what
# checkify's own run-time checks do), and errors.py gives the exception back its class.

from jax._src import callback as _callback                      # noqa: E402
from jax._src.lib import _jax as _jaxlib                         # noqa: E402

JaxRuntimeError = _jaxlib.JaxRuntimeError

host_callback_p = core.Primitive("pallax_host_callback")
host_callback_p.multiple_results = True


def _host_callback_abstract_eval(*avals, fn, result_avals):
  del avals, fn
  return list(result_avals), {debug_effect}


def _outside_any_mesh(fn):
  """``fn``, run with no mesh in context: a kernel on the host computes on plain arrays,
  whatever mesh (``jax.set_mesh``) the program around it runs under, while the values its jaxpr
  was traced with carry ``jax.shard_map``'s manual mesh."""
  def run(*args):
    with jax.set_mesh(None):
      return fn(*args)
  return run


def _host_callback_impl(*args, fn, result_avals):
  del result_avals
  import numpy as np
  return list(_outside_any_mesh(fn)(*[np.asarray(a) for a in args]))


def _host_callback_lowering(ctx, *args, fn, result_avals):
  del result_avals
  outs, _, _ = _callback.emit_python_callback(
      ctx, _outside_any_mesh(fn), None, list(args), list(ctx.avals_in), list(ctx.avals_out),
      has_side_effect=True, returns_token=False)
  return outs


host_callback_p.def_effectful_abstract_eval(_host_callback_abstract_eval)
host_callback_p.def_impl(_host_callback_impl)
mlir.register_lowering(host_callback_p, _host_callback_lowering)


def host_callback(fn, result_avals, *args):
  """Calls ``fn`` on the host with NumPy arrays at run time; it returns arrays of
  ``result_avals`` (a tuple). Never dropped; an exception it raises fails the computation."""
  return host_callback_p.bind(*args, fn=fn, result_avals=tuple(result_avals))


def on_runtime_error(replace) -> None:
  """Installs ``replace(message) -> exception or None`` where jaxlib creates a JaxRuntimeError
  (XLA reports a failed host callback as one, by its message): a non-None result is raised
  instead; it must be an instance of a subclass of JaxRuntimeError. Installed once, by
  errors.py; every other JaxRuntimeError is made as before."""
  base_new = JaxRuntimeError.__new__

  def new(cls, *args, **kwargs):
    if cls is JaxRuntimeError and args and isinstance(args[0], str):
      found = replace(args[0])
      if found is not None:
        return found
    return base_new(cls, *args, **kwargs)

  JaxRuntimeError.__new__ = new


# --- JAX Pallas code mixed into pallax kernels (and the reverse) -----------------------------------
# pallax never imports JAX Pallas; these recognize its frames and primitives by module name.

_JAX_PALLAS_DIR = os.path.join("jax", "_src", "pallas") + os.sep


def jax_pallas_call_in(frames) -> tuple[str, str] | None:
  """For frames (innermost last, as ``traceback.extract_tb`` gives them): (the JAX Pallas
  function called, the user's line that called it), for the outermost call from user code into
  JAX Pallas; None if JAX Pallas is not among them."""
  user = None
  for f in frames:
    if _JAX_PALLAS_DIR in f.filename:
      if user is not None:
        return f.name, user
    elif not is_library_file(f.filename):
      user = f"{f.filename}:{f.lineno} ({f.name})"
  return None


def jax_pallas_is_tracing(frames) -> str | None:
  """The user's line that called a JAX Pallas pallas_call or kernel whose tracing is under way
  in ``frames`` (outermost first), or None."""
  user = None
  for f in frames:
    if _JAX_PALLAS_DIR in f.filename:
      return user or "an unknown line"
    if not is_library_file(f.filename):
      user = f"{f.filename}:{f.lineno} ({f.name})"
  return None


@functools.cache
def is_jax_pallas_primitive(prim) -> bool:
  """Whether ``prim`` is one of JAX Pallas's primitives (its rules live in jax._src.pallas)."""
  for fn in (getattr(prim, "abstract_eval", None), getattr(prim, "impl", None)):
    cells = getattr(fn, "__closure__", None) or ()
    for f in (fn, *[_cell(c) for c in cells]):
      if (getattr(f, "__module__", None) or "").startswith("jax._src.pallas"):
        return True
  return False


def _cell(c):
  try:
    return c.cell_contents
  except ValueError:
    return None


def trace_context() -> tuple:
  """The configuration a trace depends on (x64, checks, ...): part of jax.jit's cache keys, and
  of a pallas_call's (pallas_call.py)."""
  return jax_config.trace_context()

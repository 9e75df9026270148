"""Tracing a kernel body into a jaxpr over JAX Refs, with its grid's program ids bound."""
from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any

import jax
import jax.numpy as jnp

from pallax._src import captured
from pallax._src import checks
from pallax._src import core as pc
from pallax._src import hi_types
from pallax._src import jax_internals as ji
from pallax._src.grid_mapping import scratch_aval
from pallax._src import jaxpr_util
from pallax._src import kernel_errors


# --- tracing the kernel --------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class KernelArgs:
  """How flat Refs become the kernel's arguments: pytrees of positional Refs, scratch
  passed positionally or (from a dict of scratch shapes) by keyword. ``hi``: for each positional
  leaf, the hi type (JAX's hijax) of the Ref made of its next component Refs, or None for one
  Ref; empty when no operand is of a hi type (else the kernel is traced lowering the hi Refs'
  reads and writes to their components')."""
  positional: Any           # treedef of the tuple of positional arguments
  keyword: Any = None       # treedef of the keyword arguments (or None)
  hi: tuple = ()

  @staticmethod
  def flat(n: int) -> "KernelArgs":
    return KernelArgs(jax.tree.structure(tuple(range(n))))

  def call(self, kernel, refs):
    if self.hi:
      refs = hi_types.raise_refs(self.hi, refs)
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
    return tuple(hi_types.component_names(names, self.hi))


def _check_signature(kernel, name, kernel_args: KernelArgs, ref_names):
  n_pos = len(jax.tree.unflatten(kernel_args.positional, [0] * kernel_args.positional.num_leaves))
  kw_names = () if kernel_args.keyword is None else tuple(
      jax.tree.unflatten(kernel_args.keyword, [0] * kernel_args.keyword.num_leaves))
  why = kernel_errors.bind_error(kernel, n_pos, kw_names)
  if why is not None:
    raise TypeError(
        f"pallas_call {name}: {why}: the kernel {name}{kernel_errors.signature_text(kernel)} "
        f"cannot take {n_pos} Ref arguments"
        + (f" and keyword Refs {list(kw_names)}" if kw_names else "")
        + f" (the Refs are {', '.join(ref_names)}); give the kernel one parameter per input, "
        "output and scratch buffer")


# Checks of a traced kernel that hold for every executor, ``check(params)`` each (a programming
# model registers its own: mosaic_gpu/layout_checks.py); they raise the error the user sees.
KERNEL_CHECKS: list = []


def trace_kernel(kernel, name, grid: tuple[int, ...], ref_avals, ref_names, grid_names=(),
                 kernel_args: KernelArgs | None = None, closure: str = "pallas_call",
                 extra_axes=(), ref_spaces=()):
  """Traces the kernel on Refs into a jaxpr whose invars are ``*grid_indices, *refs, *globals``.

  Named grid axes and ``extra_axes`` ((name, size) pairs: a Mosaic GPU kernel's cluster and
  thread axes) are in scope for ``lax.axis_index``/``lax.axis_size``. ``closure`` says whose
  rule for the arrays the kernel closes over applies: "pallas_call" or "kernel" (``pl.kernel``).
  ``ref_spaces``: each Ref's memory space as JAX Pallas prints it ('default'; None: unknown),
  for errors that show a Ref's type.

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
    with pc.grid_env(env):
      out = kernel_args.call(kernel, list(refs))
    if out is not None:   # even () or 0, as in JAX Pallas
      where = kernel_errors.defined_at(kernel)
      raise ValueError(   # JAX's words first: users match them
          f"The kernel function in the pallas_call {name}{f' at {where}' if where else ''} "
          f"should return None; it returned {_describe(out)}. Kernels write their results into "
          "output Refs")
    return []

  in_avals = [ji.ShapedArray((), jnp.int32)] * len(grid) + list(ref_avals)
  named = [(n, s) for n, s in zip(grid_names, grid) if n is not None] + list(extra_axes)
  try:
    trace = functools.partial(ji.trace_to_jaxpr, name=name, axes=named, lower=bool(kernel_args.hi))
    jaxpr, _, consts = trace(lambda *a: run((), *a), in_avals)
    globals_avals = [scratch_aval(w, name) for w in requested]
    if requested:
      n = len(in_avals)
      jaxpr, _, consts = trace(lambda *a: run(a[n:], *a[:n]), in_avals + globals_avals)
  except (ValueError, TypeError, IndexError, NotImplementedError, RuntimeError) as e:
    names = dict(zip(kernel_args.names(kernel), ref_names)) if ref_names else {}
    spaces = kernel_errors.spaces_by_type(ref_avals, ref_spaces)
    kernel_errors.reraise(e, f"pallas_call {name}", names, spaces)
  if _loop_returns_ref(jaxpr):
    # A loop body that returns a Ref it closes over (JAX Pallas allows it): the unused Ref
    # results go, as JAX Pallas's pruning removes them, before the state is discharged.
    jaxpr = ji.dce(jaxpr)
  captured.check(closure, jaxpr, consts, name, kernel_errors.defined_at(kernel))
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


ji.stage_axis_index_with(_axis_index_staging)


def kernel_args(in_tree, out_tree, scratch_shapes) -> KernelArgs:
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


def _loop_returns_ref(jaxpr) -> bool:
  return any(e.primitive in (ji.scan_p, ji.while_p) and any(ji.is_ref_aval(v.aval) for v in e.outvars)
             for e in jaxpr_util.equations(jaxpr))

"""Writing a kernel jaxpr as the statements of a GPU kernel: the walk over equations, naming,
source-line comments, literal folding and rule lookup, shared by the GPU emitters.

A rule has JAX's shape, ``rule(ctx, *operands, **params)``: operands are typed expressions
(``gpu/expr.py``) or a backend's Ref views, ``ctx`` a small ``RuleContext``. It returns an
expression (or a list), which the walk binds to a fresh name; it may emit statements through
``ctx.gen`` (loops, stores), and lower sub-jaxprs with ``ctx.gen.lower_jaxpr``.
"""
from __future__ import annotations

import builtins
import dataclasses
import keyword
import linecache
import re

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from pallax._src import jax_internals as ji
from pallax._src.gpu import expr as ex


class Unsupported(NotImplementedError):
  """What the backend cannot express; the message names the kernel and the user's line."""


_RESERVED = set(keyword.kwlist) | set(dir(builtins))


def identifier(s: str) -> str:
  """A Python identifier made from ``s`` (a parameter name, a hint)."""
  s = re.sub(r"\W", "_", s)
  s = s if s and not s[0].isdigit() else f"k_{s}"
  return f"{s}_v" if s in _RESERVED else s


def kernel_identifier(name: str) -> str:
  """The kernel function's name: an identifier that PTX accepts too (not only underscores, as
  the ``_`` of a ``@pl.core_map`` body)."""
  s = identifier(name)
  return s if s.strip("_") else "kernel"


@dataclasses.dataclass(frozen=True)
class ConstArray:
  """A constant array the kernel closed over: an error if an equation uses it."""
  value: np.ndarray


@dataclasses.dataclass(frozen=True)
class RuleContext:
  gen: "Source"
  eqn: object

  @property
  def avals_out(self):
    return [v.aval for v in self.eqn.outvars]

  @property
  def out(self):
    """The first output's aval."""
    return self.eqn.outvars[0].aval

  def is_used(self, k: int = 0) -> bool:
    return self.gen.is_used(self.eqn.outvars[k])


@dataclasses.dataclass(frozen=True)
class RuleTable:
  """Rules by primitive, and the name hint of each rule's results."""
  rules: dict
  hints: dict

  def register(self, *prims, hint: str = "v"):
    def add(f):
      for p in prims:
        self.rules[p] = f
        self.hints[p] = hint
      return f
    return add



class Scalar(str):
  """A generated statement that makes no operation of its own: an assignment, a loop or branch
  head, ``pass``, a comment. It renders as itself; its type is the fact (no backend reads its
  text back to learn it)."""

class Source:
  """The statements of one kernel function, and the walk that writes them."""

  def __init__(self, kernel_name: str, table: RuleTable, render: ex.Renderer, reserved=()):
    self.kernel_name = kernel_name
    self.table = table
    self.render = render
    self.lines: list[str] = []
    self.depth = 1
    self.used: set[str] = set(reserved)
    self.last_frame = None
    self.enclosing_frame = None   # the user's line of the equation whose sub-jaxpr is lowered
    self.max_numel = 1
    self._live: set = set()
    self._eqns: list = []          # the equations of the jaxpr being lowered

  # --- statements and names -----------------------------------------------------------------
  def emit(self, line: str):
    self.lines.append("    " * self.depth + line)

  def emit_scalar(self, line: str):
    """``line``, a statement with no operation of its own (an assignment, a loop or branch
    head, ``pass``, a comment), kept as a ``Scalar``: a backend that must know reads its type."""
    self.emit(line)
    self.lines[-1] = Scalar(self.lines[-1])

  def emit_expr(self, e: ex.Expr):
    self.emit(self.render(e))

  def fresh(self, hint: str) -> str:
    base = identifier(hint)
    name, k = base, 1
    while name in self.used:
      k += 1
      name = f"{base}{k}"
    self.used.add(name)
    return name

  def bind(self, e: ex.Expr, hint: str = "v", dtype=None, shape=None) -> ex.Expr:
    """``e`` as a name (a new statement unless it is a name or a literal already)."""
    dtype = e.dtype if dtype is None else np.dtype(dtype)
    shape = e.shape if shape is None else tuple(shape)
    bounds = ex.interval(e) if dtype == e.dtype else None
    divisor = ex.divisor(e) if dtype == e.dtype else 1
    if isinstance(e, (ex.Name, ex.Lit)):
      return dataclasses.replace(e, dtype=dtype, shape=shape, bounds=bounds, divisor=divisor)
    name = ex.Name(self.fresh(hint), dtype=dtype, shape=shape, bounds=bounds, divisor=divisor)
    self.max_numel = max(self.max_numel, name.numel)
    self.emit_binding(name, e)
    return name

  def emit_binding(self, name: ex.Name, e: ex.Expr):
    """The statement ``name = e`` (a backend may keep it as data: see the Gluon writer)."""
    self.emit_scalar(f"{name.name} = {self.render(e)}")

  def fresh_name(self, hint: str, dtype, shape, bounds=None) -> ex.Name:
    """A new variable; ``bounds`` (lo, hi) only where every value it will hold lies within."""
    return ex.Name(self.fresh(hint), dtype=np.dtype(dtype), shape=tuple(shape), bounds=bounds)

  def program_ids(self, decode, lanes: int, hint: str = "i") -> tuple[ex.Name | None, dict]:
    """Emits the decode of launch index 0 into program ids, as the kernel plan describes it
    (``plan.KernelPlan.decode``: its axes fastest first, each maybe reversed); returns (the
    launch index, or None for no decoded axis; {grid axis: its id}). Every id carries its
    bounds."""
    if not decode:
      return None, {}
    i32 = lambda n: ex.Lit(int(n), dtype=np.dtype(np.int32))  # noqa: E731
    pid = self.fresh_name("pid", np.int32, (), bounds=(0, lanes - 1))
    self.emit(f"{pid.name} = {self.render.ns}.program_id(0)")
    ids, rest = {}, pid
    for k, axis in enumerate(decode):
      last = k == len(decode) - 1
      idx = rest if last else ex.binary("%", rest, i32(axis.size))
      if axis.reversed:
        idx = ex.binary("-", i32(axis.size - 1), idx)
      ids[axis.axis] = self.fresh_name(f"{hint}{axis.axis}", np.int32, (), bounds=ex.interval(idx))
      self.emit(f"{ids[axis.axis].name} = {self.render(idx)}")
      if not last:
        rest = self.bind(ex.binary("//", rest, i32(axis.size)), "rest")
    return pid, ids

  def assign(self, targets: list[ex.Name], values: list[ex.Expr]):
    pairs = [(t, v) for t, v in zip(targets, values) if not (isinstance(v, ex.Name) and v.name == t.name)]
    if pairs:   # all at once: a value may read a target assigned before it (a, b = b, a)
      self.emit_scalar(", ".join(t.name for t, _ in pairs) + " = "
                       + ", ".join(self.render(v) for _, v in pairs))

  def comment_source(self, eqn):
    where = ji.user_location(eqn.source_info)
    frame = ji.user_frame(eqn.source_info)
    if frame is None or frame == self.last_frame:
      return
    self.last_frame = frame
    text = linecache.getline(where[0], where[1]).strip()
    self.emit_scalar(f"# {frame}: {text}" if text else f"# {frame}")

  def where(self, eqn) -> str:
    return ji.user_frame(eqn.source_info) or self.enclosing_frame or "unknown location"

  # --- the walk -------------------------------------------------------------------------------
  def lower_jaxpr(self, jaxpr, args, unused_outputs=()) -> list:
    """The jaxpr's statements; returns its outputs (None at ``unused_outputs``, positions the
    caller drops: a backend that leaves out unused equations may not compute them)."""
    env = dict(zip(jaxpr.invars, args))
    env.update(zip(jaxpr.constvars, map(self.constant, jaxpr.consts)))

    def read(a):
      if not isinstance(a, ji.Literal):
        return env[a]
      # an array literal (JAX's jax_use_simplified_jaxpr_constants): as a closed-over constant
      return self.constant(a.val) if np.ndim(a.val) else self.literal(a.val, a.aval.dtype)

    outer = self._live, self._eqns
    self._live = {a for e in jaxpr.eqns for a in e.invars if isinstance(a, ji.Var)}
    self._live |= {a for k, a in enumerate(jaxpr.outvars)
                   if isinstance(a, ji.Var) and k not in unused_outputs}
    self._eqns = jaxpr.eqns
    for eqn in jaxpr.eqns:
      self.at_equation(eqn)   # (before a skip: what happens there does not depend on use)
      if self.skips(eqn):
        continue
      self.comment_source(eqn)
      outs = self._lower_eqn(eqn, [read(a) for a in eqn.invars])
      env.update(zip(eqn.outvars, outs))
    result = [None if k in unused_outputs else read(a) for k, a in enumerate(jaxpr.outvars)]
    self._live, self._eqns = outer
    return result

  def at_equation(self, eqn) -> None:
    """Called before each equation is lowered (a backend may write something there)."""

  def uses(self, var) -> list:
    """The equations of the jaxpr being lowered that read ``var`` (a rule may choose how to
    compute a value from how it is used)."""
    return [e for e in self._eqns if any(a is var for a in e.invars)]

  def _lower_eqn(self, eqn, invals) -> list:
    for v in invals:
      if isinstance(v, ConstArray):
        raise Unsupported(
            f"pallas_call {self.kernel_name}: the kernel uses a constant array of shape "
            f"{v.value.shape} ({v.value.dtype}) at {self.where(eqn)}, closed over or built with "
            "jnp.array, too large to embed: pass it as an input")
    folded = self.fold(eqn, invals)
    if folded is not None:
      return [folded]
    rule = self.table.rules.get(eqn.primitive)
    where = self.where(eqn)
    if rule is None:
      raise Unsupported(
          f"pallas_call {self.kernel_name}: the GPU backend does not support the primitive "
          f"'{eqn.primitive.name}' (at {where}); run it with interpret=True or rewrite that step")
    outer, self.enclosing_frame = self.enclosing_frame, where
    try:
      out = rule(RuleContext(self, eqn), *invals, **eqn.params)
    except NotImplementedError as e:
      if str(e).startswith("pallas_call"):
        raise
      raise Unsupported(f"pallas_call {self.kernel_name}: {e} (at {where}); the GPU backend "
                        "cannot express this: run it with interpret=True") from None
    finally:
      self.enclosing_frame = outer
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    hint = self.table.hints.get(eqn.primitive, "v")
    return [self.bind(x, hint, v.aval.dtype, v.aval.shape) if isinstance(x, ex.Expr) and
            hasattr(v.aval, "shape") and x.dtype is not None else x
            for v, x in zip(eqn.outvars, outs)]

  def is_used(self, var) -> bool:
    return var in self._live

  def skips(self, eqn) -> bool:
    """Whether to leave ``eqn`` out (a backend may drop equations whose results go unused)."""
    return False

  # --- constants ------------------------------------------------------------------------------
  def literal(self, value, dtype) -> ex.Lit:
    v = np.asarray(value).item()
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
      v = bool(v)
    elif jnp.issubdtype(dtype, jnp.floating):
      v = float(v)
    else:
      v = int(v)
    return ex.Lit(v, dtype=dtype)

  def constant(self, c):
    """A constant the traced kernel closed over: a literal for a scalar, else a ConstArray (an
    error where used, unless a backend passes arrays in: see the Triton writer). Values that
    are not numbers (Refs of pl.kernel, already lowered values) pass through."""
    if isinstance(c, ex.Expr) or (not hasattr(c, "shape") and not isinstance(c, (int, float, bool))):
      return c
    a = np.asarray(c)
    if a.size == 0:   # e.g. the empty index array of a whole-window scatter: its shape is all
      return a
    return self.literal(a.reshape(()), a.dtype) if a.size == 1 else ConstArray(a)

  def fold(self, eqn, invals) -> ex.Lit | None:
    """A scalar equation of literals, computed here by lax: written out as Python numbers, the
    GPU compiler would fold it by Python's rules (-7 // 2 = -4, 2**31 - 1 + 1 does not wrap)."""
    if eqn.primitive in ji.sharding_marks:   # (a mark of sharding's, nothing to compute)
      return invals[0] if len(invals) == 1 and isinstance(invals[0], ex.Lit) else None
    if eqn.primitive not in self.table.rules or eqn.primitive.multiple_results or \
        len(eqn.outvars) != 1 or eqn.effects or eqn.outvars[0].aval.shape != () or not invals:
      return None
    if not all(isinstance(v, ex.Lit) for v in invals):
      return _absorbed(eqn, invals)
    args = [np.asarray(v.value, v.dtype) for v in invals]
    with jax.ensure_compile_time_eval(), jax.default_device(jax.devices("cpu")[0]):
      value = eqn.primitive.bind(*args, **eqn.params)
    return self.literal(np.asarray(value), eqn.outvars[0].aval.dtype)


def _absorbed(eqn, invals) -> ex.Lit | None:
  """``False & x`` and ``True | x`` of scalar booleans: their literal, whatever ``x`` is (so
  that ``pl.when(jnp.logical_and(warp == 1, ...))`` folds away in the bodies of other warps)."""
  absorbing = {lax.and_p: False, lax.or_p: True}.get(eqn.primitive)
  if absorbing is None or eqn.outvars[0].aval.dtype != np.bool_:
    return None
  if any(isinstance(v, ex.Lit) and bool(v.value) == absorbing for v in invals):
    return ex.Lit(absorbing, dtype=np.dtype(np.bool_))
  return None

"""Kernel jaxpr + GridMapping -> the source of one ``@triton.jit`` function.

Generated code is meant to be read: one statement a line, names from the kernel's
parameters, and a comment with the user's source line above the code it produced.

Grid: the axes along which programs may run concurrently become Triton's launch
grid (flattened into axis 0); axes along which a block the kernel reads back is
revisited run as loops inside each program, in order, as in the interpreter.
"""
from __future__ import annotations

import builtins
import dataclasses
import keyword
import linecache
import math
import re

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from pallax._src import checks
from pallax._src import core as pc
from pallax._src import jax_internals as ji
from pallax._src import primitives as prims
from pallax._src import schedule as sched
from pallax._src.gpu import tiling
from pallax._src.triton import movement   # its rules register themselves
from pallax._src.triton import rules
from pallax._src.triton.values import NUMBER, SIGNATURE, RefDim, RefVal, Val, literal, pow2, tl_dtype

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


@triton.jit
def _argmax(a, i, b, j):
    # NaN wins (the first one), else the first largest value: lax.argmax's rule (tl.argmax skips NaN)
    a_nan = a != a
    b_nan = b != b
    first = i < j
    take_a = (a_nan & (~b_nan | first)) | (~a_nan & ~b_nan & ((a > b) | ((a == b) & first)))
    return tl.where(take_a, a, b), tl.where(take_a, i, j)


@triton.jit
def _argmin(a, i, b, j):
    # As _argmax, for the smallest value
    a_nan = a != a
    b_nan = b != b
    first = i < j
    take_a = (a_nan & (~b_nan | first)) | (~a_nan & ~b_nan & ((a < b) | ((a == b) & first)))
    return tl.where(take_a, a, b), tl.where(take_a, i, j)
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


@dataclasses.dataclass(frozen=True)
class ConstArray:
  """A constant array the kernel closed over: an error if an equation uses it."""
  value: np.ndarray


class Unsupported(NotImplementedError):
  pass


# Values beyond this many elements spill out of a program's registers (ptxas then takes
# minutes and gigabytes, and the kernel would crawl): refuse them with a clear message.
MAX_VALUE_ELEMENTS = 128 * 512


_RESERVED = set(keyword.kwlist) | set(dir(builtins))


def _ident(s: str) -> str:
  s = re.sub(r"\W", "_", s)
  s = s if s and not s[0].isdigit() else f"k_{s}"
  return f"{s}_v" if s in _RESERVED else s


class Codegen:
  def __init__(self, kernel_name: str, compute_capability: int = 90):
    self.kernel_name = kernel_name
    self.compute_capability = compute_capability
    self.lines: list[str] = []
    self.depth = 1
    self.used: set[str] = {"tl", "triton", "libdevice", "INF", "NAN", "range"}
    self.last_frame = None
    self.max_numel = 1
    self.has_checks = False
    self.read_back: set[str] = set()   # pointers of Refs that the kernel both writes and reads
    self.enclosing_frame = None   # the user's line of the equation whose sub-jaxpr is lowered
    self.hidden: list = []        # (pointer name, shape, dtype, zeroed) of hidden buffers
    self.lane = "0"               # this program's index among the concurrent programs
    self.lanes = 1                # how many programs run concurrently

  # --- emitting ----------------------------------------------------------------------
  def emit(self, line: str):
    self.lines.append("    " * self.depth + line)

  def fresh(self, hint: str) -> str:
    base = _ident(hint)
    name, k = base, 1
    while name in self.used:
      k += 1
      name = f"{base}{k}"
    self.used.add(name)
    return name

  def bind(self, expr: str, shape, dtype, hint: str = "v", copy: bool = False) -> Val:
    if not copy and re.fullmatch(r"[A-Za-z_]\w*", expr) and expr not in ("True", "False"):
      return Val(expr, tuple(shape), jnp.dtype(dtype))   # a name already: no new line
    v = Val(self.fresh(hint), tuple(shape), jnp.dtype(dtype))
    self.max_numel = max(self.max_numel, math.prod(v.padded))
    self.emit(f"{v.expr} = {expr}")
    return v

  def comment_source(self, eqn):
    frame = ji.user_frame(eqn.source_info)
    if frame is None or frame == self.last_frame:
      return
    self.last_frame = frame
    m = re.match(r"(.*):(\d+) \((.*)\)$", frame)
    text = linecache.getline(m.group(1), int(m.group(2))).strip() if m else ""
    self.emit(f"# {frame}: {text}" if text else f"# {frame}")

  # --- values ------------------------------------------------------------------------
  def const(self, value, dtype) -> Val:
    dtype = jnp.dtype(dtype)
    v = np.asarray(value).item()
    if dtype == jnp.bool_:
      return Val("True" if v else "False", (), dtype)
    if jnp.issubdtype(dtype, jnp.floating):
      text = "INF" if v == np.inf else "-INF" if v == -np.inf else "NAN" if np.isnan(v) else repr(float(v))
      if dtype == jnp.float32 and text not in ("INF", "-INF", "NAN"):
        return Val(text, (), dtype)
      return Val(f"tl.full([], {text}, {tl_dtype(dtype)})", (), dtype)
    if dtype == jnp.int32 and -2**31 <= int(v) < 2**31:
      return Val(str(int(v)), (), dtype)
    return Val(f"tl.full([], {int(v)}, {tl_dtype(dtype)})", (), dtype)

  def tensor(self, v: Val) -> str:
    """An expression that is a Triton tensor (Python literals are wrapped)."""
    if NUMBER.fullmatch(v.expr) or v.expr in ("True", "False"):   # not a name like e4
      return f"tl.full([], {v.expr}, {tl_dtype(v.dtype)})"
    return v.expr if re.fullmatch(r"\w+", v.expr) else f"({v.expr})"

  def scalar(self, v: Val) -> str:
    return v.expr

  def f32_math(self, tmpl: str, *xs: Val, keep_f32: bool = False) -> str:
    low = any(rules._low_float(x.dtype) for x in xs)
    args = [f"{self.tensor(x)}.to(tl.float32)" if low else x.expr for x in xs]
    expr = tmpl.format(*args)
    if low and not keep_f32:
      expr = f"({expr}).to({tl_dtype(xs[0].dtype)})"
    return expr

  def valid(self, shape, padded, axes) -> str | None:
    """A mask of the lanes inside the logical shape along ``axes`` (None if none are padded)."""
    conds = []
    for a in axes:
      if shape[a] != padded[a]:
        conds.append(f"(tl.arange(0, {padded[a]}){rules._expand(a, len(padded))} < {shape[a]})")
    return " & ".join(conds) if conds else None

  def mask_padding(self, v: Val, axes, neutral: str) -> str:
    cond = self.valid(v.shape, v.padded, axes)
    if cond is None:
      return v.expr
    n = neutral.replace("float('inf')", "INF")
    return f"tl.where({cond}, {v.expr}, {n})"

  # --- Refs ----------------------------------------------------------------------------
  def index_ref(self, ref: RefVal, transforms, static=frozenset(), verb="access to") -> RefVal:
    """``ref`` viewed through ``transforms``. Indices whose ids are in ``static`` were literals in
    the jaxpr: negative ones count from the end, as in NumPy and the interpreter. Any other index
    known here (a folded constant) must lie inside the Ref, as the interpreter checks."""
    for t in transforms:
      if not isinstance(t, ji.NDIndexer):
        raise Unsupported(f"Ref transform {type(t).__name__}")
      kept = [i for i, d in enumerate(ref.dims) if d.kept]
      dims = list(ref.dims)
      gather = self._gather_axes(t)
      for k, idx in zip(kept, t.indices):
        d = dims[k]
        if d.index is not None:   # only the whole of an array-indexed dimension can be taken
          if not (isinstance(idx, ji.Slice) and idx.start == 0 and idx.size == d.size and idx.stride == 1):
            raise Unsupported("indexing a Ref view that was itself indexed with an array")
          continue
        if isinstance(idx, Val) and len(idx.shape) == 1 and len(t.int_indexer_shape) == 1 and \
            sum(not isinstance(i, ji.Slice) for i in t.indices) == 1:
          # One array of indices (a gather): the dimension stays where it is (NumPy's rule).
          dims[k] = dataclasses.replace(d, size=idx.shape[0], index=self._index(idx), exact=False)
          continue
        if gather is not None and id(idx) in gather:
          m = gather[id(idx)]
          dims[k] = dataclasses.replace(d, size=idx.shape[m], index=self._index(idx), exact=False,
                                        index_rank=len(idx.shape), index_axis=m)
          continue
        if isinstance(idx, ji.Slice):
          start = self._int_expr(idx.start)
          if not isinstance(idx.size, (int, np.integer)):
            raise Unsupported("slices of dynamic size")
          dims[k] = dataclasses.replace(d, start=_add(d.start, _mul(start, d.step)),
                                        size=int(idx.size), step=d.step * int(idx.stride))
        elif isinstance(idx, Val) and idx.shape == ():
          expr = self._index(idx)
          lit = literal(idx)
          if type(lit) is int and id(idx) in static and -d.size <= lit < 0:
            expr = str(lit + d.size)
          elif type(lit) is int and not 0 <= lit < d.size:
            raise IndexError(f"pallas_call {self.kernel_name}: out-of-bounds {verb} {ref.origin} at "
                             f"{self.enclosing_frame}: index {lit} along dimension "
                             f"{kept.index(k)}, which has size {d.size}")
          dims[k] = dataclasses.replace(d, start=_add(d.start, _mul(expr, d.step)), size=1,
                                        kept=False)
        elif isinstance(idx, (int, np.integer)):
          dims[k] = dataclasses.replace(d, start=_add(d.start, _mul(str(int(idx)), d.step)), size=1,
                                        kept=False)
        else:
          raise Unsupported("indexing a Ref with an array of indices (gather/scatter)")
      ref = dataclasses.replace(ref, dims=dims)
    return ref

  def spill(self, v: Val | None, aval=None) -> RefVal:
    """A scratch buffer private to this program, of ``v``'s shape (or ``aval``'s), holding
    ``v``: for data movement Triton cannot do in registers (movement.py)."""
    aval = aval if v is None else ji.ShapedArray(v.shape, v.dtype)
    buf = scratch_ref(self, aval, "buf")
    if v is not None:
      self.store(buf, v)
    return buf

  @staticmethod
  def _gather_axes(t) -> dict | None:
    """For a view indexed by several arrays side by side (``ref.at[rows, cols]``, broadcast by
    JAX to one shape whose rank is their number): {id(index Val): its axis in that shape}."""
    pos = [k for k, i in enumerate(t.indices) if not isinstance(i, ji.Slice)]
    arrays = [t.indices[k] for k in pos]
    shape = tuple(t.int_indexer_shape)
    if len(arrays) < 2 or pos != list(range(pos[0], pos[0] + len(pos))) or len(shape) != len(arrays):
      return None
    if any(not isinstance(a, Val) or tuple(a.shape) != shape for a in arrays):
      return None
    return {id(a): m for m, a in enumerate(arrays)}

  def _index(self, idx: Val) -> str:
    """An index's expression, widened to 32 bits: address arithmetic in int8 would wrap."""
    if jnp.dtype(idx.dtype).itemsize < 4 and not re.fullmatch(r"-?\d+", idx.expr):
      return f"{self.tensor(idx)}.to(tl.int32)"
    return idx.expr

  def _int_expr(self, x) -> str:
    if isinstance(x, Val):
      return self._index(x)
    return str(int(x))

  def address(self, ref: RefVal, user_mask: Val | None):
    """(offsets expression, mask expression or None, result shape) for a Ref view."""
    kept = [d for d in ref.dims if d.kept]
    shape = tuple(d.size for d in kept)
    padded = tuple(pow2(s) for s in shape)
    big = math.prod(d.array_size for d in ref.dims) >= 2**31
    terms, conds = [], []
    j = 0
    for d in ref.dims:
      if d.kept:
        lane = f"tl.arange(0, {padded[j]}){rules._expand(j, len(padded))}"
        # an index tensor spans the result axes of all the arrays indexing the view with it
        first = j - d.index_axis
        local = lane if d.index is None else \
            f"({d.index}){rules._expand(range(first, first + d.index_rank), len(padded))}"
        coord = _add(d.start, _mul(local, d.step))
        if d.size != padded[j]:
          conds.append(f"({lane} < {d.size})")
        if d.index is not None or d.low:
          conds.append(f"({coord} >= 0)")
        if not d.exact or user_mask is not None:
          conds.append(f"({coord} < {d.array_size})")
        j += 1
      else:
        coord = d.start
        if not d.exact and d.start != "0":
          conds.append(f"({coord} < {d.array_size})")
        if d.low:
          conds.append(f"({coord} >= 0)")
      if coord == "0":
        continue
      c = f"({coord}).to(tl.int64)" if big else coord
      terms.append(_mul(c, d.stride) if d.stride != 1 else c)
    offs = " + ".join(f"({t})" if "+" in t and len(terms) > 1 else t for t in terms) or "0"
    if user_mask is not None:
      conds.append(user_mask.expr if re.fullmatch(r"\w+", user_mask.expr) else f"({user_mask.expr})")
    return offs, (" & ".join(conds) if conds else None), shape

  def load(self, ref: RefVal, user_mask=None, other=None, hint="", cache=None, evict=None) -> Val:
    offs, mask, shape = self.address(ref, user_mask)
    hint = hint or ref.ptr.removesuffix("_ref").removesuffix("_ptr") or "x"
    args = f"{ref.ptr} + {offs}" if offs != "0" else ref.ptr
    if mask is not None:
      o = other.expr if other is not None else (
          "False" if ref.dtype == jnp.bool_ else "0.0" if jnp.issubdtype(ref.dtype, jnp.floating) else "0")
      args += f", mask={mask}, other={o}"
    args += _hints(cache_modifier=cache, eviction_policy=evict)
    self.max_numel = max(self.max_numel, math.prod(pow2(s) for s in shape))
    if ref.dtype == jnp.bool_:
      return self.bind(f"tl.load({args}) != 0", shape, ref.dtype, hint)
    return self.bind(f"tl.load({args})", shape, ref.dtype, hint)

  def store(self, ref: RefVal, val: Val, user_mask=None, evict=None):
    offs, mask, shape = self.address(ref, user_mask)
    if tuple(shape) != tuple(val.shape):
      raise Unsupported(f"store of shape {val.shape} into a Ref view of shape {shape}")
    v = self.tensor(val) if val.shape == () else val.expr
    if ref.dtype == jnp.bool_:
      v = f"{self.tensor(val)}.to(tl.int8)"
    args = f"{ref.ptr} + {offs}" if offs != "0" else ref.ptr
    self.emit(f"tl.store({args}, {v}" + (f", mask={mask}" if mask else "")
              + _hints(eviction_policy=evict) + ")")
    if ref.ptr in self.read_back:
      # The kernel reads this Ref again later, possibly through other threads: make the
      # stores visible to the whole program first.
      self.emit("tl.debug_barrier()")

  # --- jaxprs --------------------------------------------------------------------------
  def lower_jaxpr(self, jaxpr, consts, args) -> list:
    env = {}
    for v, x in zip(jaxpr.all_invars, [*map(self._constant, consts), *args]):
      env[v] = x

    def read(a):
      if isinstance(a, ji.Literal):
        return self.const(a.val, a.aval.dtype)
      return env[a]

    outer_used = getattr(self, "_used", set())
    self._used = {a for e in jaxpr.eqns for a in e.invars if isinstance(a, ji.Var)}
    self._used |= {a for a in jaxpr.outvars if isinstance(a, ji.Var)}
    for eqn in jaxpr.eqns:
      self.comment_source(eqn)
      invals = [read(a) for a in eqn.invars]
      for v in invals:
        if isinstance(v, ConstArray):
          raise Unsupported(
              f"pallas_call {self.kernel_name}: the kernel uses a constant array of shape "
              f"{v.value.shape} ({v.value.dtype}) at {ji.user_frame(eqn.source_info)}, closed over or "
              "built with jnp.array; the Triton backend cannot embed it: pass it as an input")
      folded = self.fold_constants(eqn, invals)
      if folded is not None:
        env[eqn.outvars[0]] = folded
        continue
      rule = LOWERINGS.get(eqn.primitive) or rules.RULES.get(eqn.primitive)
      where = ji.user_frame(eqn.source_info) or self.enclosing_frame or "unknown location"
      if rule is None:
        raise Unsupported(
            f"pallas_call {self.kernel_name}: the Triton backend does not support the primitive "
            f"'{eqn.primitive.name}' (at {where}); run it with interpret=True or rewrite that step")
      outer, self.enclosing_frame = self.enclosing_frame, where
      try:
        out = rule(self, eqn, *invals)
      except NotImplementedError as e:
        if str(e).startswith("pallas_call"):
          raise
        raise Unsupported(f"pallas_call {self.kernel_name}: {e} (at {where}); the Triton backend "
                          "cannot express this: run it with interpret=True") from None
      finally:
        self.enclosing_frame = outer
      outs = out if isinstance(out, (list, tuple)) else [out]
      for v, x in zip(eqn.outvars, outs):
        env[v] = x
    result = [read(a) for a in jaxpr.outvars]
    self._used = outer_used
    return result

  def _constant(self, c):
    """A constant the traced kernel closed over, as a Val (scalars only: Triton has no array
    literals)."""
    if isinstance(c, (Val, RefVal)):
      return c
    a = np.asarray(c)
    if a.size == 0:   # e.g. the empty index array of a whole-window scatter: its shape is all
      return a
    return self.const(a.reshape(()), a.dtype) if a.size == 1 else ConstArray(a)

  def fold_constants(self, eqn, invals) -> Val | None:
    """A scalar equation of literals, computed here by lax: written out as Python numbers, Triton
    would fold it by Python's rules (-7 // 2 = -4, 2**31 - 1 + 1 does not wrap)."""
    if eqn.primitive not in rules.RULES or len(eqn.outvars) != 1 or eqn.outvars[0].aval.shape != () \
        or not invals or any(literal(v) is None for v in invals):
      return None
    args = [np.asarray(literal(v), jnp.dtype(v.dtype)) for v in invals]
    with jax.ensure_compile_time_eval(), jax.default_device(jax.devices("cpu")[0]):
      value = eqn.primitive.bind(*args, **eqn.params)
    return self.const(np.asarray(value), eqn.outvars[0].aval.dtype)

  def is_used(self, var) -> bool:
    return var in self._used

  def materialize(self, v: Val, hint="c") -> Val:
    """A fresh variable holding ``v`` as a tensor of its own dtype (for loop/branch carries)."""
    return self.bind(self.tensor(v) if v.shape == () else v.expr, v.shape, v.dtype, hint, copy=True)

  def assign(self, targets: list[Val], values: list[Val]):
    pairs = [(t.expr, self.tensor(v) if v.shape == () else v.expr)
             for t, v in zip(targets, values) if t.expr != v.expr]
    if pairs:   # all at once: a value may read a target assigned before it (a, b = b, a)
      self.emit(", ".join(t for t, _ in pairs) + " = " + ", ".join(v for _, v in pairs))


def _add(a: str, b: str) -> str:
  if a == "0":
    return b
  if b == "0":
    return a
  return f"{a} + {b}"


def _mul(a: str, k) -> str:
  if isinstance(k, (int, np.integer)):
    if k == 1:
      return a
    if k == 0 or a == "0":
      return "0"
    a = f"({a})" if "+" in a or "-" in a[1:] else a
    return f"{a} * {k}"
  return f"({a}) * {k}"


# --- rules that need the generator's structure: Refs and control flow ----------------------

def _access(cg, eqn, invals):
  first, verb = checks.ACCESS[eqn.primitive]
  tree = eqn.params["tree"]
  n = tree.num_leaves
  ref = invals[0]
  transforms = ji.tree_util.tree_unflatten(tree, invals[first:first + n])
  static = {id(v) for a, v in zip(eqn.invars[first:first + n], invals[first:first + n])
            if isinstance(a, ji.Literal)}
  rest = list(invals[first + n:])
  return cg.index_ref(ref, transforms, static, verb), rest


def _get(cg, eqn, *invals):
  view, _ = _access(cg, eqn, invals)
  return cg.load(view)


def _swap(cg, eqn, *invals):
  view, _ = _access(cg, eqn, invals)
  old = None
  if cg.is_used(eqn.outvars[0]):
    old = cg.load(view, hint="old")
  cg.store(view, invals[1])
  return old if old is not None else invals[1]


def _addupdate(cg, eqn, *invals):
  view, _ = _access(cg, eqn, invals)
  cur = cg.load(view, hint="cur")
  cg.store(view, cg.bind(f"{cur.expr} + {invals[1].expr}", cur.shape, cur.dtype, "upd"))
  return []


def _hints(**hints) -> str:
  """Cache hints as keyword arguments of tl.load / tl.store (none: empty)."""
  return "".join(f", {k}={v!r}" for k, v in hints.items() if v)


def _masked_load(cg, eqn, *invals):
  view, rest = _access(cg, eqn, invals)
  mask = rest.pop(0) if eqn.params["has_mask"] else None
  other = rest.pop(0) if eqn.params["has_other"] else None
  return cg.load(view, mask, other, cache=eqn.params.get("cache"), evict=eqn.params.get("evict"))


def _masked_swap(cg, eqn, *invals):
  view, rest = _access(cg, eqn, invals)
  mask = rest[0] if eqn.params["has_mask"] else None
  old = None
  if cg.is_used(eqn.outvars[0]):
    old = cg.load(view, mask, hint="old")
  cg.store(view, invals[1], mask, evict=eqn.params.get("evict"))
  return old if old is not None else invals[1]


def _fori_index(body, num_consts: int) -> bool:
  """Whether a loop body's first carry is an index that the body increments by one."""
  if len(body.outvars) == 0 or len(body.invars) <= num_consts:
    return False
  i_in, i_out = body.invars[num_consts], body.outvars[0]
  if i_in.aval.dtype != jnp.int32:   # Triton's range() counts in int32: others loop on a carry
    return False
  for eqn in body.eqns:
    if eqn.outvars and eqn.outvars[0] is i_out and eqn.primitive is lax.add_p:
      a, b = eqn.invars
      return (a is i_in and isinstance(b, ji.Literal) and b.val == 1) or \
             (b is i_in and isinstance(a, ji.Literal) and a.val == 1)
  return False


def _scan(cg, eqn, *invals):
  p = eqn.params
  # ft_in is a flat tree (consts, carry, xs); len() counts leaves.
  consts_spec, carry_spec, xs_spec = p["ft_in"].unpack()
  nc, ncarry, length = len(consts_spec), len(carry_spec), p["length"]
  body = p["jaxpr"]
  if len(xs_spec) or len(body.outvars) != ncarry:
    return _scan_arrays(cg, eqn, invals, nc, ncarry)
  consts, init = invals[:nc], invals[nc:]
  if ncarry and _fori_index(body, nc) and not p["reverse"]:
    # A fori_loop: a Triton for loop (static bounds when the start is a constant, which
    # lets Triton pipeline it fully).
    carry = [cg.materialize(v, "carry") for v in init[1:]]
    start = init[0].expr
    stop = str(int(start) + length) if re.fullmatch(r"-?\d+", start) else f"{start} + {length}"
    i = cg.fresh("i")
    cg.emit(f"for {i} in range({start}, {stop}):")
    cg.depth += 1
    new = cg.lower_jaxpr(body, body.consts, [*consts, Val(i, (), init[0].dtype), *carry])
    cg.assign(carry, new[1:])
    cg.depth -= 1
    end = cg.bind(stop if re.fullmatch(r"-?\d+", stop) else f"({stop})", (), init[0].dtype, "i_end")
    return [end, *carry]
  carry = [cg.materialize(v, "carry") for v in init]
  cg.emit(f"for _ in range({length}):")
  cg.depth += 1
  new = cg.lower_jaxpr(body, body.consts, [*consts, *carry])
  cg.assign(carry, new)
  cg.depth -= 1
  return carry


def _scan_arrays(cg, eqn, invals, nc: int, ncarry: int):
  """lax.scan over arrays: the xs and ys live in scratch buffers private to the program; step k
  reads row k of each x and writes row k of each y."""
  p, body = eqn.params, eqn.params["jaxpr"]
  consts, init, xs = invals[:nc], invals[nc:nc + ncarry], invals[nc + ncarry:]
  x_bufs = [cg.spill(x) for x in xs]
  y_bufs = [cg.spill(None, v.aval) for v in eqn.outvars[ncarry:]]
  carry = [cg.materialize(v, "carry") for v in init]
  k = cg.fresh("k")
  cg.emit(f"for {k} in range({p['length']}):")
  cg.depth += 1
  step = cg.bind(f"{p['length'] - 1} - {k}", (), jnp.int32, "step").expr if p["reverse"] else k
  x_k = [cg.load(movement.row(b, step), hint="x_k") for b in x_bufs]
  new = cg.lower_jaxpr(body, body.consts, [*consts, *carry, *x_k])
  for b, y in zip(y_bufs, new[ncarry:]):   # before the carries change: a y may be one of them
    cg.store(movement.row(b, step), y)
  cg.assign(carry, new[:ncarry])
  cg.depth -= 1
  ys = [cg.load(b, hint="ys") for b in y_bufs]
  if y_bufs:
    cg.emit("tl.debug_barrier()")
  return [*carry, *ys]


def _while(cg, eqn, *invals):
  p = eqn.params
  cn, bn = p["cond_nconsts"], p["body_nconsts"]
  cond, body = p["cond_jaxpr"], p["body_jaxpr"]
  cconsts, bconsts, init = invals[:cn], invals[cn:cn + bn], invals[cn + bn:]
  carry = [cg.materialize(v, "carry") for v in init]
  # lax.fori_loop with dynamic bounds: carry (i, upper, ...), cond i < upper, i += 1.
  if (len(carry) >= 2 and _fori_index(body, bn) and len(cond.eqns) == 1 and
      cond.eqns[0].primitive is lax.lt_p and cond.eqns[0].invars[0] is cond.invars[cn] and
      cond.eqns[0].invars[1] is cond.invars[cn + 1] and body.outvars[1] is body.invars[bn + 1]):
    i = cg.fresh("i")
    cg.emit(f"for {i} in range({carry[0].expr}, {carry[1].expr}):")
    cg.depth += 1
    new = cg.lower_jaxpr(body, body.consts, [*bconsts, Val(i, (), carry[0].dtype), *carry[1:]])
    cg.assign(carry[2:], new[2:])
    cg.depth -= 1
    cg.emit(f"{carry[0].expr} = tl.maximum({carry[0].expr}, {carry[1].expr})")
    return carry
  (c,) = cg.lower_jaxpr(cond, cond.consts, [*cconsts, *carry])
  flag = cg.materialize(c, "go")
  cg.emit(f"while {flag.expr}:")
  cg.depth += 1
  new = cg.lower_jaxpr(body, body.consts, [*bconsts, *carry])
  cg.assign(carry, new)
  (c,) = cg.lower_jaxpr(cond, cond.consts, [*cconsts, *carry])
  cg.assign([flag], [c])
  cg.depth -= 1
  return carry


def _cond(cg, eqn, index, *ops):
  branches = eqn.params["branches"]
  results = [Val(cg.fresh("r"), v.aval.shape, jnp.dtype(v.aval.dtype)) for v in eqn.outvars]
  idx = index.expr if index.dtype != jnp.bool_ else f"{index.expr}.to(tl.int32)"
  order = [1, 0] if len(branches) == 2 else list(range(len(branches)))
  for pos, k in enumerate(order):
    if pos == len(order) - 1:
      head = "else:"
    elif len(branches) == 2:
      head = f"if {idx} != 0:"
    else:
      head = f"{'if' if pos == 0 else 'elif'} {idx} == {k}:"
    cg.emit(head)
    cg.depth += 1
    before = len(cg.lines)
    br = branches[k]
    cg.assign(results, cg.lower_jaxpr(br, br.consts, list(ops)))
    if len(cg.lines) == before:
      cg.emit("pass")
    cg.depth -= 1
  return results


def _inline(param):
  def lower(cg, eqn, *invals):
    jx = eqn.params[param]
    return cg.lower_jaxpr(jx, jx.consts, list(invals))
  return lower


def _hint(cg, eqn, x):
  fn = "tl.multiple_of" if eqn.params["kind"] == "multiple_of" else "tl.max_contiguous"
  vals = list(eqn.params["values"])
  return cg.bind(f"{fn}({x.expr}, {vals if x.shape else vals[0]})", x.shape, x.dtype, x.expr)


def _debug_print(cg, eqn, *args):
  fmt = eqn.params["fmt"]
  prefix = fmt.split("{")[0].rstrip()
  cg.emit(f"tl.device_print({prefix!r}" + "".join(f", {a.expr}" for a in args) + ")")
  return []


def _check_message(err_tree) -> str:
  """The message of a checkify check (kept in the error's pytree metadata)."""
  try:
    err = jax.tree_util.tree_unflatten(err_tree, [False] * err_tree.num_leaves)
    for meta in err._metadata.values():
      node = meta.node_data()[1] if hasattr(meta, "node_data") else None
      if node and isinstance(node[-1], str):
        return node[-1]
  except Exception:  # noqa: BLE001  (the message is a courtesy; the check still runs)
    pass
  return "pl.debug_check failed"


def _check(cg, eqn, failed, *args):
  """checkify's check: its first operand is True when the check FAILED."""
  cg.has_checks = True
  cg.emit(f"tl.device_assert({failed.expr} == 0, {_check_message(eqn.params['err_tree'])!r})")
  return []


def scratch_ref(cg, aval, name: str, zeroed: bool = False, shared: bool = False) -> RefVal:
  """A Ref to a hidden global-memory buffer: one slice per concurrent program (scratch), or
  one for all (``shared``, pl.get_global). Scratch contents persist along the grid axes that
  run as loops inside a program, as in the interpreter."""
  shape = tuple(aval.shape)
  lanes = 1 if shared else cg.lanes
  ptr = cg.fresh(name)
  cg.hidden.append((ptr, (lanes,) + shape, jnp.dtype(aval.dtype), zeroed))
  cg.read_back.add(ptr)
  lane = "0" if shared else cg.lane
  dims = [RefDim(lane, 1, lanes, int(math.prod(shape)), kept=False)]
  dims += [RefDim("0", sz, sz, _stride(shape, d)) for d, sz in enumerate(shape)]
  return RefVal(ptr, jnp.dtype(aval.dtype), dims, name)


def _run_scoped(cg, eqn, *args):
  jx, n = eqn.params["jaxpr"], eqn.params["num_consts"]
  zeroed = eqn.params.get("zeroed") or (False,) * len(jx.invars)
  if any(zeroed):
    raise Unsupported("semaphores in pl.run_scoped")
  scratch = [scratch_ref(cg, v.aval.inner_aval, "scoped") for v in jx.invars[n:]]
  return cg.lower_jaxpr(jx, jx.consts, [*args, *scratch])


LOWERINGS = {
    ji.get_p: _get, ji.swap_p: _swap, ji.addupdate_p: _addupdate,
    prims.masked_load_p: _masked_load, prims.masked_swap_p: _masked_swap,
    prims.hint_p: _hint, prims.debug_print_p: _debug_print, prims.run_scoped_p: _run_scoped,
    ji.scan_p: _scan, ji.while_p: _while, ji.cond_p: _cond, ji.check_p: _check,
    ji.jit_p: _inline("jaxpr"), ji.closed_call_p: _inline("call_jaxpr"),
    ji.custom_jvp_call_p: _inline("call_jaxpr"), ji.custom_vjp_call_p: _inline("call_jaxpr"),
    ji.remat_p: _inline("jaxpr"), ji.copy_p: lambda cg, eqn, x: x,
    ji.optimization_barrier_p: lambda cg, eqn, *xs: list(xs),
}


# --- the kernel -----------------------------------------------------------------------------

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


def generate(params, compute_capability: int = 90) -> KernelSource:
  gm, jaxpr = params.grid_mapping, params.jaxpr
  name = _ident(params.name)
  if not name.strip("_"):
    name = "kernel"   # PTX has no identifier "_" (a body named `def _():`)
  if any(gm.scratch_zeroed):
    raise Unsupported(f"pallas_call {params.name}: semaphores are not supported by the Triton "
                      "backend; run it with interpret=True")
  tables = sched.block_index_tables(gm, partial=True)
  sched.check_block_ranges(gm, tables, params.name)
  schedule = gpu_schedule(params, tables)
  tiled = tiling.rewrite(params, bool(schedule.sequential))
  if tiled.grid_mapping is not gm:   # a new first grid axis over output tiles
    params, gm = tiled, tiled.grid_mapping
    schedule = gpu_schedule(params, sched.block_index_tables(gm, partial=True))
  params, jaxpr = tiled, tiled.jaxpr
  cg = Codegen(params.name, compute_capability)
  rank, nidx, nin = len(gm.grid), gm.num_index_operands, gm.num_inputs
  names = list(params.arg_names) or [f"ref{i}" for i in range(nidx + nin + gm.num_outputs)]
  ptrs = [cg.fresh(n) for n in names[:nidx + nin + gm.num_outputs]]
  in_avals = [ji.ShapedArray(a.shape, a.dtype) for a in gm.index_map_avals[rank:]] + \
      [bm.array_aval for bm in gm.block_mappings]
  signature = {p: "*" + SIGNATURE[jnp.dtype(a.dtype).name] for p, a in zip(ptrs, in_avals)}
  if compute_capability < 89 and any(a.dtype == jnp.float8_e4m3fn for a in in_avals):
    raise Unsupported(f"pallas_call {params.name}: float8_e4m3fn arrays need compute capability "
                      f"8.9 or newer (this target is sm_{compute_capability})")

  par, seq = schedule.parallel, schedule.sequential
  cg.emit(f"# grid {gm.grid}: axes {par} run as parallel programs"
          + (f", axes {seq} as loops inside each program" if seq else ""))
  ids = _program_ids(cg, gm, jaxpr, par, seq)
  refs = _operand_refs(cg, gm, params, ids, ptrs, names)
  invars = list(jaxpr.invars)
  for eff in jaxpr.effects:
    if isinstance(eff, (ji.ReadEffect, ji.AccumEffect)) and eff.input in invars:
      k = invars.index(eff.input) - rank
      if 0 <= k < len(refs):
        cg.read_back.add(refs[k].ptr)
  cg.lower_jaxpr(jaxpr, jaxpr.consts, ids + refs)

  if cg.max_numel > MAX_VALUE_ELEMENTS:
    raise Unsupported(
        f"pallas_call {params.name}: a value of {cg.max_numel} elements is too large for one Triton "
        f"program (at most {MAX_VALUE_ELEMENTS} fit its registers); use smaller blocks")
  launch = math.prod(gm.grid[a] for a in par) if par else 1
  warps, stages, chosen = _default_warps_stages(params, cg)
  for ptr, shape, dtype, _ in cg.hidden:
    signature[ptr] = "*" + SIGNATURE[jnp.dtype(dtype).name]
  header = f"@triton.jit\ndef {name}({', '.join(ptrs + [h[0] for h in cg.hidden])}):"
  source = PROLOGUE + "\n\n" + header + "\n" + "\n".join(cg.lines) + "\n"
  hidden = tuple((shape, dtype, zeroed) for _, shape, dtype, zeroed in cg.hidden)
  return KernelSource(name, source, signature, (launch, 1, 1), warps, stages, cg.has_checks, chosen,
                      hidden)


def _program_ids(cg, gm, jaxpr, par, seq):
  """Emits the grid indices of this program: the parallel axes decoded from the launch index,
  the sequential axes as loops. Returns one Val per grid axis."""
  rank = len(gm.grid)
  ids: list = [None] * rank
  if par:
    pid = cg.fresh("pid")
    cg.emit(f"{pid} = tl.program_id(0)")
    cg.lane, cg.lanes = pid, math.prod(gm.grid[a] for a in par)
    rest = pid
    # As in Pallas on Triton, the first grid axis varies fastest between neighbouring programs.
    # Along axes that set a loop's trip count (causal attention's query blocks), programs are
    # launched from the last index down: the longest programs start first, which shortens the
    # tail of the launch. Only the order changes, never a result.
    longest_first = sched.loop_count_axes(jaxpr, rank)
    for k, a in enumerate(par):
      n = cg.fresh(f"i{a}")
      last = k == len(par) - 1
      idx = f"{rest} % {gm.grid[a]}" if not last else f"{rest}"
      cg.emit(f"{n} = {gm.grid[a] - 1} - {idx}" if a in longest_first else f"{n} = {idx}")
      if not last:
        r = cg.fresh("rest")
        cg.emit(f"{r} = {rest} // {gm.grid[a]}")
        rest = r
      ids[a] = Val(n, (), jnp.dtype(jnp.int32))
  for a in seq:
    n = cg.fresh(f"i{a}")
    cg.emit(f"for {n} in range(0, {gm.grid[a]}):")
    cg.depth += 1
    ids[a] = Val(n, (), jnp.dtype(jnp.int32))
  return ids


def _operand_refs(cg, gm, params, ids, ptrs, names) -> list[RefVal]:
  """The kernel's Refs: index operands whole, block operands where their index maps put them
  for this program, then scratch and pl.get_global buffers."""
  rank, nidx = len(gm.grid), gm.num_index_operands
  refs = []
  for k in range(nidx):
    a = gm.index_map_avals[rank + k]
    refs.append(RefVal(ptrs[k], jnp.dtype(a.dtype),
                       [RefDim("0", s, s, _stride(a.shape, d)) for d, s in enumerate(a.shape)],
                       f"args[{k}]"))
  for k, bm in enumerate(gm.block_mappings):
    ptr = ptrs[nidx + k]
    jx = bm.index_map_jaxpr
    idx = cg.lower_jaxpr(jx, jx.consts, ids + refs[:nidx]) if bm.block_shape else []
    dims = []
    shape = bm.array_aval.shape
    for d, (bd, size) in enumerate(zip(bm.block_shape, shape)):
      i = idx[d]
      element = isinstance(bd, pc.Element)
      if element:
        start = i.expr if bd.padding[0] == 0 else f"{i.expr} - {bd.padding[0]}"
      else:
        start = _mul(i.expr, bd.block_size) if i.expr != "0" else "0"
      if start != "0" and not re.fullmatch(r"\w+", start):
        start = cg.bind(start, (), jnp.int32, f"{ptr}_start{d}").expr
      exact = (not element) and (size % bd.block_size == 0)
      dims.append(RefDim(start, bd.block_size, size, _stride(shape, d),
                         kept=not isinstance(bd, pc.Squeezed), exact=exact,
                         low=element and bd.padding[0] > 0))
    refs.append(RefVal(ptr, jnp.dtype(bm.array_aval.dtype), dims, bm.origin))
  for k, aval in enumerate(gm.scratch_avals):
    refs.append(scratch_ref(cg, aval.inner_aval, names[len(refs)] if len(refs) < len(names)
                            else f"scratch{k}"))
  for k, aval in enumerate(params.globals_avals):
    refs.append(scratch_ref(cg, aval.inner_aval, f"global{k}", zeroed=True, shared=True))
  return refs


def _stride(shape, d) -> int:
  return int(math.prod(shape[d + 1:]))


def _default_warps_stages(params, cg) -> tuple[int, int, bool]:
  cp = params.compiler_params
  warps = getattr(cp, "num_warps", None)
  stages = getattr(cp, "num_stages", None)
  if isinstance(cp, tuple):   # the {"triton": {...}} dict form, frozen
    d = dict(cp)
    t = dict(d.get("triton", ())) if "triton" in d else d
    warps, stages = t.get("num_warps", warps), t.get("num_stages", stages)
  chosen = stages is not None
  if warps is None:
    warps = max(1, min(8, pow2(cg.max_numel // 256)))
  if stages is None:
    stages = 3
  return int(warps), int(stages), chosen

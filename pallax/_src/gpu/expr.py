"""Typed expressions of generated GPU code (Triton and Gluon source), rendered once.

A node knows whether it is a literal (and which), a name or an expression, and its dtype and
shape; nothing reads generated text back. ``render`` writes Python source and parenthesizes by
precedence. Values are tensors whose shape is the logical shape rounded up to powers of two
(``padded``): lanes past the logical shape hold garbage that rules neutralise where it could leak.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp
import numpy as np


def pow2(n: int) -> int:
  return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class Expr:
  dtype: Any = None           # a numpy dtype; None for tokens that are not values
  shape: tuple = ()           # the logical shape
  bounds: tuple | None = None  # an integer name's known (lo, hi), every lane (see ``interval``)
  divisor: int = 1            # an integer name's known divisor, every lane (see ``divisor``)

  @property
  def padded(self) -> tuple[int, ...]:
    return tuple(pow2(d) for d in self.shape)

  @property
  def is_padded(self) -> bool:
    return self.padded != tuple(self.shape)

  @property
  def numel(self) -> int:
    return math.prod(self.padded)


@dataclasses.dataclass(frozen=True, eq=False)
class Lit(Expr):
  """A scalar constant: a Python bool, int or float (inf and NaN included)."""
  value: Any


@dataclasses.dataclass(frozen=True, eq=False)
class Name(Expr):
  name: str


@dataclasses.dataclass(frozen=True, eq=False)
class Token(Expr):
  """Source text that is not a value of the kernel: ``tl.float32``, ``[128, 64]``, ``'evict_first'``."""
  text: str


@dataclasses.dataclass(frozen=True, eq=False)
class Op(Expr):
  """A unary (``-x``, ``~x``) or binary (``a + b``) Python operator."""
  op: str
  args: tuple


@dataclasses.dataclass(frozen=True, eq=False)
class Call(Expr):
  fn: Any                     # a dotted name (str) or an Expr (a method: Attr)
  args: tuple = ()
  kwargs: tuple = ()          # ((name, Expr or Python value), ...)


@dataclasses.dataclass(frozen=True, eq=False)
class Attr(Expr):
  obj: Expr
  attr: str


@dataclasses.dataclass(frozen=True, eq=False)
class Subscript(Expr):
  """``obj[...]``: ``index`` is a tuple of ``slice(None)`` and ``None`` (new axes) or of Exprs."""
  obj: Expr
  index: tuple


@dataclasses.dataclass(frozen=True, eq=False)
class Seq(Expr):
  """A Python list of expressions, ``[a, b]`` (an argument list of inline assembly)."""
  items: tuple


# --- constructors that keep index arithmetic small ---------------------------------------

def literal(e) -> Any:
  """The Python value of a literal node (None if ``e`` is not one)."""
  return e.value if isinstance(e, Lit) else None


def is_zero(e) -> bool:
  return isinstance(e, Lit) and not isinstance(e.value, bool) and e.value == 0


def index_literal(n: int, like=None) -> Lit:
  """An integer constant of index arithmetic: int32, or int64 where it does not fit (or where
  ``like`` is int64: an address of an array of 2**31 elements or more)."""
  wide = not -2**31 <= int(n) < 2**31 or (like is not None and np.dtype(like.dtype) == np.int64)
  return Lit(int(n), dtype=np.dtype(np.int64 if wide else np.int32))


def _fold(a: Lit, b: Lit, value: int) -> Lit:
  return index_literal(value, a if np.dtype(a.dtype) == np.int64 else b)


def add(a: Expr, b: Expr) -> Expr:
  if is_zero(a):
    return b
  if is_zero(b):
    return a
  if isinstance(a, Lit) and isinstance(b, Lit) and isinstance(a.value, int) and isinstance(b.value, int):
    return _fold(a, b, a.value + b.value)
  return Op("+", (a, b), dtype=a.dtype, shape=broadcast_shapes(a.shape, b.shape))


def mul(a: Expr, k) -> Expr:
  """``a * k`` for an int or an Expr ``k``, folding 0 and 1."""
  k = index_literal(k, a) if isinstance(k, (int, np.integer)) else k
  if literal(k) == 1:
    return a
  if is_zero(k) or is_zero(a):
    return Lit(0, dtype=a.dtype)
  if isinstance(a, Lit) and isinstance(k, Lit):
    return _fold(a, k, a.value * k.value)
  return Op("*", (a, k), dtype=a.dtype, shape=broadcast_shapes(a.shape, k.shape))


def binary(op: str, a: Expr, b: Expr, dtype=None) -> Expr:
  return Op(op, (a, b), dtype=dtype if dtype is not None else a.dtype,
            shape=broadcast_shapes(a.shape, b.shape))


def call(fn: str, *args, dtype=None, shape=(), **kwargs) -> Call:
  return Call(fn, tuple(args), tuple(kwargs.items()), dtype=dtype, shape=tuple(shape))


def method(obj: Expr, name: str, *args, dtype=None, shape=None, **kwargs) -> Call:
  return Call(Attr(obj, name), tuple(args), tuple(kwargs.items()),
              dtype=obj.dtype if dtype is None else dtype,
              shape=obj.shape if shape is None else tuple(shape))


# --- value ranges of index arithmetic ----------------------------------------------------------

def interval(e) -> tuple[int, int] | None:
  """Bounds (lo, hi) that every lane of the integer expression ``e`` lies within, or None where
  they are unknown. Known: literals, ``tl.arange``, names bound with bounds (grid indices, loop
  indices, values bound from known expressions) and + - * // % of those. Lets index code leave
  out wrap-arounds and bounds checks it can prove never fire."""
  if not isinstance(e, Expr) or e.dtype is None or not np.issubdtype(np.dtype(e.dtype), np.integer):
    return None
  got = _interval(e)
  if got is None:
    return None
  info = np.iinfo(np.dtype(e.dtype))
  return got if info.min <= got[0] <= got[1] <= info.max else None   # it could wrap: unknown


def _interval(e):
  if isinstance(e, Lit):
    return None if isinstance(e.value, bool) else (int(e.value), int(e.value))
  if isinstance(e, Name):
    return e.bounds
  if isinstance(e, Subscript) and all(i is None or i == slice(None) for i in e.index):
    return interval(e.obj)   # new axes
  if isinstance(e, Call) and e.fn == "tl.arange":
    lo, hi = (literal(a) for a in e.args)
    return None if lo is None or hi is None else (lo, hi - 1)
  if isinstance(e, Op) and len(e.args) == 2:
    a, b = (interval(x) for x in e.args)
    if a is None or b is None:
      return None
    return _combine(e.op, a, b)
  return None


def divisor(e) -> int:
  """A number every lane of the integer expression ``e`` is a multiple of (0: ``e`` is 0; 1:
  none known). Known: literals, names bound with one (``pl.multiple_of``, values bound from
  known expressions), and + - * << of those."""
  if isinstance(e, Lit):
    return 1 if isinstance(e.value, bool) or not isinstance(e.value, (int, np.integer)) else abs(int(e.value))
  if isinstance(e, Name):
    return e.divisor
  if isinstance(e, Op) and len(e.args) == 2:
    a, b = (divisor(x) for x in e.args)
    if e.op in ("+", "-"):
      return math.gcd(a, b)
    if e.op == "*":
      return a * b
    if e.op == "<<" and isinstance(e.args[1], Lit):
      return a << b if a else 0
  return 1


def _combine(op: str, a, b):
  if op == "+":
    return (a[0] + b[0], a[1] + b[1])
  if op == "-":
    return (a[0] - b[1], a[1] - b[0])
  if op == "*":
    corners = [x * y for x in a for y in b]
    return (min(corners), max(corners))
  if op in ("//", "%") and a[0] >= 0 and b[0] == b[1] > 0:   # C and Python agree here
    k = b[0]
    return (a[0] // k, a[1] // k) if op == "//" else (0, min(k - 1, a[1]))
  return None


def broadcast_shapes(a: tuple, b: tuple) -> tuple:
  """The shape of ``a op b``. Lane masks are built at padded sizes (``arange(32) < 24``): where
  a logical and a padded shape meet, the logical one (the smaller) is the value's."""
  if not a or not b:
    return tuple(a or b)
  if len(a) != len(b):
    return tuple(a if len(a) > len(b) else b)
  return tuple(x if y == 1 else y if x == 1 else min(x, y) for x, y in zip(a, b))


def neutral(kind: str, dtype) -> Lit:
  """The identity of a reduction ``kind`` in ``dtype``: what padded lanes become before one."""
  dtype = np.dtype(dtype)
  i32 = lambda n: Lit(n, dtype=np.dtype(np.int32))
  if kind in ("sum", "or", "xor"):
    return i32(0)
  if kind == "and":   # all bits set
    if dtype == np.bool_ or jnp.issubdtype(dtype, jnp.signedinteger):
      return i32(1 if dtype == np.bool_ else -1)
    return Lit(int(np.iinfo(dtype).max), dtype=dtype)
  if kind == "prod":
    return i32(1)
  if jnp.issubdtype(dtype, jnp.floating):
    return Lit(-np.inf if kind == "max" else np.inf, dtype=np.dtype(np.float32))
  if dtype == np.bool_:
    return i32(0 if kind == "max" else 1)
  info = np.iinfo(dtype)
  return Lit(int(info.min if kind == "max" else info.max), dtype=dtype)


def untyped(lit: Lit) -> Token:
  """A literal as a bare Python constant (+-inf as the prologue's INF): ``where`` keeps the
  dtype of the value it is mixed with."""
  return Token(literal_text(lit.value))


# --- rendering ---------------------------------------------------------------------------------

# Python's precedence, loosest first; comparisons do not chain in generated code.
_COMPARE = ("<", "<=", ">", ">=", "==", "!=")
_PREC = {**{op: 6 for op in _COMPARE}, "|": 7, "^": 8, "&": 9, "<<": 10, ">>": 10, "+": 11,
         "-": 11, "*": 12, "/": 12, "//": 12, "%": 12}
_UNARY, _POWER, _ATOM = 13, 14, 16

_NAMED_FLOATS = {math.inf: "INF", -math.inf: "-INF"}


def literal_text(v) -> str:
  """A Python constant as generated code writes it (inf and NaN as the prologue's INF, NAN)."""
  return _literal_text(v)[0]


def _literal_text(v) -> tuple[str, int]:
  if isinstance(v, (bool, np.bool_)):
    return ("True" if v else "False"), _ATOM
  if isinstance(v, (float, np.floating)):
    if math.isnan(v):
      return "NAN", _ATOM
    if v in _NAMED_FLOATS:
      text = _NAMED_FLOATS[v]
    else:
      text = repr(float(v))
  else:
    text = str(int(v))
  return text, (_UNARY if text.startswith("-") else _ATOM)


# dtype -> its name in triton.language (and Gluon's gl): ``{ns}.{name}``.
DTYPE_NAMES = {
    "float32": "float32", "float16": "float16", "bfloat16": "bfloat16", "float64": "float64",
    "float8_e4m3fn": "float8e4nv", "float8_e5m2": "float8e5", "int8": "int8", "int16": "int16",
    "int32": "int32", "int64": "int64", "uint8": "uint8", "uint16": "uint16", "uint32": "uint32",
    "uint64": "uint64", "bool": "int1",
    # sub-byte integers take a byte in registers (gpu/subbyte.py); in memory they are packed,
    # so they have no entry in SIGNATURE: a backend reads them through its own code or refuses
    "int4": "int8", "uint4": "uint8", "int2": "int8", "uint2": "uint8",
}


# Triton's names of kernel parameter types (``*fp16``: a pointer to float16).
SIGNATURE = {
    "float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64",
    "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5", "int8": "i8", "int16": "i16",
    "int32": "i32", "int64": "i64", "uint8": "u8", "uint16": "u16", "uint32": "u32",
    "uint64": "u64", "bool": "i1",
}


# Types the Gluon backend holds as their bits only, in memory and in registers between a load
# and a store (MMA scales: gluon/scales.py refuses any other use of their values).
GLUON_BITS = {"float8_e8m0fnu": "uint8"}


def dtype_name(dtype, ns: str = "tl") -> str:
  name = np.dtype(dtype).name
  if ns == "gl" and name in GLUON_BITS:
    return f"gl.{GLUON_BITS[name]}"
  if name not in DTYPE_NAMES:
    raise NotImplementedError(f"dtype {name} is not supported by the GPU backends")
  return f"{ns}.{DTYPE_NAMES[name]}"


def bare_literal(e: Lit) -> bool:
  """Whether a literal means itself in generated code: Python's ints are int32 there, its floats
  float32. Others are written as typed scalars (``tl.full([], 5, tl.int8)``)."""
  v, dtype = e.value, np.dtype(e.dtype)
  if dtype == np.bool_:
    return True
  if dtype == np.float32:
    return math.isfinite(v)
  return dtype == np.int32 and -2**31 <= int(v) < 2**31


def check_fits(e: Lit):
  dtype = np.dtype(e.dtype)
  if np.issubdtype(dtype, np.integer) and not isinstance(e.value, bool):
    info = np.iinfo(dtype)
    if not info.min <= e.value <= info.max:   # a typed constant would wrap silently
      raise ValueError(f"the constant {e.value} does not fit {dtype.name}")


def parts(e) -> list:
  """The expressions ``e`` is made of (its operands, callee, object, indices), one level down."""
  if isinstance(e, Op):
    return list(e.args)
  if isinstance(e, Call):
    return [e.fn, *e.args, *(v for _, v in e.kwargs)]
  if isinstance(e, Attr):
    return [e.obj]
  if isinstance(e, Subscript):
    return [e.obj, *e.index]
  if isinstance(e, Seq):
    return list(e.items)
  return []


def names(e) -> set[str]:
  """The variables expression ``e`` reads."""
  out, todo = set(), [e]
  while todo:
    x = todo.pop()
    if isinstance(x, Name):
      out.add(x.name)
    elif isinstance(x, Expr):
      todo += parts(x)
  return out


@dataclasses.dataclass(frozen=True)
class Renderer:
  """Writes expressions as Python source for one language namespace (``tl`` or ``gl``)."""
  ns: str = "tl"

  def __call__(self, e, prec: int = 0) -> str:
    """Source of ``e``, parenthesized where a context of precedence ``prec`` needs it."""
    text, own = self._render(e)
    return f"({text})" if own < prec else text

  def _render(self, e) -> tuple[str, int]:
    if not isinstance(e, Expr):
      return repr(e), _ATOM                          # a Python value: a keyword argument
    if isinstance(e, Lit):
      check_fits(e)
      text, prec = _literal_text(e.value)
      if bare_literal(e):
        return text, prec
      return f"{self.ns}.full([], {text}, {dtype_name(e.dtype, self.ns)})", _ATOM
    if isinstance(e, Name):
      return e.name, _ATOM
    if isinstance(e, Token):
      return e.text, _ATOM
    if isinstance(e, Op):
      return self._op(e)
    if isinstance(e, Call):
      fn = e.fn if isinstance(e.fn, str) else self(e.fn, _ATOM)
      args = [self(a) for a in e.args] + [f"{k}={self(v)}" for k, v in e.kwargs]
      return f"{fn}({', '.join(args)})", _ATOM
    if isinstance(e, Attr):
      return f"{self(e.obj, _ATOM)}.{e.attr}", _ATOM
    if isinstance(e, Subscript):
      return f"{self(e.obj, _ATOM)}[{', '.join(self._index(i) for i in e.index)}]", _ATOM
    if isinstance(e, Seq):
      return f"[{', '.join(self(x) for x in e.items)}]", _ATOM
    raise TypeError(f"not an expression: {e!r}")

  def _index(self, i) -> str:
    if i is None:
      return "None"
    return ":" if isinstance(i, slice) else self(i)

  def _op(self, e: Op) -> tuple[str, int]:
    if len(e.args) == 1:
      return f"{e.op}{self(e.args[0], _UNARY)}", _UNARY
    p = _PREC[e.op]
    a, b = e.args
    left = p + 1 if e.op in _COMPARE else p        # a - b - c is (a - b) - c
    return f"{self(a, left)} {e.op} {self(b, p + 1)}", p

"""Statements kept as data until a function is put together: a statement that binds a pure
expression to a new variable (``Binding``) is left out where nothing reads that variable, and
the named layouts its expression takes are then not declared either.

What a statement reads is known as data: a ``Binding``'s expression tree names the variables
and layouts it takes (``ex.names``; a layout's name is a ``LayoutName``); the writer notes what
every other statement reads as it renders it, and what the Refs written as text read (an
accumulator's variable: ``Writer.acc``). Nothing is read back from the generated text.
"""
from __future__ import annotations

from pallax._src.gpu import expr as ex

# Calls that do something besides computing a value: a statement binding one is always kept.
_EFFECTS = ("atomic", "asm", "store", "async", "mbarrier", "wait", "arrive", "fence", "print",
            "assert", "barrier")


class LayoutName(str):
  """The name of a named layout (``L3``), knowing its layout."""
  layout: object

  def __new__(cls, name: str, layout):
    text = super().__new__(cls, name)
    text.layout = layout
    return text


class Binding(str):
  """The statement ``name = expression`` of a pure expression: the variables and layouts the
  expression takes, and its block depth."""
  name: str
  reads: frozenset
  layouts: frozenset
  depth: int

  def __new__(cls, text: str, name: str, e: ex.Expr, depth: int):
    line = super().__new__(cls, text)
    line.name, line.reads, line.layouts, line.depth = name, frozenset(ex.names(e)), \
        frozenset(layouts(e)), depth
    return line


def _walk(e: ex.Expr):
  todo = [e]
  while todo:
    x = todo.pop()
    yield x
    todo += ex.parts(x)


def pure(e: ex.Expr) -> bool:
  """Whether computing ``e`` does nothing but compute a value."""
  for x in _walk(e):
    if isinstance(x, ex.Call):
      fn = x.fn if isinstance(x.fn, str) else getattr(x.fn, "attr", "")
      if any(word in fn for word in _EFFECTS):
        return False
  return True


def layouts(e: ex.Expr) -> set:
  """The named layouts expression ``e`` takes."""
  return {x.text.layout for x in _walk(e) if isinstance(x, ex.Token) and isinstance(x.text, LayoutName)}


def live(functions: list[tuple[list, set]], reads: set) -> list[tuple[list, set]]:
  """Each function (its statements, the layouts its other statements name) without the
  ``Binding``s nothing reads: neither a statement that is not a binding (``reads``) nor a
  binding that is read. A block left with no statement gets ``pass``. Returns each function's
  statements and the layouts to declare in it."""
  bindings = {line.name: line for lines, _ in functions for line in lines if isinstance(line, Binding)}
  read, todo = set(), [n for n in reads if n in bindings]
  while todo:
    n = todo.pop()
    if n not in read:
      read.add(n)
      todo += [m for m in bindings[n].reads if m in bindings]
  out = []
  for lines, named in functions:
    kept = _without_dead(lines, read)
    out.append((kept, set(named).union(*(b.layouts for b in kept if isinstance(b, Binding)))))
  return out


def _depth(line: str) -> int:
  return (len(line) - len(line.lstrip(" "))) // 4


def _is_statement(line: str, read: set) -> bool:
  return bool(line.strip()) and not line.lstrip().startswith("#") and not (
      isinstance(line, Binding) and line.name not in read)


def _without_dead(lines: list, read: set) -> list:
  """``lines`` without the bindings whose variable is not in ``read``; where one was the only
  statement of its block (the statement before it opens a block, and the next is outside),
  ``pass``."""
  out = []
  for k, line in enumerate(lines):
    if not isinstance(line, Binding) or line.name in read:
      out.append(line)
      continue
    header = next((x for x in reversed(out) if _is_statement(x, read)), None)
    after = next((x for x in lines[k + 1:] if _is_statement(x, read)), None)
    opens = header is not None and header.rstrip().endswith(":") and _depth(header) < line.depth
    if opens and (after is None or _depth(after) < line.depth):
      out.append("    " * line.depth + "pass")
  return out

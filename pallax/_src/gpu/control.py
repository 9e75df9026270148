"""Structured control flow as both GPU backends write it: counted loops, repeated bodies and
while loops over named carries, conditionals (``lax.cond``, ``lax.switch``), and the masks of
padded lanes.

A backend makes the carries (``gen.materialize``: a fresh variable holding a value, in the type
or layout its language needs) and the index variable (with the bounds it knows), then calls
these; the loop and ``if`` statements, the carries' and results' assignments (the backend's
``gen.assign``) and the values after the loop are written here once.
"""
from __future__ import annotations

import contextlib

import numpy as np

from pallax._src.gpu import expr as ex

I32 = np.dtype(np.int32)
BOOL = np.dtype(np.bool_)


def fori_loop(gen, body, consts, index: ex.Name, start: ex.Expr, length: int, carry: list,
              assign=None) -> list:
  """``for index in range(start, start + length): carry = body(*consts, index, *carry)[1:]``
  (``lax.fori_loop`` as a scan whose first carry is the index); returns the scan's results:
  the index past the end, then the carries. ``assign(carry, new)`` (default ``gen.assign``)
  writes the carries' reassignment: a backend whose carries may be Refs passes its own."""
  stop = ex.add(start, ex.Lit(int(length), dtype=I32))
  gen.emit_scalar(f"for {index.name} in range({gen.render(start)}, {gen.render(stop)}):")
  with _block(gen):
    # The body's first result, the next index, is the loop's own business.
    new = gen.lower_jaxpr(body, [*consts, index, *carry], unused_outputs=(0,))
    (assign or gen.assign)(carry, new[1:])
  return [gen.bind(stop, "i_end"), *carry]


@contextlib.contextmanager
def _block(gen):
  """The body of the block just opened, one level deeper; one with no statement (a thread
  with nothing to do in a loop) gets ``pass``."""
  start = len(gen.lines)
  gen.depth += 1
  yield
  if not any(line.strip() and not line.lstrip().startswith("#") for line in gen.lines[start:]):
    gen.emit_scalar("pass")
  gen.depth -= 1


def repeat(gen, body, consts, length: int, carry: list, assign=None) -> list:
  """``for _ in range(length): carry = body(*consts, *carry)`` (a scan over no arrays)."""
  gen.emit_scalar(f"for _ in range({length}):")
  with _block(gen):
    (assign or gen.assign)(carry, gen.lower_jaxpr(body, [*consts, *carry]))
  return carry


def while_loop(gen, cond, body, cond_consts, body_consts, carry: list, assign=None) -> list:
  """``go = cond(carry); while go: carry = body(carry); go = cond(carry)``: the flag is a carry
  like the others."""
  (go,) = gen.lower_jaxpr(cond, [*cond_consts, *carry])
  flag = gen.materialize(go, "go")
  gen.emit_scalar(f"while {flag.name}:")
  gen.depth += 1
  (assign or gen.assign)(carry, gen.lower_jaxpr(body, [*body_consts, *carry]))
  (go,) = gen.lower_jaxpr(cond, [*cond_consts, *carry])
  gen.assign([flag], [go])
  gen.depth -= 1
  return carry


def branch_order(n: int) -> list[int]:
  """The order in which ``cond`` writes the branches of a ``lax.cond``/``lax.switch`` of ``n``
  branches (a backend that analyses the branches before writing them visits them in it):
  ``if index != 0: branch 1 else: branch 0`` for two (``lax.cond(pred, true_fn, false_fn)``
  reads as written), ``if index == 0: ... elif ...: ... else: branch n-1`` for more."""
  return [1, 0] if n == 2 else list(range(n))


def static_branch(index: ex.Expr, n: int) -> int | None:
  """The branch taken when the index is known where the code is written (a literal: say a
  Mosaic GPU thread's own ``pl.when``), clamped as ``lax.switch`` clamps; None: decided at run
  time."""
  if n == 1:
    return 0
  if isinstance(index, ex.Lit):
    return int(np.clip(int(index.value), 0, n - 1))
  return None


def cond(gen, index: ex.Expr, branches, ops, avals_out, each_branch=contextlib.nullcontext,
         results=None) -> list:
  """``results = branches[index](*ops)`` as an ``if``/``elif``/``else`` chain over fresh result
  variables (a branch that writes nothing is ``pass``; an empty ``else``, as ``pl.when``'s, is
  left out). A known index lowers its branch alone. ``each_branch()``: a context manager around
  the writing of each branch (for a backend that follows some state along the code it writes);
  ``results``: the result variables, where the backend made them (with facts of its own)."""
  k = static_branch(index, len(branches))
  if k is not None:
    return gen.lower_jaxpr(branches[k], list(ops))
  if results is None:
    results = [gen.fresh_name("r", a.dtype, a.shape) for a in avals_out]
  if index.dtype == BOOL:
    index = ex.method(index, "to", ex.Token(ex.dtype_name(I32, gen.render.ns)), dtype=I32)
  order = branch_order(len(branches))
  for pos, k in enumerate(order):
    if pos == len(order) - 1:
      head = "else:"
    elif len(order) == 2:
      head = f"if {gen.render(ex.binary('!=', index, ex.Lit(0, dtype=I32), dtype=BOOL))}:"
    else:
      test = ex.binary("==", index, ex.Lit(k, dtype=I32), dtype=BOOL)
      head = f"{'elif' if pos else 'if'} {gen.render(test)}:"
    with each_branch():
      _branch(gen, head, lambda k=k: gen.assign(results, gen.lower_jaxpr(branches[k], list(ops))),
              optional=pos == len(order) - 1)
  return results


def _branch(gen, head: str, write, optional: bool):
  """``head`` and the statements ``write()`` writes beneath it; none: ``pass``, or (``optional``:
  an ``else``) nothing at all."""
  gen.emit_scalar(head)
  start = len(gen.lines)
  gen.depth += 1
  write()
  if len(gen.lines) == start:
    if optional:
      del gen.lines[start - 1:]
    else:
      gen.emit_scalar("pass")
  gen.depth -= 1


def valid_lanes(shape, dims, index_along) -> ex.Expr | None:
  """Whether each lane of a tile of logical ``shape`` (held padded to powers of two) lies inside
  it along ``dims``; ``index_along(d)``: the backend's index of each lane along dimension ``d``
  (called only for padded dimensions). None: none of ``dims`` is padded."""
  cond = None
  for d in dims:
    if ex.pow2(shape[d]) == shape[d]:
      continue
    inside = ex.binary("<", index_along(d), ex.Lit(int(shape[d]), dtype=I32), dtype=BOOL)
    cond = inside if cond is None else ex.binary("&", cond, inside, dtype=BOOL)
  return cond

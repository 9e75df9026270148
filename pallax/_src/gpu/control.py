"""Structured control flow as both GPU backends write it: counted loops, repeated bodies and
while loops over named carries, and the masks of padded lanes.

A backend makes the carries (``gen.materialize``: a fresh variable holding a value, in the type
or layout its language needs) and the index variable (with the bounds it knows), then calls
these; the loop statements, the carries' reassignment at the end of each iteration (the
backend's ``gen.assign``) and the values after the loop are written here once.
"""
from __future__ import annotations

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
  gen.emit(f"for {index.name} in range({gen.render(start)}, {gen.render(stop)}):")
  gen.depth += 1
  # The body's first result, the next index, is the loop's own business.
  new = gen.lower_jaxpr(body, [*consts, index, *carry], unused_outputs=(0,))
  (assign or gen.assign)(carry, new[1:])
  gen.depth -= 1
  return [gen.bind(stop, "i_end"), *carry]


def repeat(gen, body, consts, length: int, carry: list, assign=None) -> list:
  """``for _ in range(length): carry = body(*consts, *carry)`` (a scan over no arrays)."""
  gen.emit(f"for _ in range({length}):")
  gen.depth += 1
  (assign or gen.assign)(carry, gen.lower_jaxpr(body, [*consts, *carry]))
  gen.depth -= 1
  return carry


def while_loop(gen, cond, body, cond_consts, body_consts, carry: list, assign=None) -> list:
  """``go = cond(carry); while go: carry = body(carry); go = cond(carry)``: the flag is a carry
  like the others."""
  (go,) = gen.lower_jaxpr(cond, [*cond_consts, *carry])
  flag = gen.materialize(go, "go")
  gen.emit(f"while {flag.name}:")
  gen.depth += 1
  (assign or gen.assign)(carry, gen.lower_jaxpr(body, [*body_consts, *carry]))
  (go,) = gen.lower_jaxpr(cond, [*cond_consts, *carry])
  gen.assign([flag], [go])
  gen.depth -= 1
  return carry


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

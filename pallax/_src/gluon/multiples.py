"""What a scalar integer expression of the kernel is known to be a multiple of, from how it
was computed (``i * 128``, ``a * 64 + b * 128``, a literal), for views that need it proven:
a TMEM column slice from a run-time start is written as an index into equal chunks
(``blackwell.tmem_view``), which is exact only if the start is a multiple of the chunk."""
from __future__ import annotations

import math

import numpy as np

from pallax._src.gpu import expr as ex

ANY = 1 << 30   # zero: a multiple of everything


def known_multiple(e, names: dict) -> int:
  """The largest factor of ``e`` proven (1 if none); ``names``: what the bound names are."""
  if isinstance(e, ex.Lit):
    if not isinstance(e.value, (int, np.integer)) or isinstance(e.value, bool):
      return 1
    return abs(int(e.value)) or ANY
  if isinstance(e, ex.Name):
    return names.get(e.name, 1)
  if isinstance(e, ex.Op) and len(e.args) == 2 and e.op in ("*", "+", "-"):
    a, b = (known_multiple(x, names) for x in e.args)
    return min(a * b, ANY) if e.op == "*" else math.gcd(a, b)
  return 1


def record(names: dict, name, e) -> None:
  """Notes what ``name`` (just bound to ``e``) is a multiple of."""
  if isinstance(name, ex.Name) and name is not e and np.issubdtype(name.dtype, np.integer):
    k = known_multiple(e, names)
    if k > 1:
      names[name.name] = k

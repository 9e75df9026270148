"""The operand layout of Ref-access primitives, decoded in one place.

Every primitive that reads or writes a Ref through an indexer takes its operands as
``(ref, *values, *indexer leaves, [mask], [other])``: ``values`` are the operands the access
combines with memory (a stored value; an atomic's ``cmp`` and ``val``), the leaves flatten the
chain of ``.at[...]`` views and the final index (the ``tree`` param unflattens them), and the
params ``has_mask`` / ``has_other`` say whether a mask and a fill value follow. Checks, the
interpreter and the code generators read accesses through ``split``; a primitive defined
elsewhere (the Triton module's atomics) registers its layout next to its definition.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from pallax._src import jax_internals as ji
from pallax._src import primitives as prims


@dataclasses.dataclass(frozen=True)
class Layout:
  values: int    # operands between the Ref and the indexer leaves
  verb: str      # for error messages: "read from", "write to", ...


@dataclasses.dataclass(frozen=True)
class Access:
  """One access, decoded: the Ref, the values it combines with memory, the chain of indexers
  (views first, the access's own index last), and the optional mask and fill value."""
  ref: Any
  values: tuple
  transforms: tuple
  mask: Any = None
  other: Any = None


_LAYOUTS: dict = {}   # primitive -> Layout; filled at import time, like JAX's rule tables


def register(prim, values: int, verb: str) -> None:
  """Declares ``prim`` a Ref access with ``values`` operands before its indexer leaves."""
  _LAYOUTS[prim] = Layout(values, verb)


register(ji.get_p, 0, "read from")
register(ji.swap_p, 1, "write to")
register(ji.addupdate_p, 1, "update of")
register(prims.masked_load_p, 0, "read from")
register(prims.masked_swap_p, 1, "write to")


def primitives():
  """The registered access primitives (a live view: ``prim in primitives()``)."""
  return _LAYOUTS.keys()


def layout(prim) -> Layout | None:
  return _LAYOUTS.get(prim)


def is_access(eqn) -> bool:
  return eqn.primitive in _LAYOUTS


def verb(eqn) -> str:
  return _LAYOUTS[eqn.primitive].verb


def leaf_span(eqn) -> slice:
  """Where the indexer leaves sit among ``eqn``'s operands."""
  first = 1 + _LAYOUTS[eqn.primitive].values
  return slice(first, first + eqn.params["tree"].num_leaves)


def split(eqn, vals) -> Access:
  """Decodes ``vals`` (one per operand of the access ``eqn``: values, Vars or anything else)."""
  vals = list(vals)
  span = leaf_span(eqn)
  transforms = tuple(ji.tree_util.tree_unflatten(eqn.params["tree"], vals[span]))
  rest = vals[span.stop:]
  mask = rest.pop(0) if eqn.params.get("has_mask") else None
  other = rest.pop(0) if eqn.params.get("has_other") else None
  return Access(vals[0], tuple(vals[1:span.start]), transforms, mask, other)


def with_leaves(eqn, vals, leaves) -> list:
  """``vals`` with the indexer leaves replaced by ``leaves``."""
  vals = list(vals)
  vals[leaf_span(eqn)] = list(leaves)
  return vals

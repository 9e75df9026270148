"""The ``pallas_call`` primitive: its parameters (``Params``) and abstract evaluation.

Its rules live by concern: ``autodiff.py`` (JVP, partial evaluation, transpose), ``batching.py``
(vmap), ``dispatch.py`` (which executor runs a call: eager, lowered for a backend, interpreted).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any


from pallax._src import jax_internals as ji
from pallax._src.grid_mapping import GridMapping


# --- the primitive ---------------------------------------------------------------------------

pallas_call_p = ji.Primitive("pallas_call")
pallas_call_p.multiple_results = True


@dataclasses.dataclass(frozen=True)
class Params:
  """Everything a backend needs besides the operands (hashable: jaxprs hash by identity)."""
  jaxpr: Any
  grid_mapping: GridMapping
  name: str
  interpret: Any
  debug: bool
  input_output_aliases: tuple[tuple[int, int], ...]
  compiler_params: Any
  cost_estimate: Any
  backend: str | None
  globals_avals: tuple = ()
  arg_names: tuple[str, ...] = ()   # the kernel's parameter names (for generated code)
  threads: Any = None   # a Mosaic GPU kernel's cluster and thread axes (mosaic_gpu.core.ThreadInfo)
  jvp_of: Any = None    # a JVP call: (the primal call's Params, its operand count), for linearize

  @property
  def out_avals(self):
    return tuple(bm.array_aval for bm in self.grid_mapping.block_mappings_output)


def _abstract_eval(*avals, params: Params):
  return list(params.out_avals)


pallas_call_p.def_abstract_eval(_abstract_eval)
pallas_call_p.def_impl(functools.partial(ji.dispatch.apply_primitive, pallas_call_p))

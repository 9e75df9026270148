"""The ``pallas_call`` primitive: its parameters (``Params``) and abstract evaluation.

Its rules live by concern: ``autodiff.py`` (JVP, partial evaluation, transpose), ``batching.py``
(vmap), ``dispatch.py`` (which executor runs a call: eager, lowered for a backend, interpreted).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax


from pallax._src import backends
from pallax._src import jax_internals as ji
from pallax._src.grid_mapping import GridMapping
from pallax._src.interpret import symbolic


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
  peers: Any = None     # on a GPU, the operands that give the kernel its peers' addresses and its
                        # mesh coordinates (gpu.peers.Exchange), once they are added

  @property
  def out_avals(self):
    return tuple(bm.array_aval for bm in self.grid_mapping.block_mappings_output)


def _effects(params: Params) -> set:
  """Where the interpreter runs the kernel, a host callback that may raise (a failed check) is an
  effect. It keeps ``jax.jit`` from calling the compiled function through its C++ fast path, which
  reports a failed callback as a ValueError that no hook can give its class back (errors.py);
  calls go through Python instead (some microseconds a call). A kernel a GPU backend runs has no
  effect. Cheap: choosing a backend traces nothing."""
  if symbolic.symbolic(params):   # interpreted without host callbacks (interpret/symbolic.py)
    return set()
  if backends.choose(params, jax.default_backend()) is not None:
    return set()
  return {ji.debug_effect}


def _abstract_eval(*avals, params: Params):
  return list(params.out_avals), _effects(params)


pallas_call_p.def_effectful_abstract_eval(_abstract_eval)
pallas_call_p.def_impl(functools.partial(ji.dispatch.apply_primitive, pallas_call_p))

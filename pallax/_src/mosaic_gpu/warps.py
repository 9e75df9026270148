"""Per-warp code inside a warpgroup: ``plgpu.warp_map`` and ``plgpu.WarpMesh``.

A ``plgpu`` thread is a warpgroup of 4 warps that run its code together. ``warp_map(f)`` forks
it: each warp runs ``f(warp_id)`` on its own (warp ids 0..3), and the warpgroup goes on once
all four finished (a join). ``pl.core_map(plgpu.WarpMesh(axis_name=...))`` and
``pl.kernel(..., mesh=plgpu.WarpMesh(...))`` are the same fork, the warp id read with
``lax.axis_index(axis_name)``.

What a warp body may do is what JAX's Mosaic GPU lowering allows under warp semantics: it
computes with scalars only (a warp holds no register tensors), may close over scalars and Refs
only, and issues copies, barrier arrivals and waits, scalar loads and stores, semaphores; a
``wgmma`` is a warpgroup operation, refused here. These are checked when the body is traced,
with JAX's words ("Can only close over scalars and Refs", "Can only load scalars").

The fork is the primitive ``warp_map_p``: its body is a jaxpr over the closed-over values and
the warp id (the id is an argument, not an ``axis_index``, so the kernel's jaxpr type-checks
with ``jax_enable_checks`` and the Gluon backend can lower each warp with its id a literal).
Its meaning, with per-warp barrier phases, is in ``warp_semantics.py``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import ClassVar

import jax
import jax.numpy as jnp

from pallax._src import backends
from pallax._src import core as pc
from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src import primitives as prims
from pallax._src.mosaic_gpu import primitives as mp

NUM_WARPS = 4   # warps per warpgroup


@dataclasses.dataclass(frozen=True, kw_only=True)
class WarpMesh:
  """The 4 warps of a warpgroup as a mesh of one axis, ``axis_name`` (``pl.core_map`` over it
  runs per-warp code, as ``plgpu.warp_map`` does)."""
  axis_name: Hashable
  _NUM_WARPS_PER_WARPGROUP: ClassVar[int] = NUM_WARPS

  @property
  def shape(self) -> dict:
    return {self.axis_name: NUM_WARPS}

  def run_per_warp(self, body, out_type=(), scratch_types=()):
    """``pl.kernel(body, mesh=self)``: a function that runs ``body()`` in each warp."""
    if jax.tree.leaves(out_type) or jax.tree.leaves(scratch_types):
      raise NotImplementedError(
          "pl.kernel(mesh=plgpu.WarpMesh(...)) with out_type or scratch_types: per-warp code "
          "writes the Refs it closes over; allocate scratch around it with pl.run_scoped")

    def call(*operands):
      if operands:
        raise TypeError("a pl.kernel over a plgpu.WarpMesh takes no operands: its body closes "
                        "over the Refs it uses")
      map_warps(lambda _: body(), self.axis_name)
      return ()
    return call


def warp_map(f, /) -> None:
  """Runs ``f(warp_id)`` in each warp of the warpgroup (``warp_id`` in 0..3), then joins."""
  map_warps(f, _WarpAxis())


class _WarpAxis:
  """The warp axis of a ``warp_map`` (a name nobody else uses, as in JAX)."""

  def __repr__(self):
    return "warp"


warp_map_p = ji.Primitive("warp_map")
warp_map_p.multiple_results = True


def _warp_map_abstract_eval(*args, jaxpr, num_consts, axis_name):
  return [], {mp.mosaic_effect} | prims.body_effects(jaxpr, num_consts)


warp_map_p.def_effectful_abstract_eval(_warp_map_abstract_eval)
backends.register_kernel_primitives("mosaic_gpu", (warp_map_p,))


def map_warps(f, axis_name) -> None:
  """Traces ``f(warp_id)`` (the warp axis bound, for ``lax.axis_index``/``lax.axis_size``),
  checks it, and binds ``warp_map_p``."""
  outer = pc.innermost_grid_env()
  where = ji.current_user_frame()

  def body(warp_id):
    env = outer
    if env is not None:   # lax.axis_index(axis_name) is the warp id, as a grid axis's is its id
      env = dataclasses.replace(env, ids=(*env.ids, warp_id), sizes=(*env.sizes, NUM_WARPS),
                                names=(*env.names, axis_name))
      with pc.grid_env(env):
        f(warp_id)
    else:
      f(warp_id)
    return []

  jaxpr, _, consts = ji.trace_to_jaxpr(body, [ji.ShapedArray((), jnp.int32)],
                                       name=getattr(f, "__name__", "warp_map"),
                                       axes=[(axis_name, NUM_WARPS)])
  check_body(jaxpr, consts, where)
  warp_map_p.bind(*consts, jaxpr=jaxpr, num_consts=len(consts), axis_name=axis_name)


# --- what a warp body may do ------------------------------------------------------------------

_WARPGROUP_ONLY = {
    mp.wgmma_p: "plgpu.wgmma (a warpgroup's matrix product)",
    mp.wgmma_wait_p: "plgpu.wgmma_wait",
    mp.set_max_registers_p: "plgpu.set_max_registers (a warpgroup's register budget)",
}


def _at(eqn, where) -> str:
  line = ji.user_frame(eqn.source_info) or where
  return f" (at {line})" if line else ""


def check_body(jaxpr, consts, where) -> None:
  """Refuses what a warp cannot do anywhere, with JAX's words. (Arrays in warp code run in the
  interpreter, as in JAX's: ``refuse_arrays`` is the compiler's rule.)"""
  del consts
  for eqn in jaxpr_util.equations(jaxpr):
    p = eqn.primitive
    if p is warp_map_p:
      raise ValueError(f"plgpu.warp_map{_at(eqn, where)}: Cannot nest mpmd_maps: per-warp code "
                       "inside per-warp code; write one warp_map")
    if p in _WARPGROUP_ONLY:
      raise ValueError(f"{_WARPGROUP_ONLY[p]} inside plgpu.warp_map{_at(eqn, where)}: it is an "
                       "operation of the whole warpgroup; issue it outside the warp body")


class WarpArrayError(NotImplementedError, ValueError):
  """Array code in a warp body on a GPU backend: JAX's Mosaic GPU compiler refuses it with a
  ValueError (and the words these messages carry), and so does pallax's GPU backend; it is also
  a NotImplementedError, as every refusal of a GPU backend is: the interpreter runs the kernel,
  as JAX's does."""


def refuse_arrays(jaxpr, num_consts: int, where=None) -> None:
  """What Mosaic GPU's compiler refuses in warp code, with its words: a warp holds no register
  arrays (the interpreter runs such code, as JAX's does; a GPU backend calls this, and the
  refusal is a ``WarpArrayError``: the kernel runs with interpret=True)."""
  for v in jaxpr.invars[:num_consts]:
    aval = v.aval
    if not ji.is_ref_aval(aval) and aval.shape:
      raise WarpArrayError(
          f"plgpu.warp_map{f' at {where}' if where else ''}: Can only close over scalars and Refs "
          f"when using mpmd_map with WarpMesh: the warp body closes over an array of type "
          f"{aval.str_short()}. A warp holds no register arrays: compute the value in the "
          "warpgroup and write it to SMEM before warp_map, or read scalars from Refs in the warp")
  for eqn in jaxpr_util.equations(jaxpr):
    _refuse_array_eqn(eqn, where)


def _refuse_array_eqn(eqn, where) -> None:
  p = eqn.primitive
  if p is ji.get_p and eqn.outvars[0].aval.shape:
    raise WarpArrayError(
        f"a load of shape {eqn.outvars[0].aval.shape} in plgpu.warp_map{_at(eqn, where)}: Can "
        "only load scalars in warp-level code (a warp holds no register arrays); copy arrays "
        "with plgpu.copy_smem_to_gmem/copy_gmem_to_smem, or load them outside warp_map")
  if p is ji.swap_p and eqn.invars[1].aval.shape:
    raise WarpArrayError(
        f"a store of shape {eqn.invars[1].aval.shape} in plgpu.warp_map{_at(eqn, where)}: Can "
        "only store scalars in warp-level code (a warp holds no register arrays); store arrays "
        "outside warp_map, or copy them with TMA")
  if p in (ji.get_p, ji.swap_p) or any(True for _ in jaxpr_util.sub_jaxprs(eqn.params)):
    return
  for v in eqn.outvars:
    aval = v.aval
    if not ji.is_ref_aval(aval) and getattr(aval, "shape", ()):
      raise WarpArrayError(
          f"{p} makes an array of type {aval.str_short()} in plgpu.warp_map{_at(eqn, where)}: "
          "warp-level code computes with scalars only (a warp holds no register arrays); "
          "compute arrays in the warpgroup, outside warp_map")

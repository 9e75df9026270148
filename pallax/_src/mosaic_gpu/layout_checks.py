"""Checks of a Mosaic GPU kernel's register layouts that JAX's Mosaic GPU compiler makes, made at
trace time so that both executors (the interpreter and the Gluon backend) raise them as JAX does:

- a reduction across the warps of a value in the WGMMA layout (along its rows) needs
  ``CompilerParams.reduction_scratch_bytes`` of SMEM for the partial results: JAX refuses a
  kernel whose scratch is too small;
- a loop whose carry enters in one explicit layout (``plgpu.layout_cast``) and comes back from
  the body in another: JAX's layout inference finds no layout for it;
- a reshape of a tiled SMEM Ref that collapses dimensions tiled in more than one element other
  than the minormost of them: no strided view of the tiles gives it.

pallax itself picks layouts in its GPU backend and needs neither rule; they keep a kernel that
JAX refuses from running in pallax only.
"""
from __future__ import annotations

import numpy as np
from jax import lax

from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src import primitives as prims
from pallax._src import ref_access
from pallax._src import tracing
from pallax._src.mosaic_gpu import core as mc
from pallax._src.mosaic_gpu import primitives as mp

_REDUCTIONS = (lax.reduce_sum_p, lax.reduce_max_p, lax.reduce_min_p)
_WGMMA = (mc.Layout.WGMMA, mc.Layout.WGMMA_ACC_32BIT)
# Mosaic GPU's cross-warp reduction of a WGMMA tile along its rows: each of the 4 warps puts
# its 32 lanes' partial results (vectors of 2, WGMMA.reduce(0)'s vector length) in scratch.
_WARPS, _LANES, _VECTOR = 4, 32, 2


def _at(eqn) -> str:
  line = ji.user_frame(eqn.source_info)
  return f" at {line}" if line else ""


def _layouts(jaxpr) -> dict:
  """Variable -> the layout a ``plgpu.layout_cast`` of this jaxpr gave it."""
  return {e.outvars[0]: e.params["new_layout"] for e in jaxpr.eqns if e.primitive is mp.layout_cast_p}


def _layout_of(layouts: dict, x):
  return None if isinstance(x, ji.Literal) else layouts.get(x)


def _check_reduction(eqn, layouts: dict, kernel: str, scratch_bytes: int):
  (x,) = eqn.invars
  if _layout_of(layouts, x) not in _WGMMA or len(x.aval.shape) != 2 or tuple(eqn.params["axes"]) != (0,):
    return
  required = _WARPS * _LANES * _VECTOR * np.dtype(x.aval.dtype).itemsize
  if required > scratch_bytes:
    raise ValueError(
        f"pallas_call {kernel}{_at(eqn)}: Required reduction scratch size ({required} bytes) is "
        f"larger than the available scratch size ({scratch_bytes} bytes): reducing a WGMMA-layout "
        f"value of shape {tuple(x.aval.shape)} along its rows combines the warps' partial results "
        "in SMEM; pass plgpu.CompilerParams(reduction_scratch_bytes=...) of at least "
        f"{required}")


def _carried(eqn):
  """(initial values, the body's jaxpr, the body's results) of a loop's carry, or None."""
  p = eqn.params
  if eqn.primitive is lax.while_p:
    n = p["cond_nconsts"] + p["body_nconsts"]
    return eqn.invars[n:], p["body_jaxpr"].jaxpr, p["body_jaxpr"].jaxpr.outvars
  if eqn.primitive is lax.scan_p:
    k, c, _ = (len(s) for s in p["ft_in"].unpack())
    return eqn.invars[k:k + c], p["jaxpr"].jaxpr, p["jaxpr"].jaxpr.outvars[:c]
  return None


def _check_carry(eqn, layouts: dict, kernel: str):
  carried = _carried(eqn)
  if carried is None:
    return
  init, body, results = carried
  inner = _layouts(body)
  for k, (x, y) in enumerate(zip(init, results)):
    a, b = _layout_of(layouts, x), _layout_of(inner, y)
    if a is not None and b is not None and a != b:
      raise ValueError(
          f"pallas_call {kernel}{_at(eqn)}: the loop's carry {k} has layout {b} at the end of "
          f"the body, when it should be {a}, its layout on entry (plgpu.layout_cast): Failed to "
          "infer a possible set of layouts. Cast both to one layout")


def _tilings(eqn) -> dict:
  """The tiling of each SMEM scratch Ref a ``run_scoped`` allocates (its body's variable)."""
  p = eqn.params
  refs = p["jaxpr"].invars[p["num_consts"]:]
  out = {}
  for v, kind in zip(refs, p.get("scratch_types") or ()):
    for t in getattr(kind, "transforms", ()) or ():
      if isinstance(t, mc.TilingTransform):
        out[v] = t.tiling
  return out


def _collapsed(old, new) -> list[list[int]]:
  """The groups of ``old``'s dimensions that a reshape to ``new`` merges into one (none where
  it splits a dimension)."""
  groups, i = [], 0
  for n in new:
    group, size = [], 1
    while i < len(old) and (not group or size < n):
      size *= old[i]
      group.append(i)
      i += 1
    if size != n:
      return []
    groups.append(group)
  return [g for g in groups if len(g) > 1]


def _check_reshape(eqn, tilings: dict, kernel: str):
  a = ref_access.split(eqn, eqn.invars)
  tiling = tilings.get(a.ref) if isinstance(a.ref, ji.Var) else None
  if tiling is None:
    return
  shape = tuple(a.ref.aval.inner_aval.shape)
  for t in a.transforms:
    if isinstance(t, ji.NDIndexer):
      shape = tuple(t.get_indexer_shape())
      continue
    if isinstance(t, ji.ReshapeRef):
      tiles = (1,) * max(0, len(shape) - len(tiling)) + tuple(tiling)[-len(shape):]
      for group in _collapsed(shape, tuple(t.shape)):
        if any(tiles[d] != 1 for d in group[:-1]):
          raise ValueError(
              f"pallas_call {kernel}{_at(eqn)}: reshaping an SMEM Ref of shape {shape} tiled by "
              f"{tuple(tiling)} to {tuple(t.shape)}: any of the dimensions being collapsed other "
              "than the minormost one has non-unit tiling, which no view of the tiles gives; "
              "tile those dimensions by 1, or reshape the value after loading it")
    return


def _walk(jaxpr, kernel: str, scratch_bytes: int, tilings=None):
  layouts, tilings = _layouts(jaxpr), tilings or {}
  for eqn in jaxpr.eqns:
    if eqn.primitive in _REDUCTIONS:
      _check_reduction(eqn, layouts, kernel, scratch_bytes)
    elif eqn.primitive in (ji.get_p, ji.swap_p) and tilings:
      _check_reshape(eqn, tilings, kernel)
    _check_carry(eqn, layouts, kernel)
    inner = _tilings(eqn) if eqn.primitive is prims.run_scoped_p else {}
    for sub in jaxpr_util.sub_jaxprs(eqn.params):
      _walk(getattr(sub, "jaxpr", sub), kernel, scratch_bytes, inner)


def check(params) -> None:
  """Raises JAX's error where a Mosaic GPU kernel breaks the rules above."""
  # (layout casts occur in Mosaic GPU kernels only; without CompilerParams, JAX's default scratch)
  scratch = getattr(params.compiler_params, "reduction_scratch_bytes",
                    mc.CompilerParams.reduction_scratch_bytes)
  _walk(params.jaxpr.jaxpr, params.name, scratch)


tracing.KERNEL_CHECKS.append(check)

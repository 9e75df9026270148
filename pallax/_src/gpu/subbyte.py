"""Sub-byte integers (int4, uint4, int2, uint2) in kernels for the GPU backends.

A GPU has no 4-bit registers or arithmetic. In generated code a sub-byte value lives in a byte
(int8 for the signed types, uint8 for the unsigned ones) holding a value of the type's range.
Legalization (this module's ``computes`` and ``via_i32``, called from gpu/legalize.py) leaves
the emitter only equations that move or select such values, Ref accesses and conversions:
every other equation on sub-byte values runs in 32 bits and is converted back, which is exact
because lax's sub-byte arithmetic wraps modulo 2**bits, as a conversion to a sub-byte type does.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util

SUBBYTE = tuple(np.dtype(t) for t in (ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2))

# Equations that only move or select values: the emitter handles sub-byte values in them as bytes.
MOVES = {
    lax.convert_element_type_p, lax.select_n_p, lax.broadcast_in_dim_p, ji.broadcast_to_p,
    lax.reshape_p, lax.squeeze_p, lax.transpose_p, lax.rev_p, lax.slice_p, lax.dynamic_slice_p,
    lax.dynamic_update_slice_p, lax.concatenate_p, lax.pad_p, lax.gather_p, lax.split_p,
    ji.copy_p, ji.optimization_barrier_p,
}
# Front-end primitives say so next to their definitions (this layer imports no front end):
# ``p.only_moves = True``: it only moves values (plgpu.layout_cast); ``p.exact_on_bytes = True``:
# a product accumulating in 32 bits whose sub-byte operands are widened to int8, which holds
# every int4 and uint4 value exactly and which the tensor cores multiply (plgpu.mma).
# On a widened signed value these would count or shift in the sign extension's bits.
_ON_BITS = {lax.shift_right_logical_p, lax.population_count_p}   # (of unsigned types: popcount)


def is_subbyte(dtype) -> bool:
  return dtype is not None and np.dtype(dtype) in SUBBYTE


def bits(dtype) -> int:
  return int(ml_dtypes.iinfo(np.dtype(dtype)).bits)


def storage(dtype) -> np.dtype:
  """The byte type that holds one value of sub-byte ``dtype`` in registers or scratch."""
  return np.dtype(np.int8 if ml_dtypes.iinfo(np.dtype(dtype)).min < 0 else np.uint8)


def computes(eqn) -> bool:
  """Whether ``eqn`` computes on sub-byte values (not movement, control flow nor Ref access)."""
  moves = eqn.primitive in MOVES or getattr(eqn.primitive, "only_moves", False)
  if moves or any(True for _ in jaxpr_util.sub_jaxprs(eqn.params)):
    return False
  avals = [a.aval for a in eqn.invars] + [v.aval for v in eqn.outvars]
  if any(ji.is_ref_aval(a) for a in avals):
    return False
  return any(is_subbyte(getattr(a, "dtype", None)) for a in avals)


def _widen(x, unsigned_bits: bool):
  """``x`` in 32 bits (its bit pattern, zero-extended, when ``unsigned_bits``)."""
  dt = np.dtype(x.dtype)
  if not is_subbyte(dt):
    return x
  if unsigned_bits and ml_dtypes.iinfo(dt).min < 0:
    x = _convert(x, np.dtype(getattr(ml_dtypes, f"uint{bits(dt)}")))
  return _convert(x, np.uint32 if unsigned_bits else np.int32)


def _as_signed_bits(x, dtype):
  """XLA shifts an unsigned sub-byte value arithmetically as the signed value of its bits
  (uint4 10 >> 2 is 14, as jnp's ``>>`` on uint4 asks): the widened operand gets the sign of its
  top bit."""
  if not is_subbyte(dtype) or ml_dtypes.iinfo(dtype).min < 0:
    return x
  k = np.int32(32 - bits(dtype))
  return lax.shift_right_arithmetic(lax.shift_left(x, k), k)


def _convert(x, dtype):
  if isinstance(x, (np.ndarray, np.generic)):   # a literal in the re-trace
    return np.asarray(x).astype(dtype)[()]
  return lax.convert_element_type(x, dtype)


def via_i32(eqn, rule, invals, params, ctx, cast):
  """``eqn`` computed on 32-bit operands, its sub-byte outputs converted back with ``cast``
  (legalize's conversion). ``rule``, if any, is the equation's legalization rule."""
  dt = np.dtype(eqn.invars[0].aval.dtype) if eqn.invars else None
  if eqn.primitive is lax.clz_p or (eqn.primitive is lax.population_count_p and dt is not None
                                   and ml_dtypes.iinfo(dt).min < 0):
    # XLA on the CPU counts the bits of the byte holding a signed value (popcount(int4 -8) is 5
    # there): the interpreter and a GPU would disagree, so neither answer is given here.
    raise NotImplementedError(
        f"{eqn.primitive.name} of {dt.name} values on the GPU (convert them to the unsigned type "
        "of the same width first, or to int8)")
  unsigned_bits = eqn.primitive in _ON_BITS
  if getattr(eqn.primitive, "exact_on_bytes", False):
    return eqn.primitive.bind(*[_convert(x, np.int8) if is_subbyte(x.dtype) else x for x in invals],
                              **params)
  xs = [_widen(x, unsigned_bits) for x in invals]
  if eqn.primitive is lax.shift_right_arithmetic_p and dt is not None:
    xs[0] = _as_signed_bits(xs[0], dt)
  # The rule sees the 32-bit equation: its results' types say 32 bits too (shifts read them).
  wide = dataclasses.replace(ctx, out_avals=tuple(
      a.update(dtype=np.dtype(np.uint32 if unsigned_bits else np.int32)) if is_subbyte(a.dtype) else a
      for a in ctx.out_avals))
  outs = None if rule is None else rule(wide, *xs, **params)
  if outs is None:
    outs = eqn.primitive.bind(*xs, **eqn.primitive.get_bind_params(_widened_params(params)))
  outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
  return [cast(ctx, o, a.dtype) if is_subbyte(a.dtype) else o for o, a in zip(outs, ctx.out_avals)]


def _widened_params(params):
  """Parameters naming a sub-byte result type (``preferred_element_type``, ``dtype``) name
  int32 instead: the result is converted back after."""
  out = dict(params)
  for k in ("preferred_element_type", "dtype"):
    if is_subbyte(out.get(k)):
      out[k] = jnp.dtype(np.int32)
  return out

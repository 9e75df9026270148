"""Dot algorithms: each ``lax.DotAlgorithmPreset`` a kernel asks for, written out as the dots XLA
computes for it on a GPU, so that the interpreter and the GPU backends compute the same thing.

XLA on a CPU ignores most presets (``BF16_BF16_F32`` multiplies in float32 there) and refuses the
others (``TF32_TF32_F32``, ``BF16_BF16_F32_X9``, ...); a GPU backend sees one ``dot_general``. So
``expand(jaxpr, tf32_dots)`` replaces every ``dot_general`` whose ``precision`` is a preset
(sub-jaxprs included) by lax equations whose meaning a CPU and a GPU share. What the result
guarantees:

1. No ``dot_general`` carries a preset, except, with ``tf32_dots`` (the Triton backend: ``tl.dot``
   has ``input_precision="tf32"`` and ``"tf32x3"``), TF32_TF32_F32 and TF32_TF32_F32_X3 on float32
   operands. The other dots have ``precision=None`` (16-bit, 8-bit or float64 operands: exact
   products) or ``Precision.HIGHEST`` (float32 operands multiplied in float32).
2. Operands are converted to the preset's input type: float16 (F16_*), bfloat16 (BF16_BF16_F32 and
   BF16_BF16_BF16, from float32 too: the GPU rounds them), float64 (F64_F64_F64), float32 (the
   others). Products accumulate in float32 (float64 for F64_F64_F64); F16_F16_F16 and
   BF16_BF16_BF16 round the sums to their 16-bit type, then every result is converted to the
   equation's result type. Without ``jax_enable_x64``, F64_F64_F64 multiplies in float32 (as
   F32_F32_F32: no float64 value can exist).
3. BF16_BF16_F32_X3, _X6, _X9 split each float32 operand into bfloat16 parts ``p0 = bf16(a)``,
   ``p1 = bf16(a - p0)``, ``p2 = bf16(a - p0 - p1)`` and add the products of parts smallest first,
   as XLA does: X9: p2*q1, p2*q2, p1*q2; X6 (and X9): p2*q0, p0*q2, p1*q1; all: p1*q0, p0*q1. A NaN
   in that partial sum (an infinite operand has a NaN part) becomes 0, then p0*q0 is added.
4. Without ``tf32_dots`` (the interpreter), TF32_TF32_F32 rounds the float32 operands to tf32
   (10 significand bits, to nearest, ties away from zero: PTX's ``cvt.rna.tf32.f32``) and
   multiplies them in float32; TF32_TF32_F32_X3 splits them into tf32 parts as in 3 (two parts,
   three products).
5. ANY_F8_* presets multiply float8 operands as they are (an error for other operands).

A ``lax.DotAlgorithm`` that is not a preset is an error naming it and the kernel's line.
``Precision`` values (``DEFAULT``, ``HIGH``, ``HIGHEST``) are left to the backends.
"""
from __future__ import annotations

import functools

import jax
import numpy as np
from jax import lax

from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util

Preset = lax.DotAlgorithmPreset
_F32, _F64, _BF16 = np.dtype(np.float32), np.dtype(np.float64), np.dtype("bfloat16")
_HIGHEST = (lax.Precision.HIGHEST, lax.Precision.HIGHEST)
_F8 = (np.dtype("float8_e4m3fn"), np.dtype("float8_e5m2"))

# Products of parts (i, j) = p_i * q_j, in the order they are added (p0*q0 comes last).
_X3 = ((1, 0), (0, 1))
_X6 = ((2, 0), (0, 2), (1, 1)) + _X3
_X9 = ((2, 1), (2, 2), (1, 2)) + _X6
SPLIT_PASSES = {Preset.BF16_BF16_F32_X3: _X3, Preset.BF16_BF16_F32_X6: _X6,
                 Preset.BF16_BF16_F32_X9: _X9, Preset.TF32_TF32_F32_X3: _X3}
_TF32 = (Preset.TF32_TF32_F32, Preset.TF32_TF32_F32_X3)


def expand(jaxpr: ji.Jaxpr, tf32_dots: bool) -> ji.Jaxpr:
  """``jaxpr`` with its presets written out (the contract above); the same object if it has none.
  ``tf32_dots``: the backend multiplies in tf32 and tf32x3 itself."""
  return jaxpr_util.retrace(jaxpr, functools.partial(_rule, tf32_dots), _applies)


def _applies(eqn) -> bool:
  return eqn.primitive is lax.dot_general_p and \
      isinstance(eqn.params["precision"], (Preset, lax.DotAlgorithm))


def _rule(tf32_dots: bool, eqn, invals, params):
  try:
    return [_expand(tf32_dots, np.dtype(eqn.outvars[0].aval.dtype), *invals, **params)]
  except NotImplementedError as e:
    frame = ji.user_frame(eqn.source_info)
    raise NotImplementedError(f"{e}, at {frame}" if frame else str(e)) from None


def _convert(x, dtype):
  return x if np.dtype(x.dtype) == np.dtype(dtype) else lax.convert_element_type(x, dtype)


def _expand(tf32_dots: bool, out, a, b, *, precision, preferred_element_type, **params):
  p = precision
  dot = lambda x, y, prec=None, acc=_F32: lax.dot_general_p.bind(
      x, y, precision=prec, preferred_element_type=acc, **params)
  if not isinstance(p, Preset):
    raise NotImplementedError(f"the dot algorithm {p}: pallax computes the lax.DotAlgorithmPreset "
                              "algorithms (pass one of them as precision=)")
  if p is Preset.DEFAULT:
    return dot(a, b, None, preferred_element_type)
  if p.name.startswith("ANY_F8"):
    if np.dtype(a.dtype) not in _F8 or np.dtype(b.dtype) not in _F8:
      raise NotImplementedError(
          f"the dot algorithm {p.name} multiplies float8 operands, not {np.dtype(a.dtype).name} "
          f"and {np.dtype(b.dtype).name}: convert them to float8_e4m3fn or float8_e5m2 first")
    acc = preferred_element_type if p.accumulation_type is None else _F32
    return _convert(dot(a, b, None, acc), out)
  if p is Preset.F64_F64_F64 and jax.dtypes.canonicalize_dtype(_F64) != _F64:
    p = Preset.F32_F32_F32   # without jax_enable_x64 no float64 value exists: float32 products
  a, b = (_convert(x, p.supported_lhs_types[0]) for x in (a, b))
  acc_type = np.dtype(p.accumulation_type)
  if p in _TF32 and tf32_dots:
    res = dot(a, b, p)   # the backend's own tf32 and tf32x3 products
  elif p in SPLIT_PASSES:
    res = _split_passes(dot, _tf32_parts if p in _TF32 else _bf16_parts, a, b, SPLIT_PASSES[p])
  elif p is Preset.TF32_TF32_F32:
    res = dot(_round_tf32(a), _round_tf32(b), _HIGHEST)
  elif p is Preset.F32_F32_F32:
    res = dot(a, b, _HIGHEST)
  else:   # F16_*, BF16_BF16_F32, BF16_BF16_BF16, F64_F64_F64: exact products
    res = dot(a, b, None, _F64 if acc_type == _F64 else _F32)
  return _convert(_convert(res, acc_type), out)


def _split_passes(dot, split, a, b, passes):
  """The sum of the products of parts ``passes``, as contract 3 says."""
  n = 1 + max(max(ij) for ij in passes)
  pa, pb = split(a, n), split(b, n)
  prec = None if np.dtype(pa[0].dtype) == _BF16 else _HIGHEST
  small = None
  for i, j in passes:
    d = dot(pa[i], pb[j], prec)
    small = d if small is None else lax.add(small, d)
  small = lax.select_n(lax.ne(small, small), small, lax.full_like(small, 0))   # NaN -> 0
  return lax.add(small, dot(pa[0], pb[0], prec))


def _bf16_parts(x, n: int) -> list:
  parts, rest = [], x
  for k in range(n):
    parts.append(lax.convert_element_type(rest, _BF16))
    if k + 1 < n:
      rest = lax.sub(rest, lax.convert_element_type(parts[-1], _F32))
  return parts


def _round_tf32(x):
  """float32 ``x`` rounded to tf32 (10 significand bits), to nearest, ties away from zero."""
  bits = lax.bitcast_convert_type(x, np.uint32)
  r = lax.bitwise_and(lax.add(bits, np.uint32(0x1000)), np.uint32(0xFFFFE000))
  return lax.select_n(lax.ne(x, x), lax.bitcast_convert_type(r, _F32), x)   # NaN stays NaN


def _tf32_parts(x, n: int) -> list:
  parts, rest = [], x
  for k in range(n):
    parts.append(_round_tf32(rest))
    if k + 1 < n:
      rest = lax.sub(rest, parts[-1])
  return parts

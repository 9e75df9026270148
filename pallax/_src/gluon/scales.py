"""MMA scales (``float8_e8m0fnu``) in generated Gluon for sm_100a.

Gluon has no e8m0 type: its block-scaled MMA (``blackwell.tcgen05_mma_scaled``) takes the
scales as bytes (``gl.uint8``, the e8m0 exponent bits). So the backend holds e8m0 values as
their bits (``gpu/expr.GLUON_BITS``): in GMEM, SMEM and TMEM, and in registers between a load
and a store, which move bits exactly. Any other use of an e8m0 value (a conversion, arithmetic)
would compute on the bits as integers, and is refused by name (``refuse_scale_math``).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src.gpu import expr as ex
from pallax._src.gpu import source as src

E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
_MOVES = (ji.get_p, ji.swap_p)   # loads and stores of a Ref: bits in, bits out


def is_bits(dtype) -> bool:
  return np.dtype(dtype) == E8M0


def signature_type(dtype) -> str:
  """The kernel parameter's type of an e8m0 array: a pointer to its bytes."""
  return ex.SIGNATURE[ex.GLUON_BITS[np.dtype(dtype).name]]


def refuse_scale_math(params):
  """Refuses an equation that computes on e8m0 values (anything but a load or a store)."""
  for eqn in jaxpr_util.equations(params.jaxpr):
    if eqn.primitive in _MOVES:
      continue
    avals = [v.aval for v in (*eqn.invars, *eqn.outvars) if hasattr(v, "aval")]
    if any(not ji.is_ref_aval(a) and is_bits(getattr(a, "dtype", np.float32)) for a in avals):
      line = ji.user_frame(eqn.source_info)
      raise src.Unsupported(
          f"pallas_call {params.name}: {eqn.primitive.name} of float8_e8m0fnu values"
          f"{f' (at {line})' if line else ''}: pallax's Gluon backend holds e8m0 values (MMA "
          "scales) as their bits, to be loaded, stored and copied only; convert them outside "
          "the kernel (or pass them as uint8 and compute on the bits), or run the kernel in the "
          "interpreter (interpret=True)")

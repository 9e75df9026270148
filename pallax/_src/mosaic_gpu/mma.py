"""``plgpu.mma``: ``acc + a @ b`` from registers, synchronously (Ampere's ``mma.sync``).

A value primitive (no Refs, no effects): the interpreter computes it with lax, the Gluon
backend writes Gluon's ``mma_v2``. Its types are JAX's: ``acc`` (M, N), ``a`` (M, K), ``b``
(K, N); ``a`` and ``b`` of one dtype; an int32 accumulator for integer operands, float16,
float32 or float64 for floating ones (JAX's errors, with its words).
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from pallax._src import backends
from pallax._src import jax_internals as ji


def mma(acc, a, b, /):
  """``acc + a @ b``, accumulated in ``acc``'s dtype, as the tensor cores' ``mma.sync``."""
  return mma_p.bind(acc, a, b)


mma_p = ji.Primitive("mma")
mma_p.exact_on_bytes = True   # (int4/uint4 operands widened to int8: gpu/subbyte.py)


def _mma_abstract_eval(acc, a, b):
  if len(acc.shape) != 2 or len(a.shape) != 2 or len(b.shape) != 2 or (
      acc.shape != (a.shape[0], b.shape[1]) or a.shape[1] != b.shape[0]):
    raise ValueError(
        f"plgpu.mma: Incompatible shapes for matrix multiplication: lhs={a.shape}, "
        f"rhs={b.shape}, acc={acc.shape}; acc + a @ b needs a (M, K), b (K, N), acc (M, N)")
  if a.dtype != b.dtype:
    raise TypeError(f"plgpu.mma: Operand dtypes must match: {a.dtype} != {b.dtype}; cast one "
                    "with .astype")
  if jnp.issubdtype(a.dtype, jnp.integer) or a.dtype == jnp.bool_:
    if acc.dtype != jnp.int32:
      raise NotImplementedError(
          "plgpu.mma: Only int32 accumulator supported for integer and boolean operands. "
          f"Got {acc.dtype}")
  elif jnp.issubdtype(a.dtype, jnp.floating):
    if acc.dtype not in (jnp.float64, jnp.float32, jnp.float16):
      raise NotImplementedError(
          "plgpu.mma: Only float64, float32 and float16 accumulators supported for floating "
          f"operands. Got {acc.dtype}")
  else:
    raise NotImplementedError(f"plgpu.mma: Unsupported operand type: {a.dtype}")
  return ji.ShapedArray(acc.shape, acc.dtype)


def _mma_impl(acc, a, b):
  # Products of the operands are exact in the accumulator's dtype (float32 for 16- and 8-bit
  # floats, int32 for 8- and 4-bit integers); the tensor cores sum them in it.
  wide = acc.dtype if acc.dtype != jnp.float16 else jnp.float32
  prod = lax.dot(a.astype(wide), b.astype(wide), precision=lax.Precision.HIGHEST,
                 preferred_element_type=wide)
  return (acc.astype(wide) + prod).astype(acc.dtype)


mma_p.def_abstract_eval(_mma_abstract_eval)
mma_p.def_impl(_mma_impl)
backends.register_kernel_primitives("mosaic_gpu", (mma_p,))

"""Sparse ``tcgen05`` MMAs (``tcgen05_mma(..., a_sparse_metadata=...)``): ``a`` holds two of
every four values of each row along K (2:4 structured sparsity), compressed to half of K, and
its metadata names, for each group of four, the two positions the values stand at (two 2-bit
indices, increasing). The product is that of the logical ``a``, zeros elsewhere.

The metadata reaches the tensor core from SMEM in the tiles PTX describes for the operand width
("sparsity selector" layouts): ``format_tcgen05_sparse_metadata`` writes them from an
(M, K // 4, 2) array of indices; ``async_copy_sparse_metadata_to_tmem`` copies them, as they
are, into a TMEM of shape (M, K // 2); the interpreter's MMA reads them back (``logical_a``).
"""
from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np

TILE = (128, 64)   # metadata entries of a tile: 128 rows, 64 entries (32 groups of K) each


def _tiling(m: int, h: int, bits: int) -> tuple[tuple, tuple]:
  """(the (M, K // 2) metadata's split dimensions, the order the tiles hold them in), per PTX's
  layouts for 8- and 16-bit operands."""
  if bits == 8:   # a tile: 128 rows, each its 64 entries in order
    return (m // 128, 128, h // 64, 64), (0, 2, 1, 3)
  if bits == 16:  # rows and entries interleaved in groups of 8, 2 and 8, 4, 2, 8
    return (m // 128, 8, 2, 8, h // 64, 4, 2, 8), (0, 4, 1, 6, 3, 5, 2, 7)
  raise NotImplementedError(f"sparse tcgen05 MMAs of {bits}-bit operands: the metadata layout "
                            "is defined for 8- and 16-bit operands")


def tiles_shape(shape) -> tuple | None:
  """The SMEM shape of the tiles of a (M, K // 2) metadata TMEM (None: not made of whole tiles)."""
  m, h = shape
  return (m // 128, h // 64, *TILE) if m % 128 == 0 and h % 64 == 0 else None


def format_tcgen05_sparse_metadata(meta, operand_dtype):
  """``meta`` (M, K // 4, 2) of ``uint2`` indices as the tiles (M // 128, K // 128, 128, 64) the
  tensor core reads for operands of ``operand_dtype``, to copy to SMEM and then to TMEM with
  ``async_copy_sparse_metadata_to_tmem``."""
  if jnp.dtype(meta.dtype) != jnp.dtype(ml_dtypes.uint2):
    raise ValueError(f"Expected metadata dtype to be uint2, got: {meta.dtype}")
  if meta.ndim != 3 or meta.shape[-1] != 2:
    raise ValueError(f"Expected metadata of shape (M, K // 4, 2), got {tuple(meta.shape)}")
  m, groups, _ = meta.shape
  if m % 128 or groups % 32:
    raise ValueError(f"Expected M a multiple of 128 and K // 4 of 32, got {tuple(meta.shape)}")
  shape, order = _tiling(m, 2 * groups, jnp.dtype(operand_dtype).itemsize * 8)
  return meta.reshape(shape).transpose(order).reshape(m // 128, 2 * groups // 64, *TILE)


def indices(tmem: np.ndarray, bits: int) -> np.ndarray:
  """The (M, K // 4, 2) indices of a metadata TMEM (M, K // 2) that holds the tiles as copied."""
  m, h = tmem.shape
  shape, order = _tiling(m, h, bits)
  tiled = np.asarray(tmem).reshape([shape[d] for d in order])
  return tiled.transpose(np.argsort(order)).reshape(m, h // 2, 2).astype(np.int64)


def logical_a(a: np.ndarray, meta: np.ndarray) -> tuple[np.ndarray, tuple | None]:
  """(the logical (M, K) ``a`` of compressed ``a`` (M, K // 2) and indices (M, K // 4, 2),
  the first (row, group) whose two indices do not increase, or None)."""
  m, h = a.shape
  bad = np.argwhere(meta[..., 0] >= meta[..., 1])
  out = np.zeros((m, h // 2, 4), a.dtype)
  np.put_along_axis(out, meta, a.reshape(m, h // 2, 2), axis=-1)
  return out.reshape(m, 2 * h), (tuple(int(i) for i in bad[0]) if len(bad) else None)

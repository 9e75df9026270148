"""Blackwell's tensor cores (``tcgen05``) and tensor memory (TMEM): the primitives' types and
effects, and the functions of ``plgpu`` that bind them. Their meaning, with the checks of the
rules that JAX's documentation leaves to the user, is in ``tcgen05_semantics.py``.

Each primitive takes its Refs as ``(ref, *transform leaves)`` with one pytree per Ref in the
``trees`` param (``None`` for an absent Ref), as the primitives of ``primitives.py`` do.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from pallax._src import backends
from pallax._src import jax_internals as ji
from pallax._src.mosaic_gpu import primitives as mp
from pallax._src.mosaic_gpu import tcgen05_sparse as sparse
from pallax._src.mosaic_gpu.core import TMEM  # noqa: F401 (the Gluon backend refuses it by this name)



def _check_ref(x, what: str):
  if not (isinstance(x, ji.TransformedRef) or ji.is_ref_aval(jax.typeof(x))):
    raise TypeError(f"{what} must be a Ref (a TMEM or SMEM scratch buffer or a view of one), "
                    f"got a value of type {jax.typeof(x)}")


# --- tcgen05_mma -------------------------------------------------------------------------------

def _mma_abstract_eval(*avals, trees, collective_axis, scaled, sparse=False):
  shapes = mp.ref_shapes(avals, trees)
  (acc, _), (a, _), (b, _) = shapes[:3]
  if len(acc) != 2 or len(a) != 2 or len(b) != 2:
    raise ValueError(f"tcgen05_mma takes 2D operands, got acc{list(acc)}, a{list(a)}, b{list(b)}")
  if acc[0] != a[0]:
    raise ValueError("Accumulator and LHS have incompatible shapes. Expected LHS to have shape "
                     f"(m, k) and accumulator to have shape (m, n). Accumulator: {acc}. LHS: {a}.")
  if collective_axis is not None and acc[1] != 2 * b[1]:
    raise ValueError("Accumulator and RHS have incompatible shapes. Expected RHS to have shape "
                     "(k, n) and accumulator to have shape (m, n * 2) in collective mode. "
                     f"Accumulator: {acc}. RHS: {b}.")
  if collective_axis is None and acc[1] != b[1]:
    raise ValueError("Accumulator and RHS have incompatible shapes. Expected RHS to have shape "
                     f"(k, n) and accumulator to have shape (m, n). Accumulator: {acc}. RHS: {b}.")
  if a[1] * (2 if sparse else 1) != b[0]:
    raise ValueError(f"LHS and RHS have incompatible shapes. LHS: {a}. RHS: {b}."
                     + (" (A sparse LHS holds half of K.)" if sparse else ""))
  return [], mp.ref_effects(trees, reads=(1, 2, 4, 5, 6), writes=(0, 3))


tcgen05_mma_p = mp.primitive("tcgen05_mma", _mma_abstract_eval)


def tcgen05_mma(acc, a, b, barrier=None, *, a_scale=None, b_scale=None, a_sparse_metadata=None,
                accumulate=True, collective_axis=None) -> None:
  """``acc = a @ b (+ acc if accumulate)`` on the tensor core, asynchronously: ``acc`` is a TMEM
  Ref (M, N) in float32 (float16 for 16- and 8-bit inputs, int32 for int8), ``a`` an SMEM or
  TMEM Ref (M, K), ``b`` an SMEM Ref (K, N); transposed views (``.T``, ``.transpose``) are
  allowed for the SMEM operands. Its completion is awaited through ``barrier`` (an
  ``orders_tensor_core`` barrier it arrives on) or ``tcgen05_commit_arrive``. With ``a_scale``
  and ``b_scale`` (TMEM, one scale per block of K), a block-scaled product.

  With ``collective_axis`` (a cluster axis of size 2, the first one), the two blocks of a pair
  compute one product: each holds half of ``a``'s rows and of ``b``'s columns, and its ``acc``
  (a ``collective`` TMEM) gets its rows of ``a`` times both halves of ``b``; the leader block
  (index 0) issues the MMA, the other's call does nothing.

  With ``a_sparse_metadata`` (a TMEM (M, K // 2) of ``uint2``, filled by
  ``async_copy_sparse_metadata_to_tmem``), ``a`` is 2:4 sparse: (M, K // 2), the two values of
  each group of four along K, at the positions the metadata names (tcgen05_sparse.py)."""
  if (a_scale is None) != (b_scale is None):
    raise ValueError("a_scale and b_scale must both be present or absent.")
  for x, what in ((acc, "acc"), (a, "a"), (b, "b")):
    _check_ref(x, f"tcgen05_mma: {what}")
  barrier = None if barrier is None else mp.barrier_view(barrier)
  mp.bind_refs(tcgen05_mma_p, (acc, a, b, barrier, a_scale, b_scale, a_sparse_metadata),
        (jnp.asarray(accumulate, jnp.bool_),), collective_axis=collective_axis,
        scaled=a_scale is not None, sparse=a_sparse_metadata is not None)


def _commit_abstract_eval(*avals, trees, collective_axis):
  return [], mp.ref_effects(trees, writes=(0,))


tcgen05_commit_arrive_p = mp.primitive("tcgen05_commit_arrive", _commit_abstract_eval)


def tcgen05_commit_arrive(barrier, collective_axis=None) -> None:
  """One arrival on ``barrier`` (``orders_tensor_core=True``) once every ``tcgen05_mma`` and
  SMEM->TMEM copy this thread issued so far has completed. With ``collective_axis``: issued by
  the leader block of the pair only, one arrival on the barrier of each of the two blocks."""
  mp.bind_refs(tcgen05_commit_arrive_p, (mp.barrier_view(barrier),), collective_axis=collective_axis)


# --- TMEM loads and stores ----------------------------------------------------------------------

_REDUCTIONS = ("max", "min", "absmax", "absmin")


def _load_abstract_eval(*avals, trees, reduce):
  ((shape, dtype),) = mp.ref_shapes(avals, trees)
  out = [ji.ShapedArray(shape, dtype)]
  if reduce is not None:
    if jnp.dtype(dtype) not in map(jnp.dtype, (jnp.float32, jnp.int32, jnp.uint32)):
      raise ValueError(f"Unsupported dtype for reduction: {jnp.dtype(dtype)}. Only float32, "
                       "int32 and uint32 are supported.")
    out.append(ji.ShapedArray(shape[:-1], dtype))
  return out, mp.ref_effects(trees, reads=(0,))


async_load_tmem_p = mp.primitive("async_load_tmem", _load_abstract_eval)


def async_load_tmem(src, *, layout=None, reduce=None):
  """Reads the TMEM view ``src`` into registers. The value can be used at once, but the read
  may still be going on: call ``wait_load_tmem`` before anything overwrites ``src``. With
  ``reduce`` ('max', 'min', 'absmax', 'absmin'), also returns the reduction over the last axis."""
  if reduce is not None and reduce not in _REDUCTIONS:
    raise ValueError(f"async_load_tmem: reduce must be one of {_REDUCTIONS}, got {reduce!r}")
  _check_ref(src, "async_load_tmem: src")
  outs = mp.bind_refs(async_load_tmem_p, (src,), reduce=reduce)
  value = outs[0] if layout is None else mp.layout_cast(outs[0], layout)
  return value if reduce is None else (value, outs[1])


def _store_abstract_eval(*avals, trees):
  ((shape, dtype),), (val,) = mp.ref_shapes(avals, trees), avals[-1:]
  if tuple(val.shape) != tuple(shape) or val.dtype != dtype:
    raise ValueError(f"async_store_tmem: the TMEM view is {jnp.dtype(dtype).name}{list(shape)} "
                     f"but the value is {val.str_short()}; they must match")
  return [], mp.ref_effects(trees, writes=(0,))


async_store_tmem_p = mp.primitive("async_store_tmem", _store_abstract_eval)


def async_store_tmem(ref, value) -> None:
  """Writes ``value`` to the TMEM view ``ref``; the write is seen by loads and MMAs once this
  thread calls ``commit_tmem``."""
  _check_ref(ref, "async_store_tmem: ref")
  mp.bind_refs(async_store_tmem_p, (ref,), (jnp.asarray(value),))


wait_load_tmem_p = mp.no_ref_primitive("wait_load_tmem")
commit_tmem_p = mp.no_ref_primitive("commit_tmem")


def wait_load_tmem() -> None:
  """Waits until every ``async_load_tmem`` of this thread has finished reading TMEM."""
  wait_load_tmem_p.bind()


def commit_tmem() -> None:
  """Makes this thread's ``async_store_tmem`` writes visible to TMEM loads and MMAs."""
  commit_tmem_p.bind()


# --- SMEM -> TMEM copies -------------------------------------------------------------------------

def _copy_abstract_eval(*avals, trees, what, collective_axis):
  (src, sdt), (dst, ddt) = mp.ref_shapes(avals, trees)
  if sdt != ddt:
    raise ValueError(f"Expected SMEM element type ({jnp.dtype(sdt)}) to equal the TMEM element "
                     f"type ({jnp.dtype(ddt)})")
  if what == "async_copy_scales_to_tmem" and len(dst) == 2 and src in (
      scales_tiles(dst), m64_collective_scales_tiles(dst)):
    pass   # scales in the tiles the tensor core reads them in (see scales_tiles)
  elif what == "async_copy_sparse_metadata_to_tmem":
    tiles = sparse.tiles_shape(dst) if len(dst) == 2 else None
    if tiles is None or src != tiles:
      raise ValueError(f"Expected the SMEM metadata tiles (M // 128, K // 128, 128, 64) of "
                       f"format_tcgen05_sparse_metadata for a TMEM of shape {dst}, got {src}")
  elif src != dst:
    raise ValueError(f"Expected SMEM reference shape {src} to equal the TMEM reference shape {dst}"
                     + (f" (or, for scales, {scales_tiles(dst)}: MMA scale tiles)"
                        if what == "async_copy_scales_to_tmem" else ""))
  return [], mp.ref_effects(trees, reads=(0,), writes=(1,))


async_copy_smem_to_tmem_p = mp.primitive("async_copy_smem_to_tmem", _copy_abstract_eval)


def scales_tiles(shape) -> tuple:
  """The SMEM shape of (rows, k) MMA scales stored as the tensor core reads them: per 128 rows
  and 4 scales of K, a tile of 32 x 16 (row r, scale c at [r % 32, (r // 32) * 4 + c])."""
  rows, k = shape
  return (rows // 128, k // 4, 32, 16) if rows % 128 == 0 and k % 4 == 0 else None


def m64_collective_scales_tiles(shape) -> tuple | None:
  """The SMEM shape of the B scales of a two-block MMA of M = 64 a block
  (``TMEMLayout.SCALES_M64_COLLECTIVE_LAYOUT``): N in two halves of up to 128 rows, per 4 scales
  of K a tile of 64 x 16 (half h, row r of its 32-row group g, scale c at [h * 32 + r, g * 4 + c])."""
  rows, k = shape
  return (rows // 256, k // 4, 64, 16) if rows % 256 == 0 and k % 4 == 0 else None


def untile_m64_collective_scales(x):
  """The (rows, k) scales of SMEM tiles of ``m64_collective_scales_tiles`` (NumPy): each half of
  N at 128 rows."""
  a, c, _, _ = x.shape
  return x.reshape(a, c, 2, 32, 4, 4).transpose(0, 2, 4, 3, 1, 5).reshape(a * 256, c * 4)


def untile_scales(x):
  """The (rows, k) scales of SMEM tiles of ``scales_tiles`` (NumPy)."""
  a, c, _, _ = x.shape
  return x.reshape(a, c, 32, 4, 4).transpose(0, 3, 2, 1, 4).reshape(a * 128, c * 4)


def _copy_fn(what: str):
  def fn(smem_ref, tmem_ref, collective_axis=None) -> None:
    _check_ref(smem_ref, f"{what}: smem_ref")
    _check_ref(tmem_ref, f"{what}: tmem_ref")
    mp.bind_refs(async_copy_smem_to_tmem_p, (smem_ref, tmem_ref), what=what,
                 collective_axis=collective_axis)
  fn.__name__ = what
  fn.__doc__ = ("Copies the SMEM view into the TMEM view asynchronously (tcgen05.cp); an MMA of "
                "this thread may use the TMEM at once, anything else after "
                "tcgen05_commit_arrive and a wait on its barrier. With collective_axis (a "
                "cluster axis of size 2), the pair's leader block copies each block's SMEM "
                "into that block's TMEM; the other block's call does nothing.")
  return fn


async_copy_smem_to_tmem = _copy_fn("async_copy_smem_to_tmem")
async_copy_scales_to_tmem = _copy_fn("async_copy_scales_to_tmem")
async_copy_sparse_metadata_to_tmem = _copy_fn("async_copy_sparse_metadata_to_tmem")


backends.register_kernel_primitives("mosaic_gpu", (
    tcgen05_mma_p, tcgen05_commit_arrive_p, async_load_tmem_p, async_store_tmem_p,
    wait_load_tmem_p, commit_tmem_p, async_copy_smem_to_tmem_p))
BLACKWELL_PRIMITIVES = (tcgen05_mma_p, tcgen05_commit_arrive_p, async_load_tmem_p,
                        async_store_tmem_p, wait_load_tmem_p, commit_tmem_p,
                        async_copy_smem_to_tmem_p)

"""``tcgen05_mma`` in the eager interpreter: the product, its operand and shape rules (those of
Mosaic GPU's ``tcgen05.mma``, with JAX's messages), and its place among the operations in
flight (tcgen05_semantics.py)."""
from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from pallax._src.interpret import eager
from pallax._src.interpret.eager import View, fail, rule
from pallax._src.mosaic_gpu import core as mc
from pallax._src.mosaic_gpu import primitives as mp
from pallax._src.mosaic_gpu import semantics as ms
from pallax._src.mosaic_gpu import tcgen05 as tc
from pallax._src.mosaic_gpu import tcgen05_collective as tcc
from pallax._src.mosaic_gpu import tcgen05_sparse as sparse
from pallax._src.mosaic_gpu import tcgen05_semantics as ts

_FP8 = {np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)}
_FP4 = {np.dtype(ml_dtypes.float4_e2m1fn)}
_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
_F32, _F16, _BF16, _I32 = (np.dtype(t) for t in (np.float32, np.float16, ml_dtypes.bfloat16,
                                                  np.int32))
_I8 = {np.dtype(np.int8), np.dtype(np.uint8)}   # kind::i8 takes signed and unsigned bytes


def _swizzle(view: View) -> int:
  """The SMEM operand's swizzle in bytes (128 where it has no SwizzleTransform, as the
  interpreter lays SMEM out for the tensor core's widest reads)."""
  return next((t.swizzle for t in getattr(view.buf.kind, "transforms", ())
               if isinstance(t, mc.SwizzleTransform)), 128)


def _check_dtypes(th, a_dt, b_dt, acc_dt, scaled: bool):
  """The element types ``tcgen05.mma`` takes (Mosaic GPU's rules and messages)."""
  if a_dt != b_dt and not (a_dt in _FP8 and b_dt in _FP8):
    fail(th, "MMA requires A and B to have the same element type, except that FP8 types "
             f"(f8E4M3FN and f8E5M2) may be mixed; got: {a_dt} and {b_dt}", ValueError)
  name = a_dt.name
  if a_dt in (_F32, _BF16, _F16):
    allowed = (_F32, _F16) if a_dt == _F16 else (_F32,)
    if scaled:
      fail(th, f"MMA with element type {name} does not support block scaling", ValueError)
  elif a_dt in _FP8:
    allowed = (_F32,) if scaled else (_F32, _F16)
  elif a_dt in _FP4:
    allowed = (_F32,)
    if not scaled:
      fail(th, f"MMA with element type {name} only supports block scaling (pass a_scale and "
               "b_scale)", ValueError)
  elif a_dt in _I8:
    allowed = (_I32,)
    if scaled:
      fail(th, f"MMA with element type {name} does not support block scaling", ValueError)
  else:
    fail(th, f"tcgen05_mma: Unsupported element type: {name} (the tensor core takes float32 "
             "(as tf32), bfloat16, float16, float8, float4, int8 and uint8)", NotImplementedError)
  if acc_dt not in allowed:
    fail(th, f"MMA with element type {name} only supports accumulators of type "
             f"{' or '.join(a.name for a in allowed)}, but got: {acc_dt.name}", ValueError)


def _check_shape(th, m, n, k, a_dt, acc_dt, a_in_tmem, swizzle, collective=False):
  """The shapes one ``tcgen05.mma`` can run (per block: ``n`` is the block's columns of B)."""
  if a_in_tmem and m != 128:
    fail(th, f"Only M=128 is supported for MMA with A in TMEM, but got M={m}",
         NotImplementedError)
  if m not in (64, 128):
    fail(th, f"Only M=128 and M=64 are supported for MMA, but got M={m}: split the product "
             "into MMAs of 128 rows", ValueError)
  groups = 2 if m == 64 and not collective else 1
  multiple = (16 if collective else 8) * (2 if acc_dt == _I32 else 1)
  if n % groups or (n // groups) % multiple:
    fail(th, f"In {2 if collective else 1} CTA {'integer ' if acc_dt == _I32 else ''}MMA"
             f"{' with 2 lane groups' if groups > 1 else ''}, N must be a multiple of "
             f"{multiple * groups}, got N={n}", ValueError)
  if n > 256 and n != 512:
    fail(th, f"The only supported N > 256, is 512, but got N={n}", NotImplementedError)
  if collective and n > 128:
    fail(th, "Only N <= 128 are supported for collective MMA", ValueError)
  bits = 4 if a_dt in _FP4 else a_dt.itemsize * 8
  k_group = 8 * swizzle // bits
  if k % k_group:
    fail(th, f"K must be a multiple of {k_group}, got: {k} (a {swizzle}-byte swizzle of "
             f"{a_dt.name} operands reads {k_group} elements of K at a time)", ValueError)


def _scales(th, a_scale: View, b_scale: View, m, n, k, a_dt, sparse=False, collective=False):
  """(A's scales (M, K), B's scales (K, N)) expanded over their blocks of K, as float32 (a
  sparse MMA's float8 blocks are twice as long along the logical K: the instruction's K step).
  A two-block MMA of 64 rows a block reads the first 64 of the 128 rows of its A scales, and B
  scales in ``SCALES_M64_COLLECTIVE_LAYOUT`` hold each half of N at 128 rows."""
  sa, sb = np.asarray(eager.read(a_scale)), np.asarray(eager.read(b_scale))
  if collective and m == 64 and sa.ndim == 2 and sa.shape[0] == 128:
    sa = sa[:m]

  if sa.ndim != 2 or k % sa.shape[1]:
    fail(th, f"K={k} is not divisible by A scale second dimension {sa.shape[-1]}", ValueError)
  block = k // sa.shape[1]
  if sparse and a_dt not in _FP8:
    fail(th, f"sparse block-scaled MMAs of {a_dt.name}: the interpreter runs float8 ones only",
         NotImplementedError)
  if a_dt in _FP8:
    if sa.dtype != _E8M0:
      fail(th, f"Scale element type mismatch: expected f8e8m0fnu, got {sa.dtype}", ValueError)
    if block != 32 * (2 if sparse else 1):
      fail(th, f"Scale block size mismatch: expected {32 * (2 if sparse else 1)}, got {block}",
           ValueError)
  elif sa.dtype == _E8M0 and block not in (16, 32) or sa.dtype != _E8M0 and block != 16:
    fail(th, f"Scale block size mismatch: expected {'16 or 32' if sa.dtype == _E8M0 else 16}, "
             f"got {block}", ValueError)
  if sb.dtype != sa.dtype:
    fail(th, f"B scale dtype mismatch: expected {sa.dtype} (same as A), got {sb.dtype}", ValueError)
  if sa.shape != (m, k // block):
    fail(th, f"A scale shape mismatch: expected ({m}, {k // block}), got {sa.shape}", ValueError)
  if sb.shape[0] % 128 or sb.shape[0] < n or sb.shape[1] != k // block:
    fail(th, f"B scale shape[0] must be a multiple of 128 and >= N={n}, and shape[1] "
             f"{k // block}; got {sb.shape}", ValueError)
  if ts.m64_collective_scales(b_scale) and sb.shape[0] >= 256 and n <= 256:
    sb = np.concatenate([sb[:n // 2], sb[128:128 + n // 2]])
  expand = lambda s: np.repeat(s.astype(np.float32), block, axis=1)   # noqa: E731
  return expand(sa), expand(sb[:n]).T


def _product(a, b, acc_dt, scales):
  if acc_dt == _I32:
    return a.astype(np.int32) @ b.astype(np.int32)
  if scales is not None:
    a, b = a.astype(np.float32) * scales[0], b.astype(np.float32) * scales[1]
  elif a.dtype != b.dtype:   # mixed float8: both exactly in float32
    a, b = a.astype(np.float32), b.astype(np.float32)
  return np.asarray(lax.dot_general(jnp.asarray(a), jnp.asarray(b), (((1,), (0,)), ((), ())),
                                    preferred_element_type=jnp.float32))


def _operands(th, acc, a, b, what):
  """The views of an MMA's operands, checked as the operands of ``th``'s own block, with A's mask."""
  acc = ts.view_of(th, acc, "tmem", what, "accumulator")
  b = ts.view_of(th, b, "smem", what, "right-hand side (b)")
  a_space = a[0].buf.space
  a = ts.view_of(th, a, a_space if a_space in ("smem", "tmem") else "smem", what,
                 "left-hand side (a)")
  ts.smem_operand(th, b, what)
  a_mask = (ts.smem_operand(th, a, what) if a_space == "smem" else ms.view_mask(a))
  if a_space == "tmem":
    ts.check_committed_tmem(th, a, a_mask, what)
    eager.check_initialized(th, a, what)
    if a.buf.kind.packing != 4 // a.buf.data.dtype.itemsize:
      fail(th, f"{what}: an a operand in TMEM must be packed ({a.buf.name}: allocate it with "
               "plgpu.TMEM(..., packed=True))", ValueError)
  return acc, a, b


def _pair(th, axis, views, accumulate, what):
  """[(acc, a, b)] of each block the MMA computes for: this one, and with ``axis`` its partner
  (None: this block does not lead its pair, and its call does nothing)."""
  if axis is None:
    return [views]
  other = tcc.partner(th, axis, what)
  if other is None:
    tcc.follower_call(th, axis, views, what)
    return None
  acc, a, _ = views
  tcc.check_collective(th, acc, "Accumulator", what)
  tcc.check_collective(th, a, "LHS", what)
  theirs = [tcc.twin(v, other) for v in views]
  for v in theirs[1:] + theirs[:1] * accumulate:
    eager.check_initialized(th, v, f"{what} (an operand of the pair's other block)")
  return [views, theirs]


@rule(tc.tcgen05_mma_p)
def _tcgen05_mma(th, eqn, invals):
  yield from ()
  what = "tcgen05_mma"
  (acc, a, b, bar, a_scale, b_scale, meta), (accumulate,) = mp.split_refs(invals, eqn.params["trees"])
  accumulate = bool(np.asarray(accumulate))
  axis = eqn.params["collective_axis"]
  blocks = _pair(th, axis, _operands(th, acc, a, b, what), accumulate, what)
  if blocks is None:
    return []
  acc, a, b = blocks[0]
  metas = _metadata(th, meta, axis, len(blocks), what) if eqn.params.get("sparse") else None
  a_val = _lhs(th, a, metas and metas[0], what)
  b_val = np.concatenate([np.asarray(eager.read(ops[2])) for ops in blocks], axis=1)
  (m, k), n = a_val.shape, b_val.shape[1]
  acc_dt, scaled = acc.buf.data.dtype, eqn.params["scaled"]
  _check_dtypes(th, a_val.dtype, b_val.dtype, acc_dt, scaled)
  _check_shape(th, m, n // len(blocks), k, a_val.dtype, acc_dt, a.buf.space == "tmem",
               max(_swizzle(b), _swizzle(a) if a.buf.space == "smem" else 0), axis is not None)
  scale_views, scales = [], [None] * len(blocks)
  if scaled:
    scale_views, scales = _block_scales(th, a_scale, b_scale, axis, (m, n, k), a_val.dtype,
                                        metas is not None, what)
  reads, writes = [(s.buf, ms.view_mask(s)) for s in scale_views + (metas or [])], []
  for i, (acc_i, a_i, b_i) in enumerate(blocks):
    reads += _write_product(th, acc_i, _lhs(th, a_i, metas and metas[i], what), b_val, scales[i],
                            accumulate, a_i, b_i, what)
    writes.append((acc_i.buf, ms.view_mask(acc_i)))
  # Earlier MMAs into this accumulator and copies into its operands complete before it.
  after = [op for op in ts.ops(th)
           if any(ts.overlaps(op.writes, buf, mask) for buf, mask in reads + writes)]
  op = ts.Op(what, th, th.line, reads, writes, after)
  ts.issue(th, op)
  if axis is not None:
    tcc.share(th, op, _other(th, axis))
  if bar is not None:
    _arrive(th, bar[0].at(bar[1]), axis, what)
  return []


def _block_scales(th, a_scale, b_scale, axis, mnk, a_dt, sparse_mma, what):
  """(the scale views the MMA reads, the scales of each block it computes for). A two-block MMA
  scales each block's rows of ``a`` by that block's ``a_scale`` and all of ``b`` by the
  leader's ``b_scale`` (which a collective copy gave both blocks)."""
  m, n, k = mnk
  a_view, b_view = (ts.view_of(th, s, "tmem", what, role)
                    for s, role in ((a_scale, "a_scale"), (b_scale, "b_scale")))
  a_views = [a_view] if axis is None else [a_view, tcc.twin(a_view, _other(th, axis))]
  for s in a_views + [b_view]:
    if axis is not None:
      tcc.check_collective(th, s, "Scale", what)
    ts.check_committed_tmem(th, s, ms.view_mask(s), what)
    ts.check_ordered(th, s.buf, ms.view_mask(s), what, "reads")
    eager.check_initialized(th, s, what)
  scales = [_scales(th, a_i, b_view, m, n, k, a_dt, sparse_mma, axis is not None) for a_i in a_views]
  return a_views + [b_view], scales


def _metadata(th, meta, axis, n_blocks: int, what) -> list[View]:
  """The views of a sparse MMA's metadata TMEM, in each block it computes for, checked as
  scales are: copied (``async_copy_sparse_metadata_to_tmem``) before the MMA."""
  view = ts.view_of(th, meta, "tmem", what, "a_sparse_metadata")
  views = [view] if n_blocks == 1 else [view, tcc.twin(view, _other(th, axis))]
  for v in views:
    ts.check_committed_tmem(th, v, ms.view_mask(v), what)
    ts.check_ordered(th, v.buf, ms.view_mask(v), what, "reads")
    eager.check_initialized(th, v, what)
  return views


def _lhs(th, a: View, meta: View | None, what) -> np.ndarray:
  """The logical ``a`` of an MMA: as read, or a sparse one's values put where its metadata
  says (tcgen05_sparse.py)."""
  a_val = np.asarray(eager.read(a))
  if meta is None:
    return a_val
  tmem = np.asarray(eager.read(meta)).astype(np.int64)
  if tmem.shape != (a_val.shape[0], a_val.shape[1]):
    fail(th, f"{what}: the sparse metadata of shape {tmem.shape} does not match the compressed "
             f"a of shape {a_val.shape} (it holds one index per value: (M, K // 2))", ValueError)
  try:
    idx = sparse.indices(tmem, a_val.dtype.itemsize * 8)
  except NotImplementedError as e:
    fail(th, f"{what}: {e}", NotImplementedError)
  logical, bad = sparse.logical_a(a_val, idx)
  if bad is not None:
    fail(th, f"{what}: the sparse metadata of row {bad[0]}, group {bad[1]} of K names positions "
             f"{tuple(int(i) for i in idx[bad])}: each group of four names two increasing "
             "positions (plgpu.format_tcgen05_sparse_metadata of (M, K // 4, 2) indices)",
         ValueError)
  return logical


def _other(th, axis):
  return tcc.partner(th, axis, "tcgen05_mma")


def _write_product(th, acc, a_val, b_val, scales, accumulate, a, b, what) -> list:
  """``acc (+)= a @ b`` in one block; returns the (buffer, mask) pairs the MMA reads there."""
  acc_mask = ms.view_mask(acc)
  ts.check_loads_done(th, acc, acc_mask, what)
  ts.check_committed_tmem(th, acc, acc_mask, what)
  if accumulate:
    eager.check_initialized(th, acc, f"{what} with accumulate=True")
  reads = [(b.buf, ms.view_mask(b)), (a.buf, ms.view_mask(a))]
  ts.check_ordered(th, acc.buf, acc_mask, what, "writes")
  if a.buf.space == "tmem":
    ts.check_ordered(th, a.buf, reads[1][1], what, "reads")
    ms.check_union_read(th, a, reads[1][1], what)
  if accumulate:
    ms.check_union_read(th, acc, acc_mask, f"{what} with accumulate=True")
  prod = _product(a_val, b_val, acc.buf.data.dtype, scales)
  total = prod + np.asarray(eager.read(acc), prod.dtype) if accumulate else prod
  eager.write(acc, total.astype(acc.buf.data.dtype))
  ms.union_write(th, acc, acc_mask)
  return reads + ([(acc.buf, acc_mask)] if accumulate else [])


def _arrive(th, bar: View, axis, what: str):
  if axis is None:
    ts.commit(th, bar, what)
  else:
    tcc.commit_both(th, bar, _other(th, axis), what)


@rule(tc.tcgen05_commit_arrive_p)
def _commit_arrive(th, eqn, invals):
  yield from ()
  what = "tcgen05_commit_arrive"
  (bar,), _ = mp.split_refs(invals, eqn.params["trees"])
  axis = eqn.params["collective_axis"]
  if axis is not None and tcc.partner(th, axis, what) is None:
    return []   # the other block of the pair: the leader arrives for it
  _arrive(th, bar[0].at(bar[1]), axis, what)
  return []

"""Views of SMEM buffers that Gluon's descriptors cannot take directly, as views they can:
nested static slices made one, pieces from a run-time start (the same bytes reinterpreted as
pieces, then indexed), the leading dimensions of a flattened buffer (rank > 3, or leading
dimensions of one element that are not stored) indexed all at once or the first ones only; and
static slices of register tiles read from accumulators.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from pallax._src import jax_internals as ji
from pallax._src.gluon import layouts as L
from pallax._src.gluon.values import i32
from pallax._src.gluon.writer import SmemRef
from pallax._src.gpu import expr as ex
from pallax._src.gpu.expr import Lit


def dynamic_piece(gen, ref: SmemRef, text: str, shape, idx) -> str:
  """A slice of the leading dimension from a start known only at run time, ``idx.size`` long:
  the view's leading dimension split into pieces of that size (the same bytes reinterpreted) (a power of two dividing it; for
  rows of a swizzled matrix, whole swizzle patterns of 8 rows), and the piece the start is at.
  A start that is not a multiple of the size stops the kernel (``trap``): the piece would be
  the wrong one."""
  n, size = shape[0], idx.size
  swizzled_rows = len(shape) == 2 and ref.swizzle
  if not (L.is_pow2(size) and L.is_pow2(n) and n % size == 0) or (swizzled_rows and size % 8) \
      or tuple(L.padded(shape[1:])) != tuple(shape[1:]):
    gen.unsupported(f"a slice of {size} from a run-time start of an SMEM dimension of {n} (pieces "
                    "of a power-of-two size dividing a power-of-two dimension only)")
  start = gen.render(gen.bind(idx.start, "start"))
  gen.emit(f"if {start} % {size} != 0:   # not at a piece: stop rather than use the wrong one")
  gen.emit('    gl.inline_asm_elementwise("trap;\\n mov.u32 $0, 0;", "=r", [], dtype=gl.int32, '
           "is_pure=False, pack=1)")
  layout = gen.layout(ref.buffer.seen_with(len(shape)))   # the same bytes, the pieces apart
  return (f"{text}._reinterpret({ex.dtype_name(ref.dtype, 'gl')}, {[n // size, size, *shape[1:]]}, "
          f"{layout}).index({start} // {size})")


def dynamic_columns(gen, ref: SmemRef, text: str, shape, idx) -> str:
  """A slice of the last dimension of a whole swizzled matrix from a start known only at run
  time, one swizzle width wide: rows wider than the swizzle are stored as column chunks one
  swizzle wide, one after another, so the matrix reinterpreted as (chunks, rows, swizzle width)
  is the same bytes, and the slice is the chunk the start is in. The start must be known to be a
  multiple of the width (JAX's Mosaic GPU refuses it otherwise, at compile time too)."""
  rows, cols = shape
  width = ref.swizzle // ref.dtype.itemsize if ref.swizzle else 0
  if not width or idx.size != width or cols % width or not L.is_pow2(cols) or not L.is_pow2(rows):
    gen.unsupported(f"a slice of {idx.size} columns from a run-time start of an SMEM matrix of "
                    f"shape {list(shape)} (one swizzle width, {width} elements, of a matrix of "
                    "power-of-two sizes only)")
  if ex.divisor(idx.start) % width:
    raise ValueError(
        f"pallas_call {gen.kernel_name}: a slice of {width} columns of a {ref.swizzle}-byte "
        f"swizzled SMEM matrix from a run-time start not known to be a multiple of {width}: "
        "Failed to infer a possible set of layouts (a slice must take whole swizzle chunks); "
        f"if the start is one, say so with pl.multiple_of(start, {width})")
  start = gen.render(gen.bind(idx.start, "start"))
  return (f"{text}._reinterpret({ex.dtype_name(ref.dtype, 'gl')}, {[cols // width, rows, width]}, "
          f"{gen.layout(ref.layout)}).index({start} // {width})")


def _static(i) -> int | None:
  i = i.value if isinstance(i, Lit) else i
  return i if isinstance(i, (int, np.integer)) else None


def compose_slices(transforms) -> list:
  """``transforms`` with each indexer of static slices and the indexer after it made one
  (``x.at[32:96].at[0:32]`` is ``x.at[32:64]``, which Gluon can slice where the first cannot)."""
  out = []
  for t in transforms:
    prev = out[-1] if out else None
    if (isinstance(t, ji.NDIndexer) and isinstance(prev, ji.NDIndexer)
        and all(isinstance(i, ji.Slice) and i.stride == 1 and _static(i.start) is not None
                for i in prev.indices)
        and all(_static(i.start if isinstance(i, ji.Slice) else i) is not None
                and (not isinstance(i, ji.Slice) or i.stride == 1) and not getattr(i, "shape", ())
                for i in t.indices)):
      indices = tuple(
          ji.Slice(_static(p.start) + _static(i.start), i.size, 1) if isinstance(i, ji.Slice)
          else _static(p.start) + _static(i) for p, i in zip(prev.indices, t.indices))
      out[-1] = ji.NDIndexer(indices, prev.shape, ())
      continue
    out.append(t)
  return out


def merge_lead_indices(transforms, lead) -> list:
  """``transforms`` with an indexer that takes integers at the first leading dimensions and the
  rest whole merged with the indexer after it (``smem.at[slot].at[i]`` is ``smem.at[slot, i]``),
  so that ``flat_index`` sees every integer index of the leading dimensions at once."""
  out = list(transforms)
  while len(out) > 1 and isinstance(out[0], ji.NDIndexer) and isinstance(out[1], ji.NDIndexer):
    t, nxt = out[0], out[1]
    ints = [not isinstance(i, ji.Slice) and not getattr(i, "shape", ()) for i in t.indices]
    k = ints.index(False) if False in ints else len(ints)
    whole = all(isinstance(i, ji.Slice) and (_static(i.start), i.size, i.stride) == (0, n, 1)
                for i, n in zip(t.indices[k:], t.shape[k:]))
    if not 0 < k < len(lead) or not whole or len(nxt.indices) != len(t.indices) - k:
      break
    out[:2] = [ji.NDIndexer((*t.indices[:k], *nxt.indices), t.shape, ())]
  return out


def flat_index(gen, ref: SmemRef, t):
  """(text, shape, the rest of indexer ``t``, the flat index) after indexing every leading
  dimension of a flattened buffer at once (Gluon's SMEM layouts describe at most one leading
  dimension), or the first ones only (``_partial_index``)."""
  n = len(ref.lead)
  k = indexed_lead(ref.shape, ref.lead, t)
  if k is None:
    gen.unsupported(f"slicing the leading dimensions of an SMEM buffer of shape {ref.shape} "
                    "(index them with integers)")
  if k < n:
    return _partial_index(gen, ref, t, k)
  rest = ji.NDIndexer(tuple(t.indices[n:]), tuple(ref.shape[n:]), t.int_indexer_shape)
  if unstored(ref):   # every index is 0 (the interpreter checks the bounds)
    return ref.text, list(ref.shape[n:]), rest, None
  flat = t.indices[0]
  for idx, size in zip(t.indices[1:n], L.padded(ref.lead[1:])):
    flat = gen.bind(ex.add(ex.mul(flat, i32(size)), idx), "slot")
  return f"{ref.text}.index({gen.render(flat)})", list(ref.shape[n:]), rest, flat


def indexed_lead(shape, lead, t) -> int | None:
  """How many leading dimensions of a flattened buffer indexer ``t`` indexes with integers:
  all of them, or the first k when the others are taken whole and are powers of two (the view
  is then a run of whole slabs of the flat dimension); None for any other indexer."""
  n = len(lead)
  if not isinstance(t, ji.NDIndexer) or len(t.indices) < n:
    return None
  ints = [not isinstance(i, ji.Slice) and not getattr(i, "shape", ()) for i in t.indices[:n]]
  k = ints.index(False) if False in ints else n
  if k == n:
    return n
  rest = t.indices[k:n]
  if k == 0 or any(ints[k:]) or tuple(L.padded(lead[k:])) != tuple(lead[k:]) or any(
      not isinstance(i, ji.Slice) or (getattr(i.start, "value", i.start), i.size, i.stride) != (0, m, 1)
      for i, m in zip(rest, lead[k:])):
    return None
  return k


def _partial_index(gen, ref: SmemRef, t, k: int):
  """The first ``k`` leading dimensions indexed, the others whole: the flattened buffer seen as
  (those k flattened, the others, the matrix), whose bytes are the same (an NVMMA layout keeps
  each matrix whole and its leading dimensions outermost), then indexed."""
  n = len(ref.lead)
  flat = t.indices[0]
  for idx, size in zip(t.indices[1:k], L.padded(ref.lead[1:k])):
    flat = gen.bind(ex.add(ex.mul(flat, i32(size)), idx), "slot")
  outer = int(np.prod(L.padded(ref.lead[:k])))
  shape = [outer, *ref.lead[k:], *L.padded(ref.shape[n:])]
  layout = dataclasses.replace(ref.buffer.seen_with(len(shape) - 1), bits=ref.dtype.itemsize * 8)
  text = (f"{ref.text}._reinterpret({ex.dtype_name(ref.dtype, 'gl')}, {shape}, "
          f"{gen.layout(layout)}).index({gen.render(flat)})")
  rest = ji.NDIndexer(tuple(t.indices[k:]), tuple(ref.shape[k:]), t.int_indexer_shape)
  return text, list(ref.shape[k:]), rest, flat


def unstored(ref) -> bool:
  """Whether ``ref``'s leading dimensions have one element in all, and are not stored
  (``allocation.stored_shape``)."""
  return bool(ref.lead) and int(np.prod(L.padded(ref.lead))) == 1


def static_slice(transforms, shape) -> tuple[list, list] | None:
  """(starts, limits) of a view that slices a register tile (an accumulator) statically with
  one indexer, None for any other."""
  if len(transforms) != 1 or not isinstance(transforms[0], ji.NDIndexer):
    return None
  starts, limits = [], []
  for idx, n in zip(transforms[0].indices, shape):
    start = idx.start.value if isinstance(getattr(idx, "start", None), Lit) else getattr(idx, "start", None)
    if not isinstance(idx, ji.Slice) or not isinstance(start, int) or idx.stride != 1:
      return None
    starts.append(start)
    limits.append(start + idx.size)
  return starts, limits

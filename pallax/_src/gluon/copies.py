"""Gluon rules of the Mosaic GPU primitives that move data between GMEM and SMEM, and of the
barriers they complete: TMA copies (a box the hardware cannot take in one copy is split into
pieces), TMA stores and their waits, and what Gluon 3.6's TMA cannot do at all, done from
registers instead (stores of rows from a run-time start, reduce-stores as atomics).

The views and pointers these share with the register loads and stores are in ``memory.py``.
"""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from pallax._src import jax_internals as ji
from pallax._src.gpu import expr as ex
from pallax._src.gpu.expr import binary, method
from pallax._src.gluon import layouts as L
from pallax._src.mosaic_gpu import primitives as mp
from pallax._src.gluon.assign import Gmem, Smem, layout_rule
from pallax._src.gluon.events import Access, BarrierOp, Copy, SmemView
from pallax._src.gluon.memory import (barrier_view, gmem_pointers, register_view, register_view_layouts,
                                      row_slice, smem_view, smem_view_layouts)
from pallax._src.gluon.multiples import known_multiple
from pallax._src.gluon.values import I32, i32, iota_in
from pallax._src.gluon import peers, subbyte
from pallax._src.gluon.writer import GmemRef, SmemRef, rule


# --- TMA boxes -------------------------------------------------------------------------------

def _gmem_coords(gen, ref: GmemRef, transforms) -> tuple[list, tuple]:
  """(the box's starting coordinates in the operand, the box shape over all of the operand's
  dimensions) of a GMEM view: an integer index is a dimension of the box of size 1."""
  starts = [i32(0) for _ in ref.shape]
  dims = list(range(len(ref.shape)))       # view dimension -> operand dimension
  box = list(ref.shape)
  for t in (*ref.pre, *transforms):
    if not isinstance(t, ji.NDIndexer):
      gen.unsupported(f"the GMEM view {t}")
    kept = []
    for idx, d in zip(t.indices, dims):
      if isinstance(idx, ji.Slice):
        if idx.stride != 1:
          gen.unsupported("TMA copies of strided GMEM views")
        start, box[d] = (idx.start if isinstance(idx.start, ex.Expr) else i32(idx.start)), idx.size
        kept.append(d)
      elif not getattr(idx, "shape", ()):
        start, box[d] = idx, 1
      else:
        gen.unsupported("TMA copies of gathered GMEM views")
      starts[d] = gen.bind(ex.add(starts[d], start), "c")
    dims = kept
  return starts, tuple(box)


def _shared(smem: SmemRef, rank: int) -> L.Shared:
  """The NVMMA layout of view ``smem`` with ``rank`` dimensions (its buffer's swizzle)."""
  layout = L.shared(smem.shape, smem.dtype, rank)
  if smem.buffer is not None and smem.buffer.layout.swizzle == 0:
    layout = dataclasses.replace(layout, swizzle=0)
  return layout


def _box_view(gen, smem: SmemRef, box) -> tuple[str, L.Layout]:
  """(the SMEM expression a TMA copy of ``box`` reads or writes, the descriptor's layout): a box
  with more dimensions than the buffer (unit ones) sees it through a reshape."""
  if tuple(box) == tuple(smem.shape) and smem.reshaped:   # Gluon infers the reshape's layout
    return smem.text, gen.declared(_shared(smem, len(box)))
  _refuse_permuted(gen, smem, box)
  if tuple(box) == tuple(smem.shape):   # the buffer's layout may have a lower rank (its views')
    if len(box) <= 2 and not gen.is_whole(smem):
      return smem.text, smem.layout
    layout = gen.declared(_shared(smem, len(box)))
    if gen.is_whole(smem):
      return gen.whole_view(smem), layout
    if smem.buffer is not None and smem.buffer.wide_rows(len(box)):
      gen.unsupported(f"a TMA box {tuple(box)} of a view of an SMEM buffer stored with a layout "
                      f"of rank {smem.buffer.rank}, its rows wider than the swizzle (copy it "
                      "slot by slot, smem.at[i])")
    return (f"{smem.text}._reinterpret({ex.dtype_name(smem.dtype, 'gl')}, {list(L.padded(box))}, "
            f"{gen.layout(layout)})", layout)
  if tuple(d for d in box if d != 1) != tuple(d for d in smem.shape if d != 1):
    gen.unsupported(f"a TMA box {tuple(box)} for an SMEM buffer of shape {smem.shape}")
  layout = gen.declared(_shared(smem, len(box)))
  return f"{smem.text}.reshape({list(L.padded(box))})", layout


def _refuse_permuted(gen, smem: SmemRef, box):
  """A transpose that is not the view's last step (``_tma`` handles those): the box would land
  in the buffer's own order (Gluon's reinterpretation of a view drops its permutation), so that
  is refused."""
  perms = [s[1] for s in smem.steps if s[0] == "permute" and tuple(s[1]) != tuple(range(len(s[1])))]
  if perms:
    gen.unsupported(f"a TMA box {tuple(box)} into a view of SMEM whose dimensions "
                    f"plgpu.transpose_ref reordered {tuple(perms[0])} (copy into the buffer's own "
                    "order and transpose in registers, or copy slice by slice)")


# --- copies and barriers ---------------------------------------------------------------------

def barrier_name(b) -> str:
  """``barrier[k]`` (the k-th barrier allocation), or ``barrier[k][i]`` for a literal index i
  into an array of barriers."""
  if b.count == 1:
    return f"barrier[{b.id}]"
  return f"barrier[{b.id}][{b.index.value if isinstance(b.index, ex.Lit) else '?'}]"


def _refs(ctx, invals):
  refs, rest = mp.split_refs(invals, ctx.eqn.params["trees"])
  refs = [peers.resolve(ctx.gen, *r, tma=True) if r is not None and isinstance(r[0], GmemRef)
          else r for r in refs]
  return refs, rest


def _predicated(gen, eqn, rest):
  """Opens ``if predicate:`` when the primitive has one (close with _end)."""
  if not eqn.params.get("has_predicate"):
    return False
  gen.emit(f"if {gen.render(rest[0])}:")
  gen.depth += 1
  return True


def _end(gen, opened):
  if opened:
    gen.depth -= 1


TMA_MAX_BOX = 256   # elements along one dimension of a hardware TMA box


def _split(b: int, p: int, n: int) -> list[int]:
  """The sizes a box dimension of ``b`` elements (padded to ``p``; the array's dimension has
  ``n``) is copied in: whole where TMA takes it; past 256, boxes of 256; along a dimension the
  box spans only part of, never past the box's end (powers of two that sum to it: 16 + 8 for 24,
  128 + 64 for 192, 256 + 128 for 384), where padding would reach into the next block."""
  if b != n and not L.is_pow2(b):
    rest = b % TMA_MAX_BOX
    return [TMA_MAX_BOX] * (b // TMA_MAX_BOX) + [1 << k for k in reversed(range(rest.bit_length()))
                                                 if rest >> k & 1]
  return [TMA_MAX_BOX] * (p // TMA_MAX_BOX) if p > TMA_MAX_BOX else [b]


def _box_pieces(box, padded, gmem_shape, smem: SmemRef, swizzle: int) -> list[list[tuple[int, int]]]:
  """Per dimension of a TMA box, the (offset, size) pieces it is copied in (``_split``; a tiled
  SMEM buffer is copied so by Mosaic GPU too). A piece must start in SMEM where TMA may write
  (128 bytes, or a whole swizzle pattern of 8 rows; along rows, at a swizzle atom's columns, or
  16 bytes unswizzled), a swizzled buffer splits along rows in whole patterns only, and a piece
  of a row spans at least the swizzle's width (``swizzle``: the bytes of the descriptor's
  layout). Where they cannot, the dimension stays whole and the descriptor says why."""
  out = []
  for d, (b, p, n) in enumerate(zip(box, padded, gmem_shape)):
    step = int(np.prod(padded[d + 1:])) * smem.dtype.itemsize   # SMEM bytes per index of d
    along_rows = d == len(box) - 1 and len(box) > 1
    align = (swizzle or 16) if along_rows else max(128, 8 * smem.swizzle)
    sizes = _split(b, p, n)
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    rows = d == len(box) - 2 and smem.swizzle
    narrow = along_rows and any(q * step < swizzle for q in sizes)
    if any(o * step % align for o in offsets) or (rows and any(q % 8 for q in sizes[1:])) or narrow:
      sizes, offsets = [b], [0]
    out.append(list(zip(offsets, sizes)))
  return out


def _planes(smem: SmemRef, box) -> list[tuple[int, SmemRef]]:
  """A TMA box of a whole 3-D buffer stored with a layout of rank 2 whose rows are wider than
  its swizzle: the box copied plane by plane, each ``(plane, smem.index(plane))`` through a
  box of one plane, so that TMA places the bytes as the buffer's own layout does
  (``Buffer.wide_rows``). Otherwise ``[]``: the box as it is."""
  buffer = smem.buffer
  if buffer is None or smem.lead or len(box) != 3 or tuple(box) != tuple(smem.shape) or \
      buffer.rank != 2 or not buffer.wide_rows(3):
    return []
  return [(p, dataclasses.replace(smem, text=f"{smem.text}.index({p})", shape=tuple(smem.shape[1:]),
                                  steps=smem.steps + (("index", i32(p)),), whole=False,
                                  layout=buffer.layout))
          for p in range(box[0])]


def _tma(gen, smem_ref, gmem_ref, direction: str, barrier=None) -> tuple[list, int]:
  """The boxes of a copy, each (the SMEM side's expression, the descriptor, the coordinates,
  the box as data: ``events.Copy``), and their bytes (see ``_box_pieces``; ``_planes``)."""
  transforms, perm = _trailing_permutation(smem_ref[1])
  smem = smem_view(gen, smem_ref[0], transforms)
  starts, box = _gmem_coords(gen, *gmem_ref)
  if perm is not None:
    starts, box, gmem_ref = _gmem_reordered(gen, gmem_ref, starts, box, perm)
  if smem.packed is not None or subbyte.in_bytes(gmem_ref[0].dtype):
    starts, box, gmem_ref = _gmem_bytes(gen, smem, gmem_ref, starts, box)
  if len(box) > TMA_RANK:
    starts, box, gmem_ref = _without_unit_dims(gen, gmem_ref, starts, box)
  planes = _planes(smem, box)
  if not planes:
    return _tma_box(gen, smem, starts, box, gmem_ref, direction, barrier)
  boxes, nbytes = [], 0
  for p, plane in planes:
    at = [gen.bind(ex.add(starts[0], i32(p)), "c"), *starts[1:]]
    more, n = _tma_box(gen, plane, at, (1, *box[1:]), gmem_ref, direction, barrier)
    boxes, nbytes = boxes + more, nbytes + n
  return boxes, nbytes


TMA_RANK = 5   # the most dimensions a TMA copy has


def _without_unit_dims(gen, gmem_ref, starts, box):
  """A copy of more dimensions than TMA takes, over the operand seen without its dimensions of
  size one (whose coordinate can only be 0): (starts, box, GMEM ref)."""
  ref, transforms = gmem_ref
  keep = [d for d, n in enumerate(ref.shape) if n != 1]
  if len(keep) > TMA_RANK:
    gen.unsupported(f"a TMA copy of {ref.origin} of shape {ref.shape}: TMA copies have at most "
                    f"{TMA_RANK} dimensions, and only those of size one can be left out")
  strides = ref.strides or tuple(int(np.prod(ref.shape[k + 1:])) for k in range(len(ref.shape)))
  seen = dataclasses.replace(ref, shape=tuple(ref.shape[d] for d in keep),
                             strides=tuple(strides[d] for d in keep))
  return [starts[d] for d in keep], tuple(box[d] for d in keep), (seen, transforms)


def _trailing_permutation(transforms) -> tuple[list, tuple | None]:
  """(``transforms`` without the transposes at their end, the permutation those make; None if
  none or the identity)."""
  transforms, perm = list(transforms), None
  while transforms and isinstance(transforms[-1], ji.TransposeRef):
    p = tuple(transforms.pop().permutation)
    perm = p if perm is None else tuple(p[i] for i in perm)
  return transforms, None if perm is None or perm == tuple(range(len(perm))) else perm


def _gmem_reordered(gen, gmem_ref, starts, box, perm):
  """A TMA copy into (or out of) ``transpose_ref(view, perm)``: issued in the SMEM view's own
  order of dimensions, over the GMEM operand seen with its dimensions reordered to match (a
  descriptor with permuted shape and strides), so that TMA places every element where the
  transposed view has it. The operand's innermost dimension must stay innermost (TMA reads
  rows of consecutive elements)."""
  ref, transforms = gmem_ref
  rank, extra = len(ref.shape), len(ref.shape) - len(perm)
  if extra > 0 and all(b == 1 for b in box[:extra]):   # leading dimensions indexed away
    perm = (*range(extra), *(p + extra for p in perm))
  inv = tuple(int(i) for i in np.argsort(perm))   # buffer dimension -> operand dimension
  if len(perm) != rank or inv[-1] != rank - 1:
    gen.unsupported(f"a TMA box {tuple(box)} into a view of SMEM whose dimensions "
                    f"plgpu.transpose_ref reordered {perm} (TMA keeps the innermost dimension "
                    "innermost: transpose in registers instead)")
  strides = ref.strides or tuple(int(np.prod(ref.shape[k + 1:])) for k in range(rank))
  seen = dataclasses.replace(ref, shape=tuple(ref.shape[i] for i in inv),
                             strides=tuple(strides[i] for i in inv))
  return [starts[i] for i in inv], tuple(box[i] for i in inv), (seen, transforms)


def _gmem_bytes(gen, smem: SmemRef, gmem_ref, starts, box):
  """A TMA copy of packed values (subbyte.py) as one of their bytes: (starts, box, GMEM ref)
  along the last dimension in bytes, the operand seen as bytes."""
  ref, transforms = gmem_ref
  if smem.packed != ref.dtype:
    gen.unsupported(f"a TMA copy between {ref.origin} of {ref.dtype.name} and an SMEM buffer of "
                    f"{getattr(smem.packed, 'name', smem.dtype.name)}")
  per = subbyte.values_per_byte(ref.dtype)
  shape = subbyte.byte_shape(ref.shape, ref.dtype)
  last = starts[-1]
  if shape is None or box[-1] % per or known_multiple(last, gen.multiples) % per:
    gen.unsupported(f"a TMA copy of {ref.origin} ({ref.dtype.name}, {per} values a byte) whose "
                    "rows do not start and end on a byte")
  start = i32(last.value // per) if isinstance(last, ex.Lit) else gen.bind(
      ex.binary("//", last, i32(per)), "c")
  as_bytes = dataclasses.replace(ref, dtype=subbyte.BYTES, shape=shape)
  return [*starts[:-1], start], (*box[:-1], box[-1] // per), (as_bytes, transforms)


def _tma_box(gen, smem: SmemRef, starts, box, gmem_ref, direction: str, barrier):
  """``_tma`` of one box: its pieces."""
  text, layout = _box_view(gen, smem, box)
  padded = L.padded(box)
  pieces, nbytes = [], 0
  swizzle = layout.swizzle if isinstance(layout, L.Shared) else smem.swizzle
  for piece in itertools.product(*_box_pieces(box, padded, gmem_ref[0].shape, smem, swizzle)):
    slices = [(o, L.pow2(q), d) for d, (o, q) in enumerate(piece) if L.pow2(q) < padded[d]]
    view = text + "".join(f".slice({o}, {q}, dim={d})" for o, q, d in slices)
    coords = [gen.bind(ex.add(s, i32(o)), "c") if o else s for s, (o, _) in zip(starts, piece)]
    piece_box = tuple(q for _, q in piece)
    steps = smem.steps + tuple(("slice", *s) for s in slices)
    event = Copy(direction, gmem_ref[0].origin, SmemView(gen.smem_name(smem), steps),
                 L.padded(piece_box), tuple(coords), barrier)
    pieces.append((view, gen.descriptor(gmem_ref[0], piece_box, layout),
                   ", ".join(map(gen.render, coords)), event))
    # The hardware counts each whole (padded) box's bytes, zeros past the array's end too.
    nbytes += int(np.prod(L.padded(piece_box))) * smem.dtype.itemsize
  return pieces, nbytes


@rule(mp.copy_gmem_to_smem_p)
def _copy_gmem_to_smem(ctx, *invals, **params):
  gen = ctx.gen
  (src, dst, bar), rest = _refs(ctx, invals)
  # A multicast copy: each block of the cluster loads the whole box itself (gluon/clusters.py).
  if params["collective_axes"] and params.get("leader_tracked") is not None:
    gen.unsupported("leader-tracked cluster copies (copy_gmem_to_smem(leader_tracked=...))")
  if bar is None:
    raise NotImplementedError("copy_gmem_to_smem needs a barrier on Hopper")
  if not isinstance(src[0], GmemRef) or not isinstance(dst[0], SmemRef):
    raise ValueError("copy_gmem_to_smem copies from GMEM to SMEM")
  barrier = barrier_view(gen, *bar)
  pieces, nbytes = _tma(gen, dst, src, "in", barrier_name(barrier))
  b = f"{barrier.name}.index({gen.render(barrier.index)})"
  opened = _predicated(gen, ctx.eqn, rest)
  gen.events.append(BarrierOp("expect", barrier_name(barrier), nbytes))
  gen.emit(f"mbarrier.expect({b}, {nbytes})")   # one arrival, whatever the number of boxes
  for target, desc, coords, event in pieces:
    gen.events.append(event)
    gen.emit(f"tma.async_copy_global_to_shared({desc}, [{coords}], {b}, {target})")
  if opened:   # predicated off: the barrier still gets its one arrival, as in Mosaic GPU
    gen.depth -= 1
    gen.emit("else:")
    gen.emit(f"    mbarrier.arrive({b})")
  return []


def _dynamic_rows(smem, transforms) -> tuple[ex.Expr, int] | None:
  """(start, size) where ``transforms`` take rows of a 2-D SMEM buffer from a start known only
  at run time (and whole columns); None otherwise."""
  rows = row_slice(smem, transforms)
  return rows if rows is not None and len(smem.shape) == 2 and not isinstance(rows[0], int) else None


def _store_rows_through_registers(gen, smem: SmemRef, start, size, dst: GmemRef, transforms):
  """A TMA store of SMEM rows [start, start + size) (a start known only at run time, which TMA
  boxes and Gluon's SMEM slices cannot take) as a masked register store: the whole buffer is
  read, and each row written to where the copy would put it. The GMEM view is 2-D: two slices
  (rows, columns) of its last indexer, its other dimensions indexed by integers. Rows and columns
  TMA would clip past the end of the indexed array are masked off too."""
  *outer, t = transforms
  kept = [d for d, i in enumerate(t.indices) if isinstance(i, ji.Slice)]
  if len(kept) != 2 or any(getattr(t.indices[d], "shape", ()) for d in range(len(t.indices))
                           if d not in kept):
    gen.unsupported("copies of dynamic SMEM slices to GMEM views other than 2-D slices "
                    "(integer indices and two slices)")
  dr, dc = kept
  grows, gcols = t.indices[dr], t.indices[dc]
  g0 = grows.start if isinstance(grows.start, ex.Expr) else i32(grows.start)
  c0 = gcols.start if isinstance(gcols.start, ex.Expr) else i32(gcols.start)
  first = gen.bind(binary("-", g0, start), "row0")   # the GMEM row of the buffer's row 0
  indices = list(t.indices)
  indices[dr] = ji.Slice(first, smem.shape[0], 1)
  shifted = ji.NDIndexer(tuple(indices), t.shape, t.int_indexer_shape)
  ptrs, shape, layout, valid, offset = gmem_pointers(gen, dst, [*outer, shifted])
  r = iota_in(gen, I32, shape, 0, layout)
  c = iota_in(gen, I32, shape, 1, layout)
  b = np.dtype(np.bool_)
  conds = [binary(">=", r, start, dtype=b), binary("<", r, ex.add(start, i32(size)), dtype=b),
           binary("<", ex.add(first, r), i32(t.shape[dr]), dtype=b),
           binary("<", ex.add(c0, c), i32(t.shape[dc]), dtype=b)]
  mask = conds[0] if valid is None else binary("&", valid, conds[0], dtype=b)
  for cond in conds[1:]:
    mask = binary("&", mask, cond, dtype=b)
  view = register_view(gen, smem, [])
  gen.events += [Access("load", gen.smem_view(view), view.shape),
                 Access("store", dst.origin, shape, offset)]
  value = gen.value(method(ex.Name(view.text, dtype=view.dtype, shape=view.shape), "load",
                           ex.Token(gen.layout(layout))), layout)
  rows = gen.render(gen.bind(mask, "rows"))
  gen.emit(f"gl.store({gen.render(ptrs)}, {gen.render(value)}, mask={rows})")


_ATOMICS = {"add": "gl.atomic_add", "min": "gl.atomic_min", "max": "gl.atomic_max",
            "and": "gl.atomic_and", "or": "gl.atomic_or", "xor": "gl.atomic_xor"}


def _reduce_through_registers(gen, src, dst, op: str):
  """A TMA reduce-store (Gluon 3.6 has none) as atomics from registers: each element of the SMEM
  view reduced into GMEM, as the hardware's reduce does, past the array's end dropped."""
  if op not in _ATOMICS:
    gen.unsupported(f"TMA reduce-stores with reduction_op={op!r}")
  starts, box = _gmem_coords(gen, *dst)
  ptrs, shape, layout, mask, offset = gmem_pointers(gen, *dst)
  kept = [d for d, b in enumerate(box) if b != 1 or len(shape) == len(box)]
  if len(kept) != len(shape):
    gen.unsupported("TMA reduce-stores into GMEM views with indexed dimensions")
  b = np.dtype(np.bool_)
  for j, d in enumerate(kept):   # TMA drops what lies past the array's end
    inside = binary("<", ex.add(starts[d], iota_in(gen, I32, shape, j, layout)),
                    i32(dst[0].shape[d]), dtype=b)
    mask = inside if mask is None else binary("&", mask, inside, dtype=b)
  view = register_view(gen, *src)
  gen.events += [Access("load", gen.smem_view(view), view.shape),
                 Access("atomic", dst[0].origin, shape, offset)]
  value = gen.value(method(ex.Name(view.text, dtype=view.dtype, shape=view.shape), "load",
                           ex.Token(gen.layout(layout))), layout)
  masks = "" if mask is None else f", mask={gen.render(gen.bind(mask, 'inside'))}"
  gen.emit(f"{_ATOMICS[op]}({gen.render(ptrs)}, {gen.render(value)}{masks})")


@rule(mp.copy_smem_to_gmem_p)
def _copy_smem_to_gmem(ctx, *invals, **params):
  gen = ctx.gen
  (src, dst, _), rest = _refs(ctx, invals)
  if not isinstance(src[0], SmemRef) or not isinstance(dst[0], GmemRef):
    raise ValueError("copy_smem_to_gmem copies from SMEM to GMEM")
  rows = _dynamic_rows(*src)
  if (params["reduction_op"] is not None or rows is not None) and src[0].packed is not None:
    gen.unsupported(subbyte.UNWRITTEN.format("a copy through registers (a reduction, or rows from "
                                             "a run-time start) of an SMEM buffer", src[0].packed.name))
  if params["reduction_op"] is not None:
    opened = _predicated(gen, ctx.eqn, rest)
    _reduce_through_registers(gen, src, dst, params["reduction_op"])
    _end(gen, opened)
    return []
  if rows is not None:
    opened = _predicated(gen, ctx.eqn, rest)
    _store_rows_through_registers(gen, src[0], *rows, dst[0], dst[1])
    _end(gen, opened)
    return []
  pieces, _ = _tma(gen, src, dst, "out")
  if not params["commit_group"]:
    gen.grouped_stores = True   # Gluon groups each store alone: waits become waits for all
  opened = _predicated(gen, ctx.eqn, rest)
  for source, desc, coords, event in pieces:
    gen.events.append(event)
    gen.emit(f"tma.async_copy_shared_to_global({desc}, [{coords}], {source})")
  _end(gen, opened)
  return []


@rule(mp.barrier_wait_p)
def _barrier_wait(ctx, *invals, **_):
  gen = ctx.gen
  (bar,), _ = _refs(ctx, invals)
  b = barrier_view(gen, *bar)
  i = gen.render(b.index)
  gen.events.append(BarrierOp("wait", barrier_name(b)))
  gen.phases_read.add(b.phase)
  gen.emit(f"mbarrier.wait({b.name}.index({i}), ({b.phase} >> {i}) & 1)")
  gen.emit_scalar(f"{b.phase} = {b.phase} ^ (1 << {i})")
  return []


@rule(mp.barrier_arrive_p)
def _barrier_arrive(ctx, *invals, **_):
  gen = ctx.gen
  (bar,), rest = _refs(ctx, invals)
  b = barrier_view(gen, *bar)
  opened = _predicated(gen, ctx.eqn, rest)
  gen.events.append(BarrierOp("arrive", barrier_name(b)))
  gen.emit(f"mbarrier.arrive({b.name}.index({gen.render(b.index)}))")
  _end(gen, opened)
  return []


@rule(mp.commit_smem_p)
def _commit_smem(ctx):
  ctx.gen.emit("hopper.fence_async_shared()")
  return []


@rule(mp.commit_smem_to_gmem_group_p)
def _commit_group(ctx):
  return []   # see _wait_smem_to_gmem


@rule(mp.wait_smem_to_gmem_p)
def _wait_smem_to_gmem(ctx, *, n, wait_read_only):
  # Gluon counts each store as a group: with groups of several stores (commit_group=False), wait
  # for all of them. Its store_wait waits for a store's reads of SMEM only; a full wait (the
  # writes to GMEM done) is the same PTX without `.read`, by the thread that issued the stores,
  # then a barrier for the warpgroup's other threads.
  gen = ctx.gen
  n = 0 if gen.grouped_stores else n
  gen.emit(f"tma.store_wait({n})")
  if not wait_read_only:
    gen.emit(f'gl.inline_asm_elementwise("cp.async.bulk.wait_group {n};\\n mov.u32 $0, 0;", "=r", '
             "[], dtype=gl.int32, is_pure=False, pack=1)")
    gen.emit("gl.thread_barrier()")
  return []


# --- layout assignment (assign.py) ------------------------------------------------------------

@layout_rule(mp.copy_gmem_to_smem_p)
def _copy_gmem_to_smem_layouts(ctx, *invals, **params):
  (src, dst, bar), _ = _refs(ctx, invals)
  if not params["collective_axes"] and bar is not None and isinstance(dst[0], Smem):
    smem_view_layouts(*dst)
    ctx.padding_unread(dst[0])   # (it writes the view's elements only)
  return None


@layout_rule(mp.copy_smem_to_gmem_p)
def _copy_smem_to_gmem_layouts(ctx, *invals, **params):
  (src, dst, _), _ = _refs(ctx, invals)
  if not isinstance(src[0], Smem) or not isinstance(dst[0], Gmem):
    return None
  if params["reduction_op"] is not None:
    if params["reduction_op"] in _ATOMICS:
      register_view_layouts(*src)
  elif _dynamic_rows(*src) is not None:
    register_view_layouts(src[0], [])
  else:
    smem_view_layouts(*src)
  return None

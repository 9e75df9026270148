"""Gluon views of Refs (SMEM slices, indices and transposes; barrier indices; GMEM pointer
tensors) and the rules of register loads and stores through them. A view whose last transform is
``ref.reshape(...)`` is read or written by registers only: the view before the reshape is loaded
and the value reshaped in registers (a store: the value reshaped back, then stored).
"""
from __future__ import annotations

import dataclasses

import numpy as np
from jax import lax

from pallax._src import jax_internals as ji
from pallax._src import ref_access
from pallax._src import remote
from pallax._src.gluon import acc_pieces
from pallax._src.gluon import layouts as L
from pallax._src.gluon.assign import Acc, Closed, Gmem, Smem, Val, layout_rule
from pallax._src.gluon.events import Access
from pallax._src.gluon.reshapes import reshape_tile, reshaped_val
from pallax._src.gluon.shapes import halve_all, halvings
from pallax._src.gluon.smem_views import (compose_slices, dynamic_columns, dynamic_piece, flat_index,
                                          indexed_lead,
                                          merge_lead_indices,
                                          static_slice, unstored)
from pallax._src.gluon.values import (I32, dtype_token, i32, masked, shape_token, slice_layout,
                                      to_layout, valid_lanes, wait_all, wgmma_vector_of)
from pallax._src.gluon import peers, subbyte
from pallax._src.gluon.writer import AccRef, BarrierRef, GmemRef, SmemRef, ValueRef, rule
from pallax._src.gpu import expr as ex
from pallax._src.gpu.expr import Lit, call, method
from pallax._src.mosaic_gpu import primitives as mp

def smem_view(gen, ref: SmemRef, transforms, k_last: bool = False) -> SmemRef:
  """The view of ``ref`` that ``transforms`` take (``k_last``: a wgmma operand whose buffer's
  last dimension is K, which may be sliced inside a swizzle atom, as wgmma itself steps
  through it)."""
  text, shape, permuted, steps = ref.text, list(ref.shape), False, list(ref.steps)
  transforms = _bytes_view(gen, ref, compose_slices(transforms))
  if ref.lead:
    transforms = merge_lead_indices(transforms, ref.lead)
  if ref.lead:   # a buffer of rank > 3, stored with its leading dimensions flattened
    if not transforms:   # used whole: the flattened dimension split again
      return dataclasses.replace(ref, text=f"{ref.text}.reshape({list(L.padded(ref.shape))})",
                                 lead=(), reshaped=True, whole=False,
                                 steps=ref.steps + (("reshape", L.padded(ref.shape)),))
    text, shape, transforms[0], flat = flat_index(gen, ref, transforms[0])
    if flat is not None:
      steps.append(("index", flat))
  # (leading dimensions of one element, not stored: indexing them leaves the whole buffer)
  whole = ref.whole and (not ref.lead or (unstored(ref) and flat is None))
  for t in transforms:
    if isinstance(t, ji.TransposeRef):
      text = f"{text}.permute({tuple(t.permutation)})"
      shape = [shape[p] for p in t.permutation]
      permuted, whole = True, False
      steps.append(("permute", tuple(t.permutation)))
      continue
    if not isinstance(t, ji.NDIndexer):
      gen.unsupported(_unknown_view(t))
    new_shape, dim, rank = [], 0, sum(isinstance(i, ji.Slice) for i in t.indices)
    for idx, size in zip(t.indices, shape):
      if isinstance(idx, ji.Slice):
        run_time = _run_time_slice(gen, ref, text, shape, idx, dim, whole, permuted)
        if run_time is not None:
          text, step = run_time
          steps.append(step)
          new_shape.append(idx.size)
          whole = False
          dim += 1
          continue
        if not (isinstance(idx.start, Lit) or isinstance(idx.start, int)) or idx.stride != 1:
          gen.unsupported("dynamic or strided slices of SMEM")
        start = idx.start.value if isinstance(idx.start, Lit) else idx.start
        if (start, idx.size) != (0, size):
          if permuted:
            gen.unsupported("partial slices of a transposed SMEM view")
          _check_smem_slice(gen, ref, start, idx.size, rank - dim, k_last)
          text, whole = f"{text}.slice({start}, {idx.size}, {dim})", False
          steps.append(("slice", start, idx.size, dim))
        new_shape.append(idx.size)
        dim += 1
      elif not getattr(idx, "shape", ()):
        if dim != 0:
          gen.unsupported("indexing an inner dimension of SMEM")
        text, whole = f"{text}.index({gen.render(idx)})", False
        steps.append(("index", idx))
      else:
        gen.unsupported("gathers from SMEM")
    shape = new_shape
  return SmemRef(text, tuple(shape), ref.dtype, ref.layout, ref.swizzle, buffer=ref.buffer,
                 steps=tuple(steps), whole=whole, packed=ref.packed)


def _run_time_slice(gen, ref: SmemRef, text: str, shape, idx, dim: int, whole: bool,
                    permuted: bool):
  """(the view's text, its step) for a slice from a start known only at run time that Gluon
  can take: of the leading dimension (``dynamic_piece``), or of the last dimension of a whole
  2-D matrix (``dynamic_columns``); None for any other slice."""
  if isinstance(idx.start, (Lit, int)) or idx.stride != 1 or permuted:
    return None
  if dim == 0:
    return dynamic_piece(gen, ref, text, shape, idx), ("piece", idx.start, idx.size)
  if dim == 1 == len(shape) - 1 and whole:
    return dynamic_columns(gen, ref, text, shape, idx), ("columns", idx.start, idx.size)
  return None


def _unknown_view(t) -> str:
  """What ``smem_view`` refuses: a reshaped view there is an asynchronous operation's operand
  (register loads and stores take the view before the reshape: ``split_reshape``)."""
  if isinstance(t, ji.ReshapeRef):
    return (f"the SMEM view {t} as the operand of a TMA copy or an MMA (only register loads and "
            "stores go through ref.reshape(...): copy or multiply through a buffer allocated in "
            "the shape wanted, or reshape a loaded value in registers)")
  return f"the SMEM view {t}"


def _bytes_view(gen, ref: SmemRef, transforms) -> list:
  """``transforms`` of a buffer of packed values (subbyte.py) as views of its bytes."""
  if ref.packed is None:
    return transforms
  view = subbyte.byte_view(transforms, ref.shape, subbyte.values_per_byte(ref.packed))
  if view is None:
    gen.unsupported(f"a view of an SMEM buffer of {ref.packed.name} that splits a byte (its "
                    "values are packed: slice its rows at whole bytes)")
  return view


def _check_smem_slice(gen, ref: SmemRef, start: int, size: int, from_end: int, k_last: bool):
  """Swizzled SMEM splits at whole swizzle atoms only: along rows in groups of 8, along the
  last dimension in whole swizzle widths (16 bytes when not swizzled), or, where that is a
  wgmma operand's K, in steps of wgmma's K (32 bytes); and a slice starts at a multiple of its
  own size (Gluon's subslices are aligned tiles)."""
  if start % size or not L.is_pow2(size):
    gen.unsupported(f"a slice [{start}:{start + size}] of SMEM that does not start at a multiple "
                    f"of its size {size}, or whose size is not a power of two")
  if from_end == 1 and k_last:
    atom = 32 // ref.dtype.itemsize
    what = f"{atom} elements (wgmma's K step)"
  elif from_end == 1:
    atom = max(ref.swizzle, 16) // ref.dtype.itemsize
    what = f"{atom} elements (its {ref.swizzle}-byte swizzle)"
  elif from_end == 2:
    atom, what = 8, "8 rows"
  else:
    return
  if start % atom or size % atom:
    gen.unsupported(f"a slice [{start}:{start + size}] of SMEM that does not start and end at a "
                    f"multiple of {what}")


def barrier_view(gen, ref: BarrierRef, transforms) -> BarrierRef:
  if not isinstance(ref, BarrierRef):
    raise ValueError(f"a barrier operation takes a plgpu.Barrier, not {type(ref).__name__}")
  if not transforms:
    return dataclasses.replace(ref, index=i32(0))
  (t,) = transforms
  if any(isinstance(i, ji.Slice) for i in t.indices):
    gen.unsupported("a barrier operation on several barriers at once")
  # Barriers of several dimensions (Barrier(num_barriers=(2, 3))) are allocated flat.
  idx, stride = None, 1
  for i, n in reversed(list(zip(t.indices, t.shape))):
    term = ex.mul(i32(i) if isinstance(i, (int, np.integer)) else i, stride)
    if idx is None:
      idx = term
    elif isinstance(term, Lit) and isinstance(idx, Lit):
      idx = i32(term.value + idx.value)
    else:
      idx = ex.binary("+", term, idx)
    stride *= n
  return dataclasses.replace(ref, index=idx)



def gmem_pointers(gen, ref: GmemRef, transforms, packed: bool = False) -> tuple:
  """(the pointer tensor of a GMEM view, the view's shape, its layout, the mask of its padded
  lanes or None, its first element's offset): register accesses of GMEM read or write whole
  views; the interpreter checks their bounds. ``packed``: the view's element offsets instead of
  pointers (a sub-byte array, whose elements share bytes: ``subbyte.py``)."""
  ref, transforms = peers.resolve(gen, ref, transforms)
  if subbyte.in_bytes(ref.dtype) and not packed:
    gen.unsupported(subbyte.UNWRITTEN.format(f"a store or atomic into {ref.origin} from registers", ref.dtype.name))
  gen.pointer_uses.add(ref.ptr)
  rank = len(ref.shape)
  strides = [int(np.prod(ref.shape[k + 1:])) for k in range(rank)]
  offset: ex.Expr = i32(0)
  dims = list(range(rank))          # view dimension -> operand dimension
  sizes = list(ref.shape)
  for t in (*ref.pre, *transforms):
    if isinstance(t, ji.TransposeRef):   # (``ref.T``) the view's dimensions in another order
      dims, sizes = [dims[p] for p in t.permutation], [sizes[p] for p in t.permutation]
      continue
    if not isinstance(t, ji.NDIndexer):
      gen.unsupported(f"the GMEM view {t}")
    new_dims, new_sizes = [], []
    for idx, d, size in zip(t.indices, dims, sizes):
      if isinstance(idx, ji.Slice):
        if idx.stride != 1:
          gen.unsupported("strided register accesses of GMEM")
        start = idx.start if isinstance(idx.start, ex.Expr) else i32(idx.start)
        new_dims.append(d)
        new_sizes.append(idx.size)
      elif not getattr(idx, "shape", ()):
        start = idx
      else:
        gen.unsupported("gathers from GMEM")
      offset = ex.add(offset, ex.mul(start, strides[d]))
    dims, sizes = new_dims, new_sizes
  shape = tuple(sizes)
  base = i32(0) if packed else ex.Name(ref.ptr, dtype=ref.dtype)
  hint = "element" if packed else "ptr"
  ptr = gen.bind(ex.add(base, offset), hint)
  if not shape:
    return ptr, shape, None, None, offset
  layout = gen.declared(L.blocked(shape, ref.dtype))
  for j, (d, n) in enumerate(zip(dims, shape)):
    if len(shape) > 2:
      ar = _offsets_along(gen, layout, shape, j)
    else:
      lane = layout if len(shape) == 1 else slice_layout(gen, layout, 1 - j)
      ar = call("gl.arange", i32(0), i32(ex.pow2(n)), layout=ex.Token(gen.layout(lane)), dtype=I32, shape=(n,))
    if len(shape) == 2:
      ar = call("gl.expand_dims", ar, i32(1 - j), dtype=I32, shape=(n, 1) if j == 0 else (1, n))
    ptr = gen.bind(ex.add(ptr, ex.mul(gen.bind(ar, "offs"), strides[d])), hint + "s")
  return ptr, shape, layout, valid_lanes(gen, shape, layout, range(len(shape))), offset


def _offsets_along(gen, layout, shape, j: int):
  """0, 1, ... along dimension ``j`` of a tile of rank > 2 in ``layout``, every other dimension
  of size 1 (the arange in ``layout`` with the others sliced away, expanded back): added to
  pointers, it broadcasts along them."""
  others = [d for d in range(len(shape)) if d != j]
  lane = layout
  for d in reversed(others):
    lane = slice_layout(gen, lane, d)
  e = call("gl.arange", i32(0), i32(ex.pow2(shape[j])), layout=ex.Token(gen.layout(lane)), dtype=I32,
           shape=(shape[j],))
  for d in others:   # the dimensions below d are back already: d is its position
    e = call("gl.expand_dims", e, i32(d), dtype=I32,
             shape=tuple(shape[k] if k == j else 1 for k in range(len(shape)) if k == j or k <= d))
  return e



@rule(ji.get_p)
def _get(ctx, *invals, **_):
  gen = ctx.gen
  a = ref_access.split(ctx.eqn, invals)
  if isinstance(a.ref, AccRef):
    wait_all(gen, [a.ref])
    if not ctx.is_used():
      return None
    value = gen.fresh_name("acc_value", ctx.out.dtype, a.ref.shape)
    gen.emit_scalar(f"{value.name} = {acc_pieces.whole(gen, a.ref)}")   # a copy: later wgmmas reassign it
    bounds = static_slice(a.transforms, a.ref.shape)
    if not a.transforms or bounds == ([0] * len(a.ref.shape), list(a.ref.shape)):
      gen.layouts[value.name] = gen.assigned(ctx.eqn.outvars[0])
      return value
    gen.layouts[value.name] = a.ref.layout
    steps = gen.facts(ctx.eqn)
    if bounds is None or steps is None:
      gen.unsupported("reading a slice of a wgmma accumulator other than static pieces of a "
                      "power-of-two size at multiples of it (read it whole, then slice)")
    return halve_all(gen, value, steps)
  if isinstance(a.ref, ValueRef):
    if any(not isinstance(t, ji.NDIndexer) or any(not isinstance(i, ji.Slice) or i.size != n
           for i, n in zip(t.indices, a.ref.value.shape)) for t in a.transforms):
      gen.unsupported("indexing a value pl.run_state closes over")
    return a.ref.value
  if not isinstance(a.ref, (GmemRef, SmemRef)):
    gen.unsupported(f"register loads from {a.ref}")
  transforms, reshape = reshape_last(gen, a.transforms)
  if reshape is None:
    return _load(gen, a.ref, transforms, gen.assigned(ctx.eqn.outvars[0]))   # (see vector_layout)
  x = _load(gen, a.ref, transforms, gen.facts(ctx.eqn))   # (_get_layouts)
  what = f"{'an SMEM' if isinstance(a.ref, SmemRef) else 'a GMEM'} view read through {reshape}"
  return _reshaped(gen, x, tuple(reshape.shape), gen.assigned(ctx.eqn.outvars[0]), what)


def _load(gen, ref, transforms, layout):
  """A register load of the view ``transforms`` take of GMEM or SMEM ``ref``: an SMEM view is
  read in ``layout`` (the assignment's), a GMEM view in its pointers' layout."""
  if isinstance(ref, GmemRef):
    return _load_gmem(gen, ref, transforms)
  _refuse_packed(gen, ref, "a register load")
  if (rows := unaligned_rows(ref, transforms)) is not None:
    return _load_rows_in_pieces(gen, ref, transforms[0], *rows)
  view = register_view(gen, ref, transforms)
  layout = gen.declared(layout)
  gen.events.append(Access("load", gen.smem_view(view), view.shape))
  smem = ex.Name(view.text, dtype=view.dtype, shape=view.shape)
  return gen.value(method(smem, "load", ex.Token(gen.layout(layout))), layout)


def _load_gmem(gen, ref: GmemRef, transforms):
  dtype = ref.dtype
  ref, transforms = peers.resolve(gen, ref, transforms)
  packed = subbyte.is_packed(ref.dtype)
  if subbyte.in_bytes(ref.dtype) and not packed:   # float4
    gen.unsupported(subbyte.UNWRITTEN.format(f"a register load of {ref.origin}", ref.dtype.name))
  ptrs, shape, layout, mask, offset = gmem_pointers(gen, ref, transforms, packed)
  gen.events.append(Access("load", ref.origin, shape, offset))
  if packed:
    return gen.value(subbyte.load_gmem(gen, ref.ptr, ptrs, ref.dtype, mask), layout)
  masks = {} if mask is None else {"mask": mask}
  return gen.value(call("gl.load", ptrs, dtype=dtype, shape=shape, **masks), layout)


def split_reshape(transforms) -> tuple[list, ji.ReshapeRef | None] | None:
  """(the transforms before a final ``ref.reshape(...)``, the reshape), or (``transforms``, None)
  where there is no reshape; None where the Gluon backend does not take the view: a reshape may
  be followed only by indexers that take every dimension whole (no view at all), and be the only
  one."""
  transforms = list(transforms)
  at = [k for k, t in enumerate(transforms) if isinstance(t, ji.ReshapeRef)]
  if not at:
    return transforms, None
  k = at[-1]
  whole = all(isinstance(t, ji.NDIndexer) and all(
      isinstance(i, ji.Slice) and (getattr(i.start, "value", i.start), i.size, i.stride) == (0, n, 1)
      for i, n in zip(t.indices, t.shape)) for t in transforms[k + 1:])
  return (transforms[:k], transforms[k]) if whole and len(at) == 1 else None


def reshape_last(gen, transforms) -> tuple[list, ji.ReshapeRef | None]:
  """``split_reshape``, refusing a view it does not take."""
  split = split_reshape(transforms)
  if split is None:
    reshape = next(t for t in transforms if isinstance(t, ji.ReshapeRef))
    gen.unsupported(f"indexing, transposing or reshaping again a Ref view made by {reshape} "
                    "(registers read or write a reshaped view whole: index the Ref before "
                    "reshaping it, or reshape the loaded value in registers and index that)")
  return split


def _reshaped(gen, x, shape: tuple, layout, what: str):
  """Register value ``x`` of a view reshaped to ``shape`` in ``layout`` (reshapes.py's rule)."""
  if not x.shape or not shape:
    gen.unsupported(f"{what}: a reshape to or from a view without dimensions")
  return reshape_tile(gen, x, shape, layout, what)


def _refuse_packed(gen, ref: SmemRef, what: str):
  if ref.packed is not None:
    gen.unsupported(subbyte.UNWRITTEN.format(f"{what} of an SMEM buffer", ref.packed.name))


def register_view(gen, ref: SmemRef, transforms) -> SmemRef:
  """The SMEM view a register load or store reads or writes, in a layout of its own rank."""
  view = smem_view(gen, ref, transforms)
  if gen.is_whole(view):
    return dataclasses.replace(view, text=gen.whole_view(view))
  return view


def row_slice(ref: SmemRef, transforms) -> tuple[int | ex.Expr, int] | None:
  """(start, size) where ``transforms`` take SMEM rows [start, start + size) and the whole of
  every other dimension (start: an int, or an expression known only at run time); None for any
  other view."""
  if len(transforms) != 1 or not isinstance(transforms[0], ji.NDIndexer) or ref.lead:
    return None
  rows, *rest = transforms[0].indices
  if not isinstance(rows, ji.Slice) or rows.stride != 1 or any(
      not isinstance(i, ji.Slice) or (getattr(i.start, "value", i.start), i.size, i.stride) != (0, n, 1)
      for i, n in zip(rest, ref.shape[1:])):
    return None
  return (rows.start.value if isinstance(rows.start, Lit) else rows.start), rows.size


def unaligned_rows(ref: SmemRef, transforms) -> tuple[int, int, int] | None:
  """(start, size, piece) where ``transforms`` take SMEM rows [start, start + size) that do not
  start at a multiple of their size (Gluon's slices must), but do at a multiple of ``piece``
  rows, a power of two that a swizzled buffer can be sliced at (8 rows or more)."""
  rows = row_slice(ref, transforms)
  if rows is None or not isinstance(rows[0], int):
    return None
  start, size = rows
  piece = start & -start
  if not start or not L.is_pow2(size) or start % size == 0 or piece > size or (
      len(ref.shape) == 2 and ref.swizzle and piece < 8):
    return None
  return start, size, piece


def _load_rows_in_pieces(gen, ref: SmemRef, t, start: int, size: int, piece: int):
  """A register load of SMEM rows [start, start + size) as loads of ``piece`` rows each, at
  offsets Gluon can slice at, joined in registers (rows of one piece, then of the next)."""
  rest = t.indices[1:]
  parts = []
  for o in range(start, start + size, piece):
    idx = ji.NDIndexer((ji.Slice(o, piece, 1), *rest), t.shape, t.int_indexer_shape)
    view = register_view(gen, ref, [idx])
    layout = gen.declared(L.blocked(view.shape, view.dtype))
    gen.events.append(Access("load", gen.smem_view(view), view.shape))
    smem = ex.Name(view.text, dtype=view.dtype, shape=view.shape)
    parts.append(gen.value(method(smem, "load", ex.Token(gen.layout(layout))), layout))
  while len(parts) > 1:   # join pairs: (r, ...) and (r, ...) -> (2, r, ...) -> (2r, ...)
    a, b = parts[0], parts[1]
    rank, padded = len(a.shape), L.padded(a.shape)
    shape = (2 * a.shape[0], *a.shape[1:])
    joined = gen.fresh("rows")
    gen.emit_scalar(f"{joined} = gl.join({gen.render(a)}, {gen.render(b)}).permute({(rank, *range(rank))})"
             f".reshape({[2 * padded[0], *padded[1:]]})")
    layout = gen.declared(L.blocked(shape, a.dtype))
    merged = gen.value(call("gl.convert_layout", ex.Name(joined), ex.Token(gen.layout(layout)), dtype=a.dtype,
                            shape=shape), layout)
    parts = parts[2:] + [merged]
  return parts[0]


@rule(ji.swap_p)
def _swap(ctx, ref, value, *leaves, **_):
  gen = ctx.gen
  a = ref_access.split(ctx.eqn, [ref, value, *leaves])
  if isinstance(a.ref, AccRef):
    target = gen.facts(ctx.eqn)   # the layout of what the accumulator's variable holds
    v = value if target is None else gen.convert(value, target)
    acc_pieces.assign(gen, a.ref, gen.render(v))
    return None
  if ctx.is_used(0):
    gen.unsupported("using the old value of a store")
  transforms = a.transforms
  if isinstance(a.ref, (GmemRef, SmemRef)):
    transforms, reshape = reshape_last(gen, a.transforms)
    if reshape is not None and value.shape:   # the value in the shape of the view before it
      shape, layout = gen.facts(ctx.eqn)   # (_swap_layouts)
      value = _reshaped(gen, value, shape, layout, f"a value stored through {reshape}")
  if isinstance(a.ref, GmemRef):
    ref, transforms = peers.resolve(gen, a.ref, transforms)
    ptrs, shape, layout, mask, offset = gmem_pointers(gen, ref, transforms)
    gen.events.append(Access("store", ref.origin, shape, offset))
    if shape:
      value = to_layout(gen, value, layout, shape, ref.dtype)
    masks = "" if mask is None else f", mask={gen.render(mask)}"
    gen.emit(f"gl.store({gen.render(ptrs)}, {gen.render(value)}{masks})")
    return None
  if not isinstance(a.ref, SmemRef):
    gen.unsupported(f"register stores to {a.ref}")
  _refuse_packed(gen, a.ref, "a register store")
  view = register_view(gen, a.ref, transforms)
  if not value.shape:
    layout = gen.declared(L.blocked(view.shape, view.dtype))
    value = gen.value(call("gl.full", shape_token(view.shape), value, dtype_token(view.dtype),
                           layout=ex.Token(gen.layout(layout)), dtype=view.dtype, shape=view.shape), layout)
  value = masked(gen, value, range(len(view.shape)), i32(0))   # SMEM padding stays zero
  gen.events.append(Access("store", gen.smem_view(view), view.shape))
  gen.emit(f"{view.text}.store({gen.render(value)})")
  return None


# --- layout assignment (assign.py) ------------------------------------------------------------

def smem_view_layouts(ref: Smem, transforms) -> Smem:
  """``smem_view`` as the assignment sees it: the view's shape, whether it is still the whole
  buffer; its rank noted on the buffer."""
  shape, transforms, whole = list(ref.shape), compose_slices(transforms), True
  if ref.packed is not None:   # (a view splitting a byte: the writer refuses it)
    transforms = subbyte.byte_view(transforms, ref.shape,
                                   subbyte.values_per_byte(ref.packed)) or transforms
  if ref.lead:
    transforms = merge_lead_indices(transforms, ref.lead)
  if ref.lead:
    if not transforms:
      return dataclasses.replace(ref, lead=(), whole=False, reshaped=True)
    t = transforms[0]
    n = indexed_lead(ref.shape, ref.lead, t)
    if n is None:
      return dataclasses.replace(ref, lead=(), whole=False)   # the writer refuses it
    shape, whole = shape[n:], unstored(ref) and n == len(ref.lead)
    transforms[0] = ji.NDIndexer(tuple(t.indices[n:]), tuple(ref.shape[n:]), t.int_indexer_shape)
  for t in transforms:
    if isinstance(t, ji.TransposeRef):
      shape, whole = [shape[p] for p in t.permutation], False
      continue
    if isinstance(t, ji.ReshapeRef):   # (registers load the view before it: split_reshape)
      shape, whole = list(t.shape), False
      continue
    new_shape = []
    for idx, size in zip(getattr(t, "indices", ()), shape):
      if isinstance(idx, ji.Slice):
        whole = whole and (getattr(idx.start, "value", idx.start), idx.size) == (0, size)
        new_shape.append(idx.size)
      else:
        whole = False
    shape = new_shape
  ref.buffer.ranks.add(len(shape))
  return Smem(ref.buffer, tuple(shape), ref.dtype, ref.swizzle, whole=whole, packed=ref.packed)


def register_view_layouts(ref: Smem, transforms) -> Smem:
  """``register_view`` as the assignment sees it: a view that is not the whole buffer needs a
  layout of its own rank."""
  view = smem_view_layouts(ref, transforms)
  if not view.whole and not view.reshaped:
    ref.buffer.registers.add(len(view.shape))
  return view


def gmem_view_shape(ref: Gmem, transforms) -> tuple:
  """The shape of a GMEM view: the sizes of the slices of each indexer."""
  shape = ref.shape
  for t in (*ref.pre, *transforms):
    if isinstance(t, ji.TransposeRef):
      shape = tuple(shape[p] for p in t.permutation)
      continue
    if isinstance(t, remote.PeerRef):   # the same view, of a peer
      continue
    if isinstance(t, ji.ReshapeRef):
      shape = tuple(t.shape)
      continue
    shape = tuple(i.size for i in getattr(t, "indices", ()) if isinstance(i, ji.Slice))
  return shape


def vector_layout(ctx, shape) -> L.Layout | None:
  """The layout to read a vector from SMEM in when it is only broadcast into tiles that wgmma
  accumulators fill (softmax statistics in attention), or cast to a wgmma slice layout: a slice
  of the accumulators' layout, so that no conversion through shared memory follows the load.
  None: choose locally."""
  gen = ctx.a.gen
  uses = ctx.uses(ctx.eqn.outvars[0])
  if len(shape) != 1 or not uses or not gen.wgmma:
    return None
  if len(uses) == 1 and uses[0].primitive is mp.layout_cast_p:   # plgpu.load(..., layout=)
    return wgmma_vector_of(uses[0].params["new_layout"], shape, gen.mma_bits)
  tiles = set()
  for e in uses:
    if e.primitive is not lax.broadcast_in_dim_p or len(e.params["shape"]) != 2:
      return None
    (new,) = {0, 1} - set(e.params["broadcast_dimensions"])
    tiles.add((new, e.params["shape"][1]))
  (dim, n), *others = tiles
  if others or e.params["shape"][0] % (16 * L.WARPS):
    return None
  return L.Slice(dim, L.wgmma(n, gen.mma_bits))


@layout_rule(ji.get_p)
def _get_layouts(ctx, *invals, **_):
  a = ref_access.split(ctx.eqn, invals)
  ref, out = a.ref, ctx.out
  if isinstance(ref, Acc):
    whole = Val(ref.shape, np.dtype(out.dtype), ref.layout)
    bounds = static_slice(a.transforms, ref.shape)
    if bounds == ([0] * len(ref.shape), list(ref.shape)):
      return whole
    found = None if bounds is None else halvings(ctx.a, whole, *bounds)
    if found is None:
      return whole   # (the writer refuses a slice it cannot take)
    steps, view = found
    ctx.facts(steps)
    return view
  if isinstance(ref, Closed):
    return ref.value
  if not isinstance(ref, (Gmem, Smem)):
    return None
  # (a view split_reshape does not take: seen as it is; the writer refuses it)
  transforms, reshape = split_reshape(a.transforms) or (a.transforms, None)
  if reshape is None:
    return _load_layouts(ctx, ref, transforms)
  x = _load_layouts(ctx, ref, transforms, reshaped=True)
  ctx.facts(x.layout)   # the view before the reshape is read in it
  return reshaped_val(tuple(reshape.shape), x.dtype)


def _load_layouts(ctx, ref, transforms, reshaped: bool = False) -> Val:
  """``_load`` as the assignment sees it (``reshaped``: the load is reshaped before any use)."""
  if isinstance(ref, Gmem):
    shape = gmem_view_shape(ref, transforms)
    return Val(shape, ref.dtype, L.blocked(shape, ref.dtype) if shape else None)
  if (rows := unaligned_rows(ref, transforms)) is not None:
    start, size, piece = rows
    t = transforms[0]
    for o in range(start, start + size, piece):
      view = register_view_layouts(ref, [ji.NDIndexer((ji.Slice(o, piece, 1), *t.indices[1:]), t.shape,
                                                      t.int_indexer_shape)])
    shape = (size, *view.shape[1:])
    return Val(shape, ref.dtype, L.blocked(shape, ref.dtype))
  view = register_view_layouts(ref, transforms)
  vector = None if reshaped else vector_layout(ctx, view.shape)
  layout = vector or L.blocked(view.shape, view.dtype)
  free = vector is None and len(view.shape) == 2 and not reshaped
  return Val(view.shape, view.dtype, layout, free=free)


@layout_rule(ji.swap_p)
def _swap_layouts(ctx, ref, value, *leaves, **_):
  a = ref_access.split(ctx.eqn, [ref, value, *leaves])
  if isinstance(a.ref, Acc):
    ctx.facts(ctx.a.same_layout(a.ref, value))
    return None
  if not isinstance(a.ref, (Gmem, Smem)):
    return None
  transforms, reshape = split_reshape(a.transforms) or (a.transforms, None)
  if isinstance(a.ref, Gmem):
    shape = gmem_view_shape(a.ref, transforms)
  else:
    shape = register_view_layouts(a.ref, transforms).shape
  if reshape is not None and getattr(value, "shape", ()):   # reshaped to the view's shape
    value = reshaped_val(tuple(shape), value.dtype)
    ctx.facts((tuple(shape), value.layout))
  if isinstance(a.ref, Gmem) and shape and getattr(value, "shape", ()):
    ctx.a.to_layout(value, L.blocked(shape, a.ref.dtype), shape, a.ref.dtype)
  return None

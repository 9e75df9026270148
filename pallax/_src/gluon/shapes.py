"""Gluon rules that make or reshape register tiles: broadcasts, iotas, static slices (by
halving), layout casts and one-row scatters.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pallax._src.gluon import layouts as L
from pallax._src.gluon import reshapes
from pallax._src.gluon.assign import Val, layout_rule
from pallax._src.gluon.events import Halve
from pallax._src.gluon.values import (broadcast_to, convert_layout, expand, i32, iota_in,
                                      slice_layout, to_layout,
                                      wgmma_vector_of)
from pallax._src.gluon.writer import rule
from pallax._src.gpu import expr as ex
from pallax._src.gpu.expr import call
from pallax._src.mosaic_gpu import core as mc
from pallax._src.mosaic_gpu import primitives as mp

def _broadcast_tile(ctx, x, shape, broadcast_dimensions):
  """A reduced vector back to a tile: ``expand_dims`` undoes its slice layout (the vector is
  converted to a slice of the tile's layout unless it is one already)."""
  gen = ctx.gen
  new_dims = [d for d in range(len(shape)) if d not in broadcast_dimensions]
  if len(new_dims) != 1 or len(shape) != 2:
    return _broadcast_any(gen, x, shape, broadcast_dimensions,
                          gen.declared(gen.assigned(ctx.eqn.outvars[0])))
  (dim,), parent = new_dims, gen.assigned(ctx.eqn.outvars[0])
  # Where every use broadcasts again in its own layout, the tile is not written here (the
  # vector's conversion is: the uses broadcast from it).
  unwritten = gen.unwritten(ctx.eqn, lambda new: None if new.kind == "other" else expand(
      gen, gen.in_layout(x, slice_layout(gen, new, dim)), shape, dim, new))
  if unwritten is None:
    gen.declared(parent)
  if gen.layout_of(x) != L.Slice(dim, parent):
    x = gen.convert(x, slice_layout(gen, parent, dim))
  return unwritten or expand(gen, x, shape, dim, parent)


def _broadcast_any(gen, x, shape, broadcast_dimensions, layout):
  """Any other broadcast of a tile: its dimensions put where ``broadcast_dimensions`` says
  among dimensions of one (a reshape that only adds ones, which padding does not disturb), in
  the result's layout, then broadcast against a tile of the result's shape."""
  ones = [1] * len(shape)
  for i, d in enumerate(broadcast_dimensions):
    ones[d] = x.shape[i]
  placed = gen.bind(ex.method(x, "reshape", ex.Token(str(list(L.padded(ones)))), dtype=x.dtype,
                              shape=tuple(ones)), "placed")
  placed = call("gl.convert_layout", placed, ex.Token(gen.layout(layout)), dtype=x.dtype,
                shape=tuple(ones))
  return broadcast_to(gen, placed, shape, layout)


@rule(lax.broadcast_in_dim_p)
def _broadcast(ctx, x, *, shape, broadcast_dimensions, **_):
  if x.shape:
    return _broadcast_tile(ctx, x, tuple(shape), tuple(broadcast_dimensions))
  gen, shape = ctx.gen, tuple(shape)
  return gen.unwritten(ctx.eqn, lambda new: gen.splat(x, shape, new)) or \
      gen.splat(x, shape, gen.declared(gen.assigned(ctx.eqn.outvars[0])))


@rule(lax.iota_p)
def _iota(ctx, *, dtype, shape, dimension, **_):
  """``broadcasted_iota``: an ``arange`` along ``dimension``, broadcast over the others."""
  shape = tuple(shape)
  if len(shape) > 2:
    ctx.gen.unsupported("iotas of rank 3 or more")
  gen = ctx.gen
  again = lambda new: None if new.kind == "other" else iota_in(gen, np.dtype(dtype), shape, dimension, new)  # noqa: E731
  return gen.unwritten(ctx.eqn, again) or \
      iota_in(gen, np.dtype(dtype), shape, dimension, gen.declared(gen.assigned(ctx.eqn.outvars[0])))



def _half(gen, x, dim: int, upper: bool):
  """The lower or upper half of register tile ``x`` along ``dim``: Gluon has no slicing of
  registers, but splits a trailing dimension of 2 (reshape, move it last, split)."""
  shape, padded = list(x.shape), list(L.padded(x.shape))
  split = padded[:dim] + [2, padded[dim] // 2] + padded[dim + 1:]
  order = [d for d in range(len(shape) + 1) if d != dim] + [dim]
  pair = gen.fresh("halves")
  gen.events.append(Halve(tuple(x.shape), dim))
  gen.emit_scalar(f"{pair} = {gen.render(x)}.reshape({split}).permute({tuple(order)}).split()")
  shape[dim] //= 2
  return ex.Subscript(ex.Name(pair), (i32(int(upper)),), dtype=x.dtype, shape=tuple(shape))



def _halve(gen, v, step):
  """One halving of a 2-D tile (``halving`` chose the layouts): converted first to a layout that
  keeps both halves in each thread's registers where it is not in one."""
  dim, upper, before, after = step
  if before is not None:
    v = convert_layout(gen, v, gen.declared(before))
    half_shape = tuple(n // 2 if d == dim else n for d, n in enumerate(v.shape))
    if L.coverage(before, half_shape, v.dtype)[dim] > half_shape[dim]:
      gen.unsupported(f"slicing a register tile of shape {v.shape} along dimension {dim} into "
                      "pieces smaller than a warp's rows or a thread's vector")
  half = _half(gen, v, dim, upper)
  layout = gen.declared(after)
  return gen.value(call("gl.convert_layout", half, ex.Token(gen.layout(layout)), dtype=half.dtype,
                        shape=half.shape), layout)


@rule(lax.slice_p)
def _slice(ctx, x, *, start_indices, limit_indices, strides):
  """Static slices of a 2-D register tile into power-of-two pieces (an accumulator's epilogue
  tiles), by halving."""
  gen = ctx.gen
  if strides is not None and any(s != 1 for s in strides):
    gen.unsupported("strided slices of register tiles")
  if len(x.shape) != 2:
    return _sliced_rows(gen, x, start_indices, limit_indices,
                        gen.declared(gen.assigned(ctx.eqn.outvars[0])))
  for lo, hi, n in zip(start_indices, limit_indices, x.shape):
    if hi - lo != n and not (L.is_pow2(n) and L.is_pow2(hi - lo) and lo % (hi - lo) == 0):
      gen.unsupported(f"a slice [{lo}:{hi}] of a register tile's dimension of {n} (pieces of "
                      "a power-of-two size at multiples of it only)")
  return halve_all(gen, x, gen.facts(ctx.eqn))


def _sliced_rows(gen, x, start_indices, limit_indices, layout):
  """A static slice of a register tile of rank other than 2 (``x[1, 1]`` of a (2, 3, 64, 8)
  tile): the rows of its unsliced trailing dimensions (powers of two) it keeps, gathered
  (``reshapes.gather_rows``)."""
  shape = tuple(hi - lo for lo, hi in zip(start_indices, limit_indices))
  trailing = 0
  while trailing < len(shape) and shape[-1 - trailing] == x.shape[-1 - trailing] and \
      L.is_pow2(shape[-1 - trailing]):
    trailing += 1
  lead = len(shape) - trailing

  def source_row(t):
    ms, valid = reshapes.row_indices(t, shape[:lead])
    row = reshapes.padded_row([ex.add(m, i32(lo)) for m, lo in zip(ms, start_indices)], x.shape[:lead])
    return call("gl.where", valid, row, i32(0), dtype=row.dtype, shape=t.shape) if lead else row
  return reshapes.gather_rows(gen, x, shape, layout, trailing, source_row, "slicing a register tile")


def halve_all(gen, v, steps):
  """``v`` sliced by the halvings ``halvings`` found."""
  for step in steps:
    v = _halve(gen, v, step)
  return v


@rule(mp.layout_cast_p)
def _layout_cast(ctx, x, *, new_layout):
  """``plgpu.layout_cast``: the wgmma layouts are Gluon's (choosing them before a loop keeps its
  carries in the layout the loop computes in); other layouts are hints Gluon chooses itself."""
  layout = ctx.gen.facts(ctx.eqn)
  if layout is None:
    return x
  return to_layout(ctx.gen, x, ctx.gen.declared(layout), x.shape, x.dtype)



def _one_row_update(operand, indices, updates, *, add: bool, clip: bool):
  """``operand.at[i].set(updates)`` (or ``.add``) for ``i = indices[0]``, in operations the
  table has: a select against an iota of the first dimension (an ``i`` out of bounds matches no
  row, as ``FILL_OR_DROP`` drops the update)."""
  n = operand.shape[0]
  i = lax.reduce_max(indices, (0,))
  if clip:
    i = jnp.clip(i, 0, n - 1)
  rows = lax.broadcasted_iota(jnp.int32, operand.shape, 0) == i
  new = lax.broadcast_in_dim(updates, operand.shape, tuple(range(1, operand.ndim)))
  return jnp.where(rows, operand + new if add else new, operand)


@rule(lax.scatter_p, lax.scatter_add_p)
def _scatter(ctx, operand, indices, updates, *, dimension_numbers, mode, **_):
  dn, rank = dimension_numbers, len(operand.shape)
  if (indices.shape != (1,) or dn.inserted_window_dims != (0,) or
      dn.scatter_dims_to_operand_dims != (0,) or dn.update_window_dims != tuple(range(rank - 1)) or
      dn.operand_batching_dims):
    ctx.gen.unsupported("scatters other than x.at[i].set(row) / .add(row)")
  avals = tuple((tuple(v.aval.shape), np.dtype(v.aval.dtype)) for v in ctx.eqn.invars)
  jaxpr = _one_row_update_jaxpr(avals, ctx.eqn.primitive is lax.scatter_add_p,
                                mode == lax.GatherScatterMode.CLIP)
  return ctx.gen.lower_jaxpr(jaxpr, [operand, indices, updates])


@functools.lru_cache(maxsize=64)
def _one_row_update_jaxpr(avals, add: bool, clip: bool):
  """``_one_row_update`` traced once per signature (a loop body is lowered twice, a kernel
  maybe more often)."""
  fn = functools.partial(_one_row_update, add=add, clip=clip)
  return jax.make_jaxpr(fn)(*(jax.ShapeDtypeStruct(s, d) for s, d in avals)).jaxpr


# --- layout assignment (assign.py) ------------------------------------------------------------

@layout_rule(lax.broadcast_in_dim_p)
def _broadcast_layouts(ctx, x, *, shape, broadcast_dimensions, **_):
  """A scalar is splatted in a coalesced layout; a vector is broadcast from a slice of the tile's
  layout (converted to a slice of a coalesced layout unless it is a slice along that dimension
  already). Both can be rebuilt in another layout rather than converted."""
  shape = tuple(shape)
  if not getattr(x, "shape", ()):
    return Val(shape, x.dtype, L.blocked(shape, x.dtype), ("splat",))
  new_dims = [d for d in range(len(shape)) if d not in broadcast_dimensions]
  if not isinstance(x, Val):
    return None   # the writer refuses it
  if len(new_dims) != 1 or len(shape) != 2:   # placed among ones, then broadcast (_broadcast_any)
    return Val(shape, x.dtype, L.blocked(shape, x.dtype))
  (dim,) = new_dims
  if isinstance(x.layout, L.Slice) and x.layout.dim == dim:
    parent = x.layout.parent
  else:
    parent = L.blocked(shape, x.dtype)
    x = ctx.a.convert(x, L.Slice(dim, parent))
  return Val(shape, x.dtype, parent, ("expand", x, dim))


@layout_rule(lax.iota_p)
def _iota_layouts(ctx, *, dtype, shape, dimension, **_):
  shape = tuple(shape)
  return Val(shape, np.dtype(dtype), L.blocked(shape, dtype), ("iota",)) if len(shape) <= 2 else None


def halving(layout: L.Layout, shape, dtype, dim: int) -> tuple[L.Layout | None, L.Layout]:
  """(the layout a 2-D tile is converted to before it is halved along ``dim`` or None, the
  layout of the half): a wgmma accumulator stays one while it has more rows than a warpgroup
  covers and its halves sit in the same threads; anything else is halved in a coalesced layout
  that repeats along ``dim``."""
  before = None
  if layout.kind == "other" or L.coverage(layout, shape, dtype)[dim] * 2 > shape[dim]:
    half_shape = tuple(n // 2 if d == dim else n for d, n in enumerate(shape))
    layout = before = L.blocked(half_shape, dtype)
  half = tuple(n // 2 if d == dim else n for d, n in enumerate(shape))
  if layout.kind == "wgmma" and half[0] >= 16 * L.WARPS:
    return before, L.wgmma(half[1], L.in_bits(layout))
  return before, L.blocked(half, dtype)


@layout_rule(lax.slice_p)
def _slice_layouts(ctx, x, *, start_indices, limit_indices, strides):
  """The halvings of ``_slice``: per halving (dim, upper half, layout before, layout of the half)."""
  if isinstance(x, Val) and len(x.shape) != 2 and x.shape:
    return reshapes.reshaped_val(tuple(ctx.out.shape), x.dtype)   # (gathered: _sliced_rows)
  if not isinstance(x, Val) or x.layout is None or len(x.shape) != 2:
    return None
  found = halvings(ctx.a, x, start_indices, limit_indices)
  if found is None:
    return None   # the writer refuses it
  steps, v = found
  ctx.facts(steps)
  return v


def halvings(a, x: Val, start_indices, limit_indices):
  """(the halvings that take a static slice of 2-D tile ``x``: per halving (dim, upper half,
  layout before, layout of the half); the slice) or None where they cannot (pieces of a
  power-of-two size at multiples of it only); conversions on the way noted in ``a``."""
  steps, v = [], x
  for d, (lo, hi, n) in enumerate(zip(start_indices, limit_indices, x.shape)):
    size = hi - lo
    if size == n:
      continue
    if not (L.is_pow2(n) and L.is_pow2(size) and lo % size == 0):
      return None
    while v.shape[d] > size:
      half = v.shape[d] // 2
      before, after = halving(v.layout, v.shape, v.dtype, d)
      if before is not None:
        v = a.convert(v, before)
      steps.append((d, (lo // half) % 2 == 1, before, after))
      v = Val(tuple(half if k == d else s for k, s in enumerate(v.shape)), v.dtype, after)
  return steps, v


@layout_rule(mp.layout_cast_p)
def _layout_cast_layouts(ctx, x, *, new_layout):
  a = ctx.a
  if new_layout == mc.Layout.WGMMA and len(x.shape) == 2:
    layout = L.wgmma(x.shape[1], a.gen.mma_bits)
  else:
    layout = wgmma_vector_of(new_layout, x.shape, a.gen.mma_bits)
  ctx.facts(layout)
  return x if layout is None else a.to_layout(x, layout, x.shape, x.dtype)


@layout_rule(lax.scatter_p, lax.scatter_add_p)
def _scatter_layouts(ctx, operand, indices, updates, *, dimension_numbers, mode, **_):
  dn, rank = dimension_numbers, len(operand.shape)
  if (indices.shape != (1,) or dn.inserted_window_dims != (0,) or
      dn.scatter_dims_to_operand_dims != (0,) or dn.update_window_dims != tuple(range(rank - 1)) or
      dn.operand_batching_dims):
    return None
  avals = tuple((tuple(v.aval.shape), np.dtype(v.aval.dtype)) for v in ctx.eqn.invars)
  jaxpr = _one_row_update_jaxpr(avals, ctx.eqn.primitive is lax.scatter_add_p,
                                mode == lax.GatherScatterMode.CLIP)
  return ctx.lower(jaxpr, [operand, indices, updates])

"""Gluon rules of ``lax.reshape`` on register values: a scalar made a tile of ones (a splat), a
tile of one element made a scalar, and reshapes between shapes whose dimensions are all powers
of two (Gluon's reshape), or that differ by dimensions of one; between other shapes, which pallax
pads differently, by a gather of rows (``_gathered``); also those of register loads and stores
through ``ref.reshape(...)`` (``reshape_tile``); and of
``lax.transpose`` (Gluon's permute: padding lies at the end of each dimension, so a padded
tile's permute is the padded tile of its transpose); and of ``lax.concatenate`` (through a
row-major SMEM scratch: Gluon has no concatenation of register tiles)."""
from __future__ import annotations

import numpy as np
from jax import lax

from pallax._src.gluon import layouts as L
from pallax._src.gluon.assign import Val, layout_rule
from pallax._src.gluon.values import I32, i32, iota_in
from pallax._src.gluon.writer import rule
from pallax._src.gpu import expr as ex
from pallax._src.gpu.expr import call


def _unpadded(shape) -> bool:
  return tuple(L.padded(shape)) == tuple(shape)


def _unit_dims_only(a, b) -> bool:
  """Whether shapes ``a`` and ``b`` differ by dimensions of one only (a squeeze or an
  expand_dims, which padding to powers of two does not disturb)."""
  return [d for d in a if d != 1] == [d for d in b if d != 1]


@rule(lax.reshape_p)
def _reshape(ctx, x, *, new_sizes, dimensions, **_):
  gen, shape = ctx.gen, tuple(new_sizes)
  if dimensions is not None:
    gen.unsupported("reshapes that transpose (lax.reshape(..., dimensions=...))")
  if not x.shape:   # a scalar as a tile of ones: a splat, as broadcast_in_dim writes it
    return gen.unwritten(ctx.eqn, lambda new: gen.splat(x, shape, new)) or \
        gen.splat(x, shape, gen.declared(gen.assigned(ctx.eqn.outvars[0])))
  if not shape:   # the one element of a tile as a scalar
    if x.dtype == np.bool_:
      x = gen.value(ex.method(x, "to", ex.Token("gl.int32"), dtype=np.dtype(np.int32), shape=x.shape),
                    gen.layout_of(x))
    flat = ex.method(x, "reshape", ex.Token("[1]"), dtype=x.dtype, shape=(1,))
    one = gen.bind(call("gl.sum", flat, ex.Lit(0, dtype=np.dtype(np.int32)), dtype=x.dtype, shape=()), "one")
    if ctx.out.dtype == np.bool_:
      one = gen.bind(ex.binary("!=", one, ex.Lit(0, dtype=np.dtype(np.int32)), dtype=np.dtype(np.bool_)), "one")
    return one
  return reshape_tile(gen, x, shape, gen.assigned(ctx.eqn.outvars[0]))


def reshape_tile(gen, x, shape: tuple, layout: L.Layout, what: str = "a register value"):
  """Tile ``x`` reshaped row-major to ``shape`` (a tile too), then converted to ``layout`` (the
  assignment's: ``reshaped_val``). Gluon reshapes the padded tile, so only shapes whose
  dimensions are all powers of two, or that differ by dimensions of one, are taken; another
  reshape is refused, naming ``what`` is reshaped. (Also the reshape of a register load or store
  through ``ref.reshape(...)``: memory.py.)"""
  layout = gen.declared(layout)
  if not (_unpadded(x.shape) and _unpadded(shape)) and not _unit_dims_only(x.shape, shape):
    return _gathered(gen, x, shape, layout, what)
  padded = str(list(L.padded(shape)))   # (padding lanes stay padding where only ones move)
  reshaped = gen.bind(ex.method(x, "reshape", ex.Token(padded), dtype=x.dtype, shape=shape),
                      "reshaped")
  return gen.value(call("gl.convert_layout", reshaped, ex.Token(gen.layout(layout)), dtype=x.dtype,
                        shape=shape), layout)


MAX_GATHERED_ROWS = 1 << 14


def common_suffix(a: tuple, b: tuple) -> tuple:
  """The trailing dimensions ``a`` and ``b`` share, powers of two all."""
  n = 0
  while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n] and L.is_pow2(a[-1 - n]):
    n += 1
  return tuple(a[len(a) - n:])


def _gathered(gen, x, shape: tuple, layout: L.Layout, what: str):
  """A reshape between shapes with padding (``(384, 8)`` to ``(2, 3, 64, 8)``), where padding
  sits in other places before and after: both tiles seen as rows of their common trailing
  dimensions (powers of two), and each row of the result gathered from the row of ``x`` holding
  the same elements (padding rows read row 0)."""
  suffix = common_suffix(tuple(x.shape), shape)
  lead_x, lead_y = x.shape[:len(x.shape) - len(suffix)], shape[:len(shape) - len(suffix)]
  return gather_rows(gen, x, shape, layout, len(suffix), lambda t: _source_row(t, lead_y, lead_x),
                     f"reshaping {what}")


def gather_rows(gen, x, shape: tuple, layout: L.Layout, trailing: int, source_row, what: str):
  """The tile of ``shape`` whose rows (of its last ``trailing`` dimensions, those of ``x`` too)
  are rows of ``x``: row ``t`` of its padded leading dimensions is row ``source_row(t)`` of
  ``x``'s (``gl.gather`` along the rows), in ``layout``. ``what``: the operation, for a refusal
  ("reshaping a register value")."""
  suffix = tuple(shape[len(shape) - trailing:])
  rows_x = int(np.prod(L.padded(x.shape[:len(x.shape) - trailing])))
  rows_y = int(np.prod(L.padded(shape[:len(shape) - trailing])))
  if max(rows_x, rows_y) > MAX_GATHERED_ROWS:
    gen.unsupported(f"{what} of shape {x.shape} into {shape} (rows of its trailing dimensions "
                    f"{list(suffix)} too many to gather)")
  flat = (rows_y, *suffix)
  rows = gen.declared(L.blocked(flat, x.dtype))
  source = gen.bind(ex.method(x, "reshape", ex.Token(str([rows_x, *suffix])), dtype=x.dtype,
                              shape=(rows_x, *suffix)), "rows")
  source = gen.value(call("gl.convert_layout", source, ex.Token(gen.layout(rows)), dtype=x.dtype,
                          shape=source.shape), rows)
  index = gen.bind(source_row(iota_in(gen, I32, flat, 0, rows)), "source")
  gathered = gen.bind(call("gl.gather", source, index, i32(0), dtype=x.dtype, shape=flat), "gathered")
  reshaped = gen.bind(ex.method(gathered, "reshape", ex.Token(str(list(L.padded(shape)))),
                                dtype=x.dtype, shape=shape), "reshaped")
  return gen.value(call("gl.convert_layout", reshaped, ex.Token(gen.layout(layout)), dtype=x.dtype,
                        shape=shape), layout)


def _binary(op, a, b, dtype=I32):
  return ex.binary(op, a, b if isinstance(b, ex.Expr) else i32(b), dtype=dtype)


def row_indices(t, lead: tuple):
  """Row ``t`` of the padded leading dimensions ``lead`` as (its index along each, whether it
  is inside the unpadded ones)."""
  ms, valid = [], None
  for d, size in enumerate(lead):
    m = _binary("%", _binary("//", t, int(np.prod(L.padded(lead[d + 1:])))), L.pow2(size))
    inside = _binary("<", m, size, np.dtype(np.bool_))
    valid = inside if valid is None else _binary("&", valid, inside, np.dtype(np.bool_))
    ms.append(m)
  return ms, valid


def padded_row(indices, lead: tuple):
  """The row of the padded leading dimensions ``lead`` at ``indices``."""
  row = i32(0)
  for d, m in enumerate(indices):
    row = ex.add(row, _binary("*", m, int(np.prod(L.padded(lead[d + 1:])))))
  return row


def _source_row(t, lead_y: tuple, lead_x: tuple):
  """For each row ``t`` of the result's padded leading dimensions ``lead_y``: the row of the
  source's padded leading dimensions ``lead_x`` holding its elements (0 for a padding row)."""
  ms, valid = row_indices(t, lead_y)
  linear = i32(0)   # the row's row-major place among the unpadded rows
  for d, m in enumerate(ms):
    linear = ex.add(linear, _binary("*", m, int(np.prod(lead_y[d + 1:]))))
  source = []
  for d, size in enumerate(lead_x):
    k = _binary("//", linear, int(np.prod(lead_x[d + 1:])))
    source.append(_binary("%", k, size) if d else k)
  return call("gl.where", valid, padded_row(source, lead_x), i32(0), dtype=I32, shape=t.shape)


def reshaped_val(shape: tuple, dtype) -> Val:
  """A tile reshaped to ``shape`` as the assignment sees it (``reshape_tile``'s result): in the
  blocked layout of its shape; a scalar has none."""
  dtype = np.dtype(dtype)
  return Val(shape, dtype, L.blocked(shape, dtype) if shape else None)


@layout_rule(lax.reshape_p)
def _reshape_layouts(ctx, x, *, new_sizes, dimensions, **_):
  shape, dtype = tuple(new_sizes), np.dtype(ctx.out.dtype)
  if not getattr(x, "shape", ()):
    return Val(shape, dtype, L.blocked(shape, dtype), ("splat",))
  return reshaped_val(shape, dtype)


@rule(lax.squeeze_p)
def _squeeze(ctx, x, *, dimensions):
  """Dimensions of one dropped: a reshape."""
  return _reshape(ctx, x, new_sizes=tuple(ctx.out.shape), dimensions=None)


@layout_rule(lax.squeeze_p)
def _squeeze_layouts(ctx, x, *, dimensions):
  return _reshape_layouts(ctx, x, new_sizes=tuple(ctx.out.shape), dimensions=None)


@rule(lax.transpose_p)
def _transpose(ctx, x, *, permutation):
  """``x`` with its dimensions permuted: in a blocked layout, whose permute is the permuted
  blocked layout (each thread keeps its elements); another layout is converted first."""
  gen, permutation = ctx.gen, tuple(permutation)
  if permutation == tuple(range(len(permutation))):
    return x
  if gen.layout_of(x) is None:
    gen.unsupported("transposes of register values without a layout")
  before, after = gen.facts(ctx.eqn)
  if before is not None:
    x = gen.convert(x, gen.declared(before))
  shape = tuple(x.shape[d] for d in permutation)
  return gen.value(ex.method(x, "permute", ex.Token(str(permutation)), shape=shape), after)


@layout_rule(lax.transpose_p)
def _transpose_layouts(ctx, x, *, permutation):
  """(the layout ``x`` is converted to first or None, the result's layout): a blocked tile is
  permuted as it is; a tile in another layout (a wgmma accumulator's, a slice) is converted to
  the blocked layout whose permute is the coalesced layout of the result."""
  permutation = tuple(permutation)
  if permutation == tuple(range(len(permutation))):
    return x
  if not isinstance(x, Val) or x.layout is None:
    return None   # the writer refuses it
  before = None
  if not isinstance(x.layout, L.Blocked):
    inverse = tuple(int(d) for d in np.argsort(permutation))
    before = L.permuted(L.blocked(ctx.out.shape, x.dtype), inverse)
    x = ctx.a.convert(x, before)
  after = L.permuted(x.layout, permutation)
  ctx.facts((before, after))
  return Val(tuple(ctx.out.shape), x.dtype, after)


def _aligned_offsets(sizes) -> list[int]:
  """Where each operand's padded tile starts in the scratch: after the one before, at a
  multiple of its own padded size (Gluon slices shared memory there only)."""
  offsets, end = [], 0
  for n in sizes:
    p = L.pow2(n)
    offsets.append(-(-end // p) * p)
    end = offsets[-1] + p
  return offsets


@rule(lax.concatenate_p)
def _concatenate(ctx, *xs, dimension):
  """The operands stored into an unswizzled SMEM scratch along ``dimension``, each at a multiple
  of its padded size (``_aligned_offsets``), read back whole, and gathered along ``dimension``
  into the result (index ``j`` of the result reads the scratch where ``j``'s operand put it).
  Triton's barrier analysis orders the stores and the load."""
  gen, shape, dtype = ctx.gen, tuple(ctx.out.shape), np.dtype(ctx.out.dtype)
  if any(not x.shape for x in xs):
    gen.unsupported("concatenations of scalars")
  sizes = [x.shape[dimension] for x in xs]
  aligned = _aligned_offsets(sizes)
  stored = list(L.padded(shape))
  stored[dimension] = L.pow2(aligned[-1] + L.pow2(sizes[-1]))
  scratch = gen.fresh("concat")
  gen.emit_scalar(f"{scratch} = gl.allocate_shared_memory({ex.dtype_name(dtype, 'gl')}, {stored}, "
                  f"{gen.layout(L.RowMajorShared(len(shape)))})")
  for a, n, x in zip(aligned, sizes, xs):
    gen.emit(f"{scratch}.slice({a}, {L.pow2(n)}, dim={dimension}).store({gen.render(x)})")
  layout = gen.declared(gen.assigned(ctx.eqn.outvars[0]))
  loaded = gen.bind(ex.method(ex.Name(scratch), "load", ex.Token(gen.layout(layout)), dtype=dtype,
                              shape=tuple(stored)), "whole")
  j = iota_in(gen, I32, shape, dimension, layout)
  index, start = j, 0   # j - start + aligned, for the operand j falls in
  for a, n in zip(aligned, sizes):
    moved = ex.add(j, i32(a - start)) if a != start else j
    index = moved if start == 0 else call(
        "gl.where", ex.binary(">=", j, i32(start), dtype=np.dtype(np.bool_)), moved, index,
        dtype=I32, shape=shape)
    start += n
  if L.padded(shape)[dimension] > start:   # padding lanes read the first element, never past the end
    index = call("gl.where", ex.binary("<", j, i32(start), dtype=np.dtype(np.bool_)), index, i32(0),
                 dtype=I32, shape=shape)
  index = gen.bind(index, "source")
  return gen.value(call("gl.gather", loaded, index, i32(dimension), dtype=dtype, shape=shape),
                   layout)


@layout_rule(lax.concatenate_p)
def _concatenate_layouts(ctx, *xs, dimension):
  shape, dtype = tuple(ctx.out.shape), np.dtype(ctx.out.dtype)
  return Val(shape, dtype, L.blocked(shape, dtype))

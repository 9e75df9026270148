"""Gluon rules, one per primitive of a Mosaic GPU kernel (one thread's code): ``rule(ctx,
*operands, **params)`` as in ``gpu/source.py``. The Refs are the objects of ``gluon_codegen.py``.
TMA copies and barriers have their rules in ``gluon_copies.py``.

Values and SMEM buffers whose shapes are not powers of two live in padded tensors (see
``gluon_layouts.py``). What sits in the padding never reaches a result: reductions set it to their
identity first; GMEM is written through masks or by TMA, which drops what lies past the array's
end; and in SMEM it is zero (buffers start zeroed, register stores zero it, TMA fills it with
zeros), so a wgmma whose K is padded adds nothing from it.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src import primitives as prims
from pallax._src import ref_access
from pallax._src.gpu import expr as ex
from pallax._src.gpu.expr import Lit, binary, call, method
from pallax._src.mosaic_gpu import core as mc
from pallax._src.mosaic_gpu import gluon_layouts as L
from pallax._src.mosaic_gpu import primitives as mp
from pallax._src.mosaic_gpu.gluon_codegen import AccRef, BarrierRef, GmemRef, SmemRef, ValueRef, rule

I32 = np.dtype(np.int32)


def _i32(v) -> Lit:
  return Lit(int(v), dtype=I32)


def _dtype(d) -> ex.Token:
  return ex.Token(ex.dtype_name(d, "gl"))


def _shape(shape) -> ex.Token:
  """A tensor's shape in Gluon source: the logical shape padded to powers of two."""
  return ex.Token(str(list(L.padded(shape))))


def _valid(gen, shape, layout: str, dims) -> ex.Expr | None:
  """Whether each lane of a ``shape`` tile in ``layout`` lies inside the logical shape along
  ``dims`` (None: those dimensions are not padded)."""
  cond = None
  for d in dims:
    if L.is_pow2(shape[d]):
      continue
    inside = binary("<", _iota_in(gen, I32, tuple(shape), d, layout), _i32(shape[d]), dtype=np.dtype(np.bool_))
    cond = inside if cond is None else binary("&", cond, inside, dtype=np.dtype(np.bool_))
  return cond


def _masked(gen, v, dims, fill: ex.Expr):
  """``v`` with its padded lanes along ``dims`` set to ``fill``."""
  cond = _valid(gen, v.shape, gen.layout_of(v), dims) if v.shape and gen.layout_of(v) else None
  if cond is None:
    return v
  return gen.value(call("gl.where", cond, v, fill, dtype=v.dtype, shape=v.shape), gen.layout_of(v))


# --- scalars and register tiles --------------------------------------------------------------

_BINARY = {lax.add_p: "+", lax.sub_p: "-", lax.mul_p: "*", lax.and_p: "&", lax.or_p: "|",
           lax.xor_p: "^", lax.shift_left_p: "<<", lax.shift_right_arithmetic_p: ">>"}
_COMPARE = {lax.eq_p: "==", lax.ne_p: "!=", lax.lt_p: "<", lax.le_p: "<=", lax.gt_p: ">",
            lax.ge_p: ">="}


def _common(gen, *vals):
  """``vals`` in one layout (register tiles of two layouts cannot meet in one operation): the
  first computed tile's; a splatted constant is written again in it rather than converted."""
  tiles = [v for v in vals if v.shape and gen.layout_of(v) is not None]
  if not tiles:
    return list(vals), None
  chosen = lambda v: getattr(v, "name", None) not in gen.remat and v.name not in gen.tentative
  target = next((v for v in tiles if chosen(v)), tiles[0])
  layout = gen.layout_of(target)
  return [gen.in_layout(v, layout) for v in vals], layout


def _same_layout(gen, x, y):
  """``y`` in ``x``'s layout (``x`` is an accumulator: its layout stays)."""
  lx, ly = gen.layout_of(x), gen.layout_of(y)
  if lx is None or ly is None or lx == ly or not y.shape:
    return y, lx or ly
  return _convert_layout(gen, y, lx), lx


def _convert_layout(gen, v, layout):
  return gen.convert(v, layout)


def _binary_rule(op, compare=False):
  def lower(ctx, x, y, **_):
    gen = ctx.gen
    (x, y), layout = _common(gen, x, y)
    dtype = np.dtype(np.bool_) if compare else None
    return gen.value(binary(op, x, y, dtype=dtype), layout)
  return lower


for _p, _op in _BINARY.items():
  rule(_p)(_binary_rule(_op))
rule(ji.add_any_p)(_binary_rule("+"))
for _p, _op in _COMPARE.items():
  rule(_p)(_binary_rule(_op, compare=True))


@rule(lax.div_p)
def _div(ctx, x, y):
  (x, y), layout = _common(ctx.gen, x, y)
  return ctx.gen.value(binary("/" if np.issubdtype(x.dtype, np.floating) else "//", x, y), layout)


@rule(lax.rem_p)
def _rem(ctx, x, y):
  if np.issubdtype(x.dtype, np.floating):
    ctx.gen.unsupported("floating-point rem")
  (x, y), layout = _common(ctx.gen, x, y)
  return ctx.gen.value(binary("%", x, y), layout)


@rule(lax.max_p, lax.min_p)
def _max_min(ctx, x, y):
  (x, y), layout = _common(ctx.gen, x, y)
  fn = "gl.maximum" if ctx.eqn.primitive is lax.max_p else "gl.minimum"
  return ctx.gen.value(call(fn, x, y, dtype=x.dtype, shape=ctx.out.shape), layout)


@rule(lax.not_p)
def _not(ctx, x):
  return ctx.gen.value(ex.Op("~", (x,), dtype=x.dtype, shape=x.shape), ctx.gen.layout_of(x))


@rule(lax.neg_p)
def _neg(ctx, x):
  return ctx.gen.value(ex.Op("-", (x,), dtype=x.dtype, shape=x.shape), ctx.gen.layout_of(x))


@rule(lax.select_n_p)
def _select(ctx, pred, *cases):
  if len(cases) != 2:
    ctx.gen.unsupported("select_n with more than two cases")
  gen = ctx.gen
  (pred, a, b), layout = _common(gen, pred, *cases)
  return gen.value(call("gl.where", pred, b, a, dtype=a.dtype, shape=ctx.out.shape), layout)


@rule(lax.convert_element_type_p)
def _convert(ctx, x, *, new_dtype, **_):
  if np.dtype(new_dtype) == x.dtype:
    return x
  return ctx.gen.value(method(x, "to", _dtype(new_dtype), dtype=new_dtype), ctx.gen.layout_of(x))


@rule(lax.bitcast_convert_type_p)
def _bitcast(ctx, x, *, new_dtype):
  new = np.dtype(new_dtype)
  if new.itemsize != np.dtype(x.dtype).itemsize:
    ctx.gen.unsupported(f"bitcast_convert_type from {np.dtype(x.dtype).name} to {new.name} "
                        "(types of different sizes)")
  return ctx.gen.value(method(x, "to", _dtype(new), dtype=new, bitcast=True), ctx.gen.layout_of(x))


@rule(lax.exp2_p)
def _exp2(ctx, x, **_):
  return ctx.gen.value(call("gl.exp2", x, dtype=x.dtype, shape=x.shape), ctx.gen.layout_of(x))


@rule(lax.exp_p)
def _exp(ctx, x, **_):
  return ctx.gen.value(call("gl.exp", x, dtype=x.dtype, shape=x.shape), ctx.gen.layout_of(x))


def _reduce_rule(fn, kind: str):
  def lower(ctx, x, *, axes, **_):
    gen = ctx.gen
    if len(axes) != 1 or gen.layout_of(x) is None:
      gen.unsupported("reductions over several axes, or of values without a layout")
    (axis,) = axes
    x = _masked(gen, x, [axis], ex.untyped(ex.neutral(kind, x.dtype)))
    layout = _slice_layout(gen, gen.layout_of(x), axis)
    return gen.value(call(fn, x, _i32(axis), dtype=ctx.out.dtype, shape=ctx.out.shape), layout)
  return lower


rule(lax.reduce_max_p)(_reduce_rule("gl.max", "max"))
rule(lax.reduce_min_p)(_reduce_rule("gl.min", "min"))
rule(lax.reduce_sum_p)(_reduce_rule("gl.sum", "sum"))

_UNARY = {lax.exp_p: "gl.exp", lax.exp2_p: "gl.exp2", lax.log_p: "gl.log", lax.sqrt_p: "gl.sqrt",
          lax.rsqrt_p: "gl.rsqrt", lax.abs_p: "gl.abs"}


def _unary_rule(fn):
  return lambda ctx, x, **_: ctx.gen.value(call(fn, x, dtype=x.dtype, shape=x.shape), ctx.gen.layout_of(x))


for _p, _fn in _UNARY.items():
  rule(_p)(_unary_rule(_fn))


def _expand(gen, x, shape, dim: int, layout: str):
  """Vector ``x`` (in ``layout``'s slice along ``dim``) broadcast along ``dim`` to ``shape``."""
  e = call("gl.expand_dims", x, _i32(dim), dtype=x.dtype,
           shape=tuple(1 if d == dim else n for d, n in enumerate(shape)))
  full = call("gl.full", _shape(shape), _i32(0), _dtype(x.dtype), layout=ex.Token(layout),
              dtype=x.dtype, shape=tuple(shape))
  pair = gen.fresh("pair")
  gen.emit(f"{pair} = gl.broadcast({gen.render(e)}, {gen.render(full)})")
  v = gen.value(ex.Subscript(ex.Name(pair), (_i32(0),), dtype=x.dtype, shape=tuple(shape)), layout)
  def again(new):   # broadcast again from the vector in the new layout's slice
    if _kind(gen, new) == "other":
      return None
    return _expand(gen, gen.in_layout(x, _slice_layout(gen, new, dim)), shape, dim, new)
  gen.remat[v.name] = again
  return v


def _broadcast_tile(ctx, x, shape, broadcast_dimensions):
  """A reduced vector back to a tile: ``expand_dims`` undoes its slice layout."""
  gen = ctx.gen
  new_dims = [d for d in range(len(shape)) if d not in broadcast_dimensions]
  if len(new_dims) != 1 or len(shape) != 2:
    gen.unsupported("broadcasts of register tiles other than vectors to 2-D tiles")
  x, parent = _slice_of(gen, x, new_dims[0], shape)
  return _expand(gen, x, shape, new_dims[0], parent)


def _slice_of(gen, x, dim: int, shape):
  """(``dim``, parent layout) of vector ``x`` as a slice of a tile of ``shape``: converted to a
  slice of a coalesced layout unless it is a slice along ``dim`` already."""
  sliced = gen.slices.get(gen.layout_of(x))
  if sliced is not None and sliced[0] == dim:
    return x, sliced[1]
  parent = gen.layout(L.blocked(shape, x.dtype))
  return gen.convert(x, _slice_layout(gen, parent, dim)), parent


@rule(lax.broadcast_in_dim_p)
def _broadcast(ctx, x, *, shape, broadcast_dimensions, **_):
  if x.shape:
    return _broadcast_tile(ctx, x, tuple(shape), tuple(broadcast_dimensions))
  return ctx.gen.splat(x, tuple(shape), ctx.gen.layout(L.blocked(shape, x.dtype)))


@rule(lax.iota_p)
def _iota(ctx, *, dtype, shape, dimension, **_):
  """``broadcasted_iota``: an ``arange`` along ``dimension``, broadcast over the others."""
  shape = tuple(shape)
  if len(shape) > 2:
    ctx.gen.unsupported("iotas of rank 3 or more")
  return _iota_in(ctx.gen, np.dtype(dtype), shape, dimension, ctx.gen.layout(L.blocked(shape, dtype)))


def _iota_in(gen, dtype, shape, dimension: int, layout: str):
  if len(shape) > 2:
    return _iota_nd(gen, dtype, shape, dimension, layout)
  lane = layout if len(shape) == 1 else _slice_layout(gen, layout, 1 - dimension)
  e = call("gl.arange", _i32(0), _i32(L.padded(shape)[dimension]), layout=ex.Token(lane), dtype=I32,
           shape=(shape[dimension],))
  if dtype != I32:
    e = method(e, "to", _dtype(dtype), dtype=dtype)
  if len(shape) == 1:
    v = gen.value(e, layout)
  else:
    v = _expand(gen, gen.value(e, lane, "iota"), shape, 1 - dimension, layout)
  gen.remat[v.name] = lambda new: None if _kind(gen, new) == "other" else \
      _iota_in(gen, dtype, shape, dimension, new)
  return v


def _iota_nd(gen, dtype, shape, dimension: int, layout: str):
  """An iota along ``dimension`` of a tile of rank > 2: the vector in ``layout`` with every other
  dimension sliced away (highest first), expanded back (lowest first) and broadcast."""
  others = [d for d in range(len(shape)) if d != dimension]
  lane = layout
  for d in reversed(others):
    lane = _slice_layout(gen, lane, d)
  e = call("gl.arange", _i32(0), _i32(L.padded(shape)[dimension]), layout=ex.Token(lane),
           dtype=I32, shape=(shape[dimension],))
  for d in others:   # the dimensions below d are back already: d is its position
    e = call("gl.expand_dims", e, _i32(d), dtype=I32,
             shape=tuple(shape[k] if k == dimension else 1 for k in range(len(shape))
                         if k == dimension or k <= d))
  if dtype != I32:
    e = method(e, "to", _dtype(dtype), dtype=dtype)
  full = call("gl.full", _shape(shape), _i32(0), _dtype(dtype), layout=ex.Token(layout),
              dtype=dtype, shape=tuple(shape))
  pair = gen.fresh("pair")
  gen.emit(f"{pair} = gl.broadcast({gen.render(e)}, {gen.render(full)})")
  return gen.value(ex.Subscript(ex.Name(pair), (_i32(0),), dtype=dtype, shape=tuple(shape)), layout)


def _half(gen, x, dim: int, upper: bool):
  """The lower or upper half of register tile ``x`` along ``dim``: Gluon has no slicing of
  registers, but splits a trailing dimension of 2 (reshape, move it last, split)."""
  shape, padded = list(x.shape), list(L.padded(x.shape))
  split = padded[:dim] + [2, padded[dim] // 2] + padded[dim + 1:]
  order = [d for d in range(len(shape) + 1) if d != dim] + [dim]
  pair = gen.fresh("halves")
  gen.emit(f"{pair} = {gen.render(x)}.reshape({split}).permute({tuple(order)}).split()")
  shape[dim] //= 2
  return ex.Subscript(ex.Name(pair), (_i32(int(upper)),), dtype=x.dtype, shape=tuple(shape))


def _kind(gen, layout) -> str:
  text = gen.layout_key(layout)
  return "wgmma" if text.startswith("gl.NVMMADistributedLayout") else \
      "blocked" if text.startswith("gl.BlockedLayout") else "other"


def _halve(gen, v, dim: int, upper: bool):
  """One halving of a 2-D tile, in a layout that keeps both halves in each thread's registers
  (a wgmma accumulator stays one while it has more rows than a warpgroup covers)."""
  kind = _kind(gen, gen.layout_of(v))
  if kind == "other" or L.coverage(kind, v.shape, v.dtype)[dim] * 2 > v.shape[dim]:
    # The layout of a half-size tile: on the whole tile it repeats once along ``dim``.
    half_shape = tuple(n // 2 if d == dim else n for d, n in enumerate(v.shape))
    kind = "blocked"
    v = _convert_layout(gen, v, gen.layout(L.blocked(half_shape, v.dtype)))
    if L.coverage(kind, half_shape, v.dtype)[dim] > half_shape[dim]:
      gen.unsupported(f"slicing a register tile of shape {v.shape} along dimension {dim} into "
                      "pieces smaller than a warp's rows or a thread's vector")
  half = _half(gen, v, dim, upper)
  if kind == "wgmma" and half.shape[0] >= 16 * L.WARPS:
    k = int(gen.layout_key(gen.layout_of(v)).rsplit(",", 1)[1].strip(" ])"))   # instr_shape's K
    layout = gen.layout(L.wgmma(half.shape[1], 256 // k))
  else:
    layout = gen.layout(L.blocked(half.shape, half.dtype))
  return gen.value(call("gl.convert_layout", half, ex.Token(layout), dtype=half.dtype,
                        shape=half.shape), layout)


@rule(lax.slice_p)
def _slice(ctx, x, *, start_indices, limit_indices, strides):
  """Static slices of a 2-D register tile into power-of-two pieces (an accumulator's epilogue
  tiles), by halving."""
  gen = ctx.gen
  if strides is not None and any(s != 1 for s in strides):
    gen.unsupported("strided slices of register tiles")
  if len(x.shape) != 2:
    gen.unsupported("slices of register tiles other than 2-D ones")
  v = x
  for d, (lo, hi, n) in enumerate(zip(start_indices, limit_indices, x.shape)):
    size = hi - lo
    if size == n:
      continue
    if not (L.is_pow2(n) and L.is_pow2(size) and lo % size == 0):
      gen.unsupported(f"a slice [{lo}:{hi}] of a register tile's dimension of {n} (pieces of "
                      "a power-of-two size at multiples of it only)")
    while v.shape[d] > size:
      half = v.shape[d] // 2
      v = _halve(gen, v, d, upper=(lo // half) % 2 == 1)
  return v


@rule(ji.axis_index_p)
def _axis_index(ctx, *, axis_name):
  if axis_name not in ctx.gen.axes:
    raise NotImplementedError(f"lax.axis_index({axis_name!r}): no such axis")
  return ctx.gen.axes[axis_name]


@rule(ji.optimization_barrier_p)
def _identity(ctx, *xs, **_):
  return list(xs)


# A vector of a wgmma tile's rows sits in the same threads whatever the instruction's N, so
# ``Layout.WGMMA.reduce(1)`` picks one (slices of two N convert without moving data).
ROW_VECTOR_N = 64


@rule(mp.layout_cast_p)
def _layout_cast(ctx, x, *, new_layout):
  """``plgpu.layout_cast``: the wgmma layouts are Gluon's (choosing them before a loop keeps its
  carries in the layout the loop computes in); other layouts are hints Gluon chooses itself."""
  gen = ctx.gen
  if new_layout == mc.Layout.WGMMA and len(x.shape) == 2:
    layout = gen.layout(L.wgmma(x.shape[1], gen.mma_bits))
  else:
    layout = _wgmma_vector(gen, new_layout, x.shape)
    if layout is None:
      return x
  return _to_layout(gen, x, layout, x.shape, x.dtype)


def _wgmma_vector(gen, layout, shape) -> str | None:
  """``Layout.WGMMA.reduce(axis)`` of a vector as a Gluon slice layout (None: another layout):
  a column vector (axis 1) sits in the same threads whatever the tile's width; a row vector
  (axis 0) spans a tile as wide as itself."""
  if not (isinstance(layout, mc.ReducedLayout) and layout.layout == mc.Layout.WGMMA
          and layout.axes in ((0,), (1,)) and len(shape) == 1):
    return None
  (axis,) = layout.axes
  n = ROW_VECTOR_N if axis == 1 else shape[0]
  return _slice_layout(gen, gen.layout(L.wgmma(n, gen.mma_bits)), axis)


@rule(prims.hint_p)
def _hint(ctx, x, **_):
  return x


# --- control flow ----------------------------------------------------------------------------

def _settled(gen, init: list, body) -> list:
  """Loop carries that start as constants (splats, iotas) written in the layouts the loop body
  produces for them: ``body(carries)`` is lowered once, as a probe, to learn those."""
  if not any(getattr(v, "name", None) in gen.remat and v.shape for v in init):
    return init
  def probe():
    carries = [_carry(gen, v) for v in init]
    gen.tentative.update(c.name for c, v in zip(carries, init) if getattr(v, "name", None) in gen.remat)
    return body(carries)
  outs = gen.probe(probe)
  return [gen.in_layout(v, gen.layout_of(o)) if getattr(v, "name", None) in gen.remat else v
          for v, o in zip(init, outs)]


def _carry(gen, v: ex.Expr, hint="c") -> ex.Name:
  """A fresh variable holding ``v`` (loop and branch carries need names of their own)."""
  name = gen.fresh_name(hint, v.dtype, v.shape)
  text = gen.render(v) if v.shape or not isinstance(v, Lit) else \
      gen.render(call("gl.full", ex.Token("[]"), v, _dtype(v.dtype), dtype=v.dtype))
  gen.emit(f"{name.name} = {text}")
  if gen.layout_of(v):
    gen.layouts[name.name] = gen.layout_of(v)
  return name


@rule(ji.scan_p)
def _scan(ctx, *invals, jaxpr, length, reverse, ft_in, **_):
  gen, body = ctx.gen, jaxpr
  nc, ncarry, nxs = (len(s) for s in ft_in.unpack())
  if nxs or len(body.outvars) != ncarry or reverse:
    gen.unsupported("lax.scan over arrays")
  consts, init = list(invals[:nc]), list(invals[nc:])
  if ncarry and jaxpr_util.fori_index(body, nc):
    i = gen.fresh_name("i", I32, ())
    init[1:] = _settled(gen, init[1:], lambda c: gen.lower_jaxpr(body, [*consts, i, *c])[1:])
    carry = [_carry(gen, v) for v in init[1:]]
    stop = ex.add(init[0], _i32(length))
    gen.emit(f"for {i.name} in range({gen.render(init[0])}, {gen.render(stop)}):")
    gen.depth += 1
    new = gen.lower_jaxpr(body, [*consts, i, *carry])
    gen.assign(carry, new[1:])
    gen.depth -= 1
    return [gen.bind(stop, "i_end"), *carry]
  init = _settled(gen, init, lambda c: gen.lower_jaxpr(body, [*consts, *c]))
  carry = [_carry(gen, v) for v in init]
  gen.emit(f"for _ in range({length}):")
  gen.depth += 1
  gen.assign(carry, gen.lower_jaxpr(body, [*consts, *carry]))
  gen.depth -= 1
  return carry


@rule(ji.while_p)
def _while(ctx, *invals, cond_jaxpr, body_jaxpr, cond_nconsts, body_nconsts):
  """``while go: carry = body(carry); go = cond(carry)``: the flag is a carry like the others."""
  gen, cn, bn = ctx.gen, cond_nconsts, body_nconsts
  cconsts, bconsts, init = invals[:cn], invals[cn:cn + bn], invals[cn + bn:]
  init = _settled(gen, list(init), lambda c: gen.lower_jaxpr(body_jaxpr, [*bconsts, *c]))
  carry = [_carry(gen, v) for v in init]
  (go,) = gen.lower_jaxpr(cond_jaxpr, [*cconsts, *carry])
  flag = _carry(gen, go, "go")
  gen.emit(f"while {flag.name}:")
  gen.depth += 1
  gen.assign(carry, gen.lower_jaxpr(body_jaxpr, [*bconsts, *carry]))
  (go,) = gen.lower_jaxpr(cond_jaxpr, [*cconsts, *carry])
  gen.assign([flag], [go])
  gen.depth -= 1
  return carry


@rule(ji.cond_p)
def _cond(ctx, index, *ops, branches, **_):
  gen = ctx.gen
  if isinstance(index, Lit):   # decided when the code is written (a thread's own branch)
    k = int(np.clip(int(index.value), 0, len(branches) - 1))
    return gen.lower_jaxpr(branches[k], list(ops))
  if len(branches) != 2:
    gen.unsupported("lax.switch with more than two branches")
  results = [gen.fresh_name("r", a.dtype, a.shape) for a in ctx.avals_out]
  idx = index if index.dtype != np.bool_ else method(index, "to", _dtype(np.int32), dtype=I32)
  for head, k in ((f"if {gen.render(binary('!=', idx, _i32(0)))}:", 1), ("else:", 0)):
    gen.emit(head)
    gen.depth += 1
    before = len(gen.lines)
    gen.assign(results, gen.lower_jaxpr(branches[k], list(ops)))
    if len(gen.lines) == before:
      if k == 0:   # an empty else (pl.when): leave it out
        del gen.lines[-1]
        gen.depth -= 1
        break
      gen.emit("pass")
    gen.depth -= 1
  return results


def _inline(param):
  return lambda ctx, *invals, **params: ctx.gen.lower_jaxpr(params[param], list(invals))


for _p, _param in ((ji.jit_p, "jaxpr"), (ji.closed_call_p, "call_jaxpr"),
                   (ji.custom_jvp_call_p, "call_jaxpr"), (ji.custom_vjp_call_p, "call_jaxpr"),
                   (ji.remat_p, "jaxpr")):
  rule(_p)(_inline(_param))


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


# --- allocation ------------------------------------------------------------------------------

@rule(prims.run_scoped_p)
def _run_scoped(ctx, *consts, jaxpr, num_consts, scratch_types=(), **_):
  gen = ctx.gen
  refs = gen.hoisted.get(ctx.eqn)   # collective scratch of a thread: allocated before the split
  if refs is None and gen.thread_name in ctx.eqn.params.get("collective_axes", ()):
    gen.unsupported(f"scratch shared by the threads ({gen.thread_name!r}) allocated inside a loop "
                    "or branch (allocate it in the kernel's straight-line code)")
  types, avals = scratch_types, [v.aval.inner_aval for v in jaxpr.invars[num_consts:]]
  refs = [r if r is not None else allocate(gen, t, a)
          for r, t, a in zip(refs or [None] * len(types), types, avals)]
  return gen.lower_jaxpr(jaxpr, [*consts, *refs])


def hoist_nested(gen, jaxpr, nested: bool = False) -> None:
  """Allocates now (at the kernel's top) the SMEM buffers and barriers of scopes inside loops
  and branches, recording them by equation in ``gen.hoisted`` (None for accumulators, which
  are registers made at the scope). Each entry to such a scope reuses them: SMEM holds
  whatever the last entry left (as a fresh buffer holds anything), and a barrier goes on from
  the phase its last completion left, which the interpreter's checks make its initial one
  (every completion is awaited before the scope ends)."""
  for eqn in jaxpr.eqns:
    p = eqn.params
    if eqn.primitive is prims.run_scoped_p and nested:
      gen.hoisted[eqn] = [None if isinstance(t, mc.WGMMAAccumulatorRef) else
                          allocate(gen, t, v.aval.inner_aval)
                          for t, v in zip(p["scratch_types"], p["jaxpr"].invars[p["num_consts"]:])]
    inner = nested or eqn.primitive not in (prims.run_scoped_p, *ji.CALL_PRIMITIVES)
    for sub in jaxpr_util.sub_jaxprs(p):
      hoist_nested(gen, sub, inner)


def allocate(gen, kind, aval):
  shape, dtype = tuple(aval.shape), np.dtype(aval.dtype)
  if isinstance(kind, mc.WGMMAAccumulatorRef):
    layout = gen.layout(L.wgmma(shape[1], gen.mma_bits))
    name = gen.fresh("acc")
    gen.emit(f"{name} = gl.zeros({list(L.padded(shape))}, {ex.dtype_name(dtype, 'gl')}, layout={layout})")
    gen.accs.append(AccRef(name, shape, layout))
    return gen.accs[-1]
  if gen.depth != 1:
    gen.unsupported("SMEM or barrier allocations inside loops or branches")
  if isinstance(kind, mc.Barrier):
    name, phase = gen.fresh("bar"), gen.fresh("phase")
    n = int(np.prod(shape)) if shape else 1
    gen.emit(f"{name} = gl.allocate_shared_memory(gl.int64, [{n}, 1], {L.BARRIER})")
    gen.emit(f"for _b in gl.static_range({n}):")
    gen.emit(f"    mbarrier.init({name}.index(_b), count={kind.num_arrivals})")
    gen.emit(f"{phase} = 0")
    return BarrierRef(name, phase, n)
  if isinstance(kind, mc.GPUMemoryRef) and kind.memory_space is mc.MemorySpace.SMEM:
    # Rank > 3: the leading dimensions flattened into one, each padded to a power of two so
    # that the whole buffer can also be seen unflattened (a reshape).
    stored = shape if len(shape) <= 3 else (int(np.prod(L.padded(shape[:-2]))),) + shape[-2:]
    name = gen.fresh("smem")
    layout = gen.allocate_smem(name, stored, dtype)
    return SmemRef(name, shape, dtype, layout, L.swizzle(shape[-2:], dtype),
                   lead=shape[:-2] if len(shape) > 3 else ())
  gen.unsupported(f"scratch of type {kind}")


@rule(ji.run_state_p)
def _run_state(ctx, *invals, jaxpr, is_initialized, **_):
  """``pl.run_state`` over values (``plgpu.ACC.init(x)``): each becomes an accumulator variable;
  Refs the body closes over pass through."""
  gen, given, refs = ctx.gen, iter(invals), []
  for init, v in zip(is_initialized, jaxpr.invars):
    x = next(given) if init else None
    if x is not None and not isinstance(x, ex.Expr):
      refs.append(x)
      continue
    shape = tuple(v.aval.inner_aval.shape)
    if x is not None and x.dtype != np.float32:   # a value the body closes over: read only
      refs.append(ValueRef(x))
      continue
    if x is None or len(shape) != 2:
      gen.unsupported("pl.run_state over values other than (ACC.init of) 2-D float32 arrays")
    layout = gen.layout(L.wgmma(shape[1], gen.mma_bits))
    name = gen.fresh("acc")
    gen.emit(f"{name} = {gen.render(_to_layout(gen, x, layout, shape, x.dtype))}")
    gen.accs.append(AccRef(name, shape, layout))
    refs.append(gen.accs[-1])
  gen.lower_jaxpr(jaxpr, refs)
  outs = []
  for r, v in zip(refs, ctx.eqn.outvars):
    if isinstance(r, ValueRef):
      outs.append(r.value)
    elif isinstance(r, AccRef):
      _wait_all(gen, [r])
      value = gen.fresh_name("acc_value", v.aval.dtype, r.shape)
      gen.emit(f"{value.name} = {r.name}")
      gen.layouts[value.name] = r.layout
      outs.append(value)
    else:
      outs.append(r)
  return outs


# --- views -----------------------------------------------------------------------------------

def _smem_view(gen, ref: SmemRef, transforms, k_last: bool = False) -> SmemRef:
  """The view of ``ref`` that ``transforms`` take (``k_last``: a wgmma operand whose buffer's
  last dimension is K, which may be sliced inside a swizzle atom, as wgmma itself steps
  through it)."""
  text, shape, permuted = ref.text, list(ref.shape), False
  transforms = list(transforms)
  if ref.lead:   # a buffer of rank > 3, stored with its leading dimensions flattened
    if not transforms:   # used whole: the flattened dimension split again
      return dataclasses.replace(ref, text=f"{ref.text}.reshape({list(L.padded(ref.shape))})",
                                 lead=(), reshaped=True)
    text, shape, transforms[0] = _flat_index(gen, ref, transforms[0])
  for t in transforms:
    if isinstance(t, ji.TransposeRef):
      text = f"{text}.permute({tuple(t.permutation)})"
      shape = [shape[p] for p in t.permutation]
      permuted = True
      continue
    if not isinstance(t, ji.NDIndexer):
      gen.unsupported(f"the SMEM view {t}")
    new_shape, dim, rank = [], 0, sum(isinstance(i, ji.Slice) for i in t.indices)
    for idx, size in zip(t.indices, shape):
      if isinstance(idx, ji.Slice):
        if not (isinstance(idx.start, Lit) or isinstance(idx.start, int)) or idx.stride != 1:
          gen.unsupported("dynamic or strided slices of SMEM")
        start = idx.start.value if isinstance(idx.start, Lit) else idx.start
        if (start, idx.size) != (0, size):
          if permuted:
            gen.unsupported("partial slices of a transposed SMEM view")
          _check_smem_slice(gen, ref, start, idx.size, rank - dim, k_last)
          text = f"{text}.slice({start}, {idx.size}, {dim})"
        new_shape.append(idx.size)
        dim += 1
      elif not getattr(idx, "shape", ()):
        if dim != 0:
          gen.unsupported("indexing an inner dimension of SMEM")
        text = f"{text}.index({gen.render(idx)})"
      else:
        gen.unsupported("gathers from SMEM")
    shape = new_shape
  gen.note_view(ref.layout, len(shape))
  return SmemRef(text, tuple(shape), ref.dtype, ref.layout, ref.swizzle)


def _flat_index(gen, ref: SmemRef, t):
  """(text, shape, the rest of indexer ``t``) after indexing every leading dimension of a
  flattened buffer at once (Gluon's SMEM layouts describe at most one leading dimension)."""
  n = len(ref.lead)
  if not isinstance(t, ji.NDIndexer) or len(t.indices) < n or any(
      isinstance(i, ji.Slice) or getattr(i, "shape", ()) for i in t.indices[:n]):
    gen.unsupported(f"slicing the leading dimensions of an SMEM buffer of shape {ref.shape} "
                    "(index them with integers)")
  flat = t.indices[0]
  for idx, size in zip(t.indices[1:n], L.padded(ref.lead[1:])):
    flat = gen.bind(ex.add(ex.mul(flat, _i32(size)), idx), "slot")
  rest = ji.NDIndexer(tuple(t.indices[n:]), tuple(ref.shape[n:]), t.int_indexer_shape)
  return f"{ref.text}.index({gen.render(flat)})", list(ref.shape[n:]), rest


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


def _barrier_view(gen, ref: BarrierRef, transforms) -> BarrierRef:
  if not isinstance(ref, BarrierRef):
    raise ValueError(f"a barrier operation takes a plgpu.Barrier, not {type(ref).__name__}")
  if not transforms:
    return BarrierRef(ref.name, ref.phase, ref.count, _i32(0))
  (t,) = transforms
  (idx,) = t.indices
  return BarrierRef(ref.name, ref.phase, ref.count, idx)


def _view(gen, ref, transforms):
  if isinstance(ref, SmemRef):
    return _smem_view(gen, ref, transforms)
  if isinstance(ref, BarrierRef):
    return _barrier_view(gen, ref, transforms)
  return ref, transforms


# --- memory ----------------------------------------------------------------------------------

def _slice_layout(gen, layout: str, dim: int) -> str:
  """The layout of a tensor with ``dim`` of a ``layout`` tensor taken away (a reduction's)."""
  name = gen.layout(f"gl.SliceLayout({dim}, {layout})")
  gen.slices[name] = (dim, layout)
  return name


def _gmem_pointers(gen, ref: GmemRef, transforms) -> tuple[ex.Name, tuple, str | None, ex.Expr | None]:
  """(the pointer tensor of a GMEM view, the view's shape, its layout, the mask of its padded
  lanes or None): register accesses of GMEM read or write whole views; the interpreter checks
  their bounds."""
  gen.pointer_uses.add(ref.ptr)
  rank = len(ref.shape)
  strides = [int(np.prod(ref.shape[k + 1:])) for k in range(rank)]
  offset: ex.Expr = _i32(0)
  dims = list(range(rank))          # view dimension -> operand dimension
  sizes = list(ref.shape)
  for t in (*ref.pre, *transforms):
    if not isinstance(t, ji.NDIndexer):
      gen.unsupported(f"the GMEM view {t}")
    new_dims, new_sizes = [], []
    for idx, d, size in zip(t.indices, dims, sizes):
      if isinstance(idx, ji.Slice):
        if idx.stride != 1:
          gen.unsupported("strided register accesses of GMEM")
        start = idx.start if isinstance(idx.start, ex.Expr) else _i32(idx.start)
        new_dims.append(d)
        new_sizes.append(idx.size)
      elif not getattr(idx, "shape", ()):
        start = idx
      else:
        gen.unsupported("gathers from GMEM")
      offset = ex.add(offset, ex.mul(start, strides[d]))
    dims, sizes = new_dims, new_sizes
  shape = tuple(sizes)
  ptr = gen.bind(ex.binary("+", ex.Name(ref.ptr, dtype=ref.dtype), offset), "ptr")
  if not shape:
    return ptr, shape, None, None
  if len(shape) > 2:
    gen.unsupported("register accesses of GMEM views of rank 3 or more")
  layout = gen.layout(L.blocked(shape, ref.dtype))
  for j, (d, n) in enumerate(zip(dims, shape)):
    lane = layout if len(shape) == 1 else _slice_layout(gen, layout, 1 - j)
    ar = call("gl.arange", _i32(0), _i32(ex.pow2(n)), layout=ex.Token(lane), dtype=I32, shape=(n,))
    if len(shape) == 2:
      ar = call("gl.expand_dims", ar, _i32(1 - j), dtype=I32, shape=(n, 1) if j == 0 else (1, n))
    ptr = gen.bind(ex.binary("+", ptr, ex.mul(gen.bind(ar, "offs"), strides[d])), "ptrs")
  return ptr, shape, layout, _valid(gen, shape, layout, range(len(shape)))


def _to_layout(gen, v, layout, shape, dtype):
  """``v`` as a tensor of ``shape`` in ``layout`` (a scalar is broadcast)."""
  if not v.shape:
    return gen.value(call("gl.full", _shape(shape), v, _dtype(dtype),
                          layout=ex.Token(layout), dtype=dtype, shape=shape), layout)
  if gen.layout_of(v) not in (None, layout):
    return _convert_layout(gen, v, layout)
  return v


@rule(ji.get_p)
def _get(ctx, *invals, **_):
  gen = ctx.gen
  a = ref_access.split(ctx.eqn, invals)
  if isinstance(a.ref, AccRef):
    _wait_all(gen, [a.ref])
    value = gen.fresh_name("acc_value", ctx.out.dtype, a.ref.shape)
    gen.emit(f"{value.name} = {a.ref.name}")   # a copy: later wgmmas reassign the accumulator
    gen.layouts[value.name] = a.ref.layout
    return value
  if isinstance(a.ref, ValueRef):
    if any(not isinstance(t, ji.NDIndexer) or any(not isinstance(i, ji.Slice) or i.size != n
           for i, n in zip(t.indices, a.ref.value.shape)) for t in a.transforms):
      gen.unsupported("indexing a value pl.run_state closes over")
    return a.ref.value
  if isinstance(a.ref, GmemRef):
    ptrs, shape, layout, mask = _gmem_pointers(gen, a.ref, a.transforms)
    masks = {} if mask is None else {"mask": mask}
    return gen.value(call("gl.load", ptrs, dtype=a.ref.dtype, shape=shape, **masks), layout)
  if not isinstance(a.ref, SmemRef):
    gen.unsupported(f"register loads from {a.ref}")
  if (rows := _unaligned_rows(a.ref, a.transforms)) is not None:
    return _load_rows_in_pieces(gen, a.ref, a.transforms[0], *rows)
  view = _register_view(gen, a.ref, a.transforms)
  layout = _vector_layout(ctx, view.shape) or gen.layout(L.blocked(view.shape, view.dtype))
  smem = ex.Name(view.text, dtype=view.dtype, shape=view.shape)
  return gen.value(method(smem, "load", ex.Token(layout)), layout)


def _register_view(gen, ref: SmemRef, transforms) -> SmemRef:
  """The SMEM view a register load or store reads or writes, in a layout of its own rank."""
  view = _smem_view(gen, ref, transforms)
  if gen.is_whole(view):
    return dataclasses.replace(view, text=gen.whole_view(view))
  if not view.reshaped:
    gen.note_view(ref.layout, len(view.shape), registers=True)
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


def _unaligned_rows(ref: SmemRef, transforms) -> tuple[int, int, int] | None:
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
    view = _register_view(gen, ref, [idx])
    layout = gen.layout(L.blocked(view.shape, view.dtype))
    smem = ex.Name(view.text, dtype=view.dtype, shape=view.shape)
    parts.append(gen.value(method(smem, "load", ex.Token(layout)), layout))
  while len(parts) > 1:   # join pairs: (r, ...) and (r, ...) -> (2, r, ...) -> (2r, ...)
    a, b = parts[0], parts[1]
    rank, padded = len(a.shape), L.padded(a.shape)
    shape = (2 * a.shape[0], *a.shape[1:])
    joined = gen.fresh("rows")
    gen.emit(f"{joined} = gl.join({gen.render(a)}, {gen.render(b)}).permute({(rank, *range(rank))})"
             f".reshape({[2 * padded[0], *padded[1:]]})")
    layout = gen.layout(L.blocked(shape, a.dtype))
    merged = gen.value(call("gl.convert_layout", ex.Name(joined), ex.Token(layout), dtype=a.dtype,
                            shape=shape), layout)
    parts = parts[2:] + [merged]
  return parts[0]


def _vector_layout(ctx, shape) -> str | None:
  """The layout to read a vector from SMEM in when it is only broadcast into tiles that wgmma
  accumulators fill (softmax statistics in attention), or cast to a wgmma slice layout: a slice
  of the accumulators' layout, so that no conversion through shared memory follows the load.
  None: choose locally."""
  gen = ctx.gen
  uses = gen.uses(ctx.eqn.outvars[0])
  if len(shape) != 1 or not uses or not gen.wgmma:
    return None
  if len(uses) == 1 and uses[0].primitive is mp.layout_cast_p:   # plgpu.load(..., layout=)
    return _wgmma_vector(gen, uses[0].params["new_layout"], shape)
  tiles = set()
  for e in uses:
    if e.primitive is not lax.broadcast_in_dim_p or len(e.params["shape"]) != 2:
      return None
    (new,) = {0, 1} - set(e.params["broadcast_dimensions"])
    tiles.add((new, e.params["shape"][1]))
  (dim, n), *others = tiles
  if others or e.params["shape"][0] % (16 * L.WARPS):
    return None
  return _slice_layout(gen, gen.layout(L.wgmma(n, gen.mma_bits)), dim)


@rule(ji.swap_p)
def _swap(ctx, ref, value, *leaves, **_):
  gen = ctx.gen
  a = ref_access.split(ctx.eqn, [ref, value, *leaves])
  if isinstance(a.ref, AccRef):
    v, _ = _same_layout(gen, ex.Name(a.ref.name, dtype=value.dtype, shape=a.ref.shape), value)
    gen.layouts[a.ref.name] = a.ref.layout
    gen.emit(f"{a.ref.name} = {gen.render(v)}")
    return None
  if ctx.is_used(0):
    gen.unsupported("using the old value of a store")
  if isinstance(a.ref, GmemRef):
    ptrs, shape, layout, mask = _gmem_pointers(gen, a.ref, a.transforms)
    if shape:
      value = _to_layout(gen, value, layout, shape, a.ref.dtype)
    masks = "" if mask is None else f", mask={gen.render(mask)}"
    gen.emit(f"gl.store({gen.render(ptrs)}, {gen.render(value)}{masks})")
    return None
  if not isinstance(a.ref, SmemRef):
    gen.unsupported(f"register stores to {a.ref}")
  view = _register_view(gen, a.ref, a.transforms)
  if not value.shape:
    layout = gen.layout(L.blocked(view.shape, view.dtype))
    value = gen.value(call("gl.full", _shape(view.shape), value, _dtype(view.dtype),
                           layout=ex.Token(layout), dtype=view.dtype, shape=view.shape), layout)
  value = _masked(gen, value, range(len(view.shape)), _i32(0))   # SMEM padding stays zero
  gen.emit(f"{view.text}.store({gen.render(value)})")
  return None


# --- wgmma -----------------------------------------------------------------------------------

@rule(mp.wgmma_p)
def _wgmma(ctx, *invals, trees):
  gen = ctx.gen
  (acc, a, b), rest = mp.split_refs(invals, trees)
  acc_ref = acc[0]
  if acc[1]:
    gen.unsupported("wgmma into a view of an accumulator")
  # K is the last dimension of a's buffer unless a is transposed, of b's only if b is.
  transposed = lambda ref: any(isinstance(t, ji.TransposeRef) for t in ref[1])
  b_view = _smem_view(gen, *b, k_last=transposed(b))
  if a is None:   # a register operand: in the layout wgmma reads registers in
    value = _masked(gen, rest[0], [1], _i32(0))   # padding along K adds nothing
    bits = value.dtype.itemsize * 8
    dot = gen.layout(f"gl.DotOperandLayout(operand_index=0, parent={gen.layout(L.wgmma(acc_ref.shape[1], bits))}, "
                     f"k_width={32 // bits})")
    gen.conversions.append((gen.layout_of(value), dot, tuple(value.shape), gen.last_frame))
    a_view = SmemRef(gen.render(gen.value(call("gl.convert_layout", value, ex.Token(dot),
                                                  dtype=value.dtype, shape=value.shape), dot, "a_op")),
                     value.shape, value.dtype, dot)
  else:
    a_view = _smem_view(gen, *a, k_last=not transposed(a))
  bits = a_view.dtype.itemsize * 8
  if bits == 32 and ".permute((1, 0))" not in b_view.text:
    raise NotImplementedError(
        "wgmma of float32 operands (tf32) reads b in K-major order only: keep b as an (N, K) SMEM "
        "buffer and pass b_smem.transpose((1, 0)), or use 16-bit operands")
  layout = gen.layout(L.wgmma(acc_ref.shape[1], bits))
  if layout != acc_ref.layout:
    gen.emit(f"{acc_ref.name} = gl.convert_layout({acc_ref.name}, {layout})")
    acc_ref.layout = layout
  gen.emit(f"{acc_ref.name} = hopper.warpgroup_mma({a_view.text}, {b_view.text}, {acc_ref.name}, is_async=True)")
  # plgpu.wgmma returns with at most this wgmma in flight.
  # The operands stay alive (and unwritten) while the wgmma may read them.
  gen.emit(f"{acc_ref.name}, _, _ = hopper.warpgroup_mma_wait(1, deps=[{acc_ref.name}, {a_view.text}, "
           f"{b_view.text}])")
  pending = gen.pending_accs
  if acc_ref not in pending:
    pending.append(acc_ref)
  return []


def _wait_all(gen, accs):
  """Waits for every wgmma into ``accs`` (reading an accumulator, or wgmma_wait(0))."""
  pending = gen.pending_accs
  for acc in accs:
    gen.emit(f"{acc.name} = hopper.warpgroup_mma_wait(0, deps=[{acc.name}])")
    if acc in pending:
      pending.remove(acc)


@rule(mp.wgmma_wait_p)
def _wgmma_wait(ctx, *, n):
  # After each wgmma at most that one is in flight (see _wgmma): only n = 0 waits here.
  if n == 0:
    _wait_all(ctx.gen, list(ctx.gen.pending_accs))
  return []


@rule(mp.set_max_registers_p)
def _set_max_registers(ctx, *, n, action):
  ctx.gen.registers = n   # the running thread's partition budget (gluon_threads.split)
  return []

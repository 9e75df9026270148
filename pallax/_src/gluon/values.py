"""Helpers the Gluon rules share: literals and type tokens, operands in the layout the layout
assignment gave their operation (converted, or rebuilt where they are splats, iotas and
broadcasts), slices of layouts, masks of padded lanes, iotas, and waiting for wgmmas.

Values and SMEM buffers whose shapes are not powers of two live in padded tensors (see
``layouts.py``). What sits in the padding never reaches a result: reductions set it to their
identity first; GMEM is written through masks or by TMA, which drops what lies past the array's
end; and in SMEM it is zero wherever a wgmma may read it along K (such buffers start zeroed:
``assign.Buffer.padding_read``; register stores zero it, TMA fills it with zeros), so a wgmma
whose K is padded adds nothing from it.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from pallax._src.gluon import layouts as L
from pallax._src.gluon.events import MmaWait
from pallax._src.gluon.statements import Binding
from pallax._src.gpu import control
from pallax._src.gpu import expr as ex
from pallax._src.gpu.expr import Lit, binary, call, method
from pallax._src.mosaic_gpu import core as mc

I32 = np.dtype(np.int32)


def i32(v) -> Lit:
  return Lit(int(v), dtype=I32)


def dtype_token(d) -> ex.Token:
  return ex.Token(ex.dtype_name(d, "gl"))


def shape_token(shape) -> ex.Token:
  """A tensor's shape in Gluon source: the logical shape padded to powers of two."""
  return ex.Token(str(list(L.padded(shape))))


def valid_lanes(gen, shape, layout: L.Layout, dims) -> ex.Expr | None:
  """Whether each lane of a ``shape`` tile in ``layout`` lies inside the logical shape along
  ``dims`` (None: those dimensions are not padded)."""
  return control.valid_lanes(shape, dims, lambda d: iota_in(gen, I32, tuple(shape), d, layout))


def masked(gen, v, dims, fill: ex.Expr):
  """``v`` with its padded lanes along ``dims`` set to ``fill``."""
  cond = valid_lanes(gen, v.shape, gen.layout_of(v), dims) if v.shape and gen.layout_of(v) else None
  if cond is None:
    return v
  return gen.value(call("gl.where", cond, v, fill, dtype=v.dtype, shape=v.shape), gen.layout_of(v))



def common_layout(ctx, *vals):
  """``vals`` in the layout the assignment gave the operation's result (register tiles of two
  layouts cannot meet in one operation): converted to it, or written again in it where they
  are splats, iotas or broadcasts."""
  layout = ctx.gen.assigned(ctx.eqn.outvars[0])
  return [ctx.gen.in_layout(v, layout) for v in vals], layout


def convert_layout(gen, v, layout):
  return gen.convert(v, layout)



def expand(gen, x, shape, dim: int, layout: L.Layout):
  """Vector ``x`` (in ``layout``'s slice along ``dim``) broadcast along ``dim`` to ``shape``."""
  e = call("gl.expand_dims", x, i32(dim), dtype=x.dtype,
           shape=tuple(1 if d == dim else n for d, n in enumerate(shape)))
  v = broadcast_to(gen, e, shape, layout)
  def again(new):   # broadcast again from the vector in the new layout's slice
    if new.kind == "other":
      return None
    return expand(gen, gen.in_layout(x, slice_layout(gen, new, dim)), shape, dim, new)
  gen.remat[v.name] = again
  return v



def broadcast_to(gen, e, shape, layout: L.Layout):
  """``e`` (dimensions of one where ``shape`` has more) broadcast to ``shape`` in ``layout``:
  against a tile of zeros of that shape (Gluon's broadcast takes two tensors)."""
  full = call("gl.full", shape_token(shape), i32(0), dtype_token(e.dtype),
              layout=ex.Token(gen.layout(layout)), dtype=e.dtype, shape=tuple(shape))
  pair = gen.fresh("pair")
  gen.emit_scalar(f"{pair} = gl.broadcast({gen.render(e)}, {gen.render(full)})")
  return gen.value(ex.Subscript(ex.Name(pair), (i32(0),), dtype=e.dtype, shape=tuple(shape)), layout)


def iota_in(gen, dtype, shape, dimension: int, layout: L.Layout):
  if len(shape) > 2:
    return iota_nd(gen, dtype, shape, dimension, layout)
  lane = layout if len(shape) == 1 else slice_layout(gen, layout, 1 - dimension)
  e = call("gl.arange", i32(0), i32(L.padded(shape)[dimension]), layout=ex.Token(gen.layout(lane)), dtype=I32,
           shape=(shape[dimension],))
  if dtype != I32:
    e = method(e, "to", dtype_token(dtype), dtype=dtype)
  if len(shape) == 1:
    v = gen.value(e, layout)
  else:
    v = expand(gen, gen.value(e, lane, "iota"), shape, 1 - dimension, layout)
  gen.remat[v.name] = lambda new: None if new.kind == "other" else \
      iota_in(gen, dtype, shape, dimension, new)
  return v


def iota_nd(gen, dtype, shape, dimension: int, layout: L.Layout):
  """An iota along ``dimension`` of a tile of rank > 2: the vector in ``layout`` with every other
  dimension sliced away (highest first), expanded back (lowest first) and broadcast."""
  others = [d for d in range(len(shape)) if d != dimension]
  lane = layout
  for d in reversed(others):
    lane = slice_layout(gen, lane, d)
  e = call("gl.arange", i32(0), i32(L.padded(shape)[dimension]), layout=ex.Token(gen.layout(lane)),
           dtype=I32, shape=(shape[dimension],))
  for d in others:   # the dimensions below d are back already: d is its position
    e = call("gl.expand_dims", e, i32(d), dtype=I32,
             shape=tuple(shape[k] if k == dimension else 1 for k in range(len(shape))
                         if k == dimension or k <= d))
  if dtype != I32:
    e = method(e, "to", dtype_token(dtype), dtype=dtype)
  full = call("gl.full", shape_token(shape), i32(0), dtype_token(dtype), layout=ex.Token(gen.layout(layout)),
              dtype=dtype, shape=tuple(shape))
  pair = gen.fresh("pair")
  gen.emit_scalar(f"{pair} = gl.broadcast({gen.render(e)}, {gen.render(full)})")
  return gen.value(ex.Subscript(ex.Name(pair), (i32(0),), dtype=dtype, shape=tuple(shape)), layout)



# A vector of a wgmma tile's rows sits in the same threads whatever the instruction's N, so
# ``Layout.WGMMA.reduce(1)`` picks one (slices of two N convert without moving data).
ROW_VECTOR_N = 64


def wgmma_vector_of(layout, shape, mma_bits: int) -> L.Layout | None:
  """``Layout.WGMMA.reduce(axis)`` of a vector as a Gluon slice layout (None: another layout):
  a column vector (axis 1) sits in the same threads whatever the tile's width; a row vector
  (axis 0) spans a tile as wide as itself."""
  if not (isinstance(layout, mc.ReducedLayout) and layout.layout == mc.Layout.WGMMA
          and layout.axes in ((0,), (1,)) and len(shape) == 1):
    return None
  (axis,) = layout.axes
  n = ROW_VECTOR_N if axis == 1 else shape[0]
  return L.Slice(axis, L.wgmma(n, mma_bits))



def slice_layout(gen, layout: L.Layout, dim: int) -> L.Slice:
  """The layout of a tensor with ``dim`` of a ``layout`` tensor taken away (a reduction's)."""
  sliced = L.Slice(dim, layout)
  gen.declared(sliced)
  return sliced



def to_layout(gen, v, layout, shape, dtype):
  """``v`` as a tensor of ``shape`` in ``layout`` (a scalar is broadcast)."""
  if not v.shape:
    return gen.value(call("gl.full", shape_token(shape), v, dtype_token(dtype),
                          layout=ex.Token(gen.layout(layout)), dtype=dtype, shape=shape), layout)
  if gen.layout_of(v) not in (None, layout):
    return convert_layout(gen, v, layout)
  return v



@dataclasses.dataclass(frozen=True)
class IssuedWait:
  """The ``warpgroup_mma_wait(1, ...)`` a wgmma was written with: where it is (the function's
  lines, its index, the block depth), the accumulator, the operands it keeps alive."""
  lines: list
  index: int
  depth: int
  acc: Any
  deps: str


def wgmma_issued(gen, acc_ref, deps: str):
  """After a wgmma into ``acc_ref``: the wait that leaves at most it in flight, keeping its
  operands (``deps``) alive while it may read them."""
  name = gen.acc(acc_ref)
  gen.emit(f"{name}, _, _ = hopper.warpgroup_mma_wait(1, deps=[{name}, {deps}])")
  gen.issued_wait = IssuedWait(gen.lines, len(gen.lines) - 1, gen.depth, acc_ref, deps)
  gen.events.append(MmaWait(1, (gen.accs.index(acc_ref),)))
  if acc_ref not in gen.pending_accs:
    gen.pending_accs.append(acc_ref)


def _waits_just_issued(gen, waited: list) -> bool:
  """Whether the wgmma's own wait (``wgmma_issued``) is the last statement before this one, in
  the same block, with only comments and pure bindings since (no loop or branch boundary):
  then that wait becomes the full one."""
  w = gen.issued_wait
  if w is None or w.lines is not gen.lines or w.depth != gen.depth or waited != [w.acc]:
    return False
  return all(isinstance(line, Binding) or line.lstrip().startswith("#")
             for line in gen.lines[w.index + 1:])


def wait_all(gen, accs):
  """Waits for every wgmma into ``accs`` that may be in flight (reading an accumulator, or
  wgmma_wait(0)): one wait for them all; an accumulator no wgmma wrote since its last wait
  needs none (``gen.pending_accs``, followed along loops and branches by ``mma.py``). Right
  after the wgmma's own wait, that wait waits for all instead."""
  waited = [acc for acc in accs if acc in gen.pending_accs]
  if not waited:
    return
  k = tuple(gen.accs.index(acc) for acc in waited)
  if _waits_just_issued(gen, waited):
    w = gen.issued_wait
    name = gen.acc(w.acc)
    gen.lines[w.index] = ("    " * w.depth
                          + f"{name}, _, _ = hopper.warpgroup_mma_wait(0, deps=[{name}, {w.deps}])")
    last = max(i for i, e in enumerate(gen.events) if isinstance(e, MmaWait))
    gen.events[last] = MmaWait(0, k)
  else:
    names = ", ".join(gen.acc(acc) for acc in waited)
    gen.emit_scalar(f"{names} = hopper.warpgroup_mma_wait(0, deps=[{names}])")
    gen.events.append(MmaWait(0, k))
  gen.issued_wait = None
  gen.pending_accs = [acc for acc in gen.pending_accs if acc not in waited]

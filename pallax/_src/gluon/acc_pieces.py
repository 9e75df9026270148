"""wgmma accumulators held as column pieces.

Also an accumulator that wgmmas write through column views (``acc.at[:, :128]``) is held as
pieces that make up each view (``for_views``).

An accumulator whose width N is not a power of two but a multiple of 64 (JAX's 192-wide tiles)
is kept as accumulators of the powers of two summing to N, widest first (192: 128 + 64), each
written by its own wgmma over the matching columns of ``b``. Padded to the next power of two, a
128 x 192 float32 accumulator of one warpgroup would take 256 registers a thread and ptxas would
spill it (JAX's ragged dot with 192-wide tiles ran 8x slower than under Mosaic GPU); in pieces
it takes 192. Where the kernel reads the accumulator whole, the pieces are joined in registers
into the padded tile, and a store into it is split back: the wgmma layouts of any width place a
row on the same lanes and warps, so no data moves between threads (a probe compiled the joins
with no shared memory).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from pallax._src import jax_internals as ji
from pallax._src.gluon import layouts as L
from pallax._src.mosaic_gpu import primitives as mp


def widths(n: int) -> tuple[int, ...]:
  """The widths of the pieces of an accumulator ``n`` wide: () where it is one piece (a power of
  two, or not a multiple of 64, which stays padded)."""
  if L.is_pow2(n) or n % 64:
    return ()
  return tuple(1 << b for b in range(n.bit_length() - 1, -1, -1) if n >> b & 1)


MIN_WIDTH = 8   # wgmma's narrowest N


def for_views(n: int, views) -> tuple[int, ...] | None:
  """The pieces of an accumulator ``n`` wide that wgmmas write through column views ``views``
  ((first column, width) each: ``plgpu.wgmma(acc.at[:, 128:], ...)``): each view made of whole
  pieces, every piece a power of two at a multiple of its width (the largest that fits, from the
  left); None where that needs a piece narrower than a wgmma. Without views, ``widths(n)``."""
  if not views:
    return widths(n)
  cuts = sorted({0, n} | {o for o, _ in views} | {o + w for o, w in views})
  pieces = []
  for start, end in zip(cuts, cuts[1:]):
    p = start
    while p < end:
      w = 1 << (end - p).bit_length() - 1
      while p % w:
        w //= 2
      if w < MIN_WIDTH:
        return None
      pieces.append(w)
      p += w
  return () if len(pieces) == 1 else tuple(pieces)


def column_view(transforms, shape) -> tuple[int, int] | None:
  """(first column, width) of an accumulator view that takes whole rows and static columns
  (``acc.at[:, 64:192]``); None for any other view."""
  if len(transforms) != 1 or not isinstance(transforms[0], ji.NDIndexer):
    return None
  rows, cols = (tuple(transforms[0].indices) + (None, None))[:2]
  start = lambda i: _static(getattr(i, "start", None))
  if len(transforms[0].indices) != 2 or not isinstance(rows, ji.Slice) or not isinstance(cols, ji.Slice) \
      or (start(rows), rows.size) != (0, shape[0]) or start(cols) is None or cols.stride != 1:
    return None
  return start(cols), cols.size


def _static(i) -> int | None:
  """A literal of the jaxpr, of the generated code, or an int, as an int (None otherwise)."""
  i = getattr(i, "val", getattr(i, "value", i))
  return int(i) if isinstance(i, (int, np.integer)) and not isinstance(i, bool) else None


def wgmmas_into(jaxpr, var) -> list:
  """The wgmma equations of ``jaxpr`` (its own, not those of loops or branches in it) that
  accumulate into ``var``."""
  return [e for e in jaxpr.eqns if e.primitive is mp.wgmma_p and e.invars[0] is var]


def views_in(jaxpr, var, shape) -> list[tuple[int, int]] | None:
  """The column views (``column_view``) through which the wgmmas of ``jaxpr`` write the
  accumulator ``var``; None where one writes it through another view."""
  views = []
  for e in wgmmas_into(jaxpr, var):
    (acc, _, _), _ = mp.split_refs(e.invars, e.params["trees"])
    if acc[1]:
      view = column_view(acc[1], shape)
      if view is None:
        return None
      views.append(view)
  return views


def within(pieces, start: int, width: int) -> list[int] | None:
  """The indices of the pieces that make up columns [start, start + width), or None where they
  do not exactly."""
  found = [k for k, (o, w) in enumerate(offsets(pieces)) if start <= o and o + w <= start + width]
  return found if sum(pieces[k] for k in found) == width else None


def offsets(pieces) -> list[tuple[int, int]]:
  """(first column, width) of each piece."""
  out, o = [], 0
  for w in pieces:
    out.append((o, w))
    o += w
  return out


def names(name: str, pieces) -> list[str]:
  return [f"{name}_c{o}" for o, _ in offsets(pieces)]


def piece_layout(layout: L.Wgmma, width: int) -> L.Wgmma:
  return dataclasses.replace(layout, n=width)


def join(gen, ref) -> str:
  """An expression of the accumulator ``ref`` whole: its pieces joined into the padded tile, in
  the accumulator's layout, pairwise (a piece beside its neighbour of the same width, or beside
  zeros where the padding is). Statements making the intermediate tiles are written first."""
  rows = ref.shape[0]
  at = {o: (name, w) for (o, w), name in zip(offsets(ref.pieces), names(ref.name, ref.pieces))}

  def tile(start: int, width: int) -> str | None:
    if at.get(start, (None, 0))[1] == width:
      return at[start][0]
    if start >= ref.shape[1]:
      return None   # padding
    lo, hi = tile(start, width // 2), tile(start + width // 2, width // 2)
    cur = gen.fresh("acc_join")
    gen.emit_scalar(f"{cur} = gl.convert_layout(gl.join({lo}, {hi or f'gl.zeros_like({lo})'})"
                    f".permute(0, 2, 1).reshape([{rows}, {width}]), "
                    f"{gen.layout(piece_layout(ref.layout, width))})")
    return cur

  return tile(0, L.pow2(ref.shape[1]))


def split(gen, ref, text: str) -> None:
  """Assigns the padded tile ``text`` (in the accumulator's layout) to ``ref``'s pieces: each half
  split off in registers until a piece is reached."""
  rows, mine = ref.shape[0], dict(zip((o for o, _ in offsets(ref.pieces)), names(ref.name, ref.pieces)))
  widths_at = dict(offsets(ref.pieces))

  def take(value: str, start: int, width: int):
    if widths_at.get(start) == width:
      gen.emit_scalar(f"{mine[start]} = {value}")
      return
    half = width // 2
    lo, hi = gen.fresh("acc_lo"), gen.fresh("acc_hi")
    layout = gen.layout(piece_layout(ref.layout, half))
    gen.emit_scalar(f"{lo}, {hi} = {value}.reshape([{rows}, 2, {half}]).permute(0, 2, 1).split()")
    gen.emit_scalar(f"{lo} = gl.convert_layout({lo}, {layout})")
    take(lo, start, half)
    if any(start + half <= o < start + width for o in mine):
      gen.emit_scalar(f"{hi} = gl.convert_layout({hi}, {layout})")
      take(hi, start + half, half)

  take(text, 0, L.pow2(ref.shape[1]))


def whole(gen, ref) -> str:
  """The text of accumulator ``ref``'s value whole (its pieces joined first)."""
  names_text = gen.acc(ref)
  return join(gen, ref) if ref.pieces else names_text


def assign(gen, ref, text: str) -> None:
  """``ref`` = the tile ``text`` (in the accumulator's layout; split into its pieces)."""
  names_text = gen.acc(ref)
  if ref.pieces:
    split(gen, ref, text)
  else:
    gen.emit_scalar(f"{names_text} = {text}")

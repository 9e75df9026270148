"""wgmma accumulators held as column pieces.

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

from pallax._src.gluon import layouts as L


def widths(n: int) -> tuple[int, ...]:
  """The widths of the pieces of an accumulator ``n`` wide: () where it is one piece (a power of
  two, or not a multiple of 64, which stays padded)."""
  if L.is_pow2(n) or n % 64:
    return ()
  return tuple(1 << b for b in range(n.bit_length() - 1, -1, -1) if n >> b & 1)


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
  the accumulator's layout. Statements making the intermediate halves are written first."""
  rows = ref.shape[0]
  parts = list(zip(names(ref.name, ref.pieces), ref.pieces))
  cur, width = parts.pop()
  while parts or width < L.pow2(ref.shape[1]):
    if parts and parts[-1][1] == width:
      lo, _ = parts.pop()
      hi = cur
    else:   # padding: zeros beside it
      lo, hi = cur, f"gl.zeros_like({cur})"
    cur = gen.fresh("acc_join")
    width *= 2
    gen.emit_scalar(f"{cur} = gl.convert_layout(gl.join({lo}, {hi}).permute(0, 2, 1)"
                    f".reshape([{rows}, {width}]), {gen.layout(piece_layout(ref.layout, width))})")
  return cur


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

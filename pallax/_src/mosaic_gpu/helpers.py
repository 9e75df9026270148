"""Library code over the primitives: ``nd_loop``, ``planar_snake``, ``find_swizzle``."""
from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
from jax import lax


@dataclasses.dataclass(frozen=True, eq=False)
class NDLoopInfo:
  """One step of ``nd_loop``: the grid index, this thread's step number and its step count."""
  index: tuple
  local_index: Any
  num_local_steps: Any


def _unravel(step, dims):
  index = []
  for d in reversed(dims):
    d = lax.convert_element_type(d, step.dtype)
    index.append(lax.rem(step, d))
    step = lax.div(step, d)
  return index[::-1]


def nd_loop(grid, *, collective_axes, tiling=None, init_carry=None):
  """Loops over ``grid`` (row-major), its steps dealt out round-robin along ``collective_axes``:
  the program at position p of those axes runs steps p, p + size, p + 2 size, ... The body takes
  an ``NDLoopInfo`` (and ``carry=`` when ``init_carry`` is given). ``tiling`` visits the grid
  tile by tile (each tile row-major)."""
  me = lax.axis_index(collective_axes)
  size = lax.axis_size(collective_axes)
  dims = tuple(grid)
  if tiling:
    if len(tiling) != len(dims):
      raise ValueError(f"nd_loop: tiling={tuple(tiling)} and grid={dims} must have the same length")
    if any(isinstance(d, int) and d % t for d, t in zip(dims, tiling)):
      raise ValueError(f"nd_loop: tiling {tuple(tiling)} does not divide the grid {dims}")
    dims = tuple(d // t for d, t in zip(dims, tiling)) + tuple(tiling)
  total = jnp.asarray(1, me.dtype)
  for d in dims:
    total = total * lax.convert_element_type(d, me.dtype)
  steps = lax.div(total, jnp.asarray(size, me.dtype)) + (me < lax.rem(total, jnp.asarray(size, me.dtype))).astype(me.dtype)

  def decorator(body):
    def step_fn(k, carry):
      index = _unravel(k * size + me, dims)
      if tiling:
        n = len(tiling)
        index = [sub + tile * t for tile, sub, t in zip(index[:n], index[n:], tiling)]
      info = NDLoopInfo(tuple(index), k, steps)
      if init_carry is None:
        body(info)
        return carry
      return body(info, carry=carry)
    return lax.fori_loop(0, steps, step_fn, init_carry)
  return decorator


def find_swizzle(minor_dim_bits: int, what: str = "") -> int:
  """The largest swizzle (128, 64, 32 or 16 bytes) that divides a row of ``minor_dim_bits`` bits."""
  for swizzle in (128, 64, 32, 16):
    if minor_dim_bits % (swizzle * 8) == 0:
      return swizzle
  what = f" for {what}" if what else ""
  raise ValueError(f"No valid out swizzle{what}: minor dimension has {minor_dim_bits} bits, which "
                   "is not a multiple of 128 (16 bytes)")


def planar_snake(lin_idx, shape, minor_dim: int, tile_width: int):
  """The ``lin_idx``-th position of a walk over a 2-D ``shape`` that keeps neighbours close: the
  minor dimension is cut into tiles ``tile_width`` wide; each tile is walked minor-fastest, and
  every other tile walks the major dimension backwards, so consecutive tiles meet at an edge."""
  i32 = lambda x: jnp.asarray(x, jnp.int32)
  lin = i32(lin_idx)
  major_size, minor_size, width = i32(shape[1 - minor_dim]), i32(shape[minor_dim]), i32(tile_width)
  tile_size = width * major_size
  full_tiles = lax.div(minor_size, width)
  in_full = lin < full_tiles * tile_size
  tile = jnp.where(in_full, lax.div(lin, tile_size), full_tiles)
  this_width = jnp.where(in_full, width, jnp.maximum(lax.rem(minor_size, width), 1))
  within = lin - tile * tile_size
  major, minor_in_tile = lax.div(within, this_width), lax.rem(within, this_width)
  major = jnp.where(lax.rem(tile, 2) == 0, major, major_size - 1 - major)
  minor = tile * width + minor_in_tile
  return (minor, major) if minor_dim == 0 else (major, minor)

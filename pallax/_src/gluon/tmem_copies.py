"""``plgpu.async_copy_smem_to_tmem`` for sm_100a: an SMEM view copied into a TMEM view; and
``plgpu.async_copy_scales_to_tmem``: MMA scales into their TMEM buffer.

Written as a register round trip, ``tmem.store(smem.load(layout))`` in TMEM's own register
layout, not as Gluon 3.6's ``blackwell.tcgen05_copy``: that one takes 32-bit elements only,
and its docstring calls its semantics not well defined yet; a register round trip is exact for
every element type and layout. It is also synchronous (the store is awaited,
``tcgen05.wait::st``), which is stronger than plgpu's promise: an MMA of this thread may use
the TMEM at once, anything else after ``tcgen05_commit_arrive`` and a wait, as before.
"""
from __future__ import annotations

import numpy as np

from pallax._src.gluon.assign import Smem, layout_rule
from pallax._src.gluon import layouts as L
from pallax._src.gluon.blackwell import TmemRef, TmemRegisters, TmemScales, tmem_registers, tmem_view
from pallax._src.gluon.events import Access
from pallax._src.gluon.memory import register_view, register_view_layouts, smem_view_layouts
from pallax._src.gluon.writer import SmemRef, rule
from pallax._src.gpu import expr as ex
from pallax._src.gpu.expr import call, method
from pallax._src.mosaic_gpu import primitives as mp
from pallax._src.mosaic_gpu import tcgen05 as tc

WRITTEN = (tc.async_copy_smem_to_tmem_p,)


@rule(tc.async_copy_smem_to_tmem_p)
def _copy_smem_to_tmem(ctx, *invals, trees, what, collective_axis):
  gen = ctx.gen
  (src, dst), _ = mp.split_refs(invals, trees)
  if not isinstance(src[0], SmemRef) or not isinstance(dst[0], TmemRef):
    gen.unsupported(f"plgpu.{what} from {type(src[0]).__name__} to {type(dst[0]).__name__}")
  if collective_axis is not None:
    gen.unsupported(f"plgpu.{what}(collective_axis={collective_axis!r}) for sm_100a (Gluon 3.6 "
                    "has no copies over a cluster's pair of blocks; the interpreter runs it)")
  if what == "async_copy_sparse_metadata_to_tmem":
    gen.unsupported(f"plgpu.{what} for sm_100a (Gluon 3.6 has no sparse MMA; the interpreter "
                    "runs it)")
  if what == "async_copy_scales_to_tmem":
    return _copy_scales(gen, src, dst)
  text, shape = tmem_view(gen, *dst)
  view = register_view(gen, *src)
  regs = tmem_registers(gen, dst[0], shape)
  gen.events.append(Access("load", gen.smem_view(view), view.shape))
  smem = ex.Name(view.text, dtype=view.dtype, shape=view.shape)
  value = gen.value(method(smem, "load", ex.Token(gen.layout(regs))), regs, "copied")
  gen.emit(f"{text}.store({gen.render(value)})")
  return []


@layout_rule(tc.async_copy_smem_to_tmem_p)
def _copy_smem_to_tmem_layouts(ctx, *invals, trees, what, collective_axis):
  (src, _), _ = mp.split_refs(invals, trees)
  if not isinstance(src[0], Smem):
    return None
  if what == "async_copy_scales_to_tmem" and reads_rows(smem_view_layouts(*src)):
    return None   # read as rows of 16 bytes (``_tile_rows``): no layout of the view's rank
  register_view_layouts(*src)
  return None


def reads_rows(view) -> bool:
  """Whether scale tiles are read through a view of their rows (``_tile_rows``): a rank-4 view
  that is part of a buffer (a pipeline's slot), whose layout has a lower rank (a buffer of rank
  > 3 is stored with its leading dimensions flattened), not the whole buffer (a reshape)."""
  return len(view.shape) == 4 and not view.whole and not view.reshaped


def _copy_scales(gen, src, dst) -> list:
  """MMA scales into their TMEM buffer (``TensorMemoryScalesLayout``), from SMEM of the same
  (rows, k) shape or in the tensor core's tiles (``tc.scales_tiles``: per 128 rows and 4
  scales of K a (32, 16) tile, row r and scale c at [r % 32, (r // 32) * 4 + c % 4]), which
  are untiled in registers (``tc.untile_scales``'s reshape, permute and reshape)."""
  ref = dst[0]
  if not isinstance(ref.layout, TmemScales) or dst[1]:
    gen.unsupported("plgpu.async_copy_scales_to_tmem into TMEM other than a whole buffer of "
                    "TMEMLayout.SCALES_LAYOUT for sm_100a")
  view = register_view(gen, *src)
  shape, tiles = tuple(ref.shape), tc.scales_tiles(ref.shape)
  if tuple(view.shape) not in (shape, tiles):
    gen.unsupported(f"plgpu.async_copy_scales_to_tmem from SMEM of shape {list(view.shape)} "
                    f"into {list(shape)} for sm_100a")
  regs = gen.declared(TmemRegisters(ex.dtype_name(ref.dtype, "gl"), shape, TmemScales()))
  gen.events.append(Access("load", gen.smem_view(view), view.shape))
  smem = ex.Name(view.text, dtype=view.dtype, shape=view.shape)
  if tuple(view.shape) == shape:
    value = gen.value(method(smem, "load", ex.Token(gen.layout(regs))), regs, "scales")
  else:
    value = _untiled(gen, _tile_rows(gen, view) if reads_rows(view) else smem, tiles, shape,
                     regs)
  gen.emit(f"{ref.name}.store({gen.render(value)})")
  return []


def _tile_rows(gen, view: SmemRef):
  """Scale tiles ``view`` (a rank-4 view) seen as their rows of 16 bytes, one after another: the
  same bytes in an unswizzled layout of rank 2, as in the buffer's unswizzled layout of any rank
  (an NVMMA layout without swizzle keeps 16-byte rows in order, leading dimensions outermost)."""
  rows = (int(np.prod(view.shape[:-1])), view.shape[-1])
  if view.buffer.layout.swizzle or view.shape[-1] * view.dtype.itemsize != 16:
    gen.unsupported(f"plgpu.async_copy_scales_to_tmem from swizzled SMEM tiles of shape "
                    f"{list(view.shape)} for sm_100a")
  layout = gen.layout(L.shared(rows, view.dtype))
  text = f"{view.text}._reinterpret({ex.dtype_name(view.dtype, 'gl')}, {list(rows)}, {layout})"
  return ex.Name(text, dtype=view.dtype, shape=rows)


def _untiled(gen, smem, tiles, shape, regs):
  """The (rows, k) scales of SMEM tiles ``smem`` of shape ``tiles`` (or of their rows:
  ``_tile_rows``), in the register layout ``regs``."""
  dtype, (blocks, chunks, _, _) = smem.dtype, tiles
  tiled = gen.value(method(smem, "load", ex.Token(gen.layout(gen.declared(
      L.blocked(smem.shape, dtype))))), gen.declared(L.blocked(smem.shape, dtype)), "scale_tiles")
  split = [blocks, chunks, 32, 4, 4]   # (row block, chunk of 4 scales, row % 32, row // 32 % 4, scale % 4)
  x = gen.bind(method(tiled, "reshape", ex.Token(str(split)), dtype=dtype, shape=tuple(split)),
               "scale_tiles")
  order = (0, 3, 2, 1, 4)
  x = gen.bind(method(x, "permute", ex.Token(str(order)), dtype=dtype,
                      shape=tuple(split[d] for d in order)), "scale_tiles")
  x = gen.bind(method(x, "reshape", ex.Token(str(list(shape))), dtype=dtype, shape=shape),
               "scale_rows")
  return gen.value(call("gl.convert_layout", x, ex.Token(gen.layout(regs)), dtype=dtype,
                        shape=shape), regs, "scales")

"""``plgpu.async_copy_smem_to_tmem`` for sm_100a: an SMEM view copied into a TMEM view.

Written as a register round trip, ``tmem.store(smem.load(layout))`` in TMEM's own register
layout, not as Gluon 3.6's ``blackwell.tcgen05_copy``: that one takes 32-bit elements only,
and its docstring calls its semantics not well defined yet; a register round trip is exact for
every element type and layout. It is also synchronous (the store is awaited,
``tcgen05.wait::st``), which is stronger than plgpu's promise: an MMA of this thread may use
the TMEM at once, anything else after ``tcgen05_commit_arrive`` and a wait, as before.
"""
from __future__ import annotations

from pallax._src.gluon.assign import Smem, layout_rule
from pallax._src.gluon.blackwell import TmemRef, tmem_registers, tmem_view
from pallax._src.gluon.events import Access
from pallax._src.gluon.memory import register_view, register_view_layouts
from pallax._src.gluon.writer import SmemRef, rule
from pallax._src.gpu import expr as ex
from pallax._src.gpu.expr import method
from pallax._src.mosaic_gpu import primitives as mp
from pallax._src.mosaic_gpu import tcgen05 as tc

WRITTEN = (tc.async_copy_smem_to_tmem_p,)


@rule(tc.async_copy_smem_to_tmem_p)
def _copy_smem_to_tmem(ctx, *invals, trees, what, collective_axis):
  gen = ctx.gen
  (src, dst), _ = mp.split_refs(invals, trees)
  if not isinstance(src[0], SmemRef) or not isinstance(dst[0], TmemRef):
    gen.unsupported(f"plgpu.{what} from {type(src[0]).__name__} to {type(dst[0]).__name__}")
  if what == "async_copy_scales_to_tmem":   # (their TMEM and MMAs are refused before this)
    gen.unsupported(f"plgpu.{what} (MMA scales) for sm_100a")
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
  if isinstance(src[0], Smem):
    register_view_layouts(*src)
  return None

"""Gluon rule of ``plgpu.mma`` (Ampere's ``mma.sync``, which Hopper runs too): Gluon's
``mma_v2``, with the accumulator in the version-2 NVMMA layout and the operands in its dot
operand layouts (converted to them where they were computed in others)."""
from __future__ import annotations

import dataclasses

import numpy as np

from pallax._src.gluon import layouts as L
from pallax._src.gluon.assign import Val, layout_rule
from pallax._src.gluon.values import to_layout
from pallax._src.gluon.writer import rule
from pallax._src.gpu.expr import call
from pallax._src.mosaic_gpu.mma import mma_p


@dataclasses.dataclass(frozen=True)
class MmaV2(L.Layout):
  """The accumulator layout of ``mma.sync`` (16x8 tiles, the 4 warps along the rows)."""

  def text(self, name) -> str:
    return (f"gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[{L.WARPS}, 1], "
            "instr_shape=[16, 8])")


@dataclasses.dataclass(frozen=True)
class MmaOperand(L.Layout):
  """The layout ``mma.sync`` reads operand ``index`` (0: a, 1: b) in."""
  index: int
  parent: L.Layout
  k_width: int

  def text(self, name) -> str:
    return (f"gl.DotOperandLayout(operand_index={self.index}, parent={name(self.parent)}, "
            f"k_width={self.k_width})")


_SUPPORTED = ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int8", "float32")


def _layouts(a_dtype):
  bits = np.dtype(a_dtype).itemsize * 8
  acc = MmaV2()
  k_width = max(1, 32 // bits)
  return acc, MmaOperand(0, acc, k_width), MmaOperand(1, acc, k_width)


@rule(mma_p)
def _mma(ctx, acc, a, b):
  gen = ctx.gen
  if np.dtype(a.dtype).name not in _SUPPORTED:
    gen.unsupported(f"plgpu.mma of {np.dtype(a.dtype).name} operands (Gluon's mma_v2 takes "
                    f"{', '.join(_SUPPORTED)})")
  acc_l, a_l, b_l = _layouts(a.dtype)
  gen.declared(acc_l)   # before the operand layouts, whose text names it
  acc = to_layout(gen, acc, gen.declared(acc_l), acc.shape, acc.dtype)
  a = to_layout(gen, a, gen.declared(a_l), a.shape, a.dtype)
  b = to_layout(gen, b, gen.declared(b_l), b.shape, b.dtype)
  return gen.value(call("gl.nvidia.ampere.mma_v2", a, b, acc, dtype=acc.dtype, shape=acc.shape),
                   acc_l, "mma")


@layout_rule(mma_p)
def _mma_layouts(ctx, acc, a, b):
  acc_l, a_l, b_l = _layouts(a.dtype)
  for v, layout in ((acc, acc_l), (a, a_l), (b, b_l)):   # as the writer converts them
    ctx.a.to_layout(v, layout, v.shape, v.dtype)
  return Val(tuple(acc.shape), np.dtype(acc.dtype), acc_l)

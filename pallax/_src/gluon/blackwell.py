"""Gluon rules of Blackwell's tensor cores for sm_100a (``plgpu.lower(...,
compute_capability=100)``): TMEM scratch, ``tcgen05_mma`` with SMEM operands (block-scaled:
``tcgen05_mma_scaled``, float8 operands with e8m0 scales), its barrier and
``tcgen05_commit_arrive``, ``async_load_tmem`` and its wait. Compiled on any machine; never run
on Blackwell hardware here. What is not written yet (collective MMAs, float4 operands, dynamic
TMEM slices not proven aligned) is refused by name (``codegen._refuse_blackwell``,
``unsupported``).

The model is Gluon's: ``blackwell.tcgen05_mma(a, b, acc, use_acc=..., mbarriers=[bar])`` arrives
on ``bar`` when the MMA completes (as ``plgpu.tcgen05_mma(..., barrier)`` does); without a
barrier Gluon waits for the MMA, which keeps plgpu's meaning (its completion is then awaited
by the next ``tcgen05_commit_arrive``'s wait). A TMEM load waits for its data, so
``wait_load_tmem`` writes nothing.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from pallax._src import jax_internals as ji
from pallax._src.gluon import layouts as L
from pallax._src.gluon import scales
from pallax._src.gluon.assign import Smem, Val, layout_rule
from pallax._src.gluon.copies import barrier_name
from pallax._src.gluon.events import BarrierOp
from pallax._src.gluon.multiples import known_multiple
from pallax._src.gluon.memory import barrier_view, smem_view, smem_view_layouts
from pallax._src.gluon.values import slice_layout, to_layout
from pallax._src.gluon.writer import SmemRef, rule
from pallax._src.gpu import expr as ex
from pallax._src.gpu.source import Unsupported
from pallax._src.gpu.expr import call, method
from pallax._src.mosaic_gpu import core as mc
from pallax._src.mosaic_gpu import primitives as mp
from pallax._src.mosaic_gpu import tcgen05 as tc

HEADER = "from triton.experimental.gluon.language.nvidia import blackwell\n"
WRITTEN = (tc.tcgen05_mma_p, tc.tcgen05_commit_arrive_p, tc.async_load_tmem_p, tc.wait_load_tmem_p,
           tc.async_store_tmem_p, tc.commit_tmem_p)


@dataclasses.dataclass(frozen=True)
class TmemLayout(L.Layout):
  """How a TMEM buffer is laid out: (rows, columns) blocks, one element a 32-bit column
  (``col_stride`` 1) or packed."""
  block: tuple
  col_stride: int
  registers = False

  def text(self, name) -> str:
    return f"blackwell.TensorMemoryLayout(block={self.block}, col_stride={self.col_stride})"


@dataclasses.dataclass(frozen=True)
class TmemScales(L.Layout):
  """The TMEM layout of MMA scales (``plgpu.TMEMLayout.SCALES_LAYOUT``): (rows, k) bytes as
  the tensor core reads them, which Gluon places itself."""
  registers = False

  def text(self, name) -> str:
    return "blackwell.TensorMemoryScalesLayout()"


@dataclasses.dataclass(frozen=True)
class TmemRegisters(L.Layout):
  """The register layout TMEM loads of a (rows, columns) view come in (one row a thread)."""
  dtype: str
  shape: tuple
  tmem: TmemLayout

  def text(self, name) -> str:
    return (f"blackwell.get_tmem_reg_layout({self.dtype}, {self.shape}, {name(self.tmem)}, "
            f"{L.WARPS})")


@dataclasses.dataclass
class TmemRef:
  name: str
  shape: tuple
  dtype: np.dtype
  layout: TmemLayout


def allocate_tmem(gen, kind, aval) -> TmemRef:
  """A TMEM scratch buffer (2-D, 128 or 64 rows: the M of one-block MMAs)."""
  shape, dtype = tuple(aval.shape), np.dtype(aval.dtype)
  if kind.collective:
    _refuse_collective(gen, "collective TMEM (plgpu.TMEM(..., collective=True))")
  if kind.layout is not None:
    return _allocate_scales(gen, kind, shape, dtype)
  if len(shape) != 2 or shape[0] not in (64, 128) or not L.is_pow2(shape[1]):
    _refuse(gen, f"TMEM of shape {list(shape)} for sm_100a (128 or 64 rows, a power-of-two "
                    "number of columns)")
  layout = TmemLayout((shape[0], min(shape[1], 256)),
                      1 if kind.packing > 1 else 32 // (dtype.itemsize * 8))
  return _allocated(gen, "tmem", shape, dtype, layout)


def _allocated(gen, hint: str, shape, dtype, layout) -> TmemRef:
  """A new TMEM allocation of ``shape`` in ``layout``."""
  gen.blackwell = True
  name = gen.fresh(hint)
  gen.declared(layout)
  gen.emit_scalar(f"{name} = blackwell.allocate_tensor_memory({ex.dtype_name(dtype, 'gl')}, "
                  f"{list(shape)}, {gen.layout(layout)})")
  return TmemRef(name, shape, dtype, layout)


def _allocate_scales(gen, kind, shape, dtype) -> TmemRef:
  """TMEM for MMA scales: float8_e8m0fnu (held as bytes, ``scales.py``), (rows, k) with rows a
  multiple of 128."""
  if getattr(kind.layout, "layout_cls", kind.layout) is not mc.TMEMLayout.SCALES_LAYOUT:
    _refuse(gen, f"TMEM with layout {kind.layout} (sparsity metadata or two-block layouts) "
                 "for sm_100a")
  if not scales.is_bits(dtype) or len(shape) != 2 or shape[0] % 128:
    _refuse(gen, f"MMA scales in TMEM of type {dtype.name}{list(shape)} for sm_100a (Gluon "
                 "3.6 scales fp8 operands by float8_e8m0fnu scales, (rows, k) with rows a "
                 "multiple of 128)")
  return _allocated(gen, "scales_tmem", shape, dtype, TmemScales())


def _refuse_collective(gen, what: str):
  """Two-block (``cta_group::2``) MMAs need both blocks of a cluster pair to share barriers and
  operands; pallax's Gluon backend runs a cluster's blocks as independent ones (``clusters.py``),
  and Gluon 3.6 has no cluster ranks or cluster barriers to write them with."""
  _refuse(gen, f"{what}: collective (two-block) MMAs over a cluster for sm_100a")


def _refuse(gen, what: str):
  """``gen.unsupported``, naming the kernel itself: TMEM is allocated outside the rules (which
  add the kernel's name and the way out to what they refuse)."""
  raise Unsupported(f"pallas_call {gen.kernel_name}: {what}: not supported by pallax's Gluon "
                    "backend; run the kernel in the interpreter (interpret=True)")


def tmem_view(gen, ref, transforms) -> tuple[str, tuple]:
  """(the source of a TMEM view, its shape): whole rows, static column slices."""
  if not isinstance(ref, TmemRef):
    gen.unsupported(f"a TMEM operation on {type(ref).__name__}")
  if isinstance(ref.layout, TmemScales):
    gen.unsupported("TMEM loads, stores and views of MMA scales (TMEMLayout.SCALES_LAYOUT) for "
                    "sm_100a (written: plgpu.async_copy_scales_to_tmem into a whole buffer)")
  text, shape = ref.name, ref.shape
  for t in transforms:
    if not isinstance(t, ji.NDIndexer) or len(t.indices) != 2:
      gen.unsupported("TMEM views other than column slices")
    rows, cols = t.indices
    static = lambda i: isinstance(i, (int, np.integer)) or isinstance(i, ex.Lit)   # noqa: E731
    value = lambda i: i.value if isinstance(i, ex.Lit) else int(i)   # noqa: E731
    if not (isinstance(rows, ji.Slice) and static(rows.start) and value(rows.start) == 0
            and rows.size == shape[0]):
      gen.unsupported("TMEM views of some of its rows")
    if not (isinstance(cols, ji.Slice) and cols.stride == 1):
      gen.unsupported("TMEM views other than column slices")
    if static(cols.start):
      text = f"{text}.slice({value(cols.start)}, {cols.size})"
    else:
      text = _chunk(gen, ref, text, shape, cols.start, cols.size)
    shape = (shape[0], cols.size)
  return text, shape


def _chunk(gen, ref, text, shape, start, size) -> str:
  """Columns [start, start + size) from a run-time start, as Gluon writes them (its slices
  take constant starts): the buffer viewed as equal chunks of ``size`` columns, side by side
  as a 3-D TMEM buffer's are, and the chunk ``start // size`` of them. Exact where ``start``
  is a multiple of ``size`` (``pl.ds(slot * n, n)``), which must be proven
  (``multiples.py``)."""
  if text != ref.name or shape[1] % size or not L.is_pow2(size) or (
      known_multiple(start, gen.multiples) % size):
    gen.unsupported(f"TMEM column slices of size {size} from a run-time start not known to be "
                    f"a multiple of {size} for sm_100a (slices pl.ds(i * {size}, {size}) of the "
                    "whole buffer are written)")
  block = (shape[0], min(ref.layout.block[1], size))
  layout = gen.declared(dataclasses.replace(ref.layout, block=block))
  chunks = f"[{shape[1] // size}, {shape[0]}, {size}]"
  view = gen.fresh(f"{ref.name}_chunk")
  gen.emit_scalar(f"{view} = {ref.name}._reinterpret({ex.dtype_name(ref.dtype, 'gl')}, {chunks}, "
           f"{gen.layout(layout)}).index({gen.render(start)} // {size})")
  return view


def _transposed(ref) -> bool:
  return any(isinstance(t, ji.TransposeRef) for t in ref[1])


def _arrival(gen, bar) -> str:
  """The barrier the tensor core arrives on once its work completes; recorded as an arrival
  (the order of ``warp_map`` bodies depends on it: warps.py)."""
  b = barrier_view(gen, *bar)
  gen.events.append(BarrierOp("arrive", barrier_name(b)))
  return f"{b.name}.index({gen.render(b.index)})"


@rule(tc.tcgen05_mma_p)
def _tcgen05_mma(ctx, *invals, trees, collective_axis, scaled, sparse=False):
  gen = ctx.gen
  (acc, a, b, bar, a_scale, b_scale, _), (accumulate,) = mp.split_refs(invals, trees)
  if sparse:
    gen.unsupported("sparse tcgen05_mma (a_sparse_metadata=...) for sm_100a (Gluon 3.6 has no "
                    "sparse MMA; the interpreter runs it)")
  if collective_axis is not None:
    _refuse_collective(gen, f"tcgen05_mma(collective_axis={collective_axis!r})")
  _refuse_operands(gen, acc[0], a, b)
  packed = [getattr(r[0], "packed", None) for r in (a, b)]
  if not scaled and any(p is not None for p in packed):
    gen.unsupported(f"tcgen05_mma of {next(p for p in packed if p is not None).name} operands "
                    "without scales for sm_100a (Gluon 3.6 multiplies float4 in block-scaled "
                    "MMAs only: pass a_scale= and b_scale=)")
  scaling = _scaling(gen, ctx.eqn, trees, a, a_scale, b_scale) if scaled else ""
  acc_text, _ = tmem_view(gen, *acc)
  a_text = _tmem_operand(gen, a) if isinstance(a[0], TmemRef) else smem_view(
      gen, *a, k_last=not _transposed(a)).text
  b_view = smem_view(gen, *b, k_last=_transposed(b))
  barriers = "" if bar is None else f", mbarriers=[{_arrival(gen, bar)}]"
  mma = "tcgen05_mma_scaled" if scaled else "tcgen05_mma"
  gen.emit(f"blackwell.{mma}({a_text}, {b_view.text}, {acc_text}{scaling}, "
           f"use_acc={gen.render(accumulate)}{barriers})")
  return []


# Gluon's names of the operand types its block-scaled MMA takes with e8m0 scales, one scale per
# 32 elements of K: float8 (``kind::mxf8f6f4``, ``scale_vec::1X``) and float4, both operands,
# held packed two a byte in SMEM (``kind::mxf4``, ``scale_vec::2X``; Gluon 3.6 writes no other
# scale vector, so float4 blocks of 16 are not written).
_SCALED_FORMATS = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2", "float4_e2m1fn": "e2m1"}
_SCALE_BLOCK = 32


def _scaling(gen, eqn, trees, a, a_scale, b_scale) -> str:
  """The scale arguments of ``tcgen05_mma_scaled`` (``, a_scale, b_scale, "e4m3", "e5m2"``)
  where Gluon 3.6's block-scaled MMA computes what the interpreter does: float8 operands, a
  from SMEM, a float32 accumulator of 128 rows, whole TMEM scale buffers of float8_e8m0fnu,
  a_scale (M, K/32) and b_scale (N, K/32); anything else is refused by name."""
  (acc, acc_dt), (a_shape, a_dt), (b_shape, b_dt) = mp.ref_shapes(
      [v.aval for v in eqn.invars], trees)[:3]
  (m, n), k = acc, a_shape[1]
  types = [np.dtype(a_dt).name, np.dtype(b_dt).name]
  float4 = [t == "float4_e2m1fn" for t in types]
  if not all(t in _SCALED_FORMATS for t in types) or float4[0] != float4[1]:
    gen.unsupported(f"block-scaled tcgen05_mma of {types[0]} x {types[1]} operands for sm_100a "
                    "(written: float8_e4m3fn and float8_e5m2 operands, or float4_e2m1fn ones "
                    "(both), scaled by float8_e8m0fnu per 32 elements of K; Gluon 3.6 reads a "
                    "float4 operand beside a float8 one in a padded layout pallax does not write)")
  if isinstance(a[0], TmemRef) or np.dtype(acc_dt) != np.float32 or m != 128:
    gen.unsupported(f"block-scaled tcgen05_mma with a in {type(a[0]).__name__}, an "
                    f"{np.dtype(acc_dt).name} accumulator of {m} rows for sm_100a (Gluon 3.6's "
                    "tcgen05_mma_scaled reads a from SMEM into a float32 accumulator of 128 rows)")
  cols = getattr(a_scale[0], "shape", (0, 0))[-1]
  if cols and k % cols == 0 and k // cols != _SCALE_BLOCK:
    gen.unsupported(f"block-scaled tcgen05_mma with one scale per {k // cols} elements of K for "
                    f"sm_100a (Gluon 3.6 writes block-scaled MMAs with one scale per "
                    f"{_SCALE_BLOCK} elements only: scale_vec::1X for float8, ::2X for float4)")
  want = ((m, k // _SCALE_BLOCK), (n, k // _SCALE_BLOCK))
  for ref, role, shape in ((a_scale, "a_scale", want[0]), (b_scale, "b_scale", want[1])):
    if not isinstance(ref[0], TmemRef) or not isinstance(ref[0].layout, TmemScales) or ref[1] or (
        tuple(ref[0].shape) != shape or k % _SCALE_BLOCK):
      gen.unsupported(
          f"block-scaled tcgen05_mma with {role} of shape {list(getattr(ref[0], 'shape', ()))} "
          f"for sm_100a (written: a whole plgpu.TMEM{list(shape)} scale buffer of "
          f"TMEMLayout.SCALES_LAYOUT, one scale per {_SCALE_BLOCK} elements of K: Gluon 3.6 "
          "scales B by exactly N rows)")
  formats = ", ".join(f'"{_SCALED_FORMATS[t]}"' for t in types)
  return f", {a_scale[0].name}, {b_scale[0].name}, {formats}"


def _refuse_operands(gen, acc, a, b):
  """What Gluon 3.6's ``tcgen05_mma`` does not take: integer products (it accumulates in
  float16 or float32 only) and float32 (tf32) operands stored M- or N-major (its lowering
  transposes 16- and 8-bit operands only)."""
  dtype = np.dtype(a[0].dtype)
  if np.issubdtype(acc.dtype, np.integer):
    gen.unsupported(f"tcgen05_mma of {dtype.name} operands into an {acc.dtype.name} accumulator "
                    "for sm_100a (Gluon 3.6's tcgen05_mma accumulates in float16 or float32 only)")
  if dtype == np.float32 and (_transposed(a) or not _transposed(b)):
    gen.unsupported("tcgen05_mma of float32 (tf32) operands for sm_100a with a or b stored "
                    "M- or N-major (Gluon 3.6 transposes 16- and 8-bit operands only): keep both "
                    "K-major (a (M, K), b as the transpose of an (N, K) buffer, b_smem.T)")


def _tmem_operand(gen, a) -> str:
  """``a`` in TMEM (the ``tcgen05.mma [d], [a], b-desc`` form): packed, as the tensor core reads
  it (16- and 8-bit elements two or four to a 32-bit column)."""
  ref = a[0]
  if ref.dtype.itemsize not in (1, 2) or ref.layout.col_stride != 1:
    gen.unsupported(f"tcgen05_mma with a in TMEM ({ref.dtype.name}, column stride "
                    f"{ref.layout.col_stride}) for sm_100a, which reads a 16- or 8-bit a from "
                    "TMEM packed (plgpu.TMEM(..., packed=True))")
  text, _ = tmem_view(gen, *a)
  return text


@rule(tc.tcgen05_commit_arrive_p)
def _commit_arrive(ctx, *invals, trees, collective_axis):
  if collective_axis is not None:
    _refuse_collective(ctx.gen, f"tcgen05_commit_arrive(collective_axis={collective_axis!r})")
  (bar,), _ = mp.split_refs(invals, trees)
  ctx.gen.emit(f"blackwell.tcgen05_commit({_arrival(ctx.gen, bar)})")
  return []


@rule(tc.async_load_tmem_p)
def _async_load_tmem(ctx, *invals, trees, reduce):
  gen = ctx.gen
  (src,), _ = mp.split_refs(invals, trees)
  text, shape = tmem_view(gen, *src)
  dtype = src[0].dtype
  regs = tmem_registers(gen, src[0], shape)
  loaded = gen.value(method(ex.Name(text, dtype=dtype, shape=shape), "load",
                            ex.Token(gen.layout(regs))), regs, "tmem_value")
  layout = gen.declared(gen.assigned(ctx.eqn.outvars[0]))
  value = gen.value(call("gl.convert_layout", loaded, ex.Token(gen.layout(layout)), dtype=dtype,
                         shape=shape), layout)
  if reduce is None:
    return value
  # reduce=: the loaded rows reduced too (tcgen05.ld's .red form), in registers here
  x = gen.value(call("gl.abs", value, dtype=dtype, shape=shape), layout) if "abs" in reduce else value
  fn = "gl.max" if reduce.endswith("max") else "gl.min"
  rows = gen.value(call(fn, x, ex.Lit(1, dtype=np.dtype(np.int32)), dtype=dtype, shape=shape[:1]),
                   slice_layout(gen, layout, 1), reduce)
  return [value, rows]


def tmem_registers(gen, ref, shape) -> TmemRegisters:
  """The register layout of TMEM accesses of a (rows, columns) view of ``ref``."""
  tmem_layout = dataclasses.replace(ref.layout, block=(ref.layout.block[0],
                                                     min(ref.layout.block[1], shape[1])))
  gen.declared(tmem_layout)
  return gen.declared(TmemRegisters(ex.dtype_name(ref.dtype, "gl"), shape, tmem_layout))


@rule(tc.async_store_tmem_p)
def _async_store_tmem(ctx, *invals, trees):
  gen = ctx.gen
  (dst,), (value,) = mp.split_refs(invals, trees)
  text, shape = tmem_view(gen, *dst)
  dtype = dst[0].dtype
  value = to_layout(gen, value, gen.declared(L.blocked(shape, dtype)), shape, dtype)
  regs = tmem_registers(gen, dst[0], shape)
  stored = gen.value(call("gl.convert_layout", value, ex.Token(gen.layout(regs)), dtype=dtype,
                          shape=shape), regs, "tmem_value")
  gen.emit(f"{text}.store({gen.render(stored)})")   # Gluon waits for the store (tcgen05.wait::st)
  return []


@rule(tc.wait_load_tmem_p, tc.commit_tmem_p)
def _nothing(ctx):
  return []


# --- layout assignment (assign.py) ------------------------------------------------------------

@layout_rule(tc.tcgen05_mma_p)
def _tcgen05_mma_layouts(ctx, *invals, trees, **_):
  (_, a, b, _, _, _, _), _ = mp.split_refs(invals, trees)
  for ref in (a, b):
    if isinstance(ref[0], Smem):
      smem_view_layouts(*ref)
  return None


@layout_rule(tc.async_load_tmem_p)
def _async_load_tmem_layouts(ctx, *invals, trees, reduce):
  """A TMEM load comes in TMEM's register layout and is converted to a blocked one at once,
  so that the rest of the kernel sees the layouts it always does."""
  out = ctx.eqn.outvars[0].aval
  shape, dtype = tuple(out.shape), np.dtype(out.dtype)
  layout = L.blocked(shape, dtype)
  if reduce is None:
    return Val(shape, dtype, layout)
  return [Val(shape, dtype, layout), Val(shape[:1], dtype, L.Slice(1, layout))]


@layout_rule(tc.async_store_tmem_p)
def _async_store_tmem_layouts(ctx, *invals, trees):
  """The value is stored from a blocked layout (converted to TMEM's register layout there)."""
  (dst,), (value,) = mp.split_refs(invals, trees)
  shape = tuple(getattr(value, "shape", ()))
  if shape:
    ctx.a.to_layout(value, L.blocked(shape, value.dtype), shape, value.dtype)
  return None

"""Gluon rules of Hopper's warpgroup MMA (``plgpu.wgmma``) and its waits."""
from __future__ import annotations

import contextlib

import numpy as np

from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src.gluon import acc_pieces
from pallax._src.gluon import layouts as L
from pallax._src.gluon.assign import Acc, Conversion, Smem, layout_rule
from pallax._src.gluon.events import MmaWait, Wgmma
from pallax._src.gluon.memory import smem_view, smem_view_layouts
from pallax._src.gluon.smem_views import indexed_lead
from pallax._src.gluon.values import i32, masked, wait_all, wgmma_issued
from pallax._src.gluon.writer import AccRef, SmemRef, rule
from pallax._src.gpu import expr as ex
from pallax._src.gpu.expr import call
from pallax._src.mosaic_gpu import primitives as mp

@rule(mp.wgmma_p)
def _wgmma(ctx, *invals, trees):
  gen = ctx.gen
  (acc, a, b), rest = mp.split_refs(invals, trees)
  acc_ref = acc[0]
  if not isinstance(acc_ref, AccRef):   # (ACC.init of a value other than float32 or float16)
    gen.unsupported("wgmma into an accumulator other than a float32 or float16 plgpu.ACC")
  chosen, start = _view_pieces(gen, acc_ref, acc[1], a)
  for op in (a, b):
    if op is not None and _slot_indexed_again(*op):
      gen.unsupported("wgmma of a view that indexes part of the leading dimensions of an SMEM "
                      "buffer of rank 4 or more, then indexes it again (a_ref.at[0] of a pipeline "
                      "slot of 3-D blocks): use 2-D blocks")
  n = acc_ref.shape[1]
  if np.issubdtype(ctx.eqn.invars[0].aval.dtype, np.integer) and \
      max(acc_pieces.widths(n) or [ex.pow2(n)]) > 128:
    gen.unsupported(f"an int8 wgmma {n} wide (Triton 3.6 writes int8 wgmmas up to N=128, and "
                    "pads N to a power of two; 192 runs as pieces of 128 and 64: split the "
                    "accumulator's columns)")
  # K is the last dimension of a's buffer unless a is transposed, of b's only if b is.
  transposed = lambda ref: any(isinstance(t, ji.TransposeRef) for t in ref[1])
  b_view = smem_view(gen, *b, k_last=transposed(b))
  if a is None and tuple(acc_ref.pieces) != acc_pieces.widths(n):
    gen.unsupported("a wgmma with a register a into an accumulator that other wgmmas write "
                    "through column views (keep a in SMEM)")
  if a is None:   # a register operand: in the layout wgmma reads registers in (per piece)
    value = masked(gen, rest[0], [1], i32(0))   # padding along K adds nothing
    bits = value.dtype.itemsize * 8
    a_views = []
    for dot in operand_layouts(acc_ref.shape[1], bits):
      dot = gen.declared(dot)
      gen.conversions.append((gen.layout_of(value), dot, tuple(value.shape), gen.last_frame))
      a_views.append(SmemRef(gen.render(gen.value(call(
          "gl.convert_layout", value, ex.Token(gen.layout(dot)), dtype=value.dtype, shape=value.shape),
          dot, "a_op")), value.shape, value.dtype, dot))
    a_view = a_views[0]
  else:
    a_view = smem_view(gen, *a, k_last=not transposed(a))
    a_views = [a_view] * max(1, len(acc_ref.pieces))
  bits = a_view.dtype.itemsize * 8
  k_major_b = any(isinstance(t, ji.TransposeRef) and tuple(t.permutation) == (1, 0) for t in b[1])
  if bits == 32 and not k_major_b:
    raise NotImplementedError(
        "wgmma of float32 operands (tf32) reads b in K-major order only: keep b as an (N, K) SMEM "
        "buffer and pass b_smem.transpose((1, 0)), or use 16-bit operands")
  layout = gen.declared(gen.facts(ctx.eqn))   # the accumulator's layout for this operand width
  if layout != acc_ref.layout:
    gen.conversions.append((acc_ref.layout, layout, tuple(acc_ref.shape), gen.last_frame))
    for v, w in zip(acc_ref.variables, acc_ref.pieces or [layout.n]):
      gen.emit_scalar(f"{v} = gl.convert_layout({v}, {gen.layout(acc_pieces.piece_layout(layout, w))})")
    acc_ref.layout = layout
  gen.events.append(Wgmma(tuple(acc_ref.shape), "registers" if a is None else gen.smem_view(a_view),
                          gen.smem_view(b_view)))
  # Triton 3.6 cannot keep 8-bit register operands alive through warpgroup_mma_wait ("Unexpected
  # bitwidth in WGMMAWaitGroupOp"): such a wgmma completes before the next statement.
  _issue(gen, acc_ref, a_views, b_view, sync=a is None and bits == 8, chosen=chosen, start=start)
  return []


def _view_pieces(gen, acc_ref, transforms, a):
  """(the pieces of ``acc_ref`` that its view ``transforms`` is made of, the view's first
  column); (None, 0) for the whole accumulator."""
  if not transforms:
    return None, 0
  view = acc_pieces.column_view(transforms, acc_ref.shape)
  chosen = None
  if view is not None and a is not None:
    chosen = acc_pieces.within(acc_ref.pieces or (acc_ref.shape[1],), *view)
  if chosen is None:
    gen.unsupported("wgmma into a view of an accumulator other than a range of its columns "
                    "that its other views leave whole, with a in SMEM")
  return chosen, view[0]


def _issue(gen, acc_ref, a_views, b_view, sync: bool, chosen=None, start: int = 0):
  """The wgmmas into ``acc_ref`` (one per piece, over its columns of ``b``; ``chosen``: the
  pieces of a view of its columns from ``start``, whose columns ``b`` has), then the wait that
  leaves at most them in flight (``sync``: none)."""
  gen.acc(acc_ref)
  places = acc_pieces.offsets(acc_ref.pieces) or [(0, acc_ref.shape[1])]
  chosen = range(len(places)) if chosen is None else chosen
  for k in chosen:
    v, a_piece, (o, w) = acc_ref.variables[k], a_views[k], places[k]
    b_text = b_view.text if w == b_view.shape[1] else f"{b_view.text}.slice({o - start}, {w}, dim=1)"
    gen.emit_scalar(f"{v} = hopper.warpgroup_mma({a_piece.text}, {b_text}, {v}"
                    f"{'' if sync else ', is_async=True'})")
  if sync:
    waited = [r for r in gen.pending_accs if r is not acc_ref] + [acc_ref]
    gen.events.append(MmaWait(0, tuple(gen.accs.index(r) for r in waited)))
    gen.pending_accs, gen.issued_wait = [], None   # a synchronous wgmma waits for all before it
    return
  # plgpu.wgmma returns with at most this wgmma in flight.
  wgmma_issued(gen, acc_ref, ", ".join(dict.fromkeys([*(p.text for p in a_views), b_view.text])))


def operand_layouts(n: int, bits: int) -> list[L.DotOperand]:
  """The layouts a register ``a`` is read in by the wgmmas into an accumulator ``n`` wide: one per
  piece (``acc_pieces.py``)."""
  acc = L.wgmma(n, bits)
  return [L.DotOperand(acc_pieces.piece_layout(acc, w), 32 // bits) for w in acc_pieces.widths(n) or [acc.n]]



@rule(mp.wgmma_wait_p)
def _wgmma_wait(ctx, *, n):
  # After each wgmma at most that one is in flight (see _wgmma): only n = 0 waits here.
  if n == 0:
    wait_all(ctx.gen, list(ctx.gen.pending_accs))
  return []


# --- which accumulators may have a wgmma in flight, along loops and branches ------------------
# ``gen.pending_accs`` holds every accumulator a wgmma may still be writing where code is being
# written; reading one waits for it (``values.wait_all``), reading one not in it needs no wait.

def _union(a: list, b: list) -> list:
  return a + [x for x in b if x not in a]


@contextlib.contextmanager
def loop_in_flight(gen, *bodies):
  """Around the writing of a loop of ``bodies``: a wgmma of one iteration may still be in flight
  when the next begins, so in a loop with wgmmas every accumulator made before it counts as in
  flight at the body's start; after the loop, what was in flight before it (no iteration) or
  at the end of its body (some)."""
  before = list(gen.pending_accs)
  if any(jaxpr_util.uses(b, {mp.wgmma_p}) for b in bodies):
    gen.pending_accs = _union(before, gen.accs)
  yield
  gen.pending_accs = _union(before, gen.pending_accs)


class BranchesInFlight:
  """Around the writing of a conditional: each branch starts with what was in flight before
  it; after it, what any branch leaves in flight (``done``)."""

  def __init__(self, gen):
    self.gen, self.before, self.after = gen, list(gen.pending_accs), []

  @contextlib.contextmanager
  def branch(self):
    self.gen.pending_accs = list(self.before)
    yield
    self.after = _union(self.after, self.gen.pending_accs)

  def done(self):
    self.gen.pending_accs = self.after


# --- layout assignment (assign.py) ------------------------------------------------------------

@layout_rule(mp.wgmma_p)
def _wgmma_layouts(ctx, *invals, trees):
  """The register operand in wgmma's operand layout; the accumulator in the layout of the
  wgmma's operand width (converted if it was in another)."""
  a = ctx.a
  (acc, lhs, rhs), rest = mp.split_refs(invals, trees)
  if not isinstance(acc[0], Acc) or not isinstance(rhs[0], Smem) or (acc[1] and lhs is None):
    return None   # the writer refuses it
  _unpadded_k(ctx, rhs, smem_view_layouts(*rhs), k=-2)
  if lhs is None:
    value = rest[0]
    bits = value.dtype.itemsize * 8
    for dot in operand_layouts(acc[0].shape[1], bits):
      a.conversions.append(Conversion(getattr(value, "layout", None), dot, tuple(value.shape), a.last_frame))
  elif isinstance(lhs[0], Smem):
    bits = lhs[0].dtype.itemsize * 8
    _unpadded_k(ctx, lhs, smem_view_layouts(*lhs), k=-1)
  else:
    return None
  layout = L.wgmma(acc[0].shape[1], bits)
  if layout != acc[0].layout:
    a.conversions.append(Conversion(acc[0].layout, layout, tuple(acc[0].shape), a.last_frame))
    acc[0].layout = layout
  ctx.facts(layout)
  return None


def _unpadded_k(ctx, operand, view: Smem, k: int) -> None:
  """A wgmma reads the padding of an SMEM operand only along K (``view.shape[k]``, the view as
  the wgmma sees it, transposes applied) when K is not a power of two: what it reads of the
  padding of M or N lands in the accumulator's padding, which reaches no result."""
  if view.shape[k] == ex.pow2(view.shape[k]):
    ctx.padding_unread(operand[0])


def _slot_indexed_again(ref, transforms) -> bool:
  """Whether ``transforms`` take some of a flattened buffer's leading dimensions, then index
  the view again: Gluon compiled the merged index of that once, and its products on an H200
  were wrong (tests/test_gluon_gaps.py), so it is refused."""
  indexers = [t for t in transforms if isinstance(t, ji.NDIndexer)]
  if not getattr(ref, "lead", ()) or len(indexers) < 2:
    return False
  return indexed_lead(ref.shape, ref.lead, indexers[0]) != len(ref.lead)

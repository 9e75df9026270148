"""What a generated Gluon kernel does, as data: its memory and barrier operations in the order
each thread makes them, recorded by the rules as they write them (as the Triton backend's
``accesses``). Tests check these rather than the generated text.

SMEM buffers are named ``smem[k]`` (the k-th buffer allocated: ``GluonSource.buffers[k]``),
barriers ``barrier[k]`` (the k-th allocation of ``plgpu.Barrier``), GMEM operands by their
origin (``args[0]``, ``out[1]``).
"""
from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class SmemView:
  """A view of an SMEM buffer: the buffer, and the steps that take the view from it, in order:
  ("index", expression), ("slice", start, size, dim), ("permute", permutation),
  ("reshape", shape), and slices from a run-time start: ("piece", start, size) of the leading
  dimension, ("columns", start, size) of the last."""
  ref: str
  steps: tuple = ()


@dataclasses.dataclass(frozen=True)
class Copy:
  """A TMA copy of one box between GMEM and SMEM."""
  direction: str        # "in" (GMEM to SMEM) or "out"
  gmem: str             # the operand
  smem: SmemView        # the SMEM it reads or writes (a box copied in pieces: the piece's slice)
  box: tuple            # the box's shape (padded to powers of two, as the descriptor's)
  coords: tuple         # its GMEM coordinates (expressions)
  barrier: str | None = None   # the barrier a copy in completes on


@dataclasses.dataclass(frozen=True)
class BarrierOp:
  kind: str             # "expect" (of ``nbytes``), "wait", "arrive"
  barrier: str
  nbytes: int = 0


@dataclasses.dataclass(frozen=True)
class Access:
  """A register load or store (or atomic update) of a GMEM or SMEM view."""
  kind: str             # "load", "store", "atomic"
  ref: Any              # the operand (str) or an SmemView
  shape: tuple          # the view's shape
  offset: Any = None    # GMEM: the view's first element, as an expression


@dataclasses.dataclass(frozen=True)
class Wgmma:
  acc_shape: tuple
  a: Any                # an SmemView, or "registers"
  b: SmemView


@dataclasses.dataclass(frozen=True)
class MmaWait:
  """A wait for wgmmas: until at most ``outstanding`` are in flight, the accumulators ``accs``
  (k: the k-th accumulator the function makes) then readable or reassignable."""
  outstanding: int
  accs: tuple


@dataclasses.dataclass(frozen=True)
class ZeroPadding:
  """A padded SMEM buffer zeroed where it is allocated (something may read its padding: see
  ``assign.Buffer.padding_read``): every slot of its ``stored`` shape."""
  ref: str
  stored: tuple


@dataclasses.dataclass(frozen=True)
class Halve:
  """A register tile split in two along ``dim`` (slices of register tiles)."""
  shape: tuple
  dim: int


@dataclasses.dataclass
class Partition:
  """One thread's code (a kernel without threads has one): its statements, register budget
  (None: the default), warps, the operations it makes in order, and the layouts its
  statements name (its function declares those only)."""
  lines: list
  registers: int | None
  warps: int
  events: list
  layouts: set = dataclasses.field(default_factory=set)

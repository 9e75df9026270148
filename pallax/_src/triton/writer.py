"""The state of one Triton kernel being written: the shared statement writer, plus what Triton's
Refs, hidden buffers and padded tensors need."""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from pallax._src.gpu import control
from pallax._src.gpu import expr as ex
from pallax._src.gpu.source import ConstArray, RuleTable, Source
from pallax._src.triton import lang as tl

# Constant arrays up to this size are passed to the kernel as inputs; larger ones are refused (a
# kernel that needs a table that large should take it as an operand).
MAX_CONSTANT_ELEMENTS = 1 << 16

TABLE: RuleTable = RuleTable({}, {})   # every Triton rule, registered by the modules that define them
rule = TABLE.register

_PROLOGUE_NAMES = ("tl", "triton", "libdevice", "INF", "NAN", "range", "_and", "_or", "_mul",
                   "_exp2", "_exp", "_max", "_min", "_argmax", "_argmin")


@dataclasses.dataclass(frozen=True)
class Access:
  """One memory access the kernel makes: a load or a store of a Ref view, and its mask."""
  kind: str                  # "load" or "store"
  origin: str                # 'args[0]', 'out[1]', 'scratch[0]', ...
  shape: tuple
  mask: ex.Expr | None       # None: every lane accesses memory


class Writer(Source):
  def __init__(self, kernel_name: str, compute_capability: int, load_constant=None):
    super().__init__(kernel_name, TABLE, tl.render, _PROLOGUE_NAMES)
    # (writer, name, array) -> the loaded value of a constant array passed as an input
    # (``memory.load_constant``; the rules that load live above this module)
    self.load_constant = load_constant
    self.compute_capability = compute_capability
    self.has_checks = False
    self.read_back: set[str] = set()   # pointers of Refs that the kernel both writes and reads
    self.hidden: list = []              # (pointer name, shape, dtype, zeroed) of hidden buffers
    self.lane: ex.Expr = tl.i32(0)      # this program's index among the concurrent programs
    self.lanes = 1                      # how many programs run concurrently
    self.accesses: list[Access] = []    # every load and store, as data (tests check masks here)
    self.constants: list = []           # (pointer name, array): constant arrays, passed as inputs
    self.approx_math = False            # the GPU's fast math approximations (CompilerParams)
    self.math_calls: list = []          # (primitive name, math_functions.Fn) of each math call
    self.mesh: dict = {}                # mesh axis -> its coordinate's variable (gpu/peers.py)

  def constant(self, c):
    """A constant array the kernel closed over (``jnp.array([...])`` in a kernel): an input of
    the launch, read whole where the (sub)jaxpr that holds it starts."""
    value = super().constant(c)
    if not isinstance(value, ConstArray) or value.value.size > MAX_CONSTANT_ELEMENTS:
      return value
    a = value.value
    name = next((n for n, b in self.constants if b is a), None)
    if name is None:
      name = self.fresh("const")
      self.constants.append((name, a))
    return self.load_constant(self, name, a)

  def valid(self, shape, axes) -> ex.Expr | None:
    """A mask of the lanes inside the logical ``shape`` along ``axes`` (None: none padded)."""
    return control.valid_lanes(shape, axes,
                               lambda a: tl.expand(tl.arange(ex.pow2(shape[a])), a, len(shape)))

  def mask_padding(self, v: ex.Expr, axes, neutral: ex.Expr) -> ex.Expr:
    """``v`` with its padded lanes along ``axes`` set to ``neutral`` (a reduction's identity)."""
    cond = self.valid(v.shape, axes)
    return v if cond is None else tl.where(cond, v, neutral)

  def materialize(self, v: ex.Expr, hint="c") -> ex.Name:
    """A fresh variable holding ``v`` as a tensor of its own dtype (for loop/branch carries)."""
    name = self.fresh_name(hint, v.dtype, v.shape)
    self.max_numel = max(self.max_numel, name.numel)
    self.emit(f"{name.name} = {self.render(tl.tensor(v))}")
    return name

  def assign(self, targets, values):
    super().assign(targets, [tl.tensor(v) if v.shape == () else v for v in values])


def is_float(dtype) -> bool:
  return jnp.issubdtype(dtype, jnp.floating)

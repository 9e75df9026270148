"""Layout assignment: the pass that decides, before any Gluon is written, where every value of a
kernel sits. It walks the (legalized) kernel jaxpr the way the writer will, once per thread,
with rules of JAX's shape, ``rule(ctx, *operands, **params)``, registered by the rule modules
next to the rules that write code (``@layout_rule``). It gives

- every register value its layout (``Scope.layouts``: per lowering of a jaxpr, per variable);
- every loop the layouts of its carries: a carry that starts as a splat or an iota takes the
  layout the loop body computes it in (the body is analysed once with such carries undecided,
  then again with them decided);
- every SMEM buffer (``Buffer``) its stored shape, the rank of its layout and its swizzle, from
  the ranks of all its views, in every thread;
- every accumulator the layout each wgmma leaves it in, and each rule the facts it renders from
  (``Scope.facts``);
- the list of layout conversions (``Assignment.conversions``: what ``debug=True`` prints).

The writer (``writer.py``) lowers each jaxpr with its ``Scope`` and renders what it says. Where
two layouts meet the rule is local: an operation takes the layout of its first computed operand
(not one that is rebuilt more cheaply: a splat, an iota, a broadcast vector) and the others are
converted to it or rebuilt in it. The pass never rejects a kernel: what the Gluon backend cannot
express is reported by the writer when it gets there (values it cannot place get no layout).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from pallax._src import jax_internals as ji
from pallax._src.gluon import layouts as L
from pallax._src.gpu import source as src

LAYOUT_RULES = src.RuleTable({}, {})
layout_rule = LAYOUT_RULES.register


@dataclasses.dataclass(eq=False)
class Val:
  """A value as the assignment sees it. ``layout`` is None for scalars and for tiles the pass
  cannot place; ``rebuild`` says how the value can be computed again in another layout instead
  of converted: ("splat",), ("iota",), or ("expand", vector, dim) for a vector broadcast along
  ``dim``; ``tentative``: a loop carry whose layout the loop body is to decide."""
  shape: tuple
  dtype: Any
  layout: L.Layout | None = None
  rebuild: tuple | None = None
  tentative: bool = False
  used: bool = False   # some operation takes it as it is (not rebuilt in another layout): a
                       # splat or an iota nothing takes as it is is not written (``unused``)
  free: bool = False   # a load from SMEM, which reads in any layout: its first user's (``convert``)


def val(aval, layout=None, rebuild=None) -> Val:
  return Val(tuple(getattr(aval, "shape", ())), np.dtype(aval.dtype) if hasattr(aval, "dtype") else None,
             layout, rebuild)


@dataclasses.dataclass(frozen=True)
class Conversion:
  """A ``gl.convert_layout`` the kernel makes (data may move through shared memory)."""
  source: L.Layout | None
  target: L.Layout
  shape: tuple
  frame: str | None    # the user's line


@dataclasses.dataclass(eq=False)
class Buffer:
  """An SMEM buffer: the shape it is allocated with (a buffer of rank > 3 has its leading
  dimensions flattened into one), its element type, and the ranks of its views (``registers``:
  of those that registers read or write, which need a layout of exactly their rank).
  ``declared``: the rank it was declared with, up to which views of a buffer stored flattened
  may go (each is reinterpreted in a layout of its own rank: ``smem_views.flat_index``)."""
  shape: tuple
  dtype: np.dtype
  declared: int = 0
  ranks: set = dataclasses.field(default_factory=set)
  registers: set = dataclasses.field(default_factory=set)
  # Whether anything may read its padding, which is then zeroed where it is allocated. Only a
  # TMA copy into it and a wgmma reading it along an unpadded K are known not to (the rules say
  # so: ``AssignContext.padding_unread``); any other use of the buffer counts as a reader.
  padding_read: bool = False

  @property
  def rank(self) -> int:
    """The rank of the buffer's layout: that of its lowest-rank views (a leading dimension
    beyond it is only ever indexed)."""
    return max(1, min(self.ranks | {len(self.shape)}))

  @property
  def stored(self) -> tuple:
    """The shape allocated: the dimensions its layout describes padded to powers of two. Beside
    a layout of rank 1 the leading dimension is padded too: seen with a layout of rank 2 (a TMA
    box of the whole buffer), it must be a power of two."""
    rank = self.rank
    return L.padded(self.shape) if rank == 1 else \
        tuple(self.shape[:-rank]) + L.padded(self.shape[-rank:])

  @property
  def layout(self) -> L.Shared:
    return self.seen_with(self.rank)

  def seen_with(self, rank: int) -> L.Shared:
    """The layout of the buffer's bytes seen with ``rank`` dimensions. A buffer whose layout has
    rank 1 (its rows read or written one at a time) is not swizzled: Gluon's NVMMA layouts of
    rank 1 swizzle nothing, and its other views must see the same bytes."""
    layout = L.shared(self.shape, self.dtype, rank)
    return dataclasses.replace(layout, swizzle=0) if self.rank == 1 else layout

  def wide_rows(self, rank: int) -> bool:
    """Whether the buffer's bytes seen through a layout of ``rank`` are in another order than
    its own layout's: NVMMA layouts of ranks 2 and 3 place the swizzle-wide column chunks of
    rows wider than the swizzle differently (per plane, or across the planes). On an H200 a
    (2, 64, 64) float32 buffer written by a rank-3 TMA box and read through ``.at[0]`` was
    wrong from column 32 on."""
    row_bytes = L.padded(self.shape)[-1] * np.dtype(self.dtype).itemsize
    swizzle = self.layout.swizzle
    return rank != self.rank and bool(swizzle) and row_bytes > swizzle

  def problem(self) -> str | None:
    """Why no one layout serves every view (None: one does)."""
    rank = min(self.ranks | {len(self.shape)})
    top = max(rank + 1, self.declared)
    if rank < len(self.shape) - 1 or max(self.ranks | {rank}) > top or self._odd_registers(rank):
      return (f"SMEM views of ranks {sorted(self.ranks)} of one buffer of shape {list(self.shape)}, "
              f"register loads or stores of rank {sorted(self.registers)} among them")
    return None

  def _odd_registers(self, rank: int) -> set:
    """The ranks of register accesses that no layout serves beside the buffer's (of ``rank``).
    A buffer stored with its leading dimensions flattened sees each view in a layout of the
    view's own rank (``smem_views.flat_index``): that serves registers too, where every view
    sees the same bytes (all of one rank, unpadded, or rows no wider than the swizzle)."""
    odd = self.registers - {rank}
    if self.declared <= len(self.shape):
      return odd
    same = self.ranks == odd and tuple(self.stored) == tuple(self.shape)
    return {r for r in odd if r > self.declared or (self.wide_rows(r) and not same)}


@dataclasses.dataclass(eq=False)
class Smem:
  """An SMEM buffer or a view of it: ``whole`` (the buffer itself, unindexed), ``lead`` (a
  buffer of rank > 3 not yet indexed), ``reshaped`` (such a buffer seen whole)."""
  buffer: Buffer
  shape: tuple
  dtype: np.dtype
  swizzle: int = 0
  lead: tuple = ()
  whole: bool = True
  reshaped: bool = False
  packed: np.dtype | None = None   # the sub-byte type its bytes hold (subbyte.py)


@dataclasses.dataclass(eq=False)
class Acc:
  """A wgmma accumulator: the layout it is in (wgmmas change it to theirs), and the layout of
  the value last stored into its variable (None before any store)."""
  shape: tuple
  layout: L.Layout
  stored: L.Layout | None = None


@dataclasses.dataclass(eq=False)
class Gmem:
  shape: tuple
  dtype: np.dtype
  pre: tuple = ()     # the indexers that select the kernel's block (see codegen.block_indexer)


@dataclasses.dataclass(eq=False)
class Closed:
  """A value ``pl.run_state`` turned into a Ref the body only reads."""
  value: Any


class Opaque:
  """A Ref the pass does not look into (a barrier, an operand of a kind it does not know)."""


@dataclasses.dataclass(eq=False)
class Scope:
  """What the assignment found for one lowering of one jaxpr: the layout of each variable, the
  facts each equation's rule renders from, and the scopes of the sub-jaxprs its rules lower, in
  the order they lower them (the writer takes them in that order: ``take``)."""
  jaxpr: Any
  layouts: dict = dataclasses.field(default_factory=dict)
  values: dict = dataclasses.field(default_factory=dict)   # variable -> its Val
  facts: dict = dataclasses.field(default_factory=dict)
  subs: list = dataclasses.field(default_factory=list)
  taken: int = 0

  def take(self, jaxpr) -> "Scope":
    if self.taken >= len(self.subs) or self.subs[self.taken].jaxpr is not jaxpr:
      raise AssertionError("internal error: the Gluon writer lowers a jaxpr the layout "
                           "assignment did not analyse in that order")
    self.taken += 1
    return self.subs[self.taken - 1]


@dataclasses.dataclass
class Assignment:
  top: Scope                  # its subs: the jaxprs codegen lowers, in order
  conversions: list           # every Conversion, in the order the kernel makes them
  buffers: list               # every SMEM Buffer
  hoisted: dict               # run_scoped equation -> the refs allocated for it at the top


@dataclasses.dataclass(frozen=True)
class AssignContext:
  """What a layout rule sees: the pass (``a``) and the equation."""
  a: "Assigner"
  eqn: Any

  @property
  def out(self):
    return self.eqn.outvars[0].aval

  def lower(self, jaxpr, args) -> list:
    return self.a.lower(jaxpr, args)

  def uses(self, var) -> list:
    return self.a.uses(var)

  def facts(self, value) -> None:
    """Records what this equation's writer rule renders from."""
    self.a.scope.facts[self.eqn] = value

  def padding_unread(self, ref) -> None:
    """Says that this equation's use of the SMEM buffer ``ref`` reads none of its padding."""
    self.a.padding_unread.add(id(ref))


class Assigner:
  """The pass's state while it walks: the scope being filled, the conversions so far, the
  accumulators and buffers, and what the walk shares with the writer (``gen``: literals,
  folding, the wgmma operand width)."""

  def __init__(self, gen):
    self.gen = gen
    self.top = self.scope = Scope(None)
    self.conversions: list = []
    self.buffers: list = []
    self.accs: list = []
    self.hoisted: dict = {}
    self.axes: dict = {}
    self.thread_name = None
    self.last_frame = None
    self._live: set = set()
    self._eqns: list = []
    self._rebuilt_here: set = set()   # ids of the operands the running rule rebuilt
    self.padding_unread: set = set()  # ids of the SMEM operands whose padding it does not read
    self._origins: dict = {}          # id of a free Val -> (its scope, its variable)

  def result(self) -> Assignment:
    return Assignment(self.top, self.conversions, self.buffers, self.hoisted)

  # --- the walk ---------------------------------------------------------------------------------
  def lower(self, jaxpr, args) -> list:
    """The values ``jaxpr`` computes from ``args``; its scope becomes the next sub-scope of the
    current one."""
    scope = Scope(jaxpr)
    self.scope.subs.append(scope)
    self.padding_unread.update(id(a) for a in args)   # what reads them is in ``jaxpr``
    outer = self.scope, self._live, self._eqns
    self.scope, self._eqns = scope, jaxpr.eqns
    self._live = {a for e in jaxpr.eqns for a in e.invars if isinstance(a, ji.Var)}
    self._live |= {a for a in jaxpr.outvars if isinstance(a, ji.Var)}
    env = dict(zip(jaxpr.invars, args))
    env.update(zip(jaxpr.constvars, map(self.gen.constant, jaxpr.consts)))
    read = lambda a: (env[a] if not isinstance(a, ji.Literal) else self.gen.constant(a.val)
                      if np.ndim(a.val) else self.gen.literal(a.val, a.aval.dtype))
    try:
      for eqn in jaxpr.eqns:
        if not eqn.effects and not any(v in self._live for v in eqn.outvars):
          continue   # as the writer: index arithmetic nothing uses
        self.last_frame = ji.user_frame(eqn.source_info) or self.last_frame
        outs = self._eqn(eqn, [read(a) for a in eqn.invars])
        env.update(zip(eqn.outvars, outs))
        scope.layouts.update((v, o.layout) for v, o in zip(eqn.outvars, outs) if isinstance(o, Val))
        scope.values.update((v, o) for v, o in zip(eqn.outvars, outs) if isinstance(o, Val))
        self._origins.update((id(o), (scope, v)) for v, o in zip(eqn.outvars, outs)
                             if isinstance(o, Val) and o.free)
      outs = [read(a) for a in jaxpr.outvars]
      for o in outs:   # what the caller does with them is not tracked: taken as they are
        self.take_as_is(o)
      return outs
    finally:
      self.scope, self._live, self._eqns = outer

  def _eqn(self, eqn, invals) -> list:
    unknown = [val(v.aval) for v in eqn.outvars]
    if any(isinstance(v, src.ConstArray) for v in invals):
      return unknown   # the writer refuses it
    folded = self.gen.fold(eqn, invals)
    if folded is not None:
      return [folded]
    if eqn.primitive not in self.gen.table.rules:
      return unknown   # the writer refuses it
    rule = LAYOUT_RULES.rules.get(eqn.primitive, elementwise)
    outer = self._rebuilt_here, self.padding_unread
    self._rebuilt_here, self.padding_unread = set(), set()
    try:
      outs = rule(AssignContext(self, eqn), *invals, **eqn.params)
      for v in invals:   # operands the rule did not rebuild in another layout: taken as they are
        if id(v) not in self._rebuilt_here:
          self.take_as_is(v)
        if isinstance(v, Smem) and id(v) not in self.padding_unread:
          v.buffer.padding_read = True
    finally:
      self._rebuilt_here, self.padding_unread = outer
    if outs is None:
      return unknown
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    return [o if o is not None else u for o, u in zip(outs, unknown)]

  def uses(self, var) -> list:
    return [e for e in self._eqns if any(a is var for a in e.invars)]

  @staticmethod
  def take_as_is(v):
    if isinstance(v, Val):
      v.used = True

  def probe(self, fn):
    """``fn()``'s result, with what it recorded taken back (a loop body analysed with its carries
    undecided): conversions, sub-scopes, accumulator layouts, buffers."""
    saved = (len(self.conversions), len(self.scope.subs), len(self.buffers), list(self.accs),
             [(a, a.layout) for a in self.accs], self.last_frame)
    try:
      return fn()
    finally:
      conversions, subs, buffers, accs, layouts, self.last_frame = saved
      del self.conversions[conversions:], self.scope.subs[subs:], self.buffers[buffers:]
      self.accs[:] = accs
      for a, layout in layouts:   # (what a store into it left stays: ``same_layout``)
        a.layout = layout

  # --- values meeting in one layout ---------------------------------------------------------------
  def in_layout(self, v, layout):
    """``v`` in ``layout`` (unchanged if it is a scalar, has no layout, or is in it)."""
    if layout is None or not isinstance(v, Val) or v.layout is None or v.layout == layout or not v.shape:
      self.take_as_is(v)
      return v
    return self.convert(v, layout)

  def convert(self, v: Val, layout) -> Val:
    """``v`` in ``layout``: read in it (an SMEM load no one took yet), rebuilt in it where it
    can be, else converted."""
    if v.free and not v.used and id(v) in self._origins:
      scope, var = self._origins.pop(id(v))
      v.layout, v.free = layout, False
      scope.layouts[var] = layout
      return v
    if v.rebuild is not None:
      new = self._rebuilt(v, layout)
      if new is not None:
        self._rebuilt_here.add(id(v))
        return new
    self.take_as_is(v)   # converted from the value as it is
    self.conversions.append(Conversion(v.layout, layout, tuple(v.shape), self.last_frame))
    return Val(v.shape, v.dtype, layout)

  def _rebuilt(self, v: Val, layout) -> Val | None:
    kind = v.rebuild[0]
    if kind == "splat":
      return Val(v.shape, v.dtype, layout, v.rebuild)
    if layout.kind == "other":   # iotas and broadcasts are rebuilt in blocked and wgmma layouts
      return None
    if kind == "iota":
      return Val(v.shape, v.dtype, layout, v.rebuild)
    _, x, dim = v.rebuild
    x = self.in_layout(x, L.Slice(dim, layout))
    return Val(v.shape, v.dtype, layout, ("expand", x, dim))

  @staticmethod
  def leading(*vals) -> Val | None:
    """The tile whose layout ``vals`` meet in: the first computed one (not one rebuilt more
    cheaply, a carry whose layout is undecided, nor an SMEM load, which reads in any); None: no
    tile has a layout."""
    tiles = [v for v in vals if isinstance(v, Val) and v.shape and v.layout is not None]
    if not tiles:
      return None
    return next((v for v in tiles if v.rebuild is None and not v.tentative and not v.free), tiles[0])

  def common(self, *vals) -> tuple[list, L.Layout | None]:
    """``vals`` in one layout (``leading``'s), the others converted to it or rebuilt in it."""
    target = self.leading(*vals)
    if target is None:
      return list(vals), None
    return [self.in_layout(v, target.layout) for v in vals], target.layout

  def converting_at(self, position: int, fn):
    """``fn()``, its conversions listed at ``position`` rather than at the end (those made where
    a branch ends, found once every branch was analysed)."""
    start = len(self.conversions)
    result = fn()
    made = self.conversions[start:]
    del self.conversions[start:]
    self.conversions[position:position] = made
    return result

  def to_layout(self, v, layout, shape, dtype):
    """``v`` as a tile of ``shape`` in ``layout`` (a scalar is filled into a new tile)."""
    if not getattr(v, "shape", ()):
      return Val(tuple(shape), np.dtype(dtype), layout)
    if v.layout not in (None, layout):
      return self.convert(v, layout)
    self.take_as_is(v)
    return v

  def same_layout(self, acc: Acc, v) -> L.Layout | None:
    """The layout ``v`` is converted to when stored into accumulator ``acc``'s variable (None:
    none): that of the value the variable holds (the last value stored's; before any store,
    the accumulator's own, in which reads see it)."""
    target = None
    holds = acc.layout if acc.stored is None else acc.stored
    if isinstance(v, Val) and v.layout not in (None, holds) and v.shape:
      target = holds
      self.convert(v, target)
    acc.stored = acc.layout
    return target


def elementwise(ctx, *xs, **_):
  """Any operation on tiles: its result is in the operands' common layout."""
  _, layout = ctx.a.common(*xs)
  return [val(v.aval, layout) for v in ctx.eqn.outvars]

"""The Gluon kernel being written: the Refs the rules see (GMEM operands, SMEM buffers and their
views, barriers, wgmma accumulators) and the ``Writer``, the shared ``gpu/source.py`` statement
writer with the Gluon rule table and what Gluon needs beyond it: the layout assignment it
renders (``assign.py``: each jaxpr is lowered with its ``Scope``), the layout of every register
value written, the named layouts, the TMA descriptors the body asks for (made in the prologue
or passed by the host), and what the kernel does as data (``events.py``).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from pallax._src.gluon import acc_pieces
from pallax._src.gluon import layouts as L
from pallax._src.gluon import multiples
from pallax._src.gluon import profile
from pallax._src.gluon import statements
from pallax._src.gluon import subbyte
from pallax._src.gluon.assign import Buffer
from pallax._src.gluon.events import SmemView, ZeroPadding
from pallax._src.gpu import expr as ex
from pallax._src.gpu import source as src

TABLE = src.RuleTable({}, {})
rule = TABLE.register


@dataclasses.dataclass
class GmemRef:
  """A kernel operand in GMEM: its pointer parameter and static shape; ``pre`` indexes it
  before the kernel's own views (the block of a grid axis that ``jax.vmap`` added)."""
  ptr: str
  shape: tuple
  dtype: np.dtype
  origin: str
  pre: tuple = ()
  strides: tuple | None = None   # in elements (None: row-major; copies.py reorders dimensions)


@dataclasses.dataclass
class SmemRef:
  """An SMEM buffer or a view of it: ``text`` is its Gluon expression."""
  text: str
  shape: tuple
  dtype: np.dtype
  layout: L.Layout
  swizzle: int = 0        # bytes (the buffer's): where it may be sliced
  lead: tuple = ()        # leading dimensions stored flattened into one (buffers of rank > 3)
  reshaped: bool = False  # such a buffer seen whole, unflattened
  buffer: Buffer | None = None   # what the layout assignment found for the buffer
  steps: tuple = ()       # the view's steps from the buffer (see events.SmemView)
  whole: bool = False     # the buffer itself, unindexed
  packed: np.dtype | None = None   # the sub-byte type its bytes hold (shape, dtype: the bytes')


@dataclasses.dataclass
class BarrierRef:
  name: str               # the mbarrier array
  phase: str              # the phase bitfield variable
  count: int
  index: ex.Expr | None = None
  id: int = 0             # which allocation of barriers (``barrier[id]`` in events)


@dataclasses.dataclass
class AccRef:
  """A wgmma accumulator: the register variable holding it, or with ``pieces`` (the widths of
  its column pieces, ``acc_pieces.py``) the variables holding each."""
  name: str
  shape: tuple
  layout: L.Layout
  pieces: tuple = ()

  @property
  def variables(self) -> list[str]:
    return acc_pieces.names(self.name, self.pieces) if self.pieces else [self.name]


@dataclasses.dataclass
class ValueRef:
  """A value that ``pl.run_state`` turned into a Ref the body only reads (a closed-over array)."""
  value: ex.Expr


@dataclasses.dataclass(frozen=True)
class Descriptor:
  """A TMA descriptor of a GMEM operand for boxes of one shape (``box``: padded), and the layout
  of the SMEM it copies to or from."""
  name: str
  ptr: str
  shape: tuple
  strides: tuple
  box: tuple
  layout: L.Layout

  def line(self, gen) -> str:
    """The statement that makes it in the kernel (when it is not made on the host)."""
    return (f"{self.name} = tma.make_tensor_descriptor({self.ptr}, {list(self.shape)}, "
            f"{list(self.strides)}, {list(self.box)}, {gen.layout(self.layout)})")


@dataclasses.dataclass
class GluonSource:
  name: str
  source: str
  signature: dict
  grid: tuple
  num_warps: int = 4
  # Per operand: None (a pointer) or (shape, strides) of the host-side TMA descriptor passed in
  # its place (its box and swizzle come from the compiled kernel's metadata).
  host_descriptors: tuple = ()
  # What the kernel does, as data (``events.py``): per thread its operations; the SMEM buffers
  # (assign.Buffer), the layouts named (each function declares those
  # its statements take), the conversions made, the program ids (expressions).
  partitions: tuple = ()
  buffers: tuple = ()
  layouts: tuple = ()
  conversions: tuple = ()
  program_ids: tuple = ()
  # Buffers after the outputs (semaphore scratch): (shape, dtype, zeroed by the launch) each.
  hidden: tuple = ()


@dataclasses.dataclass(frozen=True)
class Reading(ex.Renderer):
  """A renderer that notes the variables every text it writes reads (``reads``): what the
  statements not kept as ``Binding``s need."""
  reads: set = dataclasses.field(default_factory=set)

  def __call__(self, e, prec: int = 0) -> str:
    self.reads.update(ex.names(e))
    return super().__call__(e, prec)


class Writer(src.Source):
  """The Gluon kernel being written: the statements, the layouts of register values, and the
  TMA descriptors the body asked for (emitted in the prologue)."""

  def __init__(self, kernel_name: str):
    super().__init__(kernel_name, TABLE, Reading("gl"))
    self.approx_math = False                 # plgpu.CompilerParams(approx_math=True)
    self.layouts: dict = {}                  # register value name -> its Layout
    self.remat: dict = {}                    # register value name -> layout -> the value
                                             # computed again in it (or None): splats, iotas,
                                             # broadcasts are rebuilt rather than converted
    self.assignment = None                   # the layout assignment (assign.py)
    self.allocated = 0                       # how many of its SMEM buffers are allocated
    self.scope = None                        # the assignment's Scope of the jaxpr being lowered
    self.events: list = []                   # what the running thread does (events.py)
    self.barriers = 0                        # how many barrier allocations were made
    self.constexprs: dict = {}               # Layout -> its constexpr name
    self.used_layouts: set = set()           # the layouts the function being written names
    self.pending_layouts: set = set()        # layouts named for a statement not yet written
    self.descriptors: dict = {}              # (ptr, box) -> its Descriptor
    self.pointer_uses: set = set()           # GMEM operands accessed through registers
    self.axes: dict = {}                     # axis name -> index expression
    self.cluster_barriers = 0                # plgpu.ClusterBarrier allocations (clusters.py)
    self.mma_bits = 16                       # the operand width of the kernel's wgmmas
    self.wgmma = False                       # whether the kernel has wgmmas
    self.conversions: list = []              # (from, to, shape, line) of each layout conversion
    self.hoisted: dict = {}                  # collective run_scoped equation -> its Refs
    self.grouped_stores = False              # copy_smem_to_gmem(commit_group=False) written
    self.registers = None                    # the running thread's set_max_registers
    self.pending_accs: list = []             # accumulators with a wgmma maybe in flight
    self.accs: list = []                     # the accumulators made so far in the function
    self.issued_wait = None                  # the last wgmma's own wait (values.wgmma_issued)
    self.thread_name = None                  # the thread axis of a kernel with several threads
    self.register_tensors = False            # a register-tensor layout or an SMEM allocation
                                             # (zeroed from registers) was asked for
    self.phases_read: set = set()            # barrier phase variables the running thread
                                             # waits with
    self.multiples: dict = {}                # scalar name -> what it is a multiple of
    self.only_warp = None                    # the warp of a per-warp partition (threads.py)
    self.warp_mapped = False                 # whether the thread being written has warp_map
    self.warp_body = False                   # ... and its warp only_warp has a body there
    self.warp_written: set = set()           # ids of the lines and events warp bodies wrote
    self.peers = None                        # a kernel's peers and mesh axes (peers.py)
    self.profile = None                      # a profiled kernel's record (profile.py)
    self.blocks = 1                          # how many blocks the kernel launches
    self.block_semaphores: list = []         # (pointer, shape) of semaphore scratch buffers

  def emit(self, line: str):
    super().emit(line)
    self.claim()

  def claim(self):
    """The layouts named since the last statement are the function's (``used_layouts``): the
    statement just written names them (or one still to come: they are declared either way)."""
    self.used_layouts |= self.pending_layouts
    self.pending_layouts = set()

  def emit_binding(self, name: ex.Name, e: ex.Expr):
    """``name = e``, kept as a ``statements.Binding`` (left out unless read) where ``e`` is
    pure; the layouts it takes are its own."""
    text = f"{name.name} = {ex.Renderer('gl')(e)}"
    if self.peers is not None and not name.shape:
      self.peers.scalars[name.name] = e          # (a peer's device, known at the start?)
    if not statements.pure(e):
      self.render.reads.update(ex.names(e))
      self.emit(text)
      return
    binding = statements.Binding("    " * self.depth + text, name.name, e, self.depth)
    self.pending_layouts -= binding.layouts
    self.lines.append(binding)

  def live(self, functions: list[tuple[list, set]]) -> list[tuple[list, set]]:
    """``statements.live``: what each function keeps, and the layouts it declares."""
    return statements.live(functions, self.render.reads)

  def accumulator(self, shape: tuple, dtype, layout: L.Layout, pieces=None) -> AccRef:
    """A new wgmma accumulator of zeros in ``layout`` (in column ``pieces``, by default
    ``acc_pieces.widths``): a ``Binding``, left out (its layout not declared) in a function that
    never uses it (a thread that does not compute)."""
    pieces = acc_pieces.widths(shape[1]) if pieces is None else pieces
    ref = AccRef(self.fresh("acc"), tuple(shape), layout, pieces)
    for v, n in zip(ref.variables, ref.pieces or shape[1:]):
      piece = (shape[0], n)
      name = ex.Name(v, dtype=np.dtype(dtype), shape=piece)
      self.emit_binding(name, ex.call("gl.zeros", ex.Token(str(list(L.padded(piece)))),
                                      ex.Token(ex.dtype_name(dtype, "gl")),
                                      layout=ex.Token(self.layout(acc_pieces.piece_layout(layout, L.pow2(n)))),
                                      dtype=name.dtype, shape=piece))
    return self.new_acc(ref)

  def new_acc(self, ref: AccRef) -> AccRef:
    """``ref``, noted as an accumulator of the function being written (``mma.loop_in_flight``)."""
    self.accs.append(ref)
    return ref

  def acc(self, ref: AccRef) -> str:
    """The variable of accumulator ``ref`` (of a pieced one, its pieces' variables, comma
    separated), as a statement written as text reads or writes it (noted: its zeros are then
    kept)."""
    self.render.reads.update(ref.variables)
    return ", ".join(ref.variables)

  def hoisted_barriers(self) -> list:
    return [r for refs in self.hoisted.values() for r in refs if isinstance(r, BarrierRef)]

  def hoisted_names(self) -> list[str]:
    return [r.text if isinstance(r, SmemRef) else r.ptr if isinstance(r, GmemRef) else r.name
            for refs in self.hoisted.values() for r in refs if not isinstance(r, AccRef)]

  def layout(self, layout: L.Layout) -> str:
    """The name of a layout, as a statement takes it (``L0: gl.constexpr = ...`` in the
    prologue of each function whose statements name it: see ``claim``)."""
    self.pending_layouts.add(layout)
    return statements.LayoutName(self._named(layout), layout)

  def _named(self, layout: L.Layout) -> str:
    if layout.registers:
      self.register_tensors = True
    if layout not in self.constexprs:
      if isinstance(layout, (L.Slice, L.DotOperand)):
        self._named(layout.parent)   # named first: its name is in this one's text
      self.constexprs[layout] = f"L{len(self.constexprs)}"
    return self.constexprs[layout]

  def declared(self, layout: L.Layout) -> L.Layout:
    """``layout``, named now (declared where a statement names it)."""
    self._named(layout)
    return layout

  def declarations(self, used) -> list[str]:
    """``Ln: gl.constexpr = ...`` for the layouts of ``used`` and those their text names, in
    the order they were named."""
    needed, todo = set(), list(used)
    while todo:
      layout = todo.pop()
      if layout not in needed:
        needed.add(layout)
        layout.text(lambda named: todo.append(named) or self._named(named))
    return [f"{n}: gl.constexpr = {layout.text(self._named)}"
            for layout, n in self.constexprs.items() if layout in needed]

  def bind(self, e: ex.Expr, hint: str = "v", dtype=None, shape=None) -> ex.Expr:
    name = super().bind(e, hint, dtype, shape)
    multiples.record(self.multiples, name, e)   # (for TMEM slices from a run-time start)
    return name

  def value(self, e: ex.Expr, layout: L.Layout | None, hint="v") -> ex.Name:
    name = self.bind(e, hint)
    if layout is not None and isinstance(name, ex.Name):
      self.layouts[name.name] = layout
    return name

  def lower_jaxpr(self, jaxpr, args, unused_outputs=()) -> list:
    """Lowers ``jaxpr`` with what the layout assignment found for it (the next scope of the
    current one: rules lower sub-jaxprs in the order the assignment analysed them)."""
    outer, self.scope = self.scope, self.scope.take(jaxpr)
    profile.enter_jaxpr(self)
    try:
      outs = super().lower_jaxpr(jaxpr, args, unused_outputs)
    finally:
      self.scope = outer
    profile.leave_jaxpr(self)
    return outs

  def at_equation(self, eqn) -> None:
    profile.at_equation(self, eqn)   # (a profiled kernel: where its named scopes change)

  def assigned(self, var) -> L.Layout | None:
    """The layout the assignment gave ``var`` (a variable of the jaxpr being lowered)."""
    return self.scope.layouts.get(var)

  def facts(self, eqn):
    """What the assignment found for ``eqn`` that its rule renders from (see the layout rule)."""
    return self.scope.facts.get(eqn)

  def assign(self, targets, values):
    """Loop and branch carries keep the layout they entered with (Gluon requires it)."""
    values = [self.in_layout(v, self.layout_of(t)) for t, v in zip(targets, values)]
    super().assign(targets, values)

  def materialize(self, v: ex.Expr, hint="c") -> ex.Name:
    """A fresh variable holding ``v`` (loop and branch carries need names of their own), in
    ``v``'s layout; a scalar literal as a 0-d tensor of its type."""
    name = self.fresh_name(hint, v.dtype, v.shape)
    text = self.render(v) if v.shape or not isinstance(v, ex.Lit) else self.render(
        ex.call("gl.full", ex.Token("[]"), v, ex.Token(ex.dtype_name(v.dtype, "gl")), dtype=v.dtype))
    self.emit_scalar(f"{name.name} = {text}")
    if self.layout_of(v):
      self.layouts[name.name] = self.layout_of(v)
    return name

  def in_layout(self, v, layout: L.Layout | None):
    have = self.layout_of(v)
    if layout is None or have is None or have == layout or not getattr(v, "shape", ()):
      return v
    return self.convert(v, layout)

  def unwritten(self, eqn, again) -> ex.Name | None:
    """The result of ``eqn`` (a splat or an iota) left unwritten where the layout assignment
    found that no operation takes it as it is: every use computes it again in its own layout,
    with ``again(layout)``. None: it is taken as it is somewhere (write it)."""
    var = eqn.outvars[0]
    v = self.scope.values.get(var)
    if v is None or v.used or v.rebuild is None:
      return None
    name = ex.Name(self.fresh("v"), dtype=np.dtype(var.aval.dtype), shape=tuple(var.aval.shape))
    self.layouts[name.name] = self.assigned(var)
    self.remat[name.name] = again
    return name

  def splat(self, x, shape: tuple, layout: L.Layout) -> ex.Name:
    """A tile of ``shape`` filled with scalar ``x``, in ``layout``."""
    v = self.value(ex.call("gl.full", ex.Token(str(list(L.padded(shape)))), x,
                           ex.Token(ex.dtype_name(x.dtype, "gl")), layout=ex.Token(self.layout(layout)),
                           dtype=x.dtype, shape=shape), layout)
    if isinstance(v, ex.Name):
      self.remat[v.name] = lambda new: self.splat(x, shape, new)
    return v

  def convert(self, v, layout: L.Layout) -> ex.Name:
    """``v`` converted to ``layout`` (each conversion is listed by ``debug=True``), or computed
    again in it where that is cheaper."""
    again = self.remat.get(getattr(v, "name", None))
    if again is not None:
      new = again(layout)
      if new is not None:
        return new
    self.conversions.append((self.layout_of(v), layout, tuple(v.shape), self.last_frame))
    return self.value(ex.call("gl.convert_layout", v, ex.Token(self.layout(layout)), dtype=v.dtype,
                              shape=v.shape), layout)

  def layout_text(self, layout: L.Layout) -> str:
    return layout.text(self.layout)

  def allocate_smem(self, name: str, shape: tuple, dtype) -> tuple[L.Shared, Buffer]:
    """Allocates the next SMEM buffer the layout assignment found (its stored shape and layout
    rank come from the ranks of all its views); returns its layout and the buffer. A padded
    buffer something may read the padding of (``Buffer.padding_read``) is zeroed where it is
    allocated, so that its padding is zero until TMA or registers write it."""
    buffer = self.assignment.buffers[self.allocated]
    if (buffer.shape, buffer.dtype) != (tuple(shape), np.dtype(dtype)):
      raise AssertionError("internal error: the Gluon writer allocates SMEM the layout "
                           "assignment did not find")
    self.allocated += 1
    layout = buffer.layout
    self.register_tensors = True   # its padding may be zeroed from registers
    stored, rank, gl_dtype = buffer.stored, buffer.rank, ex.dtype_name(dtype, "gl")
    self.emit_scalar(f"{name} = gl.allocate_shared_memory({gl_dtype}, {list(stored)}, {self.layout(layout)})")
    if stored != tuple(shape) and buffer.padding_read:
      zeros = (f"gl.zeros({list(stored[-rank:])}, {gl_dtype}, "
               f"layout={self.layout(L.blocked(stored[-rank:], dtype))})")
      if len(stored) == rank:
        self.emit(f"{name}.store({zeros})")
      else:
        self.emit(f"for _s in gl.static_range({stored[0]}):")
        self.emit(f"    {name}.index(_s).store({zeros})")
      self.emit("hopper.fence_async_shared()")   # before TMA writes the buffer
      self.events.append(ZeroPadding(f"smem[{self.allocated - 1}]", stored))
    return layout, buffer

  def is_whole(self, ref) -> bool:
    """Whether ``ref`` is an SMEM buffer itself, not a view of one."""
    return ref.whole and not ref.lead

  def whole_view(self, ref) -> str:
    """The text of a whole SMEM buffer read or written by registers or a TMA box of its own
    rank: the buffer's layout may have a lower rank (its other views index the leading
    dimension), and those accesses need a layout of their rank, so the bytes are reinterpreted
    with one."""
    buffer, k = ref.buffer, len(ref.shape)
    if k == buffer.rank:
      return ref.text
    if buffer.wide_rows(k):
      self.unsupported(f"registers reading or writing a whole SMEM buffer of shape "
                       f"{list(buffer.shape)} at once, its other views of rank {buffer.rank}, its "
                       f"rows wider than its {buffer.layout.swizzle}-byte swizzle (read or write "
                       "it slot by slot, smem.at[i])")
    return (f"{ref.text}._reinterpret({ex.dtype_name(buffer.dtype, 'gl')}, {list(buffer.stored)}, "
            f"{self.layout(buffer.seen_with(k))})")

  def smem_name(self, ref: SmemRef) -> str:
    """``smem[k]``: the k-th SMEM buffer allocated."""
    return f"smem[{next(k for k, b in enumerate(self.assignment.buffers) if b is ref.buffer)}]"

  def smem_view(self, ref: SmemRef) -> SmemView:
    return SmemView(self.smem_name(ref), ref.steps)

  def layout_of(self, e) -> L.Layout | None:
    return self.layouts.get(e.name) if isinstance(e, ex.Name) else None

  def descriptor(self, ref: GmemRef, box: tuple, smem_layout: L.Layout) -> str:
    if subbyte.in_bytes(ref.dtype):   # (copies._gmem_bytes sees it as its bytes first)
      raise NotImplementedError(subbyte.UNWRITTEN.format(f"a TMA copy of {ref.origin}", ref.dtype.name))
    strides = ref.strides or tuple(int(np.prod(ref.shape[k + 1:])) for k in range(len(ref.shape)))
    key = (ref.ptr, box, strides)
    itemsize = ref.dtype.itemsize
    for k in range(len(ref.shape) - 1):
      if strides[k] * itemsize % 16:
        raise NotImplementedError(
            f"TMA needs GMEM strides that are multiples of 16 bytes, but {ref.origin} of shape "
            f"{ref.shape} has a stride of {strides[k] * itemsize} bytes")
    _check_padded_box(ref, box)
    padded = L.padded(box)
    if padded[-1] * itemsize < 16 or max(padded) > 256:
      raise NotImplementedError(f"the TMA box {box} of {ref.origin}: at most 256 elements a "
                                "dimension and rows of at least 16 bytes")
    if key not in self.descriptors:
      self._named(smem_layout)   # named with the descriptor
      self.descriptors[key] = Descriptor(self.fresh(f"{ref.ptr}_desc"), ref.ptr, tuple(ref.shape),
                                         strides, padded, smem_layout)
    return self.descriptors[key].name

  def skips(self, eqn) -> bool:
    # Index arithmetic the kernel computes but never uses (a loop's next index, say).
    return not eqn.effects and not any(self.is_used(v) for v in eqn.outvars)

  def unsupported(self, what: str):
    raise NotImplementedError(f"{what}: not supported by the Gluon backend yet")


def _check_padded_box(ref: GmemRef, box: tuple):
  """A TMA box is padded to powers of two (as its SMEM buffer is) only along dimensions it spans
  whole: there the padding lies past the end of the array, where the hardware fills loads with
  zeros and drops stores. Elsewhere it would read or overwrite the next block's data."""
  for d, (b, n) in enumerate(zip(box, ref.shape)):
    if not L.is_pow2(b) and b != n:
      raise NotImplementedError(
          f"copies of {ref.origin}: a TMA box of shape {tuple(box)} over an array of shape "
          f"{tuple(ref.shape)}; Gluon pads the box to {L.padded(box)}, which in dimension {d} "
          f"would reach into the next block. Use blocks whose sizes are powers of two, that "
          "span the whole dimension, or rows that are a sum of powers of two each at least "
          "the SMEM swizzle wide (192 = 128 + 64 bfloat16 columns), copied in pieces")


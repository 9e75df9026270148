"""Property-based tests: pallax's interpreter against a NumPy model of the grid loop.

The model (``simulate``) is the reference semantics of ``pallas_call`` written out
plainly in NumPy:

- programs run one at a time, in row-major order over the grid;
- each program gets one block of every operand: block index from its
  ``index_map`` times the block size; a block that runs past the array's end is
  padded (NaN for floats) on read, and its out-of-range part is dropped on write;
- ``None``/``pl.squeezed`` block dimensions have size 1 and are dropped inside
  the kernel;
- an output block keeps its contents from one program to the next, so a block
  revisited along some grid axis accumulates and later writes win.

Alongside each value the model carries a "shadow" (float64: 0 = defined, NaN =
undefined) computed by running the same NumPy kernel on shadows. Padding of an
integer input and never-written output elements are undefined (their values are
not part of the semantics) and are not compared; padding of a float input is
defined to be NaN and is compared.

Hypothesis draws the layouts: rank 1-3, shapes with 1s and non-powers of two,
block sizes that do not divide the array, blocks larger than the array, size-1
and squeezed block dimensions, grids whose axes are permuted relative to the
array dimensions, index maps of the forms ``i``, ``n-1-i``, ``i//2`` and
constants, and extra grid axes that revisit output blocks.
"""
from __future__ import annotations

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pallax as pl

F32 = np.dtype(np.float32)
I32 = np.dtype(np.int32)
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [F32, I32, BF16]
NAN_PADDING = jax.devices()[0].platform != "gpu"   # kernels run on Triton there
MAX_PROGRAMS = 48

# PALLAX_PROPERTY_EXAMPLES=500 for a longer hunt; the default keeps the file under ~30 s.
SETTINGS = settings(max_examples=int(os.environ.get("PALLAX_PROPERTY_EXAMPLES", 14)), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _is_float(dtype) -> bool:
  return dtype in (F32, BF16) or np.issubdtype(dtype, np.floating)


# --- layouts ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DimMap:
  """How one array dimension's block index follows the grid."""
  kind: str          # "id": i, "rev": n-1-i, "half": i//2, "const": c
  axis: int          # the grid axis (unused for "const")
  n: int             # number of blocks along the dimension
  c: int = 0

  def __call__(self, ids):
    if self.kind == "id":
      return ids[self.axis]
    if self.kind == "rev":
      return self.n - 1 - ids[self.axis]
    if self.kind == "half":
      return ids[self.axis] // 2
    return self.c


def make_index_map(dmaps):
  dmaps = tuple(dmaps)

  def index_map(*ids):
    return tuple(m(ids) for m in dmaps)

  index_map.dmaps = dmaps  # for failure reports
  return index_map


@dataclasses.dataclass
class Layout:
  shape: tuple[int, ...]
  block: tuple          # the block_shape given to BlockSpec (ints, None, pl.squeezed)
  sizes: tuple[int, ...]  # block size per dim (1 for squeezed)
  nblocks: tuple[int, ...]
  grid: tuple[int, ...]
  dim_axis: tuple[int, ...]  # the grid axis that walks dimension d
  mult: tuple[int, ...]      # 1: the axis has nblocks[d] points; 2: 2*nblocks[d] (maps i//2)
  extra_axis: int | None     # a grid axis no dimension uses (its programs revisit blocks)

  @property
  def kernel_shape(self):
    return tuple(b for b, blk in zip(self.sizes, self.block) if _is_int(blk))


def _is_int(b):
  return isinstance(b, (int, np.integer))


@st.composite
def layouts(draw, min_rank=1, max_rank=3):
  rank = draw(st.integers(min_rank, max_rank))
  max_nb = {1: 6, 2: 4, 3: 3}[rank]
  shape, block, sizes, nblocks = [], [], [], []
  for _ in range(rank):
    squeeze = draw(st.integers(0, 5)) == 0
    nb = draw(st.integers(1, max_nb))
    if squeeze:
      b = 1
      blk = draw(st.sampled_from([None, pl.squeezed]))
    else:
      b = draw(st.integers(1, 5))
      blk = b
    # Any size covered by exactly nb blocks: partial last blocks, blocks larger than the array.
    size = draw(st.integers((nb - 1) * b + 1, nb * b))
    shape.append(size)
    block.append(blk)
    sizes.append(b)
    nblocks.append(-(-size // b))
  mult = [draw(st.sampled_from([1, 1, 1, 2])) for _ in range(rank)]
  extra = draw(st.sampled_from([0, 0, 1, 2, 3]))  # size of an extra grid axis (0: none)
  axis_sizes = [nb * m for nb, m in zip(nblocks, mult)]
  # Keep the grid small: drop the doublings and the extra axis when it gets large.
  if math.prod(axis_sizes) * max(extra, 1) > MAX_PROGRAMS:
    mult = [1] * rank
    axis_sizes = list(nblocks)
  if math.prod(axis_sizes) * max(extra, 1) > MAX_PROGRAMS:
    extra = 0
  axes = axis_sizes + ([extra] if extra else [])
  order = draw(st.permutations(range(len(axes))))  # grid axis order: transposes dims to axes
  grid = tuple(axes[o] for o in order)
  dim_axis = tuple(order.index(d) for d in range(rank))
  extra_axis = order.index(rank) if extra else None
  return Layout(tuple(shape), tuple(block), tuple(sizes), tuple(nblocks), grid, dim_axis,
                tuple(mult), extra_axis)


@st.composite
def dim_maps(draw, lay: Layout, dims=None, allow_const=True):
  """An index map for an operand of layout ``lay`` (its own choice of form per dimension)."""
  out = []
  for d in range(len(lay.shape)):
    nb, a = lay.nblocks[d], lay.dim_axis[d]
    kinds = ["id", "rev"] if lay.mult[d] == 1 else ["half"]
    if allow_const:
      kinds = kinds + ["const"]
    if dims is not None and d in dims:
      kinds = dims[d]
    kind = draw(st.sampled_from(kinds))
    c = draw(st.integers(0, nb - 1)) if kind == "const" else 0
    out.append(DimMap(kind, a, nb, c))
  return out


def random_array(rng, shape, dtype):
  if dtype == I32:
    return rng.integers(-1000, 1000, size=shape).astype(np.int32)
  x = rng.standard_normal(size=shape).astype(np.float32) * 4
  return x.astype(dtype)


# --- the NumPy model ------------------------------------------------------------------------

@dataclasses.dataclass
class Operand:
  """An operand of the model: an array, its block dims and index map."""
  value: np.ndarray
  block: tuple       # ints, None or pl.squeezed
  index_map: object
  shadow: np.ndarray | None = None  # outputs: NaN where undefined; None -> all undefined

  @property
  def sizes(self):
    return tuple(b if _is_int(b) else 1 for b in self.block)


def _padded(arr, sizes, fill):
  pads = [(0, -(-s // b) * b - s) for s, b in zip(arr.shape, sizes)]
  if not any(hi for _, hi in pads):
    return arr.copy()
  out = np.full(tuple(s + hi for s, (_, hi) in zip(arr.shape, pads)), fill, arr.dtype)
  out[tuple(slice(0, s) for s in arr.shape)] = arr
  return out


def _block_view(buf, op: Operand, ids):
  idx = op.index_map(*ids)
  sl = tuple(slice(int(i) * b, int(i) * b + b) for i, b in zip(idx, op.sizes))
  view = buf[sl]
  assert view.shape == op.sizes, ("index map out of range", idx, buf.shape, op.sizes)
  kshape = tuple(b for b, blk in zip(op.sizes, op.block) if _is_int(blk))
  out = view.reshape(kshape)
  assert np.shares_memory(out, buf) or out.size == 0
  return out


def simulate(grid, inputs: list[Operand], outputs: list[Operand], kernel, nan_padding=True):
  """Runs ``kernel(ids, in_blocks, out_blocks)`` (NumPy, writes ``out_blocks`` in place) over
  ``grid`` in row-major order. Returns [(value, defined)] per output."""
  in_vals, in_shadows = [], []
  for op in inputs:
    fl = _is_float(op.value.dtype)
    in_vals.append(_padded(op.value, op.sizes, np.nan if fl else 0))
    # The interpreter pads float blocks with NaN, so that padding is defined; integer padding
    # is not, nor is padding without ``nan_padding`` (Pallas leaves its values unspecified).
    in_shadows.append(_padded(np.zeros(op.value.shape), op.sizes,
                              0.0 if fl and nan_padding else np.nan))
  out_vals, out_shadows = [], []
  for op in outputs:
    fl = _is_float(op.value.dtype)
    out_vals.append(_padded(op.value, op.sizes, np.nan if fl else 0))
    sh = np.full(op.value.shape, np.nan) if op.shadow is None else op.shadow
    out_shadows.append(_padded(sh, op.sizes, np.nan))
  for ids in np.ndindex(*grid):
    ids = tuple(int(i) for i in ids)
    for bufs_in, bufs_out in ((in_vals, out_vals), (in_shadows, out_shadows)):
      ins = [_block_view(b, op, ids).copy() for b, op in zip(bufs_in, inputs)]
      outs = [_block_view(b, op, ids) for b, op in zip(bufs_out, outputs)]
      kernel(ids, ins, outs)
  res = []
  for op, v, sh in zip(outputs, out_vals, out_shadows):
    sl = tuple(slice(0, s) for s in op.value.shape)
    res.append((v[sl], ~np.isnan(sh[sl])))
  return res


# --- running pallax -------------------------------------------------------------------------


def run_pallax(kernel, mode, *, grid, inputs, outputs, aliases=None):
  interpret = pl.InterpretParams(parallel=False) if mode == "sequential" else False
  fn = pl.pallas_call(
      kernel,
      out_shape=[jax.ShapeDtypeStruct(o.value.shape, o.value.dtype) for o in outputs],
      grid=grid,
      in_specs=[pl.BlockSpec(op.block, op.index_map) for op in inputs],
      out_specs=[pl.BlockSpec(op.block, op.index_map) for op in outputs],
      input_output_aliases=aliases,
      interpret=interpret)
  args = [jnp.asarray(op.value) for op in inputs]
  if mode == "default-jit":
    fn = jax.jit(fn)
  return [np.asarray(r) for r in fn(*args)]


def assert_matches(actual, expected, defined, dtype, what):
  assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
  assert actual.dtype == expected.dtype, (what, actual.dtype, expected.dtype)
  a, e = actual[defined], expected[defined]
  if _is_float(dtype):
    a, e = a.astype(np.float32), e.astype(np.float32)
    rtol, atol = (1e-6, 1e-6) if dtype == F32 else (1e-2, 1e-2)
    np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)
  else:
    np.testing.assert_array_equal(a, e, err_msg=what)


def _describe(lay, **maps):
  parts = [f"shape={lay.shape}", f"block={lay.block}", f"grid={lay.grid}"]
  for k, v in maps.items():
    parts.append(f"{k}={[(m.kind, m.axis, m.n, m.c) for m in v]}")
  return " ".join(parts)


# --- the properties ---------------------------------------------------------------------------

@SETTINGS
@given(data=st.data(), lay=layouts(), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**32 - 1))
def test_elementwise(data, lay, dtype, seed):
  """o = x*2+1 with independent index maps for x and o (revisits: last write wins)."""
  xm = data.draw(dim_maps(lay), label="x map")
  om = data.draw(dim_maps(lay), label="o map")
  rng = np.random.default_rng(seed)
  x = random_array(rng, lay.shape, dtype)
  x_op = Operand(x, lay.block, make_index_map(xm))
  o_op = Operand(np.zeros(lay.shape, dtype), lay.block, make_index_map(om))

  def np_kernel(ids, ins, outs):
    outs[0][...] = ins[0] * 2 + 1

  [(expected, defined)] = simulate(lay.grid, [x_op], [o_op], np_kernel, NAN_PADDING)

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2 + 1

  what = _describe(lay, x=xm, o=om)
  for mode in data.draw(st.sampled_from([["default", "sequential"], ["default-jit", "sequential"]])):
    [out] = run_pallax(kernel, mode, grid=lay.grid, inputs=[x_op], outputs=[o_op])
    assert_matches(out, expected, defined, dtype, f"{mode} {what}")


@SETTINGS
@given(data=st.data(), lay=layouts(), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**32 - 1))
def test_accumulate(data, lay, dtype, seed):
  """A reduction over blocks of one dimension: its grid axis revisits the output block;
  ``pl.when(program_id(k) == 0)`` initialises it, then ``+=``."""
  d_red = data.draw(st.integers(0, len(lay.shape) - 1), label="reduced dim")
  k = lay.dim_axis[d_red]
  xm = data.draw(dim_maps(lay, dims={d_red: ["id", "rev"] if lay.mult[d_red] == 1 else ["half"]}),
                 label="x map")
  om = data.draw(dim_maps(lay), label="o map")
  om[d_red] = DimMap("const", k, 1, 0)
  out_shape = tuple(lay.sizes[d] if d == d_red else s for d, s in enumerate(lay.shape))
  rng = np.random.default_rng(seed)
  x = random_array(rng, lay.shape, dtype)
  x_op = Operand(x, lay.block, make_index_map(xm))
  o_op = Operand(np.zeros(out_shape, dtype), lay.block, make_index_map(om))

  def np_kernel(ids, ins, outs):
    if ids[k] == 0:
      outs[0][...] = 0
    outs[0][...] = outs[0] + ins[0]

  [(expected, defined)] = simulate(lay.grid, [x_op], [o_op], np_kernel, NAN_PADDING)

  def kernel(x_ref, o_ref):
    @pl.when(pl.program_id(k) == 0)
    def _init():
      o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)

    o_ref[...] += x_ref[...]

  what = _describe(lay, x=xm, o=om) + f" reduce dim {d_red} along grid axis {k}"
  for mode in data.draw(st.sampled_from([["default", "sequential"], ["default-jit", "sequential"]])):
    [out] = run_pallax(kernel, mode, grid=lay.grid, inputs=[x_op], outputs=[o_op])
    assert_matches(out, expected, defined, dtype, f"{mode} {what}")


@SETTINGS
@given(data=st.data(), lay=layouts(), seed=st.integers(0, 2**32 - 1))
def test_program_order(data, lay, seed):
  """Programs write their linear id (last write wins) and fold it into an order-sensitive
  hash kept in an aliased output (every visit of a block, in order)."""
  om = data.draw(dim_maps(lay), label="o map")
  rng = np.random.default_rng(seed)
  grid = lay.grid
  h0 = rng.integers(1, 1000, size=lay.shape).astype(np.int32)
  h_in = Operand(h0, lay.block, make_index_map(om))
  last = Operand(np.zeros(lay.shape, np.int32), lay.block, make_index_map(om))
  hist = Operand(h0, lay.block, make_index_map(om), shadow=np.zeros(lay.shape))
  P = 1000003

  def linear(ids):
    q = 0
    for i, g in zip(ids, grid):
      q = q * g + i
    return q

  def np_kernel(ids, ins, outs):
    q = linear(ids)
    outs[0][...] = q
    outs[1][...] = (outs[1] * 7 + q + 1) % P

  expected = simulate(grid, [h_in], [last, hist], np_kernel)

  def kernel(h_ref, last_ref, hist_ref):
    q = jnp.int32(0)
    for a in range(len(grid)):
      q = q * pl.num_programs(a) + pl.program_id(a)
    last_ref[...] = jnp.full(last_ref.shape, q, jnp.int32)
    hist_ref[...] = (hist_ref[...] * 7 + q + 1) % P

  what = _describe(lay, o=om)
  for mode in data.draw(st.sampled_from([["default", "sequential"], ["default-jit", "sequential"]])):
    outs = run_pallax(kernel, mode, grid=grid, inputs=[h_in], outputs=[last, hist], aliases={0: 1})
    for name, out, (e, defined) in zip(["last", "hist"], outs, expected):
      assert_matches(out, e, defined, I32, f"{mode} {name} {what}")


@pytest.mark.interpreter
@SETTINGS
@given(data=st.data(), lay=layouts(), dtype=st.sampled_from([F32, BF16]),
       seed=st.integers(0, 2**32 - 1))
def test_padding_is_nan(data, lay, dtype, seed):
  """Each program copies its whole input block (padding included) and ``jnp.isnan`` of it
  into its own slot of two outputs: the padding of a partial edge block reads as NaN."""
  xm = data.draw(dim_maps(lay), label="x map")
  rng = np.random.default_rng(seed)
  x = random_array(rng, lay.shape, dtype)
  g = len(lay.grid)
  kshape = lay.kernel_shape
  out_block = (None,) * g + kshape
  out_map = make_index_map([DimMap("id", a, lay.grid[a]) for a in range(g)]
                           + [DimMap("const", 0, 1, 0)] * len(kshape))
  x_op = Operand(x, lay.block, make_index_map(xm))
  nan_op = Operand(np.zeros(lay.grid + kshape, np.int32), out_block, out_map)
  val_op = Operand(np.zeros(lay.grid + kshape, dtype), out_block, out_map)

  def np_kernel(ids, ins, outs):
    outs[0][...] = np.isnan(ins[0])
    outs[1][...] = ins[0]

  expected = simulate(lay.grid, [x_op], [nan_op, val_op], np_kernel)
  # Every slot is written exactly once and the padding is NaN: everything is defined.
  assert all(d.all() for _, d in expected)

  def kernel(x_ref, nan_ref, val_ref):
    x = x_ref[...]
    nan_ref[...] = jnp.isnan(x).astype(jnp.int32)
    val_ref[...] = x

  what = _describe(lay, x=xm)
  for mode in data.draw(st.sampled_from([["default", "sequential"], ["default-jit", "sequential"]])):
    outs = run_pallax(kernel, mode, grid=lay.grid, inputs=[x_op], outputs=[nan_op, val_op])
    assert_matches(outs[0], expected[0][0], expected[0][1], I32, f"{mode} isnan {what}")
    assert_matches(outs[1], expected[1][0], expected[1][1], dtype, f"{mode} values {what}")


# --- a few fixed cases of the model itself (so a model bug cannot hide a pallax bug) -----------

def test_model_padding_and_revisit():
  x = np.arange(5, dtype=np.float32)
  x_op = Operand(x, (2,), make_index_map([DimMap("id", 0, 3)]))
  out = Operand(np.zeros((3, 2), np.float32), (None, 2),
                make_index_map([DimMap("id", 0, 3), DimMap("const", 0, 1)]))

  def copy(ids, ins, outs):
    outs[0][...] = ins[0]

  [(v, d)] = simulate((3,), [x_op], [out], copy)
  np.testing.assert_array_equal(v, [[0, 1], [2, 3], [4, np.nan]])
  assert d.all()
  o2 = Operand(np.zeros((2,), np.float32), (2,), make_index_map([DimMap("const", 0, 1)]))
  [(v, d)] = simulate((3,), [x_op], [o2], copy)
  np.testing.assert_array_equal(v, [4, np.nan])  # the last program wins

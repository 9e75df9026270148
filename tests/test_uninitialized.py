"""Uninitialized data in the interpreter (issue 30, point 1).

Where checks are on (pl.enable_debug_checks() or InterpretParams(check_uninitialized=True)):
- A grid that does not cover an output: a ValueError (a free, static check).
- A value computed from output or scratch elements no program wrote, and output elements no
  program writes, are KernelCheckErrors, in pallas_call kernels and in Mosaic GPU kernels, for
  float, integer and bool outputs, eagerly and under jax.jit.
- No false alarm: accumulators initialized under pl.when, padded edge blocks, masked loads,
  input_output_aliases, and every kernel of tests/kernel_corpus.py (with the checks on, each
  gives bit for bit the result it gives without them).

The suite's other kernels (JAX's GPU ops, the Mosaic GPU kernels) run with the checks on with
PALLAX_TEST_UNINIT=1 (conftest.py), e.g.
  PALLAX_TEST_UNINIT=1 pytest tests/test_jax_gpu_ops.py tests/test_mosaic_gpu*.py
"""
import re
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax as pl
import pallax.mosaic_gpu as plgpu
from helpers import rand

import kernel_corpus as kc

pytestmark = pytest.mark.interpreter

S = jax.ShapeDtypeStruct
CHECKED = pl.InterpretParams(check_uninitialized=True)


def first_line(e) -> str:
  return str(e.value).splitlines()[0]


def this_line(fn, needle) -> str:
  import inspect
  lines, start = inspect.getsourcelines(fn)
  k = next(k for k, l in enumerate(lines) if needle in l)
  return f"{inspect.getsourcefile(fn)}:{start + k}"


# --- the grid does not cover an output (static) ----------------------------------------------------

def _add(x_ref, y_ref, o_ref):
  o_ref[...] = x_ref[...] + y_ref[...]


def _add_call(n, block, grid):
  spec = pl.BlockSpec((block,), lambda i: (i,))
  return pl.pallas_call(_add, out_shape=S((n,), jnp.float32), grid=grid, in_specs=[spec, spec],
                        out_specs=spec, interpret=True)


@pytest.mark.parametrize("n,block,grid,missing,region", [
    (3000, 1024, (3000 // 1024,), 952, "[2048:3000]"),    # the README's example at n = 3000
    (1000, 300, (1000 // 300,), 100, "[900:1000]"),
    (7, 2, (1,), 5, "[2:7]"),
])
def test_grid_short_of_the_output_is_an_error(n, block, grid, missing, region):
  x, y = rand((n,)), rand((n,), salt="y")
  with pl.enable_debug_checks(), pytest.raises(ValueError) as e:
    _add_call(n, block, grid)(x, y)
  assert first_line(e) == (
      f"pallas_call _add: no program writes {missing} of the {n} elements of out[0] (shape "
      f"({n},), blocks ({block},)), within {region}: no block index of its index_map over the "
      f"grid {grid} reaches them, so they would come back as poison (on a GPU, whatever the "
      f"memory held); if the grid runs over dimension 0 of out[0], give it pl.cdiv({n}, "
      f"{block}) = {-(-n // block)} programs along that axis, not {n} // {block} = {n // block}")


def test_grid_short_along_the_second_dimension():
  x = rand((6, 10))
  f = pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2),
                     out_shape=S((6, 10), jnp.float32), grid=(2, 2),
                     in_specs=[pl.BlockSpec((3, 4), lambda i, j: (i, j))],
                     out_specs=pl.BlockSpec((3, 4), lambda i, j: (i, j)), interpret=CHECKED)
  with pytest.raises(ValueError, match=re.escape("no program writes 12 of the 60 elements of "
                                                 "out[0] (shape (6, 10), blocks (3, 4)), within "
                                                 "[0:6, 8:10]") + ".*pl.cdiv\\(10, 4\\) = 3"):
    f(x)


def test_a_whole_block_left_alone_is_an_error_only_with_checks_on():
  # JAX Pallas allows an index map that never reaches a (whole) block; the checks flag it.
  x = rand((2, 8))
  f = pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + 1),
                     out_shape=S((2, 8), jnp.float32), grid=(2,),
                     in_specs=[pl.BlockSpec((1, 8), lambda i: (0, 0))],
                     out_specs=pl.BlockSpec((1, 8), lambda i: (0, 0)), interpret=True)
  out = np.asarray(f(x))
  np.testing.assert_array_equal(out[0], x[0] + 1)
  assert np.isnan(out[1]).all()   # the poison, as JAX Pallas's interpreter leaves it
  with pl.enable_debug_checks(), pytest.raises(
      ValueError, match=re.escape("no program writes 8 of the 16 elements of out[0]")):
    f(x)


def test_grid_short_of_the_output_by_default_gives_poison():
  """Off by default (see uninit.py): the elements no program writes come back as NaN."""
  n, block = 3000, 1024
  x, y = rand((n,)), rand((n,), salt="y")
  out = np.asarray(_add_call(n, block, (n // block,))(x, y))
  np.testing.assert_allclose(out[:2048], (x + y)[:2048], rtol=0, atol=0)
  assert np.isnan(out[2048:]).all()


@pytest.mark.parametrize("n,block", [(3000, 1024), (1000, 300), (1, 1), (5, 8)])
def test_a_grid_from_cdiv_covers_the_output(n, block):
  x, y = rand((n,)), rand((n,), salt="y")
  with pl.enable_debug_checks():
    out = _add_call(n, block, (pl.cdiv(n, block),))(x, y)
  np.testing.assert_allclose(out, x + y, rtol=0, atol=0)


def test_an_aliased_output_need_not_be_covered():
  x = rand((16,))

  def k(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 3

  f = pl.pallas_call(k, out_shape=S((16,), jnp.float32), grid=(1,),
                     in_specs=[pl.BlockSpec((8,), lambda i: (i,))],
                     out_specs=pl.BlockSpec((8,), lambda i: (i,)), input_output_aliases={0: 0},
                     interpret=CHECKED)
  out = f(x)
  np.testing.assert_allclose(out, np.concatenate([x[:8] * 3, x[8:]]), rtol=0, atol=0)


# --- reading what no program wrote (dynamic, checks on) ----------------------------------------

DTYPES = [np.float32, jnp.bfloat16, np.int32, np.int8, np.bool_]


def _accumulate(x_ref, o_ref):
  o_ref[...] = o_ref[...] ^ x_ref[...] if o_ref.dtype == jnp.bool_ else o_ref[...] + x_ref[...]


def _acc_call(dtype, interpret, grid=(1,)):
  spec = pl.BlockSpec((8,), lambda i: (i,))
  return pl.pallas_call(_accumulate, out_shape=S((8 * grid[0],), dtype), grid=grid,
                        in_specs=[spec], out_specs=spec, interpret=interpret)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("how", ["debug_checks", "InterpretParams", "jit"])
def test_accumulating_into_an_uninitialized_output(dtype, how):
  x = rand((16,), dtype)
  f = _acc_call(dtype, True if how != "InterpretParams" else CHECKED, grid=(2,))
  if how == "jit":
    f = jax.jit(f)
  with pl.enable_debug_checks(how != "InterpretParams"), pytest.raises(pl.KernelCheckError) as e:
    jax.block_until_ready(f(x))
  # Programs evaluated together report one of them (here both break the rule). For bools,
  # o ^ False keeps the poison as it was: such an element counts as not written (yet).
  assert re.fullmatch(re.escape("pallas_call _accumulate: program (") + "[01]" + re.escape(
      ") stores into out[0] a value computed from output or scratch elements that no program "
      "wrote (the first such element of its block: flat offset ") + r"\d" + re.escape(
      "); the kernel reads out[0] at "
      f"{this_line(_accumulate, 'o_ref[...] ^')} (_accumulate). Write those elements before "
      "reading them, e.g. initialize an accumulator under @pl.when(pl.program_id(...) == 0)"),
      first_line(e))


@pytest.mark.parametrize("dtype", [np.float32, np.int32], ids=lambda d: np.dtype(d).name)
def test_checks_are_off_by_default(dtype):
  """The default: no error, and the result shows the poison it was computed from."""
  x = rand((8,), dtype)
  out = np.asarray(_acc_call(dtype, True)(x))
  if dtype == np.float32:
    assert np.isnan(out).all()
  else:
    np.testing.assert_array_equal(out, (np.iinfo(np.int32).min + x.astype(np.int64)).astype(np.int32))


def test_reading_uninitialized_scratch():
  def k(x_ref, o_ref, acc_ref):
    acc_ref[...] += x_ref[...]
    o_ref[...] = acc_ref[...]

  f = pl.pallas_call(k, out_shape=S((4, 8), jnp.float32), grid=(4,),
                     in_specs=[pl.BlockSpec((None, 8), lambda i: (i, 0))],
                     out_specs=pl.BlockSpec((None, 8), lambda i: (i, 0)),
                     scratch_shapes=[pl.MemoryRef((8,), jnp.float32)], interpret=CHECKED)
  with pytest.raises(pl.KernelCheckError) as e:
    f(rand((4, 8)))
  assert re.match(r"pallas_call k: program \(\d\) stores into out\[0\] a value computed from "
                  "output or scratch elements that no program wrote", first_line(e))
  assert f"the kernel reads scratch[0] at {this_line(k, 'acc_ref[...] +=')} ({k.__qualname__})" \
      in first_line(e)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_], ids=lambda d: np.dtype(d).name)
def test_reading_uninitialized_run_scoped_scratch(dtype):
  def k(x_ref, o_ref):
    def body(tmp_ref):
      o_ref[...] = x_ref[...] != tmp_ref[...] if dtype == np.bool_ else x_ref[...] + tmp_ref[...]
    pl.run_scoped(body, pl.MemoryRef((8,), dtype))

  f = pl.pallas_call(k, out_shape=S((3, 8), dtype), grid=(3,),
                     in_specs=[pl.BlockSpec((None, 8), lambda i: (i, 0))],
                     out_specs=pl.BlockSpec((None, 8), lambda i: (i, 0)), interpret=CHECKED)
  with pytest.raises(pl.KernelCheckError) as e:
    f(rand((3, 8), dtype))
  assert re.match(r"pallas_call k: program \(\d\) stores into out\[0\] a value computed from "
                  "output or scratch elements that no program wrote", first_line(e))
  assert f"the kernel reads scoped scratch tmp_ref at {this_line(k, '!= tmp_ref')} " in first_line(e)


def test_run_scoped_scratch_written_first_passes():
  x = rand((3, 8))

  def k(x_ref, o_ref):
    def body(tmp_ref):
      tmp_ref[...] = x_ref[...] * 2.0
      o_ref[...] = tmp_ref[...] + 1.0
    pl.run_scoped(body, pl.MemoryRef((8,), jnp.float32))

  f = pl.pallas_call(k, out_shape=S((3, 8), jnp.float32), grid=(3,),
                     in_specs=[pl.BlockSpec((None, 8), lambda i: (i, 0))],
                     out_specs=pl.BlockSpec((None, 8), lambda i: (i, 0)), interpret=CHECKED)
  np.testing.assert_allclose(f(x), x * 2.0 + 1.0, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_output_elements_no_program_writes(dtype):
  x = rand((16,), dtype)

  def k(x_ref, o_ref):
    @pl.when(pl.program_id(0) == 0)
    def _():
      o_ref[...] = x_ref[...]

  spec = pl.BlockSpec((8,), lambda i: (i,))
  f = pl.pallas_call(k, out_shape=S((16,), dtype), grid=(2,), in_specs=[spec], out_specs=spec,
                     interpret=CHECKED)
  with pytest.raises(pl.KernelCheckError) as e:
    f(x)
  assert first_line(e).startswith(
      "pallas_call k: no program wrote 8 of the 16 elements of out[0] (shape (16,)), within "
      "[8:16] (the smallest box holding them): out[0] would return poison there")


def test_a_store_of_part_of_each_block():
  x = rand((6, 8))

  def k(x_ref, o_ref):
    o_ref[:, :5] = x_ref[:, :5]

  spec = pl.BlockSpec((3, 8), lambda i: (i, 0))
  f = jax.jit(pl.pallas_call(k, out_shape=S((6, 8), jnp.float32), grid=(2,), in_specs=[spec],
                             out_specs=spec, interpret=CHECKED))
  with pytest.raises(pl.KernelCheckError, match=re.escape(
      "no program wrote 18 of the 48 elements of out[0] (shape (6, 8)), within [0:6, 5:8]")):
    jax.block_until_ready(f(x))


# --- no false alarms ---------------------------------------------------------------------------

def _matmul_k_in_grid(x_ref, y_ref, o_ref):
  @pl.when(pl.program_id(2) == 0)
  def _():
    o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)
  o_ref[...] += jnp.dot(x_ref[...], y_ref[...])


@pytest.mark.parametrize("parallel", [True, False])
def test_accumulator_initialized_under_when(parallel):
  x, y = rand((48, 40)), rand((40, 24), salt="y")
  f = pl.pallas_call(_matmul_k_in_grid, out_shape=S((48, 24), jnp.float32), grid=(3, 2, 5),
                     in_specs=[pl.BlockSpec((16, 8), lambda i, j, k: (i, k)),
                               pl.BlockSpec((8, 12), lambda i, j, k: (k, j))],
                     out_specs=pl.BlockSpec((16, 12), lambda i, j, k: (i, j)),
                     interpret=pl.InterpretParams(check_uninitialized=True, parallel=parallel))
  np.testing.assert_allclose(f(x, y), x @ y, rtol=1e-5, atol=1e-5)


def test_scratch_accumulator_initialized_under_when():
  x = rand((4, 6, 8))

  def k(x_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(1) == 0)
    def _():
      acc_ref[...] = jnp.zeros(acc_ref.shape, acc_ref.dtype)
    acc_ref[...] += x_ref[...]

    @pl.when(pl.program_id(1) == pl.num_programs(1) - 1)
    def _():
      o_ref[...] = acc_ref[...]

  f = pl.pallas_call(k, out_shape=S((4, 8), jnp.float32), grid=(4, 6),
                     in_specs=[pl.BlockSpec((None, None, 8), lambda i, j: (i, j, 0))],
                     out_specs=pl.BlockSpec((None, 8), lambda i, j: (i, 0)),
                     scratch_shapes=[pl.MemoryRef((8,), jnp.float32)], interpret=CHECKED)
  np.testing.assert_allclose(f(x), x.sum(1), rtol=1e-5, atol=1e-5)


def test_padded_edge_blocks_and_masked_reads_of_the_output():
  """Blocks of 8 over 13 elements: the last block's padding is read and dropped; the kernel reads
  back the part of its output it wrote, with a mask."""
  x = rand((13,))

  def k(x_ref, o_ref):
    o_ref[:4] = x_ref[:4] * 2
    idx = jnp.arange(8)
    back = pl.load(o_ref, (pl.ds(0, 8),), mask=idx < 4, other=0.0)
    o_ref[4:] = x_ref[4:] + back[:4]

  spec = pl.BlockSpec((8,), lambda i: (i,))
  out = pl.pallas_call(k, out_shape=S((13,), jnp.float32), grid=(2,), in_specs=[spec],
                       out_specs=spec, interpret=CHECKED)(x)
  want = np.concatenate([x[:4] * 2, x[4:8] + x[:4] * 2, x[8:12] * 2, x[12:13] + x[8:9] * 2])
  np.testing.assert_allclose(out, want, rtol=1e-6, atol=0)


def test_reading_and_dropping_uninitialized_elements_is_fine():
  x = rand((8,))

  def k(x_ref, o_ref):
    o_ref[...] = jnp.where(x_ref[...] > 100, o_ref[...], x_ref[...])   # never takes o_ref's

  out = pl.pallas_call(k, out_shape=S((8,), jnp.float32), interpret=CHECKED)(x)
  np.testing.assert_allclose(out, x, rtol=0, atol=0)


def test_aliased_output_starts_initialized():
  x, y = rand((16,)), rand((16,), salt="y")

  def k(x_ref, y_ref, o_ref):
    o_ref[...] += y_ref[...]

  spec = pl.BlockSpec((8,), lambda i: (i,))
  f = pl.pallas_call(k, out_shape=S((16,), jnp.float32), grid=(2,), in_specs=[spec, spec],
                     out_specs=spec, input_output_aliases={0: 0}, interpret=CHECKED)
  np.testing.assert_allclose(f(x, y), x + y, rtol=1e-6, atol=0)


@pytest.mark.parametrize("case", kc.CASES, ids=lambda c: c.name)
def test_corpus_kernels_pass_the_checks(case):
  """Every kernel of the corpus, with the checks on, gives bit for bit its unchecked result;
  the two that leave an output unwritten on purpose (for the code generators) are reported."""
  args = case.args(jax.random.key(zlib.crc32(case.name.encode())))
  plain = case.build(True)(*args)
  if case.unwritten:
    with pl.enable_debug_checks(), pytest.raises(pl.KernelCheckError, match=re.escape(
        f"no program wrote 8 of the 8 elements of {case.unwritten} (shape (8,))")):
      jax.block_until_ready(case.build(True)(*args))
    return
  with pl.enable_debug_checks():
    checked = case.build(True)(*args)
  for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(checked)):
    np.testing.assert_array_equal(bits(a), bits(b))


def bits(x):
  """The bit patterns of ``x`` (NaNs of the narrow float types compare by them)."""
  x = np.asarray(x)
  if x.dtype.kind in "fcV" or "float" in x.dtype.name:
    return x.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64, 16: np.uint64}[
        x.dtype.itemsize])
  return x


# --- Mosaic GPU kernels (the eager interpreter) --------------------------------------------------

def _tma_round_trip(x, copy_in=True, copy_rows=None):
  rows = copy_rows or x.shape[0]

  @plgpu.kernel(out_shape=S(x.shape, x.dtype),
                scratch_shapes=[plgpu.SMEM(x.shape, x.dtype), plgpu.Barrier()], interpret=True)
  def k(x_gmem, o_gmem, x_smem, bar):
    if copy_in:
      plgpu.copy_gmem_to_smem(x_gmem, x_smem, bar)
      plgpu.barrier_wait(bar)
    x_smem[...] = x_smem[...] * 2          # <- the load
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(x_smem.at[:rows], o_gmem.at[:rows])
    plgpu.wait_smem_to_gmem(0)

  return k(x)


def test_mosaic_gpu_round_trip_passes_the_checks():
  x = rand((64, 32))
  with pl.enable_debug_checks():
    out = _tma_round_trip(x)
  np.testing.assert_allclose(out, x * 2, rtol=0, atol=0)


@pytest.mark.parametrize("jit", [False, True])
def test_mosaic_gpu_load_of_smem_nothing_wrote(jit):
  x = rand((64, 32))
  run = jax.jit(lambda x: _tma_round_trip(x, copy_in=False)) if jit else \
      (lambda x: _tma_round_trip(x, copy_in=False))
  with pl.enable_debug_checks(), pytest.raises(pl.KernelCheckError) as e:
    jax.block_until_ready(run(x))
  assert first_line(e) == (
      f"k: the kernel of block (0) at {this_line(_tma_round_trip, '<- the load')} "
      "(_tma_round_trip.<locals>.k): a load "
      "reads SMEM x_smem where nothing wrote it (element (0, 0) of a view of shape (64, 32); 2048 "
      "such elements): its value is undefined (poison here, whatever the memory held on a GPU). "
      "Write or copy into it first")


@pytest.mark.parametrize("dtype", [np.float32, np.int32], ids=lambda d: np.dtype(d).name)
def test_mosaic_gpu_output_rows_nothing_copies(dtype):
  x = rand((64, 32), dtype)
  with pl.enable_debug_checks(), pytest.raises(pl.KernelCheckError) as e:
    _tma_round_trip(x, copy_rows=48)
  assert first_line(e).startswith(
      "k: nothing wrote 512 of the 2048 elements of out[0] (shape (64, 32)), within [48:64, 0:32] "
      "(the smallest box holding them)")


def test_mosaic_gpu_copy_of_uninitialized_smem_leaves_the_output_uninitialized():
  x = rand((64, 32))

  @plgpu.kernel(out_shape=S(x.shape, x.dtype), scratch_shapes=[plgpu.SMEM(x.shape, x.dtype)],
                interpret=True)
  def k(x_gmem, o_gmem, x_smem):
    x_smem[:32] = x_gmem[:32]
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(x_smem, o_gmem)
    plgpu.wait_smem_to_gmem(0)

  with pl.enable_debug_checks(), pytest.raises(pl.KernelCheckError, match=re.escape(
      "k: nothing wrote 1024 of the 2048 elements of out[0] (shape (64, 32)), within [32:64, 0:32]")):
    k(x)

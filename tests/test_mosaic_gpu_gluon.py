"""The Gluon backend for one-warpgroup Mosaic GPU kernels: generated kernels and sm_90a PTX on any
machine (``plgpu.lower``), and on a Hopper GPU the same results as the interpreter. What a kernel
does is checked through the data the backend records (``gluon/events.py``: copies, barriers,
accesses per thread; the SMEM buffers and layouts), not through the names it generates."""
import functools

import jax
import jax.numpy as jnp
import numpy as np

import pytest
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu
from pallax._src.gluon import events as ev
from pallax._src.gluon import layouts as L

from helpers import unused_definitions

BLOCK = 64


def events(k, *kinds, thread: int = 0) -> list:
  """The operations of thread ``thread`` of compiled kernel ``k`` of the given event classes."""
  return [e for e in k.generated.partitions[thread].events if not kinds or isinstance(e, kinds)]


def _scale_rows(x_ref, o_ref, smem, bar):
  """TMA in, registers, TMA out: one 64-row block a program."""
  i = lax.axis_index("m")
  plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(i * BLOCK, BLOCK)], smem, bar)
  plgpu.barrier_wait(bar)
  smem[...] = smem[...] * 2 + 1
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(smem, o_ref.at[pl.ds(i * BLOCK, BLOCK)])
  plgpu.wait_smem_to_gmem(0)


def scale_rows(x, interpret=False):
  return plgpu.kernel(
      _scale_rows, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(pl.cdiv(x.shape[0], BLOCK),),
      grid_names=("m",), scratch_types=[plgpu.SMEM((BLOCK, x.shape[1]), x.dtype), plgpu.Barrier()],
      interpret=interpret)(x)


def _matmul(a_ref, b_ref, o_ref, a_smem, b_smem, o_smem, bar):
  """A K loop of TMA copies and wgmmas into an accumulator; one 64x64 output tile a program."""
  m, n = lax.axis_index("m"), lax.axis_index("n")

  def scope(acc_ref):
    def step(k, _):
      plgpu.copy_gmem_to_smem(a_ref.at[pl.ds(m * BLOCK, BLOCK), pl.ds(k * BLOCK, BLOCK)], a_smem, bar)
      plgpu.copy_gmem_to_smem(b_ref.at[pl.ds(k * BLOCK, BLOCK), pl.ds(n * BLOCK, BLOCK)], b_smem, bar)
      plgpu.barrier_wait(bar)
      plgpu.wgmma(acc_ref, a_smem, b_smem)
      plgpu.wgmma_wait(0)
    lax.fori_loop(0, pl.cdiv(a_ref.shape[1], BLOCK), step, None)
    o_smem[...] = acc_ref[...].astype(o_smem.dtype)

  pl.run_scoped(scope, plgpu.ACC((BLOCK, BLOCK)))
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(o_smem, o_ref.at[pl.ds(m * BLOCK, BLOCK), pl.ds(n * BLOCK, BLOCK)])
  plgpu.wait_smem_to_gmem(0)


def matmul(a, b, interpret=False):
  (m, _), (_, n) = a.shape, b.shape
  tile = lambda: plgpu.SMEM((BLOCK, BLOCK), a.dtype)
  return plgpu.kernel(
      _matmul, out_type=jax.ShapeDtypeStruct((m, n), a.dtype),
      grid=(pl.cdiv(m, BLOCK), pl.cdiv(n, BLOCK)), grid_names=("m", "n"),
      scratch_types=[tile(), tile(), tile(), plgpu.Barrier(num_arrivals=2)], interpret=interpret)(a, b)


PTX_MUST_HAVE = ("cp.async.bulk.tensor", "mbarrier.try_wait.parity", "fence.proxy.async")


def test_lowers_to_sm90a_ptx_without_a_gpu():
  x = jax.ShapeDtypeStruct((192, 64), jnp.float16)
  (k,) = plgpu.lower(scale_rows, x)
  assert ".target sm_90a" in k.ptx and all(s in k.ptx for s in PTX_MUST_HAVE)
  # TMA in (one box of the whole buffer), a wait, registers, TMA out.
  whole = ev.SmemView("smem[0]")
  assert [type(e).__name__ for e in events(k)] == ["BarrierOp", "Copy", "BarrierOp", "Access", "Access", "Copy"]
  expect, copy_in, wait, load, store, copy_out = events(k)
  assert (expect.kind, expect.barrier, expect.nbytes) == ("expect", "barrier[0]", BLOCK * 64 * 2)
  assert (copy_in.direction, copy_in.gmem, copy_in.smem, copy_in.box) == ("in", "args[0]", whole, (BLOCK, 64))
  assert (wait.kind, wait.barrier) == ("wait", "barrier[0]")
  assert (load.kind, load.ref, store.kind, store.ref) == ("load", whole, "store", whole)
  assert (copy_out.direction, copy_out.gmem, copy_out.box) == ("out", "out[0]", (BLOCK, 64))
  assert "test_mosaic_gpu_gluon.py" in k.source   # comments name the kernel's lines
  assert k.num_warps == 4 and k.shared_mem_bytes >= BLOCK * 64 * 2
  a = jax.ShapeDtypeStruct((128, 192), jnp.bfloat16)
  b = jax.ShapeDtypeStruct((192, 128), jnp.bfloat16)
  (k,) = plgpu.lower(matmul, a, b)
  assert "wgmma.mma_async" in k.ptx and all(s in k.ptx for s in PTX_MUST_HAVE)


def _scratch_in_a_loop(o_ref, *, barrier: bool, steps: int = 2):
  """Two threads; a loop of ``steps`` steps, each entering a scope shared by the threads (an
  SMEM buffer, and a barrier if asked) that thread 0 fills with its step number and adds up."""
  def step(k, _):
    def scope(smem, *bar):
      @pl.when(lax.axis_index("wg") == 0)
      def _():
        smem[...] = jnp.full(smem.shape, k, smem.dtype)
        o_ref[...] = smem[...] + o_ref[...]
    pl.run_scoped(scope, plgpu.SMEM((128,), jnp.float32),
                  *([plgpu.Barrier(num_arrivals=2)] if barrier else []), collective_axes="wg")
  @pl.when(lax.axis_index("wg") == 0)
  def _():
    o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)
  lax.fori_loop(0, steps, step, None)


@pytest.mark.parametrize("barrier", [False, True])
def test_collective_scratch_inside_a_loop(barrier):
  """A scope shared by the threads inside a loop takes the same SMEM at every entry (what a stack
  gives it); one holding barriers, in a loop of a few steps, is written out step by step so that
  each step has fresh barriers. In the interpreter (the suite also lowers it to Gluon): 0 + 1 in
  every element."""
  f = plgpu.kernel(functools.partial(_scratch_in_a_loop, barrier=barrier), interpret=True,
                   out_type=jax.ShapeDtypeStruct((128,), jnp.float32), num_threads=2,
                   thread_name="wg")
  np.testing.assert_array_equal(np.asarray(f()), np.ones(128, np.float32))


def test_what_the_gluon_backend_cannot_express_says_so():
  f = plgpu.kernel(functools.partial(_scratch_in_a_loop, barrier=True, steps=9),
                   out_type=jax.ShapeDtypeStruct((128,), jnp.float32), num_threads=2,
                   thread_name="wg")
  with pytest.raises(NotImplementedError, match="barriers shared by the threads.*a loop enters "
                                                "more than once.*interpret=True"):
    plgpu.lower(f)

  def dynamic_smem_slice(o_ref, smem):   # (slices of a power-of-two size lower: test_gluon_gaps)
    smem[...] = jnp.zeros(smem.shape, smem.dtype)
    o_ref[...] = smem[pl.ds(lax.axis_index("m") * 8, 8, stride=2), :]
  g = plgpu.kernel(dynamic_smem_slice, out_type=jax.ShapeDtypeStruct((8, 64), jnp.float32),
                   grid=(2,), grid_names=("m",), scratch_types=[plgpu.SMEM((16, 64), jnp.float32)])
  with pytest.raises(NotImplementedError, match="dynamic or strided slices of SMEM.*interpret=True"):
    plgpu.lower(g)


def _rows(x_ref, o_ref, smem, bar):
  """Blocks of ``smem.shape[0]`` rows through SMEM and back."""
  i, rows = lax.axis_index("m"), smem.shape[0]
  plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(i * rows, rows)], smem, bar)
  plgpu.barrier_wait(bar)
  plgpu.copy_smem_to_gmem(smem, o_ref.at[pl.ds(i * rows, rows)])
  plgpu.wait_smem_to_gmem(0)


def copy_rows(x, rows):
  return plgpu.kernel(_rows, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0] // rows,),
                      grid_names=("m",), scratch_types=[plgpu.SMEM((rows, x.shape[1]), x.dtype),
                                                        plgpu.Barrier()])(x)


def test_shapes_that_are_not_powers_of_two_are_padded():
  """A box spanning a whole dimension of 48 is padded to 64 (past the array's end, where TMA
  fills zeros and drops stores); a block of 24 rows of 96 cannot be (its padding would be the
  next block's rows): it is copied as boxes of 16 and 8 rows. Blocks of 20 rows would need a
  box of 4 rows inside a swizzle pattern, which Gluon cannot slice: an error."""
  (k,) = plgpu.lower(copy_rows, jax.ShapeDtypeStruct((128, 48), jnp.float16), rows=64)
  (buffer,) = k.generated.buffers
  assert (buffer.shape, buffer.stored) == ((64, 48), (64, 64))
  (expect,) = events(k, ev.BarrierOp)[:1]
  assert expect.nbytes == 64 * 64 * 2   # the padded box's bytes
  (k,) = plgpu.lower(copy_rows, jax.ShapeDtypeStruct((96, 48), jnp.float16), rows=24)
  assert events(k, ev.BarrierOp)[0].nbytes == (16 + 8) * 64 * 2
  for direction in ("in", "out"):
    copies = [e for e in events(k, ev.Copy) if e.direction == direction]
    assert [(c.box, c.smem.steps) for c in copies] == [
        ((16, 64), (("slice", 0, 16, 0),)), ((8, 64), (("slice", 16, 8, 0),))]
  with pytest.raises(NotImplementedError, match=r"pads the box to \(32, 64\).*dimension 0.*next block"):
    plgpu.lower(copy_rows, jax.ShapeDtypeStruct((80, 48), jnp.float16), rows=20)


def test_tma_rules_are_checked_when_lowering():
  a = jax.ShapeDtypeStruct((100, 70), jnp.float16)   # rows of 140 bytes: TMA cannot address them
  b = jax.ShapeDtypeStruct((70, 128), jnp.float16)
  with pytest.raises(NotImplementedError, match="multiples of 16 bytes.*140 bytes"):
    plgpu.lower(matmul, a, b)


def test_wgmma_operands_are_sliced_inside_a_swizzle_atom_along_k_only():
  # b is (K, N) = (64, 128) with a 128-byte swizzle (atoms of 64 columns): a slice of N inside
  # an atom is no step of wgmma's K, and is refused; slices of K (a's columns) are lowered.
  def kernel(a_ref, b_ref, o_ref, a_smem, b_smem, bar, n0, n, k0):
    plgpu.copy_gmem_to_smem(a_ref, a_smem, bar)
    plgpu.copy_gmem_to_smem(b_ref, b_smem, bar)
    plgpu.barrier_wait(bar)

    def compute(acc):
      plgpu.wgmma(acc, a_smem.at[:, pl.ds(k0, 16)], b_smem.at[pl.ds(k0, 16), pl.ds(n0, n)])
      plgpu.wgmma_wait(0)
      return acc[...]
    o_ref[...] = pl.run_scoped(compute, plgpu.ACC((64, n)))

  def lower(n0, n, k0):
    f = plgpu.kernel(functools.partial(kernel, n0=n0, n=n, k0=k0),
                     out_shape=jax.ShapeDtypeStruct((64, n), jnp.float32),
                     scratch_shapes=[plgpu.SMEM((64, 64), jnp.bfloat16),
                                     plgpu.SMEM((64, 128), jnp.bfloat16),
                                     plgpu.Barrier(num_arrivals=2)])
    return plgpu.lower(f, jax.ShapeDtypeStruct((64, 64), jnp.bfloat16),
                       jax.ShapeDtypeStruct((64, 128), jnp.bfloat16))

  (k,) = lower(n0=64, n=64, k0=16)
  assert "wgmma.mma_async" in k.ptx
  with pytest.raises(NotImplementedError, match=r"a slice \[16:32\] of SMEM .* 64 elements"):
    lower(n0=16, n=16, k0=16)


def test_float32_wgmma_needs_a_k_major_b():
  a = jax.ShapeDtypeStruct((128, 192), jnp.float32)
  b = jax.ShapeDtypeStruct((192, 128), jnp.float32)
  with pytest.raises(NotImplementedError, match="tf32.*K-major.*transpose"):
    plgpu.lower(matmul, a, b)


def _on_hopper() -> bool:
  d = jax.devices()[0]
  return d.platform == "gpu" and float(getattr(d, "compute_capability", "0")) >= 9.0


gpu = pytest.mark.skipif(not _on_hopper(), reason="needs a Hopper GPU")


@pytest.fixture(autouse=True)
def _gluon_ran(request):
  """A GPU test here must have run a kernel on Gluon (not quietly in the interpreter)."""
  from pallax._src.gluon import compile as gluon_compile
  before = gluon_compile.LAUNCHES
  yield
  if request.node.get_closest_marker("gpu") is not None and _on_hopper():
    assert gluon_compile.LAUNCHES > before, "the Gluon backend was not used"


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("rows", [192, 100], ids=["whole_blocks", "partial_block"])
def test_scale_rows_on_the_gpu_matches_the_interpreter(dtype, rows):
  x = jax.random.normal(jax.random.key(rows), (rows, 64), dtype)
  got = np.asarray(jax.jit(scale_rows)(x), np.float32)
  want = np.asarray(scale_rows(x, interpret=True), np.float32)
  np.testing.assert_array_equal(got, want)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype,tol", [(jnp.float16, 2e-3), (jnp.bfloat16, 1e-2)])
@pytest.mark.parametrize("m,k,n", [(128, 192, 128), (100, 72, 136)], ids=["whole_tiles", "partial_tiles"])
def test_matmul_on_the_gpu_matches_the_interpreter(dtype, tol, m, k, n):
  ka, kb = jax.random.split(jax.random.key(m + k + n))
  a = jax.random.normal(ka, (m, k), dtype)
  b = jax.random.normal(kb, (k, n), dtype)
  got = np.asarray(jax.jit(matmul)(a, b), np.float32)
  want = np.asarray(matmul(a, b, interpret=True), np.float32)
  # wgmma sums in float32 in its own order (tf32 products for float32 inputs): elementwise,
  # relative to the output's scale.
  scale = float(np.sqrt(np.mean(want.astype(np.float64) ** 2)))
  np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("max_concurrent_steps", [2, 3])
def test_emit_pipeline_matmul_on_the_gpu_matches_the_interpreter(dtype, max_concurrent_steps, monkeypatch):
  from pallax._src import backends
  from test_mosaic_gpu_pipeline import quickstart_matmul
  ka, kb = jax.random.split(jax.random.key(max_concurrent_steps))
  a = jax.random.normal(ka, (128, 320), dtype)
  b = jax.random.normal(kb, (320, 192), dtype)
  run = lambda x, y: quickstart_matmul(x, y, max_concurrent_steps=max_concurrent_steps)
  got = np.asarray(jax.jit(run)(a, b))
  monkeypatch.setattr(backends, "choose", lambda params, platform: None)   # the interpreter
  want = np.asarray(run(a, b))
  scale = float(np.sqrt(np.mean(want.astype(np.float64) ** 2)))
  np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * scale)


def test_emit_pipeline_matmul_lowers_to_sm90a_ptx():
  from test_mosaic_gpu_pipeline import quickstart_matmul
  a = jax.ShapeDtypeStruct((128, 320), jnp.bfloat16)
  b = jax.ShapeDtypeStruct((320, 128), jnp.bfloat16)
  (k,) = plgpu.lower(quickstart_matmul, a, b)
  assert "wgmma.mma_async" in k.ptx and all(s in k.ptx for s in PTX_MUST_HAVE)


# --- register accesses of GMEM, register operands, accumulators in run_state, reductions --------

def _fill_and_scale(x_ref, o_ref, f_ref):
  i = lax.axis_index("m")
  rows = pl.ds(i * 8, 8)
  o_ref[rows, :] = x_ref[rows, :] * 2 + i.astype(x_ref.dtype)
  f_ref[i] = jnp.full((f_ref.shape[1],), 42, f_ref.dtype)


def fill_and_scale(x, interpret=False):
  m, n = x.shape
  return plgpu.kernel(
      _fill_and_scale, out_type=(jax.ShapeDtypeStruct(x.shape, x.dtype),
                                 jax.ShapeDtypeStruct((m // 8, 128), jnp.int32)),
      grid=(m // 8,), grid_names=("m",), interpret=interpret)(x)


def _softmax_of_product(a_ref, b_ref, o_ref, a_smem, b_smem, o_smem, bar, causal=False):
  """Attention's inner step: a register ``a`` wgmma into ``ACC.init``, row max, exp2, row sum."""
  plgpu.copy_gmem_to_smem(a_ref, a_smem, bar)
  plgpu.copy_gmem_to_smem(b_ref, b_smem, bar)
  plgpu.barrier_wait(bar)
  a = a_smem[...] * 2   # through registers: wgmma's register operand

  def product(acc_ref):
    plgpu.wgmma(acc_ref, a, b_smem)

  s = pl.run_state(product)(plgpu.ACC.init(jnp.full(o_smem.shape, 0.5, jnp.float32)))
  if causal:
    rows = plgpu.broadcasted_iota(jnp.int32, s.shape, 0, layout=plgpu.Layout.WGMMA)
    cols = plgpu.broadcasted_iota(jnp.int32, s.shape, 1, layout=plgpu.Layout.WGMMA)
    s = jnp.where(rows >= cols, s, -jnp.inf)
  p = jnp.exp2(s - jnp.max(s, axis=1)[:, None])
  o_smem[...] = (p / jnp.sum(p, axis=1)[:, None]).astype(o_smem.dtype)
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(o_smem, o_ref)
  plgpu.wait_smem_to_gmem(0)


def softmax_of_product(a, b, interpret=False, causal=False, debug=False):
  (m, k), (_, n) = a.shape, b.shape
  return plgpu.kernel(
      functools.partial(_softmax_of_product, causal=causal), out_type=jax.ShapeDtypeStruct((m, n), a.dtype),
      debug=debug,
      scratch_types=[plgpu.SMEM((m, k), a.dtype), plgpu.SMEM((k, n), a.dtype),
                     plgpu.SMEM((m, n), a.dtype), plgpu.Barrier(num_arrivals=2)],
      interpret=interpret)(a, b)


def test_register_operands_and_reductions_lower_to_sm90a_ptx():
  x = jax.ShapeDtypeStruct((64, 64), jnp.float32)
  (k,) = plgpu.lower(fill_and_scale, x)
  assert [(e.kind, e.ref, e.shape) for e in events(k)] == [
      ("load", "args[0]", (8, 64)), ("store", "out[0]", (8, 64)), ("store", "out[1]", (128,))]
  a = jax.ShapeDtypeStruct((64, 64), jnp.float16)
  b = jax.ShapeDtypeStruct((64, 128), jnp.float16)
  (k,) = plgpu.lower(softmax_of_product, a, b)
  (wgmma,) = events(k, ev.Wgmma)
  assert wgmma.a == "registers" and wgmma.b == ev.SmemView("smem[1]")
  # a goes to wgmma's operand layout; the row max and sum are slices of the accumulator's layout.
  assert any(isinstance(c.target, L.DotOperand) for c in k.generated.conversions)
  assert any(isinstance(x, L.Slice) and x.parent.kind == "wgmma" for x in k.generated.layouts)
  assert "wgmma.mma_async" in k.ptx and all(s in k.ptx for s in PTX_MUST_HAVE)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int32])
def test_register_accesses_of_gmem_on_the_gpu(dtype):
  x = (jax.random.normal(jax.random.key(5), (64, 64)) * 100).astype(dtype)
  got = jax.jit(fill_and_scale)(x)
  want = fill_and_scale(x, interpret=True)
  for g, w in zip(got, want):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_debug_prints_the_layouts_and_conversions(capsys):
  a = jax.ShapeDtypeStruct((64, 64), jnp.float16)
  b = jax.ShapeDtypeStruct((64, 128), jnp.float16)
  plgpu.lower(lambda x, y: softmax_of_product(x, y, causal=True, debug=True), a, b)
  out = capsys.readouterr().out
  assert "Gluon layouts of _softmax_of_product" in out and "NVMMADistributedLayout" in out
  assert "convert_layout" in out and "test_mosaic_gpu_gluon.py" in out


def test_the_interpreter_computes_the_softmax_of_a_product():
  ka, kb = jax.random.split(jax.random.key(7))
  a = jax.random.normal(ka, (64, 64), jnp.float16)
  b = jax.random.normal(kb, (64, 128), jnp.float16)
  s = (np.asarray(a, np.float32) * 2) @ np.asarray(b, np.float32) + 0.5
  s = np.where(np.arange(64)[:, None] >= np.arange(128)[None, :], s, -np.inf)
  p = np.exp2(s - s.max(1, keepdims=True))
  want = p / p.sum(1, keepdims=True)
  got = np.asarray(softmax_of_product(a, b, interpret=True, causal=True), np.float32)
  np.testing.assert_allclose(got, want, rtol=2e-3, atol=1e-3)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_register_operand_wgmma_and_reductions_on_the_gpu(dtype, causal):
  ka, kb = jax.random.split(jax.random.key(6))
  a = jax.random.normal(ka, (64, 64), dtype)
  b = jax.random.normal(kb, (64, 128), dtype)
  run = functools.partial(softmax_of_product, causal=causal)
  got = np.asarray(jax.jit(run)(a, b), np.float32)
  want = np.asarray(run(a, b, interpret=True), np.float32)
  tol = 1e-2 if dtype == jnp.bfloat16 else 2e-3
  np.testing.assert_allclose(got, want, rtol=tol, atol=tol * float(np.max(want)))


# --- TMA boxes with unit dimensions (attention's q_ref.at[b, rows, h]) -------------------------

def _per_head(x_ref, o_ref, smem, bar):
  b, i, h = lax.axis_index("b"), lax.axis_index("i"), lax.axis_index("h")
  rows = pl.ds(i * BLOCK, BLOCK)
  plgpu.copy_gmem_to_smem(x_ref.at[b, rows, h], smem, bar)
  plgpu.barrier_wait(bar)
  smem[...] = smem[...] * 3
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(smem, o_ref.at[b, rows, h])
  plgpu.wait_smem_to_gmem(0)


def per_head(x, interpret=False):
  batch, seq, heads, dim = x.shape
  return plgpu.kernel(
      _per_head, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(batch, seq // BLOCK, heads), grid_names=("b", "i", "h"),
      scratch_types=[plgpu.SMEM((BLOCK, dim), x.dtype), plgpu.Barrier()], interpret=interpret)(x)


def test_tma_boxes_with_unit_dimensions_lower():
  (k,) = plgpu.lower(per_head, jax.ShapeDtypeStruct((2, 128, 3, 64), jnp.float16))
  assert [(c.direction, c.box) for c in events(k, ev.Copy)] == [("in", (1, 64, 1, 64)), ("out", (1, 64, 1, 64))]
  assert "cp.async.bulk.tensor.4d" in k.ptx


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_tma_boxes_with_unit_dimensions_on_the_gpu(dtype):
  x = jax.random.normal(jax.random.key(8), (2, 128, 3, 64), dtype)
  got = np.asarray(jax.jit(per_head)(x), np.float32)
  want = np.asarray(per_head(x, interpret=True), np.float32)
  np.testing.assert_array_equal(got, want)


# --- threads: warp specialization ---------------------------------------------------------------

def _producer_consumer(x_ref, o_ref, smem, full, empty):
  """Thread 1 copies blocks into two SMEM slots; thread 0 waits, computes and stores."""
  wg = lax.axis_index("wg")
  steps = x_ref.shape[0] // BLOCK

  @pl.when(wg == 1)
  def _producer():
    plgpu.set_max_registers(40, action="decrease")

    def step(k, _):
      slot = lax.rem(k, 2)

      @pl.when(k >= 2)
      def _():
        plgpu.barrier_wait(empty.at[slot])   # the consumer released the slot
      plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(k * BLOCK, BLOCK)], smem.at[slot], full.at[slot])
    lax.fori_loop(0, steps, step, None)

  @pl.when(wg == 0)
  def _consumer():
    def step(k, _):
      slot = lax.rem(k, 2)
      plgpu.barrier_wait(full.at[slot])
      o_ref[pl.ds(k * BLOCK, BLOCK)] = smem[slot] * 2 + 1
      plgpu.barrier_arrive(empty.at[slot])
    lax.fori_loop(0, steps, step, None)


def producer_consumer(x, interpret=False):
  return plgpu.kernel(
      _producer_consumer, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), num_threads=2,
      thread_name="wg", scratch_types=[plgpu.SMEM((2, BLOCK, x.shape[1]), x.dtype),
                                       plgpu.Barrier(num_barriers=2), plgpu.Barrier(num_barriers=2)],
      interpret=interpret)(x)


def test_threads_lower_to_warp_specialized_ptx():
  (k,) = plgpu.lower(producer_consumer, jax.ShapeDtypeStruct((320, 64), jnp.float16))
  consumer, producer = k.generated.partitions
  assert "setmaxnreg" in k.ptx and all(s in k.ptx for s in PTX_MUST_HAVE[:2])
  assert k.num_warps == 8   # two warpgroups
  # The producer holds no register tensors: its partition is one warp (Gluon pads the launch to
  # whole warpgroups), so that its TMA copies and barrier operations need no cross-warp barrier.
  assert (consumer.warps, producer.warps, producer.registers) == (4, 1, 40)
  assert "bar.sync \t1, 128" not in k.ptx and "bar.sync \t2, 128" not in k.ptx
  # Each thread does its own part: the producer copies in, the consumer reads and stores.
  assert [type(e).__name__ for e in producer.events] == ["BarrierOp", "BarrierOp", "Copy"]
  assert [(e.kind, e.barrier[:10]) for e in events(k, ev.BarrierOp)] == [
      ("wait", "barrier[0]"), ("arrive", "barrier[1]")]
  # Each thread starts the phases of the barriers it waits on, and declares the layouts it
  # uses, and no others.
  assert unused_definitions(k.source) == []
  assert [e.kind for e in events(k, ev.Access)] == ["load", "store"]


def test_the_interpreter_runs_the_producer_consumer_kernel():
  x = jax.random.normal(jax.random.key(9), (320, 64), jnp.float32)
  np.testing.assert_allclose(np.asarray(producer_consumer(x, interpret=True)), np.asarray(x) * 2 + 1,
                             rtol=1e-6)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.float32])
def test_threads_on_the_gpu_match_the_interpreter(dtype):
  x = jax.random.normal(jax.random.key(10), (320, 64), dtype)
  got = np.asarray(jax.jit(producer_consumer)(x), np.float32)
  want = np.asarray(producer_consumer(x, interpret=True), np.float32)
  np.testing.assert_array_equal(got, want)


def _scale_blocks(x_ref, o_ref, smem, bar):
  i = lax.axis_index("x")
  plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(i * 64, 64)], smem, bar)
  plgpu.barrier_wait(bar)
  o_ref[pl.ds(i * 64, 64)] = smem[...] * 3 + i.astype(jnp.float32)


def scale_blocks(x, interpret=False):
  return plgpu.kernel(_scale_blocks, out_type=jax.ShapeDtypeStruct((192,), jnp.float32), grid=(3,),
                      grid_names=("x",), scratch_types=[plgpu.SMEM((64,), jnp.float32), plgpu.Barrier()],
                      interpret=interpret)(x)


def _terms(e) -> list:
  """The products summed by an index expression, each as (program id or None, factor)."""
  if getattr(e, "op", None) == "+":
    return [t for a in e.args for t in _terms(a)]
  if getattr(e, "op", None) == "*":
    return [(e.args[0], e.args[1].value)]
  return [(e, 1)]


def test_vmap_adds_a_grid_axis_that_indexes_the_operands_when_lowered():
  (k,) = plgpu.lower(jax.vmap(scale_blocks), jax.ShapeDtypeStruct((5, 192), jnp.float32))
  batch, _ = k.generated.program_ids   # the axis vmap added is the first, the slowest
  (copy,) = events(k, ev.Copy)
  assert copy.gmem == "args[0]" and copy.box == (1, 64)
  assert copy.coords[0].name == batch.name   # the box's row is the batch element
  (store,) = events(k, ev.Access)[1:]
  assert store.ref == "out[0]" and (batch.name, 192) in [
      (getattr(x, "name", None), f) for x, f in _terms(store.offset)]   # a row of 192 per element


@pytest.mark.gpu
@gpu
def test_vmap_on_the_gpu_matches_the_interpreter():
  x = jax.random.normal(jax.random.key(1), (5, 192))
  got = np.asarray(jax.jit(jax.vmap(scale_blocks))(x))
  want = np.asarray(jax.vmap(functools.partial(scale_blocks, interpret=True))(x))
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)   # the GPU may fuse x * 3 + i (one FMA)
  np.testing.assert_allclose(got, np.asarray(x) * 3 + np.repeat(np.arange(3.0), 64), rtol=1e-6,
                             atol=1e-6)


def test_gpus_before_hopper_are_pointed_to_the_interpreter():
  from pallax._src.gluon import backend
  with pytest.raises(RuntimeError, match=r"need a Hopper GPU .* this one has 8\.6\. Run it in the "
                                         r"interpreter instead: plgpu.kernel\(\.\.\., interpret=True\)"):
    backend.check_compute_capability(86, "k")
  backend.check_compute_capability(90, "k")   # Hopper passes

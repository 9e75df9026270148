"""The GPU backends' jaxpr rewrites, run in the interpreter: what a GPU would compute, checked
on the CPU against the kernel as written."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax as pl
import pallax.triton as plgpu
from pallax._src import jax_internals as ji
from pallax._src import pallas_call as pcall
from pallax._src.gpu import tiling


def _params(fun, *args):
  """The Params of the one pallas_call in ``fun``."""
  jaxpr = jax.make_jaxpr(fun)(*args).jaxpr
  (eqn,) = [e for e in jaxpr.eqns if e.primitive is pcall.pallas_call_p]
  return eqn.params["params"]


def _run(params, *args):
  return pcall.pallas_call_p.bind(*args, params=dataclasses.replace(params, interpret=True))


def _matmul_call(shape_x, shape_y, dtype, grid=(1, 1), out_dtype=None, cast=False):
  (m, k), n = shape_x, shape_y[1]
  bm, bn = m // grid[0], n // grid[1]

  def kernel(x_ref, y_ref, o_ref):
    if jnp.issubdtype(dtype, jnp.integer):   # int8 products wrap unless accumulated wider
      o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=o_ref.dtype)
      return
    p = x_ref[...] @ y_ref[...]
    o_ref[...] = p.astype(o_ref.dtype) if cast else p

  return lambda x, y: pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((m, n), out_dtype or dtype), grid=grid,
      in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)), pl.BlockSpec((k, bn), lambda i, j: (0, j))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)))(x, y)


def _inputs(shape_x, shape_y, dtype, seed):
  kx, ky = jax.random.split(jax.random.key(seed))
  if jnp.issubdtype(dtype, jnp.integer):
    return (jax.random.randint(kx, shape_x, -100, 100, dtype), jax.random.randint(ky, shape_y, -100, 100, dtype))
  return (jax.random.normal(kx, shape_x, jnp.float32).astype(dtype),
          jax.random.normal(ky, shape_y, jnp.float32).astype(dtype))


@pytest.mark.parametrize("dtype,grid,sequential,out_dtype,cast,tol", [
    (jnp.float32, (2, 2), False, None, False, 1e-5),     # the notebook's shape: spread over programs
    (jnp.float32, (1, 1), True, None, False, 1e-5),      # loops inside the program
    (jnp.bfloat16, (1, 2), False, jnp.float32, True, 1e-2),
    (jnp.int8, (1, 1), True, jnp.int32, True, 0),
])
def test_tiled_products_compute_the_product(dtype, grid, sequential, out_dtype, cast, tol):
  shape_x, shape_y = (512, 384), (384, 256 * grid[1])
  f = _matmul_call(shape_x, shape_y, dtype, grid, out_dtype, cast)
  args = _inputs(shape_x, shape_y, dtype, seed=len(str(dtype)) + grid[1])
  params = _params(f, *args)
  [t] = tiling.find(params.jaxpr)
  tiled = tiling.rewrite(params, sequential_axes=sequential)
  grows = tiled.grid_mapping.grid != params.grid_mapping.grid
  assert grows == (not sequential), "a kernel that is only the product spreads its tiles"
  if grows:
    tm, tn = t.tile_counts()
    assert tiled.grid_mapping.grid == (tm * tn,) + params.grid_mapping.grid
  assert not any(tiling.find(j) for j in [tiled.jaxpr]), "no large product left"
  [want] = _run(params, *args)
  [got] = _run(tiled, *args)
  a, b = (np.asarray(x, np.float64) for x in args)
  np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                             rtol=tol, atol=tol * 10)
  if tol == 0:
    np.testing.assert_array_equal(np.asarray(got), (a @ b).astype(np.int32))


def test_float64_tiled_products_accumulate_in_float64():
  # The tiled matmul re-implemented the dot rule with a float32 accumulator: Triton then failed
  # ("Loop-carried variable acc ... fp32 ... fp64") on 256x256 float64 blocks.
  with jax.enable_x64(True):
    f = _matmul_call((256, 256), (256, 256), jnp.float64)
    args = _inputs((256, 256), (256, 256), jnp.float64, seed=3)
    params = _params(f, *args)
    tiled = tiling.rewrite(params, sequential_axes=True)
    dots = [e for e in _equations(tiled.jaxpr) if e.primitive is jax.lax.dot_general_p]
    assert dots and all(e.outvars[0].aval.dtype == jnp.float64 for e in dots)
    [got] = _run(tiled, *args)
    np.testing.assert_allclose(np.asarray(got), np.asarray(args[0]) @ np.asarray(args[1]), rtol=1e-12,
                               atol=1e-12)  # float64 sums of 256 terms, in another order
    [a] = plgpu.lower(f, *args, compute_capability=90)
    assert "fma.rn.f64" in a.ptx or "mma" in a.ptx


def _equations(jaxpr):
  from pallax._src import jaxpr_util
  return list(jaxpr_util.equations(jaxpr))


# --- every corpus kernel: what the GPU runs, run in the interpreter ----------------------------

from kernel_corpus import CASES  # noqa: E402


def _same(got, want, tol: float, what: str):
  got, want = np.asarray(got), np.asarray(want)
  assert got.shape == want.shape and got.dtype == want.dtype, what
  if got.dtype.kind in "iub":
    np.testing.assert_array_equal(got, want, err_msg=what)
    return
  g, w = got.astype(np.float64), want.astype(np.float64)
  both_nan = np.isnan(g) & np.isnan(w)
  g, w = np.where(both_nan, 0, g), np.where(both_nan, 0, w)
  np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=what)
  zero = (w == 0) & (tol == 0)
  assert (np.signbit(g) == np.signbit(w))[zero].all(), f"{what}: the sign of zeros"


def _rewritten_runs(monkeypatch, cc: int):
  """Makes the interpreter run each pallas_call as the Triton backend prepares it for ``cc``
  (tiled and legalized), so that the kernel a GPU would run executes here."""
  from pallax._src.interpret import interpreter
  from pallax._src.triton import codegen

  def rewritten(run):
    def wrapped(*args, params, **kw):
      new, _ = codegen.prepare(params, cc)
      return run(*args, params=new, **kw)
    return wrapped
  monkeypatch.setattr(interpreter, "run", rewritten(interpreter.run))
  monkeypatch.setattr(interpreter, "run_eager", rewritten(interpreter.run_eager))


# Where the GPU's answer is deliberately not lax's (README, "Known differences").
_NOT_LAX = {
    "exp2_bfloat16": "exp2 of bfloat16: pallax computes 2**x in float32 and rounds once; lax "
                      "computes exp(x * log(2)) with log(2) and the product rounded to bfloat16 "
                      "(several ulps away for large |x|)",
}


@pytest.mark.interpreter
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_kernel_the_gpu_runs_agrees_with_the_kernel_as_written(case, monkeypatch):
  """Legalization and tiling are jaxpr rewrites: the rewritten kernel, run by the interpreter
  under plain XLA, must give the kernel's own answer (bit for bit where no reassociation is
  involved: integer and float edge cases, casts, shifts, NaN handling)."""
  if case.name in _NOT_LAX:
    pytest.skip(_NOT_LAX[case.name])
  args = case.args(jax.random.key(sum(map(ord, case.name))))
  want = jax.tree.leaves(case.build(True)(*args))
  for cc in ((90, 89) if "fp8" in case.name or "cast" in case.name else (90,)):
    with monkeypatch.context() as m:
      _rewritten_runs(m, cc)
      got = jax.tree.leaves(case.build(True)(*args))
    for k, (g, w) in enumerate(zip(got, want)):
      _same(g, w, case.tol, f"{case.name} output {k} (sm_{cc})")


# --- edge masks: every access of a block that can run past its array is masked ------------------

def _accesses(fun, *args):
  from pallax._src.triton import codegen
  return codegen.generate(_params(fun, *args), 90).accesses


def _copy_call(shape, block, out_dtype=jnp.float32):
  grid = tuple(-(-s // b) for s, b in zip(shape, block))
  spec = pl.BlockSpec(block, lambda *i: i)

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1
  return lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(shape, out_dtype),
                                  grid=grid, in_specs=[spec], out_specs=spec)(x)


@pytest.mark.parametrize("shape,block,masked", [
    ((1000,), (128,), True),          # a partial last block
    ((1024,), (128,), False),         # exact blocks: no mask at all
    ((300,), (100,), True),           # exact, but 100 lanes padded to 128
    ((64, 200), (64, 128), True),     # partial along the second dimension only
    ((64, 256), (16, 128), False),
])
def test_accesses_of_blocks_past_the_array_are_masked(shape, block, masked):
  x = jnp.zeros(shape, jnp.float32)
  acc = _accesses(_copy_call(shape, block), x)
  kinds = {(a.kind, a.origin) for a in acc}
  assert kinds == {("load", "args[0]"), ("store", "out[0]")}
  assert all((a.mask is not None) == masked for a in acc), [(a.kind, a.mask) for a in acc]

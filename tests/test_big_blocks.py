"""Blocks too large for one GPU program (issue 31, point 3): ``gpu/tiling.py`` computes their
values tile by tile. The rewritten kernel is an ordinary kernel: run in the interpreter it gives
the kernel's own answer (bit for bit where no product is reassociated), and it lowers to Triton
with no value over a program's register limit. On a GPU the Triton result is compared with the
interpreter's."""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl
import pallax.triton as plgpu
from pallax._src import jaxpr_util
from pallax._src import pallas_call as pcall
from pallax._src.gpu import regions, tiling


@dataclasses.dataclass(frozen=True)
class Case:
  name: str
  kernel: object
  ins: tuple                  # (shape, dtype) of each operand
  outs: tuple                 # (shape, dtype) of each output
  grid: tuple = ()
  in_specs: object = None     # functions of the grid's rank: None for whole arrays
  out_specs: object = None
  tol: float = 0.0            # 0: bit for bit (no product reassociated)
  gpu_tol: float = 0.0        # Triton against the interpreter (tf32 products, GPU math)

  def call(self, interpret=False):
    out_shape = [jax.ShapeDtypeStruct(s, d) for s, d in self.outs]
    kw = {} if self.in_specs is None else dict(in_specs=self.in_specs, out_specs=self.out_specs)
    return pl.pallas_call(self.kernel, out_shape=out_shape, grid=self.grid, interpret=interpret,
                          **kw)

  def args(self, seed: int):
    keys = jax.random.split(jax.random.key(seed), len(self.ins))
    out = []
    for k, (shape, dtype) in zip(keys, self.ins):
      if jnp.issubdtype(dtype, jnp.integer):
        out.append(jax.random.randint(k, shape, -100, 100, dtype))
      else:
        out.append(jax.random.normal(k, shape, jnp.float32).astype(dtype))
    return out


def _add(x_ref, y_ref, o_ref):   # JAX's pipelining page, over whole 512x512 arrays
  o_ref[...] = x_ref[...] + y_ref[...]


def _where_cast(x_ref, y_ref, o_ref):
  x = x_ref[...]
  o_ref[...] = jnp.where(x > 0, x * 2.5, 0.5 * y_ref[...].astype(jnp.float32)).astype(o_ref.dtype)


def _softmax_rows(x_ref, o_ref):
  x = x_ref[...]
  e = jnp.exp(x - jnp.max(x, axis=1, keepdims=True))
  o_ref[...] = e / jnp.sum(e, axis=1, keepdims=True)


def _center_columns(x_ref, o_ref):   # a reduction over rows: tiles split the columns
  x = x_ref[...]
  o_ref[...] = x - jnp.sum(x, axis=0, keepdims=True)


def _in_place(x_ref, o_ref):   # reads back what it wrote: tiles must not overlap
  # (no product feeds a sum: XLA's CPU code may fuse those into an FMA in one form, not the other)
  o_ref[...] = x_ref[...] + 1.5
  o_ref[...] = o_ref[...] * x_ref[...]


def _row_iota(x_ref, o_ref):
  o_ref[...] = x_ref[...] * 7 + lax.broadcasted_iota(jnp.int32, x_ref.shape, 0)


def _scale_vector(x_ref, y_ref, o_ref):
  o_ref[...] = x_ref[...] * y_ref[...] - 1.0


def _two_outputs(x_ref, a_ref, b_ref):
  x = jnp.tanh(x_ref[...])
  a_ref[...] = x + 1
  b_ref[...] = (x * x).astype(b_ref.dtype)


def _small_weights(x_ref, w_ref, o_ref):   # a product with a small operand: split by rows
  o_ref[...] = jnp.maximum(x_ref[...] @ w_ref[...], 0.0)


def _accumulate(x_ref, o_ref):   # a grid axis that revisits the output: loops in the program
  @pl.when(pl.program_id(1) == 0)
  def _():
    o_ref[...] = jnp.zeros_like(o_ref)
  o_ref[...] += x_ref[...]


def _relu_matmul(x_ref, y_ref, o_ref):   # JAX's quickstart: matmul with an activation
  o_ref[...] = jax.nn.relu(x_ref[...] @ y_ref[...])


def _matmul_bias(x_ref, y_ref, b_ref, o_ref):
  o_ref[...] = (jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)
                + b_ref[...]).astype(o_ref.dtype)


def _matmul_k_grid(x_ref, y_ref, o_ref):   # a product accumulated into its output over a grid axis
  @pl.when(pl.program_id(2) == 0)
  def _():
    o_ref[...] = jnp.zeros_like(o_ref)
  o_ref[...] += x_ref[...] @ y_ref[...]


def _product_of_casts(x_ref, y_ref, o_ref):   # not Ref reads: a product per (16, 16) tile
  o_ref[...] = jnp.dot(x_ref[...].astype(bf16), y_ref[...].astype(bf16),
                       preferred_element_type=jnp.float32)


def _product_transposed(x_ref, y_ref, o_ref):
  o_ref[...] = x_ref[...] @ y_ref[...].T


def _small_value_used_twice(x_ref, b_ref, o_ref, p_ref):   # b: in the tiles, and whole
  b = b_ref[...]
  o_ref[...] = x_ref[...] + b
  p_ref[...] = b * 2


def _strided_rows(x_ref, o_ref):   # tiles of a strided view
  o_ref[...] = x_ref[pl.ds(1, 500, stride=2), :] * 2


def _one_plane(x_ref, o_ref):   # tiles of a view indexed by an integer
  o_ref[...] = x_ref[2] + 1.0


def _int_matmul_scaled(x_ref, y_ref, o_ref):
  o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.int32) * 3 - 1


def _centered_on_max(x_ref, o_ref):   # a reduction over every tile, then the stores' tiles
  x = x_ref[...]
  o_ref[...] = x - jnp.max(x)


def _softmax_whole_block(x_ref, o_ref):   # two reductions over every tile, then the stores
  x = x_ref[...]
  e = jnp.exp(x - jnp.max(x))
  o_ref[...] = e / jnp.sum(e)


def _column_sums(x_ref, o_ref):
  o_ref[...] = jnp.sum(x_ref[...] * 2, axis=0)


def _int_stats(x_ref, s_ref, m_ref, a_ref):
  x = x_ref[...]
  s_ref[...] = jnp.sum(x, keepdims=True)
  m_ref[...] = jnp.min(x, axis=0, keepdims=True)
  a_ref[...] = jnp.any(x > 95, keepdims=True).astype(jnp.int32)


f32, bf16, i32 = jnp.float32, jnp.bfloat16, jnp.int32
CASES = [
    Case("add_512x512", _add, (((512, 512), f32),) * 2, (((512, 512), f32),)),
    Case("where_cast_300x384", _where_cast, (((300, 384), f32), ((300, 384), bf16)),
         (((300, 384), bf16),)),
    Case("softmax_rows_509x1000", _softmax_rows, (((509, 1000), f32),), (((509, 1000), f32),),
         gpu_tol=1e-6),
    # XLA's CPU column sums of 640x16 and 640x300 blocks add in different orders
    Case("center_columns_640x300", _center_columns, (((640, 300), f32),), (((640, 300), f32),),
         tol=1e-6, gpu_tol=1e-5),
    Case("in_place_300x512", _in_place, (((300, 512), f32),), (((300, 512), f32),)),
    Case("row_iota_int32_520x256", _row_iota, (((520, 256), i32),), (((520, 256), i32),)),
    # x * y - 1: Triton may fuse it into an FMA, XLA may not (gpu_tol)
    Case("vector_200000", _scale_vector, (((200000,), f32),) * 2, (((200000,), f32),),
         gpu_tol=1e-6),
    Case("vector_f16_70001", _scale_vector, (((70001,), jnp.float16),) * 2,
         (((70001,), jnp.float16),), gpu_tol=1e-3),
    Case("two_outputs_1000x130", _two_outputs, (((1000, 130), f32),),
         (((1000, 130), f32), ((1000, 130), bf16)), gpu_tol=1e-6),
    Case("small_weights_4100x64", _small_weights, (((4100, 64), f32), ((64, 64), f32)),
         (((4100, 64), f32),), tol=1e-5, gpu_tol=1e-2),
    Case("grid_of_big_blocks", _add, (((1024, 512), f32),) * 2, (((1024, 512), f32),), grid=(2,),
         in_specs=[pl.BlockSpec((512, 512), lambda i: (i, 0))] * 2,
         out_specs=pl.BlockSpec((512, 512), lambda i: (i, 0))),
    Case("accumulate_over_grid", _accumulate, (((3, 400, 256), f32),), (((400, 256), f32),),
         grid=(1, 3), in_specs=[pl.BlockSpec((None, 400, 256), lambda i, k: (k, 0, 0))],
         out_specs=pl.BlockSpec((400, 256), lambda i, k: (0, 0))),
    Case("relu_matmul_quickstart", _relu_matmul, (((1024, 1024), f32),) * 2, (((1024, 1024), f32),),
         grid=(2, 2), in_specs=[pl.BlockSpec((512, 1024), lambda i, j: (i, 0)),
                                pl.BlockSpec((1024, 512), lambda i, j: (0, j))],
         out_specs=pl.BlockSpec((512, 512), lambda i, j: (i, j)), tol=1e-5, gpu_tol=1e-2),
    Case("matmul_k_grid", _matmul_k_grid, (((512, 1024), f32), ((1024, 384), f32)),
         (((512, 384), f32),), grid=(1, 1, 2),
         in_specs=[pl.BlockSpec((512, 512), lambda i, j, k: (i, k)),
                   pl.BlockSpec((512, 384), lambda i, j, k: (k, j))],
         out_specs=pl.BlockSpec((512, 384), lambda i, j, k: (i, j)), tol=1e-5, gpu_tol=1e-2),
    Case("product_of_casts_384x512", _product_of_casts, (((384, 512), f32), ((512, 400), f32)),
         (((384, 400), f32),), tol=1e-5, gpu_tol=1e-2),
    Case("product_transposed_512", _product_transposed, (((512, 256), f32), ((520, 256), f32)),
         (((512, 520), f32),), tol=1e-5, gpu_tol=1e-2),
    Case("small_value_used_twice", _small_value_used_twice, (((700, 384), f32), ((384,), f32)),
         (((700, 384), f32), ((384,), f32))),
    Case("strided_rows", _strided_rows, (((1024, 512), f32),), (((500, 512), f32),)),
    Case("one_plane", _one_plane, (((3, 300, 512), f32),), (((300, 512), f32),)),
    Case("matmul_bias_bf16", _matmul_bias, (((384, 256), bf16), ((256, 320), bf16), ((320,), f32)),
         (((384, 320), bf16),), tol=1e-2, gpu_tol=1e-2),
    Case("centered_on_max_300x700", _centered_on_max, (((300, 700), f32),), (((300, 700), f32),)),
    # sums over tiles add in another order than XLA's sum of the whole block
    Case("softmax_whole_block_600x700", _softmax_whole_block, (((600, 700), f32),),
         (((600, 700), f32),), tol=1e-6, gpu_tol=1e-5),
    Case("column_sums_1500x64", _column_sums, (((1500, 64), f32),), (((64,), f32),),
         tol=1e-5, gpu_tol=1e-5),
    Case("int_stats_700x300", _int_stats, (((700, 300), i32),),
         (((1, 1), i32), ((1, 300), i32), ((1, 1), i32))),
    Case("int8_matmul_scaled", _int_matmul_scaled, (((256, 512), jnp.int8), ((512, 256), jnp.int8)),
         (((256, 256), i32),)),
]


def _params(case, args):
  jaxpr = jax.make_jaxpr(case.call())(*args).jaxpr
  (eqn,) = [e for e in jaxpr.eqns if e.primitive is pcall.pallas_call_p]
  return eqn.params["params"]


def _run(params, args):
  return pcall.pallas_call_p.bind(*args, params=dataclasses.replace(params, interpret=True))


def _regions_of(params) -> tuple:
  found = regions.analyze(tiling.inline_calls(params.jaxpr))
  assert isinstance(found, tuple), found.message()
  return found


def _region(params) -> regions.Region:
  """The one region of the kernel (the stores')."""
  (region,) = _regions_of(params)
  return region


def _largest(jaxpr) -> int:
  return max((regions.padded_numel(v.aval.shape) for e in jaxpr_util.equations(jaxpr)
              for v in e.outvars if hasattr(v.aval, "shape") and not hasattr(v.aval, "inner_aval")),
             default=1)


def _compare(got, want, tol, what):
  got, want = np.asarray(got), np.asarray(want)
  assert got.shape == want.shape and got.dtype == want.dtype, what
  if tol == 0:
    np.testing.assert_array_equal(got, want, err_msg=what)
  else:
    g, w = got.astype(np.float64), want.astype(np.float64)
    if np.dtype(got.dtype).itemsize == 2:
      # A 16-bit result rounded from float32 math that is a few float32 ulps from XLA's (the
      # GPU's libdevice tanh, docs/triton.md) lands one unit of the 16-bit type away where the
      # float32 values straddle a rounding boundary: one unit is the tolerance there.
      tol = max(tol, float(jnp.finfo(got.dtype).eps))
    np.testing.assert_allclose(g, w, rtol=tol, atol=tol * float(np.abs(w).max()), err_msg=what)


@pytest.mark.interpreter   # both kernels in the interpreter (on a GPU machine: on its CPU)
@pytest.mark.parametrize("sequential", [False, True])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_tiled_kernel_gives_the_kernels_answer(case, sequential):
  args = case.args(seed=len(case.name))
  params = _params(case, args)
  assert _largest(params.jaxpr) > regions.MAX_ELEMENTS, "the case must hold a large value"
  tiled = tiling.rewrite(params, sequential_axes=sequential)
  assert _largest(tiled.jaxpr) <= regions.MAX_ELEMENTS, tiled.jaxpr
  if sequential:
    assert tiled.grid_mapping.grid == params.grid_mapping.grid
  want = _run(params, args)
  got = _run(tiled, args)
  for k, (g, w) in enumerate(zip(got, want)):
    _compare(g, w, case.tol, f"{case.name} out[{k}]")


def test_whole_kernels_spread_their_tiles_over_programs():
  case = CASES[0]
  args = case.args(seed=1)
  params = _params(case, args)
  tiled = tiling.rewrite(params, sequential_axes=False)
  region = _region(params)
  assert tiled.grid_mapping.grid == (512 // region.tiles[0],) + params.grid_mapping.grid
  assert region.tiles[1] == 512, "rows stay whole: contiguous loads"


def test_partial_last_tiles_overlap_only_where_no_ref_is_read_back():
  by_name = {c.name: c for c in CASES}
  for name, exact in [("where_cast_300x384", False), ("in_place_300x512", True)]:
    case = by_name[name]
    params = _params(case, case.args(0))
    region = _region(params)
    assert region.exact == exact
    if exact:
      assert all(s % t == 0 for s, t in zip(region.sizes, region.tiles))
    else:
      assert any(s % t for s, t in zip(region.sizes, region.tiles)), "300 rows, a tile of 16"


def test_columns_are_split_where_rows_are_reduced():
  case = next(c for c in CASES if c.name == "center_columns_640x300")
  region = _region(_params(case, case.args(0)))
  assert region.tiles[0] == 640 and region.tiles[1] < 300


def test_product_epilogue_runs_once_per_output_tile():
  case = next(c for c in CASES if c.name == "relu_matmul_quickstart")
  params = _params(case, case.args(0))
  region = _region(params)
  [p] = region.products.values()
  assert region.tiles == p.tiles()[:2]
  tiled = tiling.rewrite(params, sequential_axes=False)
  dots = [e for e in jaxpr_util.equations(tiled.jaxpr) if e.primitive is lax.dot_general_p]
  assert dots and all(e.outvars[0].aval.shape == p.tiles()[:2] for e in dots)


@pytest.mark.interpreter
def test_16_bit_sums_over_tiles_accumulate_in_float32():
  def kernel(x_ref, o_ref):   # lax's sum of bf16 (jnp.sum would add in float32 itself)
    total = lax.reduce_sum_p.bind(x_ref[...], axes=(0, 1), out_sharding=None)
    o_ref[...] = jnp.broadcast_to(total, (1, 1))
  case = Case("bf16_sum", kernel, (((1000, 300), bf16),), (((1, 1), bf16),))
  (x,) = case.args(seed=5)
  x = (x.astype(f32) + 1.5).astype(bf16)   # a large total: its bf16 ulp is 2048
  params = _params(case, [x])
  (region,) = _regions_of(params)
  assert region.reduction is not None and math.prod(region.counts()) > 1
  tiled = tiling.rewrite(params, sequential_axes=True)
  loops = [e for e in jaxpr_util.equations(tiled.jaxpr) if e.primitive in (lax.scan_p, lax.while_p)]
  assert any(v.aval.dtype == f32 for e in loops for v in e.outvars), "a float32 carry"
  [got] = _run(tiled, [x])
  exact = np.asarray(x, np.float64).sum()   # the answer: within one bf16 ulp of the exact sum
  ulp = float(np.spacing(np.float32(np.asarray(jnp.asarray(exact, bf16), np.float32)))) * 2**16
  assert abs(float(np.asarray(got, np.float32)[0, 0]) - exact) <= ulp, (got, exact)


def test_vmapped_big_blocks():
  # vmap adds a grid axis before the one over the tiles; on a CPU the kernel also lowers
  case = next(c for c in CASES if c.name == "add_512x512")
  kx, ky = jax.random.split(jax.random.key(11))
  x, y = (jax.random.normal(k, (3, 512, 512), f32) for k in (kx, ky))
  [got] = jax.vmap(case.call())(x, y)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(x + y))


def test_vmapped_quickstart_matmul():
  # JAX's quickstart: jax.vmap(partial(matmul, activation=jax.nn.relu)) over 512x1024 blocks
  case = next(c for c in CASES if c.name == "relu_matmul_quickstart")
  kx, ky = jax.random.split(jax.random.key(12))
  x, y = (jax.random.normal(k, (2, 1024, 1024), f32) for k in (kx, ky))
  [got] = jax.vmap(case.call())(x, y)
  x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
  want = np.maximum(np.einsum("bij,bjk->bik", x64, y64), 0)
  if jax.devices()[0].platform == "gpu":
    # Triton's tf32 (XLA's default for float32 dots): each operand rounded to 11 significant
    # bits, so each product is off by at most 2**-10 of |x||y|; the bound is elementwise.
    bound = 2.0 ** -10 * np.einsum("bij,bjk->bik", np.abs(x64), np.abs(y64)) + 1e-3
    assert (np.abs(np.asarray(got, np.float64) - want) <= bound).all()
  else:   # float32 sums of 1024 products in the interpreter
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-3)


# --- Triton lowering (no GPU needed) --------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_lowers_for_triton(case):
  specs = [jax.ShapeDtypeStruct(s, d) for s, d in case.ins]
  [art] = plgpu.lower(case.call(), *specs, compute_capability=90)
  assert ".entry" in art.ptx
  assert "for " in art.source or "tl.program_id" in art.source


# --- what stays refused says which value and why ------------------------------------------

def _cumsum_rows(x_ref, o_ref):
  o_ref[...] = jnp.cumsum(x_ref[...], axis=0)


def _loop_carry(x_ref, o_ref):
  o_ref[...] = lax.fori_loop(0, 3, lambda i, c: c * 2, x_ref[...])


def _stored_in_loop(x_ref, o_ref):
  def body(i, c):
    o_ref[...] = c + 1.0
    return c
  lax.fori_loop(0, 2, body, x_ref[...])


@pytest.mark.parametrize("kernel,words", [
    (_cumsum_rows, ["cumsum", "test_big_blocks.py"]),
    (_loop_carry, ["test_big_blocks.py", "loop"]),
    (_stored_in_loop, ["test_big_blocks.py", "passed whole into `scan`"]),
])
def test_refusals_name_the_value_and_why(kernel, words):
  spec = jax.ShapeDtypeStruct((512, 512), jnp.float32)
  f = pl.pallas_call(kernel, out_shape=spec)
  with pytest.raises(NotImplementedError) as e:
    plgpu.lower(f, spec, compute_capability=90)
  msg = str(e.value)
  assert "too large for one Triton program" in msg and "float32[512,512]" in msg, msg
  for w in words:
    assert w in msg, msg


# --- on a GPU: Triton against the interpreter ---------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_triton_matches_the_interpreter(case):
  if jax.devices()[0].platform != "gpu":
    pytest.skip("needs an NVIDIA GPU")
  for seed in (1, 2):
    args = case.args(seed)
    got = jax.block_until_ready(case.call(interpret=False)(*args))
    want = case.call(interpret=True)(*args)
    for k, (g, w) in enumerate(zip(got, want)):
      _compare(g, w, case.gpu_tol, f"{case.name} out[{k}] (seed {seed})")


def test_a_large_loop_carry_stored_in_the_body_stays_whole():
  spec = jax.ShapeDtypeStruct((512, 512), jnp.float32)
  jaxpr = jax.make_jaxpr(pl.pallas_call(_stored_in_loop, out_shape=spec))(spec).jaxpr
  (call,) = [e for e in jaxpr.eqns if e.primitive is pcall.pallas_call_p]
  (loop,) = [e for e in call.params["params"].jaxpr.eqns if e.primitive is lax.scan_p]
  found = regions.analyze(loop.params["jaxpr"])
  assert isinstance(found, regions.Refusal), found
  assert "comes from outside" in found.message() and "float32[512,512]" in found.message()

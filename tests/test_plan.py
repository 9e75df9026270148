"""The kernel plan: one analysis of a pallas_call's grid, read by every backend."""
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl
from pallax._src import grid_mapping
from pallax._src import pallas_call as pcall
from pallax._src import plan as kplan
from helpers import params_of

pytestmark = pytest.mark.interpreter

S = jax.ShapeDtypeStruct
F32 = jnp.float32


# --- kernels, each with the plan facts it must give ----------------------------------------------

def _add(x_ref, y_ref, o_ref):
  o_ref[...] = x_ref[...] + y_ref[...]


def partial_edges():
  """A 2D grid of 8x8 blocks over a 30x20 array: partial edge blocks along both dimensions."""
  spec = pl.BlockSpec((8, 8), lambda i, j: (i, j))
  x = S((30, 20), F32)
  return params_of(pl.pallas_call(_add, out_shape=x, grid=(4, 3), in_specs=[spec, spec],
                                  out_specs=spec), x, x)


def _copy(x_ref, o_ref):
  o_ref[...] = x_ref[...]


def revisited_fixed_store():
  """Programs (i, 0..2) all write block (i, 0) at fixed indices: the last write wins, so axis 1
  runs in order on a GPU too."""
  x = S((16, 24), F32)
  return params_of(pl.pallas_call(
      _copy, out_shape=S((16, 8), F32), grid=(2, 3),
      in_specs=[pl.BlockSpec((8, 8), lambda i, j: (i, j))],
      out_specs=pl.BlockSpec((8, 8), lambda i, j: (i, 0))), x)


def _matmul(x_ref, y_ref, o_ref):
  @pl.when(pl.program_id(2) == 0)
  def _():
    o_ref[...] = jnp.zeros_like(o_ref)
  o_ref[...] += x_ref[...] @ y_ref[...]


def k_in_grid():
  """The K loop of a matmul in the grid (axis 2), accumulating into the output block."""
  x, y = S((32, 48), F32), S((48, 16), F32)
  return params_of(pl.pallas_call(
      _matmul, out_shape=S((32, 16), F32), grid=(2, 2, 3),
      in_specs=[pl.BlockSpec((16, 16), lambda i, j, k: (i, k)),
                pl.BlockSpec((16, 8), lambda i, j, k: (k, j))],
      out_specs=pl.BlockSpec((16, 8), lambda i, j, k: (i, j))), x, y)


def _triton_style(x_ref, o_ref):
  i = pl.program_id(0)
  idx = i * 8 + jnp.arange(8)
  v = pl.load(x_ref, (pl.ds(i * 8, 8),), mask=idx < 13, other=0.0)
  pl.store(o_ref, (pl.ds(i * 8, 8),), v + 1, mask=idx < 13)


def triton_style():
  """Whole-array Refs, each program storing its own slice through a mask: every program revisits
  the one output block (the interpreter runs them in order), but a GPU runs them concurrently."""
  x = S((13,), F32)
  return params_of(pl.pallas_call(_triton_style, out_shape=x, grid=(2,)), x)


def _gather(perm_ref, x_ref, o_ref):
  o_ref[...] = x_ref[...] * 2


def prefetch_in_input():
  """An input's index map reads a scalar-prefetch operand; the output's does not."""
  gs = pl.PrefetchScalarGridSpec(
      num_scalar_prefetch=1, grid=(5,), in_specs=[pl.BlockSpec((4,), lambda i, p: (p[i],))],
      out_specs=pl.BlockSpec((4,), lambda i, p: (i,)))
  x = S((20,), F32)
  return params_of(pl.pallas_call(_gather, out_shape=x, grid_spec=gs), S((5,), jnp.int32), x)


def prefetch_in_output_read_back():
  """The output's index map reads a scalar-prefetch operand and the kernel reads it back."""
  def kernel(p_ref, x_ref, o_ref):
    o_ref[...] = o_ref[...] + x_ref[...]
  gs = pl.PrefetchScalarGridSpec(
      num_scalar_prefetch=1, grid=(5,), in_specs=[pl.BlockSpec((4,), lambda i, p: (i,))],
      out_specs=pl.BlockSpec((4,), lambda i, p: (p[i],)))
  x = S((20,), F32)
  return params_of(pl.pallas_call(kernel, out_shape=x, grid_spec=gs), S((5,), jnp.int32), x)


def _window(x_ref, o_ref):
  o_ref[...] = x_ref[pl.ds(1, 4)] * 5


def element_input():
  """A pl.Element window with padding on an input."""
  x = S((16,), jnp.int32)
  return params_of(pl.pallas_call(
      _window, out_shape=x, grid=(4,),
      in_specs=[pl.BlockSpec((pl.Element(6, (1, 1)),), lambda i: (i * 4,))],
      out_specs=pl.BlockSpec((4,), lambda i: (i,))), x)


def element_output():
  """A pl.Element window on an output: windows may overlap, so programs run in order."""
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]
  x = S((16,), F32)
  return params_of(pl.pallas_call(
      kernel, out_shape=x, grid=(4,), in_specs=[pl.BlockSpec((4,), lambda i: (i,))],
      out_specs=pl.BlockSpec((pl.Element(4),), lambda i: (i * 4,))), x)


def _global_sum(x_ref, o_ref):
  g = pl.get_global(pl.ANY((4,), jnp.int32))
  g[...] += x_ref[0]

  @pl.when(pl.program_id(0) == pl.num_programs(0) - 1)
  def _():
    o_ref[...] = g[...]


def get_global():
  x = S((6, 4), jnp.int32)
  return params_of(pl.pallas_call(
      _global_sum, out_shape=S((4,), jnp.int32), grid=(6,),
      in_specs=[pl.BlockSpec((1, 4), lambda i: (i, 0))],
      out_specs=pl.BlockSpec((4,), lambda i: (0,))), x)


def _scratch_acc(x_ref, o_ref, acc_ref):
  @pl.when(pl.program_id(1) == 0)
  def _():
    acc_ref[...] = jnp.zeros_like(acc_ref)
  acc_ref[...] += x_ref[...]
  o_ref[...] = acc_ref[...]


def scratch():
  """An accumulator in scratch along axis 1; the output block is revisited along it."""
  x = S((16, 24), F32)
  return params_of(pl.pallas_call(
      _scratch_acc, out_shape=S((16, 8), F32), grid=(2, 3),
      in_specs=[pl.BlockSpec((8, 8), lambda i, j: (i, j))],
      out_specs=pl.BlockSpec((8, 8), lambda i, j: (i, 0)),
      scratch_shapes=[pl.ANY((8, 8), F32)]), x)


def _causal(x_ref, o_ref):
  n = pl.program_id(1) + 1
  o_ref[...] = lax.fori_loop(0, n, lambda k, a: a + x_ref[...], jnp.zeros_like(x_ref))


def loop_count():
  """A loop whose trip count depends on axis 1 (causal attention's query blocks)."""
  spec = pl.BlockSpec((None, None, 8), lambda i, j: (i, j, 0))
  x = S((2, 3, 8), F32)
  return params_of(pl.pallas_call(_causal, out_shape=x, grid=(2, 3), in_specs=[spec],
                                  out_specs=spec), x)


def size_one_axis():
  """Axis 0 revisits the output block; axis 1 has one program: nothing runs in parallel."""
  x = S((32, 8), F32)
  return params_of(pl.pallas_call(
      _copy, out_shape=S((8, 8), F32), grid=(4, 1),
      in_specs=[pl.BlockSpec((8, 8), lambda i, j: (i, j))],
      out_specs=pl.BlockSpec((8, 8), lambda i, j: (0, j))), x)


def squeezed_batch():
  """A squeezed leading dimension (one batch element per program) and a partial last block."""
  spec = pl.BlockSpec((None, 8), lambda b, i: (b, i))
  x = S((3, 20), F32)
  return params_of(pl.pallas_call(_add, out_shape=x, grid=(3, 3), in_specs=[spec, spec],
                                  out_specs=spec), x, x)


# The answers of the schedules as they were before the plan existed (schedule.choose for the
# interpreter, codegen.gpu_schedule for the GPU), kept as data: (schedule, launch) parallel axes.
SCHEDULES = {
    partial_edges: ((0, 1), (0, 1)),
    revisited_fixed_store: ((0,), (0,)),
    k_in_grid: ((0, 1), (0, 1)),
    triton_style: ((), (0,)),
    prefetch_in_input: ((), (0,)),
    prefetch_in_output_read_back: ((), ()),
    element_input: ((0,), (0,)),
    element_output: ((), ()),
    get_global: ((), ()),
    scratch: ((0,), (0,)),
    loop_count: ((0, 1), (0, 1)),
    size_one_axis: ((), ()),
    squeezed_batch: ((0, 1), (0, 1)),
}


@pytest.mark.parametrize("build", list(SCHEDULES), ids=lambda b: b.__name__)
def test_schedules_are_the_ones_before_the_plan(build):
  plan = kplan.analyse(build())
  rank = len(plan.tables[0].shape) - 1 if plan.tables[0] is not None else None
  want_schedule, want_launch = SCHEDULES[build]
  assert (plan.schedule.parallel, plan.launch.parallel) == (want_schedule, want_launch)
  for s in (plan.schedule, plan.launch):
    assert set(s.parallel) | set(s.sequential) == set(range(len(s.parallel) + len(s.sequential)))
    assert rank is None or len(s.parallel) + len(s.sequential) == rank


def test_schedule_reasons():
  assert kplan.analyse(prefetch_in_input()).schedule.reason == \
      "index maps read scalar-prefetch operands"
  assert kplan.analyse(element_output()).schedule.reason == \
      "an output uses pl.Element blocks (windows may overlap)"
  assert kplan.analyse(get_global()).launch.reason == \
      "pl.get_global buffers are shared by all programs"
  assert kplan.analyse(prefetch_in_output_read_back()).launch.reason.startswith(
      "an output read back has an index map that reads scalar-prefetch")
  assert kplan.analyse(revisited_fixed_store()).schedule.reason == \
      "output blocks are revisited along the sequential axes"
  assert kplan.analyse(partial_edges()).schedule.reason == \
      "every program writes its own output blocks"


def test_tables_hold_block_indices_and_none_where_prefetch_is_read():
  plan = kplan.analyse(k_in_grid())
  i, j, k = np.meshgrid(np.arange(2), np.arange(2), np.arange(3), indexing="ij")
  np.testing.assert_array_equal(plan.tables[0], np.stack([i, k], -1))    # x: (i, k)
  np.testing.assert_array_equal(plan.tables[1], np.stack([k, j], -1))    # y: (k, j)
  np.testing.assert_array_equal(plan.tables[2], np.stack([i, j], -1))    # out: (i, j)
  assert plan.tables_known
  plan = kplan.analyse(prefetch_in_input())
  assert plan.tables[0] is None and plan.tables[1].shape == (5, 1) and not plan.tables_known


def test_index_map_outside_the_array_is_an_error_of_the_plan():
  x = S((16,), F32)
  params = params_of(pl.pallas_call(
      _copy, out_shape=x, grid=(4,), in_specs=[pl.BlockSpec((4,), lambda i: (i + 1,))],
      out_specs=pl.BlockSpec((4,), lambda i: (i,))), x)
  with pytest.raises(IndexError, match=r"index_map of args\[0\] returns block index 4 along "
                     r"dimension 0 at grid point \(3,\).*allows 0\.\.3"):
    kplan.analyse(params)


# --- block views: masks and padding -------------------------------------------------------------

def test_partial_edge_blocks_are_masked_in_every_partial_dimension():
  x_view, _, out_view = kplan.analyse(partial_edges()).blocks
  assert out_view.origin == "out[0]" and x_view.origin == "args[0]"
  assert out_view.array_shape == (30, 20) and out_view.block_shape == (8, 8)
  assert out_view.masked == (True, True) and out_view.exact == (False, False)
  assert out_view.max_index == (3, 2)
  assert out_view.array_padding == ((0, 2), (0, 4))
  assert out_view.low == (False, False)


def test_exact_and_squeezed_dimensions():
  view = kplan.analyse(squeezed_batch()).blocks[2]
  assert view.block_shape == (1, 8) and view.squeezed == (True, False)
  assert view.masked == (False, True)                 # 3 % 1 == 0; 20 % 8 == 4
  view = kplan.analyse(k_in_grid()).blocks[0]
  assert view.masked == (False, False) and view.exact == (True, True)


def test_element_dimensions_are_masked_with_their_padding():
  x_view, out_view = kplan.analyse(element_input()).blocks
  assert x_view.element == (True,) and x_view.padding == ((1, 1),)
  assert x_view.masked == (True,) and x_view.low == (True,)
  assert x_view.max_index == (16 + 2 - 6,)
  assert x_view.array_padding == ((1, 1),)
  assert out_view.element == (False,) and out_view.masked == (False,)
  view = kplan.analyse(element_output()).blocks[1]
  assert view.element == (True,) and view.masked == (True,) and view.low == (False,)


# --- the GPU launch, hidden buffers, Ref effects ---------------------------------------------------

def test_decode_order_first_axis_fastest_and_loop_count_axes_reversed():
  plan = kplan.analyse(loop_count())
  assert plan.loop_count_axes == (1,)
  assert plan.decode == (kplan.ProgramAxis(0, 2, False), kplan.ProgramAxis(1, 3, True))
  assert plan.lanes == 6
  assert plan.vectorize == (0,)   # batched programs would all run the longest loop
  plan = kplan.analyse(revisited_fixed_store())
  assert plan.decode == (kplan.ProgramAxis(0, 2, False),) and plan.lanes == 2
  assert plan.launch.sequential == (1,)


def test_decode_order_runs_vmapped_axes_slowest():
  # vmap twice: grid (2, 5, 3), the kernel's own axis last. Its programs run side by side, then
  # the inner vmap's axis, then the outer's (JAX Pallas's launch order; a batch element's rows
  # lie together in memory).
  spec = pl.BlockSpec((None, 8), lambda i: (i, 0))
  f = lambda x: pl.pallas_call(_copy, out_shape=x, grid=(3,), in_specs=[spec], out_specs=spec)(x)
  params = params_of(jax.vmap(jax.vmap(f)), S((2, 5, 3, 8), F32))
  assert params.grid_mapping.grid == (2, 5, 3) and params.grid_mapping.vmapped_dims == (0, 1)
  plan = kplan.analyse(params)
  assert [(a.axis, a.size) for a in plan.decode] == [(2, 3), (1, 5), (0, 2)]
  # A grid axis that is not vmap's (tiling's) keeps its place.
  gm = grid_mapping.with_leading_grid_axis(params.grid_mapping, 4, [False] * 2, vmapped=False)
  assert gm.grid == (4, 2, 5, 3) and gm.vmapped_dims == (1, 2)
  assert kplan.decode_order((0, 1, 2, 3), gm.vmapped_dims) == [0, 3, 2, 1]


def test_hidden_buffers():
  plan = kplan.analyse(scratch())
  assert plan.scratch == (kplan.HiddenBuffer("scratch[0]", (8, 8), np.dtype(np.float32), 2,
                                             False, False),)
  assert plan.globals == ()
  plan = kplan.analyse(get_global())
  assert plan.globals == (kplan.HiddenBuffer("get_global[0]", (4,), np.dtype(np.int32), 1,
                                             True, True),)
  assert plan.lanes == 1 and plan.vectorize == ()


def test_refs_written_and_read():
  plan = kplan.analyse(k_in_grid())           # Refs: x, y, out
  assert plan.written == (2,) and plan.read == (0, 1, 2)
  plan = kplan.analyse(triton_style())        # Refs: x, out
  assert plan.written == (1,) and plan.read == (0,)
  plan = kplan.analyse(prefetch_in_input())   # Refs: perm, x, out
  assert plan.written == (2,) and plan.read == (1,)


# --- speed and caching ------------------------------------------------------------------------------

@pytest.mark.parametrize("out_map", [lambda i, j: (i, j), lambda i, j: (i, 0)],
                         ids=["disjoint", "revisited"])
def test_plan_of_a_million_program_grid_is_fast(out_map):
  n = 1024
  x = S((n * 8, n * 8), F32)
  spec = pl.BlockSpec((8, 8), lambda i, j: (i, j))
  params = params_of(pl.pallas_call(
      _add if out_map(1, 1) == (1, 1) else _copy_add, out_shape=x, grid=(n, n),
      in_specs=[spec, spec], out_specs=pl.BlockSpec((8, 8), out_map)), x, x)
  start = time.perf_counter()
  plan = kplan.analyse(params)
  elapsed = time.perf_counter() - start
  assert elapsed < 1.5, elapsed
  if out_map(1, 1) == (1, 1):
    assert plan.schedule.parallel == (0, 1) and plan.launch.parallel == (0, 1)
  else:
    assert plan.schedule.parallel == (0,) and plan.launch.parallel == (0,)


def _copy_add(x_ref, y_ref, o_ref):
  o_ref[...] = x_ref[...] + y_ref[...]


def test_plan_is_computed_once_per_pallas_call(monkeypatch):
  calls = []
  analyse = kplan.analyse
  monkeypatch.setattr(kplan, "analyse", lambda params: calls.append(params) or analyse(params))

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 3

  spec = pl.BlockSpec((4,), lambda i: (i,))
  call = pl.pallas_call(kernel, out_shape=S((16,), F32), grid=(4,), in_specs=[spec],
                        out_specs=spec, interpret=True)
  x = jnp.arange(16, dtype=F32)
  params = params_of(call, x)
  bind = lambda x: pcall.pallas_call_p.bind(x, params=params)[0]
  for _ in range(2):   # eager: the interpreter's analysis, its compiled function, the run
    np.testing.assert_array_equal(bind(x), x * 3)
  np.testing.assert_array_equal(jax.jit(bind)(x), x * 3)
  np.testing.assert_array_equal(jax.jit(lambda x: bind(x) + 1)(x), x * 3 + 1)
  assert calls == [params]
  # Through the public API: the returned function keeps its trace, and identical traces share
  # the Params object above, whose plan exists already.
  calls.clear()
  for _ in range(2):
    np.testing.assert_array_equal(call(x), x * 3)
  np.testing.assert_array_equal(jax.jit(call)(x), x * 3)
  assert calls == []


def test_plans_are_dropped_with_their_params():
  import dataclasses
  import gc
  params = dataclasses.replace(partial_edges())   # a Params object no other cache holds
  kplan.plan_for(params)
  assert kplan.plan_for(params) is kplan.plan_for(params)
  key = id(params)
  assert key in kplan._plans._values
  del params
  gc.collect()
  assert key not in kplan._plans._values


def test_plan_tables_are_read_only():
  plan = kplan.analyse(partial_edges())
  with pytest.raises(ValueError):
    plan.tables[0][0, 0, 0] = 7

"""Named grids: ``pl.pallas_call(..., grid=(("i", 2), ("j", 4)))``, as JAX Pallas accepts them.

Each kernel is written once against a module ``pl`` and run on pallax and on JAX Pallas, on fresh
random inputs (jax.random, never zeros), with partial edge blocks and sizes that are not powers of
two. JAX's own interpreter (``interpret=True``) folds ``lax.axis_size`` and ``lax.psum(1, name)``
but cannot evaluate ``lax.axis_index`` (it raises NameError: unbound axis); JAX's TPU interpreter
(``interpret=pltpu.InterpretParams()``, which runs on a CPU) can, so kernels that use
``axis_index`` are compared with that one. pallax runs them in its interpreter (vectorized and in
order) and, as every kernel of the suite, lowers them to Triton (``tests/conftest.py``); on a GPU
machine the default mode runs them on Triton.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as jpl
from jax.experimental.pallas import tpu as jpltpu

import pallax
import pallax.triton as pltriton
from helpers import rand

# pallax's two modes: the default backend (the interpreter here, Triton on a GPU), and the
# interpreter running every program in order.
PALLAX_MODES = [pytest.param(False, id="pallax-default"),
                pytest.param(pallax.InterpretParams(parallel=False), id="pallax-sequential")]
# JAX's interpreter that knows lax.axis_index of grid axes.
JAX_AXIS_INTERPRET = jpltpu.InterpretParams()
SHAPE, BLOCK = (13, 22), (5, 8)          # a 3 x 3 grid of blocks, the last row and column partial
GRID = (("i", 3), ("j", 3))


def assert_same(out, ref):
  """Elementwise, within float32 rounding (the kernels add small integers to normal values);
  NumPy references are computed in float64."""
  out, ref = np.asarray(out), np.asarray(ref)
  ref = ref.astype(np.float32) if ref.dtype == np.float64 else ref
  assert out.shape == ref.shape and out.dtype == ref.dtype, (out.shape, out.dtype, ref.shape)
  np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)


def blocked(pl, kernel, interpret, grid=GRID, name=None):
  spec = pl.BlockSpec(BLOCK, lambda i, j: (i, j))
  return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(SHAPE, jnp.float32), grid=grid,
                        in_specs=[spec], out_specs=spec, interpret=interpret, name=name)


def positions():
  """Each element's (i, j) block position, as NumPy arrays of SHAPE."""
  i = np.arange(SHAPE[0])[:, None] // BLOCK[0] + np.zeros(SHAPE, np.int32)
  j = np.arange(SHAPE[1])[None, :] // BLOCK[1] + np.zeros(SHAPE, np.int32)
  return i, j


# --- kernels: lax.axis_index, axis_size, psum(1, name) ----------------------------------------

def axis_kernel(x_ref, o_ref):
  i, j = lax.axis_index("i"), lax.axis_index("j")
  size = lax.axis_size("i") * 100 + lax.psum(1, "j") * 1000
  o_ref[...] = x_ref[...] * (i + 1).astype(jnp.float32) + (j * 10 + size).astype(jnp.float32)


def reference(x):
  i, j = positions()
  return np.asarray(x) * (i + 1) + j * 10 + 3 * 100 + 3 * 1000


@pytest.mark.parametrize("interpret", PALLAX_MODES)
def test_axis_index_axis_size_psum_match_jax(interpret):
  x = rand(SHAPE)
  out = blocked(pallax, axis_kernel, interpret)(x)
  assert_same(out, blocked(jpl, axis_kernel, JAX_AXIS_INTERPRET)(x))
  assert_same(out, reference(x))


def sizes_kernel(pl):
  def kernel(x_ref, o_ref):
    # JAX's own interpreter folds these two at trace time (it cannot run axis_index).
    o_ref[...] = (x_ref[...] + lax.axis_size("j") * 10 + lax.psum(1, "i")
                  + pl.program_id(0) * 100)
  return kernel


@pytest.mark.parametrize("interpret", PALLAX_MODES)
def test_axis_size_and_psum_match_jax_interpret(interpret):
  x = rand(SHAPE)
  out = blocked(pallax, sizes_kernel(pallax), interpret)(x)
  assert_same(out, blocked(jpl, sizes_kernel(jpl), True)(x))
  i, _ = positions()
  assert_same(out, np.asarray(x) + 30 + 3 + i * 100)


@pytest.mark.parametrize("interpret", PALLAX_MODES)
def test_positions_by_name_and_by_index_agree(interpret):
  """pl.program_id(name) / num_programs(name) (pallax, as for pl.kernel meshes), program_id(k)
  and lax.axis_index(name) name the same position."""
  def kernel(x_ref, o_ref):
    same = ((pallax.program_id("i") == lax.axis_index("i"))
            & (pallax.program_id(1) == lax.axis_index("j"))
            & (pallax.num_programs("j") == lax.axis_size("j")))
    o_ref[...] = jnp.where(same, x_ref[...], jnp.nan)

  x = rand(SHAPE)
  assert_same(blocked(pallax, kernel, interpret)(x), x)


@pytest.mark.parametrize("interpret", PALLAX_MODES)
def test_axis_index_of_a_tuple_of_names(interpret):
  # lax.axis_index(("i", "j")) is the row-major linear position over both axes.
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + lax.axis_index(("i", "j")).astype(jnp.float32)

  x = rand(SHAPE)
  out = blocked(pallax, kernel, interpret)(x)
  assert_same(out, blocked(jpl, kernel, JAX_AXIS_INTERPRET)(x))
  i, j = positions()
  assert_same(out, np.asarray(x) + i * 3 + j)


@pytest.mark.parametrize("interpret", PALLAX_MODES)
def test_axis_index_inside_loops_conditions_and_calls(interpret):
  def kernel(x_ref, o_ref):
    def body(k, acc):   # the loop body reads the position of the grid
      return acc + lax.axis_index("j") * k
    acc = lax.fori_loop(0, 4, body, jnp.int32(0))        # 6 * j
    bump = lax.cond(lax.axis_index("i") % 2 == 0, lambda: lax.axis_index("j") + 100,
                    lambda: lax.axis_index("i") * 7)
    twice = jax.jit(lambda v: v * (lax.axis_index("i") + 2).astype(jnp.float32))(x_ref[...])
    o_ref[...] = twice + (acc + bump).astype(jnp.float32)

  x = rand(SHAPE)
  out = blocked(pallax, kernel, interpret)(x)
  assert_same(out, blocked(jpl, kernel, JAX_AXIS_INTERPRET)(x))
  i, j = positions()
  assert_same(out, np.asarray(x) * (i + 2) + 6 * j + np.where(i % 2 == 0, j + 100, i * 7))


@pytest.mark.parametrize("interpret", PALLAX_MODES)
def test_a_vmap_inside_the_kernel_binds_its_own_axis_name(interpret):
  # A name bound inside the kernel shadows the grid axis of the same name, as in JAX.
  def kernel(x_ref, o_ref):
    rows = jax.vmap(lambda r: r + lax.axis_index("i").astype(jnp.float32), axis_name="i")
    o_ref[...] = rows(x_ref[...]) + lax.axis_index("j").astype(jnp.float32) * 100

  x = rand(SHAPE)
  out = blocked(pallax, kernel, interpret)(x)
  assert_same(out, blocked(jpl, kernel, JAX_AXIS_INTERPRET)(x))
  _, j = positions()
  assert_same(out, np.asarray(x) + (np.arange(SHAPE[0]) % BLOCK[0])[:, None] + j * 100)


# --- grid specs, vmap, jit ---------------------------------------------------------------------

def test_grid_spec_keeps_sizes_and_names_as_jax_does():
  for pl in (pallax, jpl):
    gs = pl.GridSpec(grid=(("i", 3), ("j", 4)))
    assert tuple(gs.grid) == (3, 4) and tuple(gs.grid_names) == ("i", "j"), pl
    plain = pl.GridSpec(grid=(3, 4))
    assert tuple(plain.grid) == (3, 4) and plain.grid_names is None, pl


@pytest.mark.parametrize("interpret", PALLAX_MODES)
def test_named_grid_through_grid_spec(interpret):
  def build(pl, interp):
    spec = pl.BlockSpec(BLOCK, lambda i, j: (i, j))
    gs = pl.GridSpec(grid=GRID, in_specs=[spec], out_specs=spec)
    return pl.pallas_call(axis_kernel, out_shape=jax.ShapeDtypeStruct(SHAPE, jnp.float32),
                          grid_spec=gs, interpret=interp)

  x = rand(SHAPE)
  out = build(pallax, interpret)(x)
  assert_same(out, build(jpl, JAX_AXIS_INTERPRET)(x))
  assert_same(out, reference(x))


@pytest.mark.parametrize("interpret", PALLAX_MODES)
def test_named_grid_with_scalar_prefetch(interpret):
  # Scalar prefetch: the row of blocks each program reads comes from a table.
  order = jnp.asarray([2, 0, 1], jnp.int32)

  def kernel(order_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...] + (lax.axis_index("i") * 10 + order_ref[lax.axis_index("i")]).astype(
        jnp.float32)

  def build(pl, prefetch_spec, interp):
    gs = prefetch_spec(num_scalar_prefetch=1, grid=(("i", 3), ("j", 3)),
                       in_specs=[pl.BlockSpec((4, 8), lambda i, j, o: (o[i], j))],
                       out_specs=pl.BlockSpec((4, 8), lambda i, j, o: (i, j)))
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((12, 22), jnp.float32),
                          grid_spec=gs, interpret=interp)

  x = rand((12, 22))
  out = build(pallax, pallax.PrefetchScalarGridSpec, interpret)(order, x)
  assert_same(out, build(jpl, jpltpu.PrefetchScalarGridSpec, JAX_AXIS_INTERPRET)(order, x))
  rows = np.concatenate([np.asarray(x)[4 * o:4 * o + 4] + 10 * i + o
                         for i, o in enumerate(np.asarray(order))])
  assert_same(out, rows)


@pytest.mark.parametrize("interpret", PALLAX_MODES)
@pytest.mark.parametrize("in_axes", [0, 1, 2])
def test_vmap_of_a_named_grid(interpret, in_axes):
  """vmap prepends a grid axis; the kernel's names still mean their own axes."""
  xs = jnp.moveaxis(rand((4,) + SHAPE), 0, in_axes)
  out = jax.vmap(blocked(pallax, axis_kernel, interpret), in_axes=in_axes)(xs)
  assert_same(out, jax.vmap(blocked(jpl, axis_kernel, JAX_AXIS_INTERPRET), in_axes=in_axes)(xs))
  assert_same(out, np.stack([reference(x) for x in np.moveaxis(np.asarray(xs), in_axes, 0)]))


@pytest.mark.parametrize("interpret", PALLAX_MODES)
def test_nested_vmap_under_jit(interpret):
  xs = rand((2, 3) + SHAPE)
  f = jax.jit(jax.vmap(jax.vmap(blocked(pallax, axis_kernel, interpret))))
  ref = jax.vmap(jax.vmap(blocked(jpl, axis_kernel, JAX_AXIS_INTERPRET)))(xs)
  assert_same(f(xs), ref)
  assert_same(f(xs)[1, 2], reference(xs[1, 2]))


def test_jvp_of_a_named_grid_kernel():
  x, t = rand(SHAPE, salt="x"), rand(SHAPE, salt="t")
  out, tangent = jax.jvp(blocked(pallax, axis_kernel, False), (x,), (t,))
  i, _ = positions()
  assert_same(out, reference(x))
  assert_same(tangent, np.asarray(t) * (i + 1))


# --- the GPU: axis_index is the program id ----------------------------------------------------

def _code(source: str, name: str) -> list[str]:
  """The generated kernel's statements, without the comments that quote the user's source."""
  body = source[source.index(f"def {name}("):]
  return [ln for ln in body.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def test_axis_index_lowers_to_the_program_id_of_its_axis():
  def by_position(x_ref, o_ref):
    i, j = pallax.program_id(0), pallax.program_id(1)
    size = pallax.num_programs(0) * 100 + pallax.num_programs(1) * 1000
    o_ref[...] = x_ref[...] * (i + 1).astype(jnp.float32) + (j * 10 + size).astype(jnp.float32)

  x = rand(SHAPE)
  named = pltriton.lower(blocked(pallax, axis_kernel, False, name="k"), x)[0].source
  plain = pltriton.lower(blocked(pallax, by_position, False, grid=(3, 3), name="k"), x)[0].source
  assert "axis_index" not in named
  assert _code(named, "k") == _code(plain, "k")


def test_pl_kernel_over_a_named_mesh_lowers_to_triton():
  """lax.axis_index of a pl.Mesh axis is a program id too: such kernels lower to Triton."""
  x = rand((6, 16))

  def body(x_ref, o_ref):
    r, c = lax.axis_index("r"), lax.axis_index("c")
    rows, cols = pallax.ds(r * 3, 3), pallax.ds(c * 8, 8)
    o_ref[rows, cols] = x_ref[rows, cols] + (r * 10 + c).astype(jnp.float32)

  k = pallax.kernel(body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
                    mesh=pallax.Mesh((2, 2), ("r", "c")))
  bump = np.repeat(np.arange(2) * 10, 3)[:, None] + np.repeat(np.arange(2), 8)[None, :]
  assert_same(k(x), np.asarray(x) + bump)
  assert "axis_index" not in pltriton.lower(k, x)[0].source


# --- errors -----------------------------------------------------------------------------------

def test_an_unknown_axis_name_is_an_unbound_axis_as_in_jax():
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + lax.axis_index("k").astype(jnp.float32)

  x = rand(SHAPE)
  with pytest.raises(NameError, match="unbound axis name: k"):
    blocked(jpl, kernel, JAX_AXIS_INTERPRET)(x)
  with pytest.raises(NameError, match="unbound axis name: k"):
    blocked(pallax, kernel, False)(x)


def test_a_grid_mixing_named_and_unnamed_axes_is_refused():
  with pytest.raises(TypeError, match=re.escape("pallas_call axis_kernel: grid") + ".*mixes named"):
    blocked(pallax, axis_kernel, False, grid=(("i", 3), 3))(rand(SHAPE))


def test_repeated_axis_names_are_refused():
  with pytest.raises(ValueError, match="axis_kernel: the names of a named grid must be distinct"):
    blocked(pallax, axis_kernel, False, grid=(("i", 3), ("i", 3)))(rand(SHAPE))

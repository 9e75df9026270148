"""Arrays a kernel closes over, by JAX Pallas's rules: ``pallas_call`` refuses them ("captures
constants"; they are to be inputs), ``pl.kernel`` refuses non-scalar ones; Python and NumPy
scalars are inlined and fine. With JAX's ``jax_use_simplified_jaxpr_constants`` on, JAX traces
arrays as literals and accepts them, and so does pallax. Also: JAX's words for a Ref passed to a
jnp function, with the block Ref's memory space ('Ref<default>{...}')."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl
from kernel_corpus import simplified_constants

S = jax.ShapeDtypeStruct
_RNG = np.random.default_rng(31)
WEIGHTS = _RNG.standard_normal((8, 128)).astype(np.float32)   # a module-level table


def _x(shape=(16, 128)):
  return jnp.asarray(_RNG.standard_normal(shape).astype(np.float32))


def _scaled(table, x):
  """A gridded kernel that multiplies each (8, 128) block of x by ``table`` (closed over)."""
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * table
  spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
  return pl.pallas_call(kernel, out_shape=S(x.shape, x.dtype), grid=(x.shape[0] // 8,),
                        in_specs=[spec], out_specs=spec, interpret=True)(x)


@pytest.mark.parametrize("table", [WEIGHTS, jnp.asarray(WEIGHTS), WEIGHTS[:1],
                                   jnp.float32(2.5) + jnp.zeros(())],
                         ids=["numpy", "jax", "one_row", "jax_0d"])
def test_a_pallas_call_kernel_closing_over_an_array_is_refused(table):
  with pytest.raises(ValueError, match=r"The kernel function in the pallas_call kernel at .* "
                     r"captures constants \[float32\[.*\] \(used at .*test_captured_constants\.py"
                     r".*\)\]\. You should pass them as inputs"):
    _scaled(table, _x())


def test_the_same_table_passed_as_an_input_gives_the_product():
  x = _x()

  def kernel(x_ref, w_ref, o_ref):
    o_ref[...] = x_ref[...] * w_ref[...]
  spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
  out = pl.pallas_call(kernel, out_shape=S(x.shape, x.dtype), grid=(2,),
                       in_specs=[spec, pl.BlockSpec((8, 128), lambda i: (0, 0))],
                       out_specs=spec, interpret=True)(x, WEIGHTS)
  np.testing.assert_allclose(out, np.asarray(x) * np.tile(WEIGHTS, (2, 1)), rtol=1e-6)


@pytest.mark.parametrize("scalar", [1.75, np.float32(-0.5), np.array(3.0, np.float32), 4],
                         ids=["python_float", "numpy_scalar", "numpy_0d", "python_int"])
def test_scalars_are_inlined_and_may_be_closed_over(scalar):
  x = _x()
  np.testing.assert_allclose(_scaled(scalar, x), np.asarray(x) * np.float32(scalar), rtol=1e-6)


def test_arrays_built_from_data_in_the_kernel_are_constants_too():
  x = _x((8, 128))

  def from_list(x_ref, o_ref):
    o_ref[...] = x_ref[jnp.array([3, 1, 4, 1, 5, 0, 2, 6]), :]

  with pytest.raises(ValueError, match=r"captures constants \[int32\[8\]"):
    pl.pallas_call(from_list, out_shape=S(x.shape, x.dtype), interpret=True)(x)

  def computed(x_ref, o_ref):   # built by operations, not from data: fine
    rows = (lax.iota(jnp.int32, 8) * 3) % 8
    o_ref[...] = x_ref[rows, :] + jnp.arange(128, dtype=jnp.float32)

  out = pl.pallas_call(computed, out_shape=S(x.shape, x.dtype), interpret=True)(x)
  want = np.asarray(x)[(np.arange(8) * 3) % 8] + np.arange(128, dtype=np.float32)
  np.testing.assert_allclose(out, want, rtol=1e-6)


def test_a_value_of_an_enclosing_jit_closed_over_is_refused():
  @jax.jit
  def f(x, s):
    return _scaled(s, x)

  with pytest.raises(ValueError, match=r"captures constants \[float32\[\]"):
    f(_x(), jnp.float32(2.0))


def test_vmap_of_a_kernel_closing_over_an_array_is_refused():
  xs = _x((3, 16, 128))
  with pytest.raises(ValueError, match="captures constants"):
    jax.vmap(functools.partial(_scaled, WEIGHTS))(xs)


def test_with_jax_simplified_constants_arrays_are_literals_and_accepted():
  x = _x()
  with simplified_constants():
    out = _scaled(WEIGHTS, x)
    indexed = pl.pallas_call(
        lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[np.array([7, 0, 5, 2]), :]),
        out_shape=S((4, 128), x.dtype), interpret=True)(x[:8])
  np.testing.assert_allclose(out, np.asarray(x) * np.tile(WEIGHTS, (2, 1)), rtol=1e-6)
  np.testing.assert_array_equal(indexed, np.asarray(x)[[7, 0, 5, 2]])


# --- pl.kernel: scalars and Refs may be closed over, arrays may not ---------------------------

def _kernel_adding(c, x):
  mesh = pl.Mesh(grid=(2,), grid_names=("i",))

  @functools.partial(pl.kernel, out_type=S(x.shape, x.dtype), mesh=mesh, interpret=True)
  def add(x_ref, o_ref):
    i = pl.program_id(0)
    o_ref[pl.ds(i * 8, 8)] = x_ref[pl.ds(i * 8, 8)] + c
  return add(x)


def test_pl_kernel_may_close_over_a_jax_scalar():
  x = _x()
  c = jnp.float32(1.5) * jnp.ones(())   # a 0-d jax.Array (pallas_call would refuse it)
  np.testing.assert_allclose(_kernel_adding(c, x), np.asarray(x) + 1.5, rtol=1e-6)


def test_x_at_ellipsis_is_not_a_captured_constant():
  # jnp's x.at[...] makes an empty index array, a constant JAX Pallas refuses; it carries no data
  x = _x((8, 128))

  def kernel(x_ref, o_ref):
    buf = jnp.zeros((8, 128), jnp.float32).at[...].set(x_ref[...])
    o_ref[...] = buf.at[:, :64].set(buf[:, 64:]) * 2

  want = np.asarray(x).copy()
  want[:, :64] = want[:, 64:]
  out = pl.pallas_call(kernel, out_shape=S(x.shape, x.dtype), interpret=True)(x)
  np.testing.assert_allclose(out, want * 2, rtol=1e-6)

  mesh = pl.Mesh(grid=(1,), grid_names=("i",))
  out = pl.kernel(kernel, out_type=S(x.shape, x.dtype), mesh=mesh, interpret=True)(x)
  np.testing.assert_allclose(out, want * 2, rtol=1e-6)


def test_pl_kernel_refuses_an_array_closed_over():
  with pytest.raises(ValueError, match=r"captures non-scalar array constants \[float32\[8,128\].*"
                     r"You can only close over scalars and Refs"):
    _kernel_adding(WEIGHTS, _x())


# --- a Ref passed where a value belongs -------------------------------------------------------

def test_a_ref_passed_to_a_lax_function_is_named_with_its_memory_space():
  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = lax.dot_general(x_ref, y_ref[...], (((1,), (0,)), ((), ())))

  x, y = _x((8, 32)), _x((32, 16))
  with pytest.raises(ValueError, match=r"Attempting to pass a Ref Ref<default>\{float32\[8,32\]\} "
                     r"to a primitive: dot_general -- did you forget to unpack \(\[\.\.\.\]\) the "
                     r"ref\? \(x_ref is args\[0\]"):
    pl.pallas_call(kernel, out_shape=S((8, 16), jnp.float32), interpret=True)(x, y)

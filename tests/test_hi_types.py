"""JAX's "hi" types (user types registered with ``jax.experimental.hijax``) as ``pallas_call``
operands or outputs: JAX Pallas lowers them to their component arrays; pallax refuses them by
name (a NotImplementedError saying what to pass instead), never as a confusing failure."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import hijax

import pallax as pl


@dataclasses.dataclass(frozen=True)
class ScaledRows:
  """Rows and one scale per row: a value that JAX sees as one thing of type ScaledRowsTy."""
  rows: jax.Array
  scales: jax.Array


@dataclasses.dataclass(frozen=True)
class ScaledRowsTy(hijax.HiType):
  rows_aval: hijax.ShapedArray
  scales_aval: hijax.ShapedArray

  @property
  def shape(self):
    return self.rows_aval.shape

  @property
  def dtype(self):
    return self.rows_aval.dtype

  def lo_ty(self):
    return [self.rows_aval, self.scales_aval]

  def lower_val(self, v):
    return [v.rows, v.scales]

  def raise_val(self, rows, scales):
    return ScaledRows(rows, scales)


hijax.register_hitype(ScaledRows, lambda v: ScaledRowsTy(jax.typeof(v.rows), jax.typeof(v.scales)))


def _value():
  rng = np.random.default_rng(5)
  return ScaledRows(jnp.asarray(rng.standard_normal((8, 16)), jnp.float32),
                    jnp.asarray(rng.standard_normal((8,)), jnp.float32))


def test_a_hi_type_operand_is_refused_by_name():
  def kernel(v_ref, o_ref):
    o_ref[...] = v_ref[...]
  with pytest.raises(NotImplementedError, match=r"args\[0\] is of type ScaledRowsTy\(.*\), a JAX "
                     r"'hi' type; .*pass the value's component arrays as separate operands"):
    pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 16), jnp.float32),
                   interpret=True)(_value())


def test_a_hi_type_operand_under_jit_is_refused_by_name():
  def kernel(v_ref, o_ref):
    o_ref[...] = v_ref[...]
  call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 16), jnp.float32),
                        interpret=True)
  with pytest.raises(NotImplementedError, match=r"args\[0\] is of type ScaledRowsTy"):
    jax.jit(call)(_value())


def test_a_hi_type_output_is_refused_by_name():
  v = _value()
  with pytest.raises(NotImplementedError, match=r"out_shape\[0\] is of type ScaledRowsTy"):
    pl.pallas_call(lambda x_ref, o_ref: None, out_shape=jax.typeof(v), interpret=True)(v.rows)


def test_the_components_as_operands_work():
  v = _value()

  def kernel(rows_ref, scales_ref, o_ref):
    o_ref[...] = rows_ref[...] * scales_ref[...][:, None]
  out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 16), jnp.float32),
                       interpret=True)(v.rows, v.scales)
  np.testing.assert_allclose(out, np.asarray(v.rows) * np.asarray(v.scales)[:, None], rtol=1e-6)

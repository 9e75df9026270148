"""JAX's "hi" types (user types registered with ``jax.experimental.hijax``) as ``pallas_call``
operands and outputs: each is split into its component arrays (``lo_ty``), its BlockSpec into one
per component (``lower_block_spec``), and the kernel sees one Ref of the hi type. What pallax
still refuses, it refuses by name."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import hijax
from jax.extend.core import Primitive

import pallax as pl
import pallax.triton as plgpu


# --- a value of rows and one scale per row -------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ScaledRows:
  rows: jax.Array     # (n, m)
  scales: jax.Array   # (n,)


@dataclasses.dataclass(frozen=True)
class ScaledRowsTy(hijax.HiType):
  rows_aval: hijax.ShapedArray
  scales_aval: hijax.ShapedArray

  shape = property(lambda self: self.rows_aval.shape)
  dtype = property(lambda self: self.rows_aval.dtype)

  def update(self, *, shape=None, **_):
    if shape is None:
      return self
    return ScaledRowsTy(self.rows_aval.update(shape=shape),
                        self.scales_aval.update(shape=shape[:1]))

  def lo_ty(self):
    return [self.rows_aval, self.scales_aval]

  def lower_val(self, v):
    return [v.rows, v.scales]

  def raise_val(self, rows, scales):
    return ScaledRows(rows, scales)

  def lower_block_spec(self, spec):
    # the rows' blocks as given; the scales of the same rows
    row_block = spec.block_shape[0]
    return [spec, pl.BlockSpec((row_block,), lambda *idx: (spec.index_map(*idx)[0],))]


hijax.register_hitype(ScaledRows,
                      lambda v: ScaledRowsTy(jax.typeof(v.rows), jax.typeof(v.scales)))


# --- a stack of planes and which plane to use: read through a high primitive -----------------

@dataclasses.dataclass(frozen=True)
class PickedPlane:
  planes: jax.Array   # (k, n, m)
  which: jax.Array    # int32[1]


@dataclasses.dataclass(frozen=True)
class PickedPlaneTy(hijax.HiType):
  planes_aval: hijax.ShapedArray

  shape = property(lambda self: self.planes_aval.shape[1:])
  dtype = property(lambda self: self.planes_aval.dtype)

  def update(self, *, shape=None, **_):
    if shape is None:
      return self
    return PickedPlaneTy(self.planes_aval.update(shape=self.planes_aval.shape[:1] + tuple(shape)))

  def lo_ty(self):
    return [self.planes_aval, hijax.ShapedArray((1,), jnp.int32)]

  def lower_val(self, v):
    return [v.planes, v.which]

  def raise_val(self, planes, which):
    return PickedPlane(planes, which)

  def lower_block_spec(self, spec):
    k = self.planes_aval.shape[0]
    planes = spec.replace(block_shape=(pl.Blocked(k), *spec.block_shape),
                          index_map=lambda *idx: (0, *spec.index_map(*idx)))
    return [planes, pl.BlockSpec(memory_space=pl.ANY)]   # `which` whole


hijax.register_hitype(PickedPlane, lambda v: PickedPlaneTy(jax.typeof(v.planes)))

pick_p = Primitive("pick_plane")
pick_p.is_high = lambda *_: True
pick_p.def_abstract_eval(lambda ref: hijax.ShapedArray(ref.shape, ref.dtype))


def _pick_to_lojax(ref):
  parts = ref._refs   # the PickedPlane of the component Refs
  return parts.planes[parts.which[0]]


pick_p.to_lojax = _pick_to_lojax


# --- a type without lower_block_spec -------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Twin:
  a: jax.Array
  b: jax.Array


@dataclasses.dataclass(frozen=True)
class TwinTy(hijax.HiType):
  a_aval: hijax.ShapedArray
  b_aval: hijax.ShapedArray

  shape = property(lambda self: self.a_aval.shape)
  dtype = property(lambda self: self.a_aval.dtype)

  def lo_ty(self):
    return [self.a_aval, self.b_aval]

  def lower_val(self, v):
    return [v.a, v.b]

  def raise_val(self, a, b):
    return Twin(a, b)


hijax.register_hitype(Twin, lambda v: TwinTy(jax.typeof(v.a), jax.typeof(v.b)))


def _rng(seed):
  return np.random.default_rng(seed)


def _scaled_rows(n=20, m=16, seed=0):
  rng = _rng(seed)
  return ScaledRows(jnp.asarray(rng.standard_normal((n, m)), jnp.float32),
                    jnp.asarray(rng.standard_normal((n,)), jnp.float32))


def _picked_plane(seed=0):
  rng = _rng(seed)
  return PickedPlane(jnp.asarray(rng.integers(-1000, 1000, (5, 24, 128)), jnp.int32),
                     jnp.asarray([3], jnp.int32))


def _row_blocks(block):
  return pl.BlockSpec((block, 16), lambda i: (i, 0))


# --- operands and outputs -------------------------------------------------------------------

def test_a_hi_operand_split_into_blocks_of_each_component():
  v = _scaled_rows()   # 20 rows in blocks of 8: the last block is partial

  def kernel(v_ref, o_ref):
    val = v_ref[...]
    o_ref[...] = val.rows * val.scales[:, None]

  out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((20, 16), jnp.float32), grid=(3,),
                       in_specs=[_row_blocks(8)], out_specs=_row_blocks(8))(v)
  np.testing.assert_array_equal(out, np.asarray(v.rows) * np.asarray(v.scales)[:, None])


def test_a_hi_output_copied_block_by_block():
  v = _scaled_rows(seed=1)

  def kernel(v_ref, o_ref):
    o_ref[...] = v_ref[...]

  out = pl.pallas_call(kernel, out_shape=jax.typeof(v), grid=(3,), in_specs=[_row_blocks(8)],
                       out_specs=_row_blocks(8))(v)
  assert isinstance(out, ScaledRows)
  np.testing.assert_array_equal(out.rows, v.rows)
  np.testing.assert_array_equal(out.scales, v.scales)


def test_a_hi_output_built_from_array_operands():
  v = _scaled_rows(seed=2)

  def kernel(rows_ref, scales_ref, o_ref):
    o_ref[...] = ScaledRows(rows_ref[...] - 1.0, scales_ref[...] * 2.0)

  ty = ScaledRowsTy(jax.typeof(v.rows), jax.typeof(v.scales))
  out = pl.pallas_call(kernel, out_shape=ty)(v.rows, v.scales)
  np.testing.assert_array_equal(out.rows, np.asarray(v.rows) - 1.0)
  np.testing.assert_array_equal(out.scales, np.asarray(v.scales) * 2.0)


def test_without_specs_each_component_is_whole_even_without_lower_block_spec():
  rng = _rng(3)
  t = Twin(jnp.asarray(rng.standard_normal((8, 8)), jnp.float32),
           jnp.asarray(rng.standard_normal((3,)), jnp.float32))

  def kernel(t_ref, o_ref):
    val = t_ref[...]
    o_ref[...] = Twin(val.a + val.b.sum(), val.b)

  out = pl.pallas_call(kernel, out_shape=jax.typeof(t))(t)
  np.testing.assert_allclose(out.a, np.asarray(t.a) + np.asarray(t.b).sum(), rtol=1e-6)
  np.testing.assert_array_equal(out.b, t.b)


def test_a_spec_without_block_shape_keeps_each_component_whole():
  rng = _rng(14)
  t = Twin(jnp.asarray(rng.standard_normal((8, 8)), jnp.float32),
           jnp.asarray(rng.standard_normal((5,)), jnp.float32))

  def kernel(t_ref, o_ref):
    o_ref[...] = t_ref[...]

  out = pl.pallas_call(kernel, out_shape=jax.typeof(t), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                       out_specs=pl.BlockSpec(memory_space=pl.ANY))(t)
  np.testing.assert_array_equal(out.a, t.a)
  np.testing.assert_array_equal(out.b, t.b)


def test_a_high_primitive_reaches_the_component_refs():
  v = _picked_plane()

  def kernel(v_ref, o_ref):
    o_ref[...] = pick_p.bind(v_ref)

  spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
  out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((24, 128), jnp.int32), grid=(3,),
                       in_specs=[spec], out_specs=spec)(v)
  np.testing.assert_array_equal(out, np.asarray(v.planes)[3])


def test_hi_operands_and_outputs_under_jit():
  v = _scaled_rows(seed=4)

  @jax.jit
  def f(v):
    def kernel(v_ref, o_ref):
      val = v_ref[...]
      o_ref[...] = ScaledRows(val.rows * 3.0, val.scales)
    return pl.pallas_call(kernel, out_shape=jax.typeof(v), grid=(3,), in_specs=[_row_blocks(8)],
                          out_specs=_row_blocks(8))(v)

  out = f(v)
  np.testing.assert_array_equal(out.rows, np.asarray(v.rows) * 3.0)
  np.testing.assert_array_equal(out.scales, v.scales)


def test_aliasing_a_hi_operand_aliases_each_component():
  v = _picked_plane(seed=5)
  spec = pl.BlockSpec((8, 128), lambda i: (i, 0))

  @jax.jit
  def f(v):
    def kernel(v_ref, o_ref):
      val = v_ref[...]
      o_ref[...] = PickedPlane(val.planes + 7, val.which)
    return pl.pallas_call(kernel, out_shape=jax.typeof(v), grid=(3,), in_specs=[spec],
                          out_specs=spec, input_output_aliases={0: 0})(v)

  out = f(v)
  np.testing.assert_array_equal(out.planes, np.asarray(v.planes) + 7)
  np.testing.assert_array_equal(out.which, v.which)


def test_mixed_array_and_hi_operands_keep_their_order():
  v = _scaled_rows(seed=6)
  bias = jnp.asarray(_rng(7).standard_normal((20, 16)), jnp.float32)

  def kernel(b_ref, v_ref, o_ref, rows_ref):
    val = v_ref[...]
    o_ref[...] = val.rows * val.scales[:, None] + b_ref[...]
    rows_ref[...] = val.rows

  outs = pl.pallas_call(
      kernel, grid=(3,), in_specs=[_row_blocks(8), _row_blocks(8)],
      out_specs=[_row_blocks(8), _row_blocks(8)],
      out_shape=[jax.ShapeDtypeStruct((20, 16), jnp.float32)] * 2)(bias, v)
  want = np.asarray(v.rows) * np.asarray(v.scales)[:, None] + np.asarray(bias)
  np.testing.assert_allclose(outs[0], want, rtol=1e-6, atol=1e-6)   # a fused multiply-add may round once
  np.testing.assert_array_equal(outs[1], v.rows)


def test_the_triton_backend_sees_the_component_arrays():
  """Lowering only (no GPU needed): the kernel's Refs are the components'."""
  def f(rows, scales):
    def kernel(v_ref, o_ref):
      val = v_ref[...]
      o_ref[...] = val.rows * val.scales[:, None]
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((32, 16), jnp.float32),
                          grid=(4,), in_specs=[_row_blocks(8)],
                          out_specs=_row_blocks(8))(ScaledRows(rows, scales))

  [art] = plgpu.lower(f, jax.ShapeDtypeStruct((32, 16), jnp.float32),
                      jax.ShapeDtypeStruct((32,), jnp.float32), compute_capability=80)
  assert "def kernel(v_ref_0, v_ref_1, o_ref)" in art.source
  assert ".entry" in art.ptx


def test_the_triton_backend_lowers_a_high_primitive_on_the_component_refs():
  def f(planes, which):
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    return pl.pallas_call(lambda v_ref, o_ref: o_ref.__setitem__(..., pick_p.bind(v_ref)),
                          out_shape=jax.ShapeDtypeStruct((24, 128), jnp.int32), grid=(3,),
                          in_specs=[spec], out_specs=spec)(PickedPlane(planes, which))

  [art] = plgpu.lower(f, jax.ShapeDtypeStruct((5, 24, 128), jnp.int32),
                      jax.ShapeDtypeStruct((1,), jnp.int32), compute_capability=90)
  assert "tl.load(v_ref_1)" in art.source   # `which`, then the plane it picks
  assert ".entry" in art.ptx


@pytest.mark.gpu
def test_on_a_gpu_the_triton_backend_runs_a_hi_call():
  if jax.devices()[0].platform != "gpu":
    pytest.skip("needs an NVIDIA GPU")
  from pallax._src.triton import launch
  v = _picked_plane(seed=8)
  spec = pl.BlockSpec((8, 128), lambda i: (i, 0))

  def kernel(v_ref, o_ref):
    o_ref[...] = pick_p.bind(v_ref) * 2

  before = launch.LAUNCHES
  out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((24, 128), jnp.int32), grid=(3,),
                       in_specs=[spec], out_specs=spec)(v)
  np.testing.assert_array_equal(out, np.asarray(v.planes)[3] * 2)
  assert launch.LAUNCHES > before


# --- what stays refused ------------------------------------------------------------------------

def test_a_block_spec_for_a_type_without_lower_block_spec_is_refused_by_name():
  t = Twin(jnp.asarray(_rng(9).standard_normal((16, 8)), jnp.float32), jnp.zeros((3,)))
  with pytest.raises(NotImplementedError, match=r"args\[0\] is of the hi type TwinTy.*no "
                     r"lower_block_spec method"):
    pl.pallas_call(lambda t_ref, o_ref: None, out_shape=jax.ShapeDtypeStruct((16, 8), jnp.float32),
                   grid=(2,), in_specs=[pl.BlockSpec((8, 8), lambda i: (i, 0))])(t)


def test_a_lower_block_spec_with_the_wrong_count_is_refused():
  @dataclasses.dataclass(frozen=True)
  class OneSpecTy(TwinTy):
    def lower_block_spec(self, spec):
      return [spec]

  t = Twin(jnp.asarray(_rng(10).standard_normal((16, 8)), jnp.float32), jnp.zeros((3,)))
  ty = OneSpecTy(jax.typeof(t.a), jax.typeof(t.b))
  with pytest.raises(ValueError, match=r"lower_block_spec gave 1 BlockSpecs for out\[0\], but its "
                     r"type has 2 components"):
    pl.pallas_call(lambda a_ref, b_ref, o_ref: None, out_shape=ty, grid=(2,),
                   out_specs=pl.BlockSpec((8, 8), lambda i: (i, 0)))(t.a, t.b)


def test_a_hi_scalar_prefetch_operand_is_refused_by_name():
  v = _picked_plane(seed=11)
  gs = pl.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(1,))
  with pytest.raises(NotImplementedError, match=r"args\[0\] is a scalar-prefetch operand of the hi "
                     r"type PickedPlaneTy"):
    pl.pallas_call(lambda v_ref, o_ref: None, grid_spec=gs,
                   out_shape=jax.ShapeDtypeStruct((1,), jnp.int32))(v)


def test_aliasing_different_hi_types_is_refused():
  v = _scaled_rows(seed=12)
  other = ScaledRowsTy(hijax.ShapedArray((20, 16), jnp.float32), hijax.ShapedArray((4,), jnp.float32))
  with pytest.raises(ValueError, match=r"input_output_aliases contains the mapping '0:0'.*"
                     r"component by component"):
    pl.pallas_call(lambda v_ref, o_ref: None, out_shape=other, input_output_aliases={0: 0})(v)


def test_vmap_over_the_components_of_a_hi_value_built_inside():
  v = _scaled_rows(seed=13)
  rows, scales = jnp.stack([v.rows, -v.rows]), jnp.stack([v.scales, v.scales + 1])

  def f(rows, scales):
    def kernel(v_ref, o_ref):
      val = v_ref[...]
      o_ref[...] = val.rows * val.scales[:, None]
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((20, 16), jnp.float32),
                          grid=(3,), in_specs=[_row_blocks(8)],
                          out_specs=_row_blocks(8))(ScaledRows(rows, scales))

  out = jax.vmap(f)(rows, scales)
  np.testing.assert_array_equal(out, np.asarray(rows) * np.asarray(scales)[:, :, None])

"""CI (no GPU): every kernel of the corpus lowers to PTX for sm_80 and sm_90."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax.triton as plgpu
from kernel_corpus import CASES, by_name, matmul_inner_loop


def _specs(case):
  args = case.args(jax.random.key(0))
  return [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]


@pytest.mark.parametrize("cc", [80, 90])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_lowers_to_ptx(case, cc):
  if cc < case.min_cc:
    with pytest.raises(NotImplementedError, match="compute capability"):
      plgpu.lower(case.build(False), *_specs(case), compute_capability=cc)
    return
  arts = plgpu.lower(case.build(False), *_specs(case), compute_capability=cc)
  assert arts, "no pallas_call found"
  for a in arts:
    assert ".entry" in a.ptx and f".target sm_{cc}" in a.ptx
    assert "@triton.jit" in a.source and a.ttir.strip()
    assert a.num_warps >= 1 and a.num_stages >= 1 and a.shared_mem_bytes >= 0


def test_bf16_matmul_uses_tensor_cores():
  x = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16)
  f = lambda a, b: matmul_inner_loop(a, b)
  [a90] = plgpu.lower(f, x, x, compute_capability=90)
  [a80] = plgpu.lower(f, x, x, compute_capability=80)
  assert "wgmma" in a90.ptx
  assert "mma.sync" in a80.ptx and "wgmma" not in a80.ptx


def test_generated_source_is_readable():
  case = by_name("matmul_inner_loop_bfloat16")
  [a] = plgpu.lower(case.build(False), *_specs(case))
  assert "for i in range(" in a.source          # the fori_loop is a Triton for loop (pipelined)
  assert "tl.dot(" in a.source
  assert "kernel_corpus.py:" in a.source        # comments point at the kernel's source lines
  assert all(len(line) < 400 for line in a.source.splitlines())


def test_unsupported_primitive_names_itself_and_the_line():
  import pallax as pl
  def kernel(x_ref, o_ref):
    o_ref[...] = jnp.sort(x_ref[...])
  f = lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16,), jnp.float32))(x)
  with pytest.raises(NotImplementedError, match=r"sort.*test_triton_lowering.py:\d+"):
    plgpu.lower(f, jax.ShapeDtypeStruct((16,), jnp.float32))


def test_too_much_shared_memory_says_how_much():
  import pallax as pl
  def kernel(x_ref, y_ref, o_ref):   # f32 operands of 128x512 and 512x128: 512 KiB to stage
    o_ref[...] = jnp.dot(x_ref[...] * 2, y_ref[...])
  s = jax.ShapeDtypeStruct((128, 512), jnp.float32)
  t = jax.ShapeDtypeStruct((512, 128), jnp.float32)
  f = lambda x, y: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((128, 128), jnp.float32))(x, y)
  with pytest.raises(ValueError, match=r"needs \d+ bytes of shared memory.*smaller blocks"):
    plgpu.lower(f, s, t, compute_capability=80)


def test_block_matmul_too_large_for_one_program_is_tiled():
  import pallax as pl
  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] @ y_ref[...]
  s = jax.ShapeDtypeStruct((512, 1024), jnp.float32)
  t = jax.ShapeDtypeStruct((1024, 512), jnp.float32)
  f = lambda x, y: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((512, 512), jnp.float32))(x, y)
  [a] = plgpu.lower(f, s, t)
  assert "too large for one program" in a.source and a.grid[0] == 16 and "tl.dot(" in a.source


def test_old_gpu_gets_a_clear_message():
  case = by_name("notebook_add_vectors")
  with pytest.raises(RuntimeError, match="compute capability 8.0.*interpret=True"):
    plgpu.lower(case.build(False), *_specs(case), compute_capability=75)


def test_cache_hints_reach_triton_and_the_interpreter_ignores_them():
  import numpy as np
  import pallax as pl

  def kernel(x_ref, o_ref):
    x = plgpu.load(x_ref, cache_modifier=".cg")
    y = plgpu.load(x_ref, eviction_policy="evict_last")
    pl.store(o_ref, (), x + y, eviction_policy="evict_first")

  f = lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((100,), jnp.float32))(x)
  [a] = plgpu.lower(f, jax.ShapeDtypeStruct((100,), jnp.float32), compute_capability=90)
  assert "cache_modifier='.cg'" in a.source and "eviction_policy='evict_last'" in a.source
  assert "eviction_policy='evict_first'" in a.source
  x = jax.random.normal(jax.random.key(5), (100,))
  np.testing.assert_array_equal(f(x), np.asarray(x) * 2)
  for hints in ({"eviction_policy": "first"}, {"cache_modifier": ".cg", "eviction_policy": "evict_last"}):
    with pytest.raises(ValueError, match="eviction_policy"):
      plgpu.lower(lambda x: pl.pallas_call(
          lambda x_ref, o_ref: o_ref.__setitem__(..., plgpu.load(x_ref, **hints)),
          out_shape=jax.ShapeDtypeStruct((100,), jnp.float32))(x), x)


def test_x64_kernels_lower():
  """int64/uint64/float64 with jax_enable_x64 (a process of its own: the flag is global)."""
  import os
  import subprocess
  import sys
  here = os.path.dirname(os.path.abspath(__file__))
  env = dict(os.environ, PYTHONPATH=os.path.dirname(here) + os.pathsep + os.environ.get("PYTHONPATH", ""),
             JAX_PLATFORMS="cpu")
  r = subprocess.run([sys.executable, os.path.join(here, "gpu_scripts", "x64_kernels.py")],
                     capture_output=True, text=True, env=env, timeout=300)
  assert "lowered: ['kernel']" in r.stdout, (r.stdout + r.stderr)[-3000:]


def test_argmax_argmin_pick_the_first_nan_as_lax_does():
  """The interpreter (the reference for the Triton backend) gives lax's answer on NaN, ties and
  infinities; the Triton code reduces (value, index) pairs so that NaN is not skipped."""
  case = by_name("argmax_argmin_nan_ties")
  (x,) = case.args(jax.random.key(5))
  rows, cols = case.build(True)(x)
  xn = np.asarray(x)

  def first(mask):   # index of the first True along axis -1, or -1
    return np.where(mask.any(-1), mask.argmax(-1), -1)

  def expect_arg(v, axis, kind):
    v = np.moveaxis(v, axis, -1)
    nan = first(np.isnan(v))
    plain = (np.nanargmax if kind == "max" else np.nanargmin)(np.where(np.isnan(v).all(-1, keepdims=True), 0, v), -1)
    return np.where(nan >= 0, nan, plain)

  np.testing.assert_array_equal(rows[0], expect_arg(xn, 1, "max"))
  np.testing.assert_array_equal(rows[1], expect_arg(xn, 1, "min"))
  np.testing.assert_array_equal(rows[2], expect_arg(np.asarray(x.astype(jnp.bfloat16), np.float32), 1, "max"))
  np.testing.assert_array_equal(cols[0], expect_arg(xn, 0, "max"))
  np.testing.assert_array_equal(cols[1], expect_arg(xn, 0, "min"))
  assert list(rows[0][:5]) == [7, 0, 0, 40, 49]
  src = plgpu.lower(case.build(False), x, compute_capability=90)[0].source
  body = src[src.rindex("@triton.jit"):]   # the kernel, after the prologue's helpers
  assert body.count(", _argmax)[1]") == 3 and body.count(", _argmin)[1]") == 2 and "tl.argmax(" not in body


def test_clamp_keeps_nan_as_lax_does():
  case = by_name("clamp_nan_and_ints")
  x, lo = case.args(jax.random.key(2))
  f, i = case.build(True)(x, lo)
  xn, lon = np.asarray(x), np.asarray(lo)
  np.testing.assert_array_equal(f[0], np.minimum(np.maximum(xn, -0.5), 0.5))   # NumPy's also keep NaN
  np.testing.assert_array_equal(f[1], np.minimum(np.maximum(xn, lon), lon + 1))
  assert np.isnan(f[0][1, 3]) and np.isnan(f[1][2, 5])
  np.testing.assert_array_equal(i, np.clip((np.nan_to_num(xn) * 4).astype(np.int32), -3, 2))
  src = plgpu.lower(case.build(False), x, lo, compute_capability=90)[0].source
  body = src[src.rindex("@triton.jit"):]
  assert body.count("propagate_nan=tl.PropagateNan.ALL") == 4   # both float clamps, both bounds


def test_integer_division_by_zero_and_sign_follow_lax():
  case = by_name("int_div_rem_by_zero_and_sign")
  x, y, f = case.args(jax.random.key(4))
  got = case.build(True)(x, y, f)
  xn, yn = np.asarray(x), np.asarray(y)
  assert got[0][0][0, 0] == np.iinfo(np.int32).min and got[0][0][0, 1] == -1   # MIN // -1, MIN // 0
  assert got[0][1][0, 0] == 0 and got[0][1][0, 1] == xn[0, 1]                  # MIN % -1, x % 0
  assert np.asarray(got[1][0])[np.abs(yn) == 0].tolist() == [2**32 - 1] * int((yn == 0).sum())
  np.testing.assert_array_equal(got[0][2], xn // 3 + xn % -4)   # jnp // and % floor, as NumPy
  s = np.asarray(got[3])
  assert np.isnan(s[1, 0]) and np.signbit(s[1, 1]) and s[1, 2] == 0 and not np.signbit(s[1, 2])
  src = plgpu.lower(case.build(False), x, y, f, compute_capability=90)[0].source
  assert "x // 3\n" in src and "(y == 0) | ((x == -2147483648) & (y == -1))" in src   # guarded only when needed


def _np_shift(x, s, kind):
  """lax's shift semantics, in NumPy: amounts outside [0, bits) give 0 (the sign for arithmetic)."""
  bits = x.dtype.itemsize * 8
  ok = (s >= 0) & (s < bits)
  sc = np.where(ok, s, 0).astype(x.dtype)
  signed = x.view(np.dtype(f"i{x.dtype.itemsize}"))
  unsigned = x.view(np.dtype(f"u{x.dtype.itemsize}"))
  if kind == "left":
    return np.where(ok, x << sc, 0).astype(x.dtype)
  if kind == "logical":
    return np.where(ok, unsigned >> sc.view(unsigned.dtype), 0).view(x.dtype)
  return np.where(ok, signed >> sc.view(signed.dtype), signed >> (bits - 1)).view(x.dtype)


def test_shifts_out_of_range_follow_lax():
  case = by_name("int_shifts_out_of_range")
  x, s = case.args(jax.random.key(5))
  got = case.build(True)(x, s)
  xn, sn = np.asarray(x), np.asarray(s)
  for out, kind in zip(got[0][:3], ("left", "logical", "arith")):
    np.testing.assert_array_equal(out, _np_shift(xn, sn, kind))
  np.testing.assert_array_equal(got[0][3], (xn << 3) + (xn >> 31))
  xu = xn.view(np.uint32)
  np.testing.assert_array_equal(got[1][0], _np_shift(xu, sn, "arith"))
  np.testing.assert_array_equal(got[1][1], _np_shift(xu, sn, "left") ^ _np_shift(xu, sn, "logical"))
  x8, s8 = xn.astype(np.int8), (sn // 4).astype(np.int8)
  np.testing.assert_array_equal(got[2], (_np_shift(x8, s8, "arith") + _np_shift(x8, s8, "left")))
  i = np.asarray(got[0])
  assert i[2][0, 0] == -7 and i[0][0, 2] == 0 and i[2][0, 4] == (-1 if xn[0, 4] < 0 else 0)   # by 0, 32, -1
  src = plgpu.lower(case.build(False), x, s, compute_capability=90)[0].source
  body = src[src.rindex("@triton.jit"):]
  assert "= x << 3\n" in body and "= x >> 31\n" in body          # literals: unguarded, or folded
  assert body.count("< 32,") == 4 and body.count("< 8,") == 1     # shl and shr_logical, guarded
  assert "x >> tl.minimum(s.to(tl.uint32, bitcast=True), 31).to(tl.int32)\n" in body   # arithmetic
  assert ".to(tl.int32, bitcast=True) >> tl.minimum(" in body     # on an unsigned value: signed

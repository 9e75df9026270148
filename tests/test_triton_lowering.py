"""CI (no GPU): every kernel of the corpus lowers to PTX for sm_70, sm_75, sm_80, sm_90 and sm_100
(Blackwell: never run here, compiled only), or
is refused with a clear error where the target lacks what it needs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax.triton as plgpu
from pallax._src.triton import api
import kernel_corpus as kc
from kernel_corpus import CASES, by_name, matmul_inner_loop


def _specs(case):
  args = case.args(jax.random.key(0))
  return [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]


@pytest.mark.parametrize("cc", [70, 75, 80, 90, 100])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_lowers_to_ptx(case, cc):
  if cc < case.min_cc:
    with pytest.raises(NotImplementedError, match="compute capability"):
      plgpu.lower(case.build(False), *_specs(case), compute_capability=cc)
    return
  try:
    arts = plgpu.lower(case.build(False), *_specs(case), compute_capability=cc)
  except Exception as e:  # noqa: BLE001
    # The GPU machine's ptxas (CUDA 13, torch's) no longer takes sm_70: a limit of that tool,
    # not of pallax; CI's ptxas (triton's own) lowers every case for sm_70.
    if "is not defined for option 'gpu-name'" in str(e):
      pytest.skip(f"this machine's ptxas cannot target sm_{cc}")
    raise
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
  [a100] = plgpu.lower(f, x, x, compute_capability=100)
  assert "wgmma" in a90.ptx
  assert "tcgen05.mma" in a100.ptx and "tcgen05.commit" in a100.ptx and "wgmma" not in a100.ptx
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


@pytest.mark.parametrize("what, kernel, dtype, shape, cc, message", [
    ("int32 matmul", lambda x_ref, o_ref: o_ref.__setitem__(..., jnp.dot(x_ref[...], x_ref[...])),
     jnp.int32, (32, 32), 90, r"integer matrix product of int32 and int32.*int8.*test_triton_lowering"),
    ("bitcast to a narrower type", lambda x_ref, o_ref: o_ref.__setitem__(
        ..., jax.lax.bitcast_convert_type(x_ref[...], jnp.int16)[:, 0].astype(jnp.int32)),
     jnp.int32, (32,), 90, r"bitcast_convert_type from int32 to int16"),
    ("e4m3fn before sm_89", lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
     jnp.float8_e4m3fn, (32,), 80, r"float8_e4m3fn arrays need compute capability 8.9"),
    ("e5m2 before sm_89", lambda x_ref, o_ref: o_ref.__setitem__(
        ..., x_ref[...].astype(jnp.float8_e5m2).astype(jnp.int32)),
     jnp.float32, (32,), 75, r"float8_e5m2 needs compute capability 8.9 .*sm_75"),
    ("int8 tensor-core dot before sm_80", lambda x_ref, o_ref: o_ref.__setitem__(
        ..., jnp.dot(x_ref[...], x_ref[...], preferred_element_type=jnp.int32)),
     jnp.int8, (32, 32), 75, r"int8 matrix product .* on sm_75.*compute capability 8.0"),
])
def test_constructs_triton_cannot_express_get_clear_errors(what, kernel, dtype, shape, cc, message):
  import pallax as pl
  out = dtype if what.startswith("e4m3fn") else jnp.int32
  f = lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(shape, out))(x)
  with pytest.raises(NotImplementedError, match=message):
    plgpu.lower(f, jax.ShapeDtypeStruct(shape, dtype), compute_capability=cc)


def test_a_lower_target_than_the_gpu_can_be_asked_for(monkeypatch):
  import pallax as pl
  from pallax._src.triton import launch
  monkeypatch.setattr(launch, "device_compute_capability", lambda: 90)
  monkeypatch.delenv("PALLAX_TRITON_COMPUTE_CAPABILITY", raising=False)   # the forced GPU pass sets it
  call = lambda cp: pl.pallas_call(lambda x_ref, o_ref: None, out_shape=jax.ShapeDtypeStruct((8,), jnp.float32),
                                   compiler_params=cp)
  params = lambda cp: next(api._pallas_call_params(jax.make_jaxpr(call(cp))(jnp.ones(8)).jaxpr))
  assert launch.target_compute_capability(params(None)) == 90
  assert launch.target_compute_capability(params(plgpu.CompilerParams(compute_capability=75))) == 75
  monkeypatch.setenv("PALLAX_TRITON_COMPUTE_CAPABILITY", "80")
  assert launch.target_compute_capability(params(None)) == 80
  with pytest.raises(ValueError, match="compute capability 100 was asked for, but this GPU has 90"):
    launch.target_compute_capability(params(plgpu.CompilerParams(compute_capability=100)))


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
  # 16 output tiles of 128x128 for each of the call's one program, each a K loop of tensor-core dots
  assert a.grid[0] == 16 and "wgmma" in a.ptx


def test_old_gpu_gets_a_clear_message():
  case = by_name("notebook_add_vectors")
  with pytest.raises(RuntimeError, match="compute capability 7.0.*interpret=True"):
    plgpu.lower(case.build(False), *_specs(case), compute_capability=61)


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


def _kernel_body(case, *args, cc=90):
  """The generated kernel function (after the prologue's helpers)."""
  src = plgpu.lower(case.build(False), *args, compute_capability=cc)[0].source
  return src[src.rindex("@triton.jit"):]


def test_argmax_argmin_pick_the_first_nan_as_lax_does():
  """The interpreter (the reference for the Triton backend) gives lax's answer on NaN, ties and
  infinities (the legalized kernel the GPU runs is checked against it in test_gpu_rewrites)."""
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


def test_clamp_keeps_nan_as_lax_does():
  case = by_name("clamp_nan_and_ints")
  x, lo = case.args(jax.random.key(2))
  f, i = case.build(True)(x, lo)
  xn, lon = np.asarray(x), np.asarray(lo)
  np.testing.assert_array_equal(f[0], np.minimum(np.maximum(xn, -0.5), 0.5))   # NumPy's also keep NaN
  np.testing.assert_array_equal(f[1], np.minimum(np.maximum(xn, lon), lon + 1))
  assert np.isnan(f[0][1, 3]) and np.isnan(f[1][2, 5])
  np.testing.assert_array_equal(i, np.clip((np.nan_to_num(xn) * 4).astype(np.int32), -3, 2))


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


def test_casts_saturate_and_fp8_overflows_as_lax():
  case = by_name("cast_saturation_and_fp8_overflow")
  args = case.args(jax.random.key(6))
  i8, u8, e4, e5, from8 = (np.asarray(o) for o in case.build(True)(*args))
  edges = np.array(kc._CAST_EDGES, np.float32)
  n, at = len(edges), edges.tolist().index
  sat = lambda v, lo, hi: np.where(np.isnan(v), 0, np.trunc(np.clip(np.nan_to_num(v), lo, hi)))
  np.testing.assert_array_equal(i8[0, 0, :n], sat(edges, -128, 127))
  np.testing.assert_array_equal(u8[0, 0, :n], sat(edges, 0, 255))
  np.testing.assert_array_equal(i8[3], sat(np.asarray(args[4], np.float32), -128, 127))   # fp8 NaN -> 0
  e4_0, e5_0 = e4[0, 0, :n].astype(np.float32), e5[0, 0, :n].astype(np.float32)
  assert np.isnan(e4_0[at(465.0)]) and e4_0[at(464.0)] == 448
  assert np.isnan(e4_0[1]) and np.isnan(e4_0[3])                  # e4m3fn has no inf: NaN
  assert e5_0[at(61439.0)] == 57344 and np.isposinf(e5_0[at(61440.0)]) and np.isneginf(e5_0[at(-65000.0)])


def test_rounding_to_odd_in_f16_then_to_fp8_rounds_f32_once():
  # The sm_80/89 conversion above, in NumPy: truncate f32 to f16, set the last bit when inexact,
  # round to fp8. It must give what one rounding of the f32 value gives (ml_dtypes).
  rng = np.random.default_rng(0)
  for dt in (jnp.float8_e4m3fn, jnp.float8_e5m2):
    grid = np.array(np.arange(256, dtype=np.uint8).view(dt), np.float32)
    grid = grid[np.isfinite(grid)]
    mids = (np.sort(grid)[1:] + np.sort(grid)[:-1]) / 2
    x = np.concatenate([mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf),
                        mids * (1 + 2.0**-12), mids * (1 - 2.0**-12),
                        rng.standard_normal(20000).astype(np.float32) * 100]).astype(np.float32)
    x = x[np.abs(x) < 400]                                   # overflow is handled separately
    h = x.astype(np.float16)
    h = np.where(np.abs(h.astype(np.float32)) > np.abs(x), np.nextafter(h, np.float16(0)), h)   # rtz
    odd = (h.view(np.int16) | (h.astype(np.float32) != x).astype(np.int16)).view(np.float16)
    np.testing.assert_array_equal(np.asarray(odd.astype(dt), np.float32), np.asarray(x.astype(dt), np.float32))
    plain = h.astype(dt)                                     # without the odd bit: it goes wrong
    assert (np.asarray(plain, np.float32) != np.asarray(x.astype(dt), np.float32)).any()


def test_popcount_and_clz_count_the_dtype_bits():
  case = by_name("popcount_clz_narrow_and_unsigned")
  args = case.args(jax.random.key(7))
  got = [np.asarray(o) for o in case.build(True)(*args)]
  for x, pop, clz in zip(args, got[:6], got[6:]):
    u = np.asarray(x).view(np.dtype(f"u{x.dtype.itemsize}")).astype(np.uint64)
    bits = x.dtype.itemsize * 8
    np.testing.assert_array_equal(pop, np.bitwise_count(u).astype(x.dtype))
    length = np.array([int(v).bit_length() for v in u.ravel()]).reshape(u.shape)
    np.testing.assert_array_equal(clz, (bits - length).astype(x.dtype))


def test_bitwise_reductions_and_narrow_sums_follow_numpy():
  case = by_name("bitwise_reductions_padded_and_narrow_sums")
  x, s = case.args(jax.random.key(8))
  xor, and_, b, n, c, f = (np.asarray(o) for o in case.build(True)(x, s))
  xn, sn = np.asarray(x), np.asarray(s)
  np.testing.assert_array_equal(xor[0], np.bitwise_xor.reduce(xn, axis=1))
  np.testing.assert_array_equal(xor[1], np.bitwise_xor.reduce(xn.view(np.uint32), axis=1).view(np.int32))
  np.testing.assert_array_equal(and_[0], np.bitwise_and.reduce(xn | 0x0F0F, axis=1))
  np.testing.assert_array_equal(and_[1], np.bitwise_and.reduce(xn.astype(np.uint16), axis=1))
  np.testing.assert_array_equal(b[0], np.logical_xor.reduce(xn > 0, axis=1))
  np.testing.assert_array_equal(b[1], np.logical_and.reduce(xn != 3, axis=1))
  s8 = sn.astype(np.int8)
  np.testing.assert_array_equal(n[0], s8.sum(axis=1, dtype=np.int8))          # wraps: 7 x 100
  np.testing.assert_array_equal(n[1], sn.astype(np.uint8).sum(axis=1, dtype=np.uint8))
  np.testing.assert_array_equal(c, np.cumsum(s8, axis=1, dtype=np.int8))
  bf = jnp.bfloat16
  np.testing.assert_array_equal(f[0], np.cumsum(sn, axis=1).astype(bf) * bf(1.01))
  sp = np.where(sn > 4, 2.0, np.where(sn > 1, 0.5, -1.0))
  np.testing.assert_array_equal(f[1], np.cumprod(sp, axis=1).astype(bf) * bf(1.01))


def test_float_edges_follow_numpy():
  case = by_name("float_edges_neg_zero_nextafter_is_finite")
  x, y = case.args(jax.random.key(9))
  o, h, b, fin, neg, k = (np.asarray(v) for v in case.build(True)(x, y))
  xn, yn = np.asarray(x), np.asarray(y)
  np.testing.assert_array_equal(neg, np.where(np.isnan(xn), 0, (-xn).view(np.int32)))
  assert neg[0, 0] == np.int32(-2**31) and neg[0, 1] == 0       # -(+0.0), -(-0.0)
  f32 = lambda a: np.asarray(a, np.float32)   # NaN == NaN for bf16 too
  qx, qy = np.round(xn * 4), 1 + np.abs(np.round(yn * 4)) % 13
  for n, (d, got) in enumerate(((np.float16, h), (jnp.bfloat16, b))):
    np.testing.assert_array_equal(f32(got[0]), f32(qx.astype(d) / qy.astype(d)))
    np.testing.assert_array_equal(f32(got[1]), f32(np.nextafter(xn.astype(d), yn.astype(d))))
    np.testing.assert_array_equal(fin[1 + n], np.isfinite(xn.astype(d)))
  np.testing.assert_array_equal(o, np.nextafter(xn, yn))
  assert o[0, 0] == np.float32(1.4e-45)                          # a subnormal, not flushed
  np.testing.assert_array_equal(fin[0], np.isfinite(xn))
  assert list(k) == [-3, -1, 0]                                  # INT_MAX + 1 wraps below 0
  body = _kernel_body(case, x, y)
  assert "tl.store(k_ref, tl.full([], -3, tl.int32))" in body                # folded by lax
  assert "tl.store(k_ref + 2, tl.full([], 0, tl.int32))" in body


def test_narrow_int_indices_are_widened():
  case = by_name("narrow_int_indices")
  x, i, r = case.args(jax.random.key(10))
  o, g = case.build(True)(x, i, r)
  xn = np.asarray(x)
  np.testing.assert_array_equal(o, xn[5] + xn[3])
  np.testing.assert_array_equal(g, xn[[7, 0, 5, 3]])
  body = _kernel_body(case, x, i, r)
  assert body.count(".to(tl.int32) * 100") == 2                        # both indices widened


def test_fp8_arithmetic_goes_through_f32_as_ml_dtypes():
  case = by_name("fp8_arithmetic_through_f32")
  args = case.args(jax.random.key(11))
  o4, o5, c = case.build(True)(*args)
  f32 = lambda a: np.asarray(a, np.float32)
  for (a, b), o in zip((args[:2], args[2:]), (o4, o5)):
    a, b = np.asarray(a), np.asarray(b)   # ml_dtypes: computed in f32, rounded once
    for got, want in zip(np.asarray(o), (a + b, a * b, a - b, np.maximum(a, b), -a)):
      np.testing.assert_array_equal(f32(got), f32(want))
  assert np.isnan(f32(o4)[0, 0, 0]) and f32(o5)[0, 0, 0] == 640   # 300 + 300: e4m3fn overflows
  assert f32(o4)[4, 0, 2] == 0 and np.signbit(f32(o4)[4, 0, 2])  # -(0.0) is -0.0
  np.testing.assert_array_equal(c[0], f32(args[0]) < f32(args[1]))


def test_integer_pow_multiplies_in_lax_order():
  case = by_name("integer_pow_in_lax_order")
  (x,) = case.args(jax.random.key(12))
  got = np.asarray(case.build(True)(x))
  xn = np.asarray(x, np.float32) * np.float32(1.7)
  x2 = xn * xn
  x4 = x2 * x2
  np.testing.assert_array_equal(got[0], xn * x4)            # 5 = 1 + 4
  np.testing.assert_array_equal(got[1], (xn * x2) * x4)     # 7 = 1 + 2 + 4
  np.testing.assert_array_equal(got[2], x4 * (x4 * x4))     # 12 = 4 + 8


def test_atomics_with_repeated_indices_masks_and_cas_follow_numpy():
  case = by_name("atomics_repeated_indices_mask_and_cas")
  v, idx, m, o0, c0 = case.args(jax.random.key(13))
  o, c, r = (np.asarray(a) for a in case.build(True)(v, idx, m, o0, c0))
  want = np.asarray(o0).copy()
  np.add.at(want, np.asarray(idx)[np.asarray(m)], np.asarray(v)[np.asarray(m)])
  np.maximum.at(want, np.asarray(idx) + 4, np.asarray(v))
  np.testing.assert_array_equal(o, want)
  c0 = np.asarray(c0)
  np.testing.assert_array_equal(r, c0)
  np.testing.assert_array_equal(c, np.where(c0 == 3, 100, c0))
  body = _kernel_body(case, v, idx, m, o0, c0)
  assert "tl.atomic_cas(c_ref + tl.arange(0, 8), " in body and "tl.atomic_add(" in body


def test_atomic_out_of_bounds_is_an_error_in_the_interpreter():
  import pallax as pl
  def kernel(i_ref, o_ref):
    o_ref[...] = jnp.zeros((8,), jnp.int32)
    plgpu.atomic_add(o_ref, (i_ref[0],), 5)
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8,), jnp.int32), interpret=True)
  np.testing.assert_array_equal(f(jnp.array([3], jnp.int32)), [0, 0, 0, 5, 0, 0, 0, 0])
  with pytest.raises(Exception, match="out-of-bounds atomic update of out"):
    jax.block_until_ready(f(jnp.array([10], jnp.int32)))


def test_a_constant_array_in_the_kernel_is_an_input_up_to_a_size():
  import pallax as pl
  from pallax._src.triton.writer import MAX_CONSTANT_ELEMENTS
  table = np.arange(4, dtype=np.float32) + 1
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + table + np.float32(0.5)
  f = lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((4,), jnp.float32))(x)
  # As JAX Pallas: refused ("captures constants") unless JAX traces arrays as literals
  with pytest.raises(ValueError, match="captures constants"):
    plgpu.lower(f, jax.ShapeDtypeStruct((4,), jnp.float32))
  with kc.simplified_constants():
    [a] = plgpu.lower(f, jax.ShapeDtypeStruct((4,), jnp.float32))
  assert "def kernel(x_ref, const, o_ref):" in a.source   # the table: an operand after x
  big = np.ones(MAX_CONSTANT_ELEMENTS + 1, np.float32)
  def big_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + jnp.asarray(big)[:4]
  g = lambda x: pl.pallas_call(big_kernel, out_shape=jax.ShapeDtypeStruct((4,), jnp.float32))(x)
  with pytest.raises(NotImplementedError, match=r"constant array of shape \(65537,\).*test_triton_lowering.py:\d+.*as an input"):
    with kc.simplified_constants():
      plgpu.lower(g, jax.ShapeDtypeStruct((4,), jnp.float32))
  def scalar_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * jnp.float32(3.0) + jnp.array(0.5, jnp.float32)
  g = lambda x: pl.pallas_call(scalar_kernel, out_shape=jax.ShapeDtypeStruct((4,), jnp.float32))(x)
  assert plgpu.lower(g, jax.ShapeDtypeStruct((4,), jnp.float32))[0].ptx


def test_dot_dtype_mixes_small_k_and_narrow_loop_index():
  case = by_name("dot_dtype_mixes_small_k_and_int8_loop")
  a, b, x, xb = case.args(jax.random.key(14))
  i, f, m, l = (np.asarray(v) for v in case.build(True)(a, b, x, xb))
  prod = np.asarray(a, np.int32) @ np.asarray(b, np.int32)
  np.testing.assert_array_equal(i, prod)
  np.testing.assert_array_equal(f, prod.astype(np.float32).view(np.int32))
  want = np.asarray(xb, np.float64) @ np.asarray(x, np.float64)
  assert np.abs(m - want).max() <= 1e-5 * np.abs(want).max()
  assert l[0] == sum((k + 5 + 128) % 256 - 128 for k in range(120, 127))   # i + 5 wraps in int8
  body = _kernel_body(case, a, b, x, xb)
  assert body.count("tl.dot(") == 1 and "tl.dot(xb.to(tl.float32), x, input_precision='ieee'" in body
  assert "for i in range" not in body                                  # int8 index: a carried loop


def test_element_block_with_low_padding_masks_the_front():
  import pallax as pl
  def kernel(x_ref, o_ref):   # the window's first element lies before the array for program 0
    w = x_ref[...]
    o_ref[...] = jnp.where(pl.program_id(0) > 0, w[0:4], 0) + w[1:5]
  call = lambda interpret: pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((16,), jnp.int32), grid=(4,),
      in_specs=[pl.BlockSpec((pl.Element(6, (1, 1)),), lambda i: (i * 4,))],
      out_specs=pl.BlockSpec((4,), lambda i: (i,)), interpret=interpret)
  x = np.arange(1, 17, dtype=np.int32)
  prev = np.concatenate([[0], x[:-1]])
  prev[:4] = 0
  np.testing.assert_array_equal(call(True)(jnp.asarray(x)), x + prev)
  src = plgpu.lower(call(False), jax.ShapeDtypeStruct((16,), jnp.int32), compute_capability=90)[0].source
  load = [l for l in src.splitlines() if "tl.load(x_ref" in l][0]
  assert "x_ref_start0 = " in src and ">= 0)" in load      # no read before the array

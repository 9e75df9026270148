"""``pallax.as_torch_kernel``: pallas_call kernels called with torch tensors (skipped where torch is
missing; the CUDA tests need a GPU). Results are compared elementwise with the same function run
by JAX on the same inputs, and with plain torch references."""
import os

import numpy as np
import pytest

_TRITON_ENV = {k: v for k, v in os.environ.items() if k.startswith("TRITON_")}
torch = pytest.importorskip("torch")


def _restore_triton_environment():
  """torch points Triton at its own ptxas (TRITON_PTXAS_PATH), which may not know the older
  targets other tests lower for (sm_70): keep the rest of the suite's environment as it was."""
  for k in [k for k in os.environ if k.startswith("TRITON_")]:
    del os.environ[k]
  os.environ.update(_TRITON_ENV)


_restore_triton_environment()


@pytest.fixture(autouse=True)
def _triton_environment_as_before_torch():
  yield
  _restore_triton_environment()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import pallax as pl  # noqa: E402
from jax_gpu_ops import cases, load  # noqa: E402

S = jax.ShapeDtypeStruct
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU for torch")


def _axpy_kernel(x_ref, y_ref, o_ref):
  o_ref[...] = x_ref[...] * 2 + y_ref[...]


def axpy(x, y):
  rows, cols = x.shape
  spec = pl.BlockSpec((8, 128), lambda i, j: (i, j))
  return pl.pallas_call(_axpy_kernel, out_shape=S(x.shape, x.dtype), in_specs=[spec, spec],
                        out_specs=spec, grid=(pl.cdiv(rows, 8), pl.cdiv(cols, 128)))(x, y)


def _rand(shape, dtype, device, seed):
  g = torch.Generator().manual_seed(seed)
  return torch.randn(shape, generator=g, dtype=torch.float32).to(dtype).to(device)


def _np(t):
  return t.detach().float().cpu().numpy()


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(8, 128), (13, 300), (1, 1)], ids=str)
def test_a_blocked_kernel_matches_torch(shape, dtype):
  f = pl.as_torch_kernel(axpy)
  x, y = _rand(shape, dtype, "cuda", 1), _rand(shape, dtype, "cuda", 2)
  out = f(x, y)
  assert isinstance(out, torch.Tensor) and out.dtype == dtype and out.device == x.device
  tol = 1e-6 if dtype == torch.float32 else 1e-2
  np.testing.assert_allclose(_np(out), _np(x * 2 + y), rtol=tol, atol=tol)


def test_cpu_tensors_run_in_the_interpreter():
  f = pl.as_torch_kernel(axpy)
  x, y = _rand((13, 300), torch.float32, "cpu", 1), _rand((13, 300), torch.float32, "cpu", 2)
  np.testing.assert_allclose(_np(f(x, y)), _np(x * 2 + y), rtol=1e-6, atol=1e-6)


@cuda
def test_inputs_that_are_views_or_transposed():
  f = pl.as_torch_kernel(axpy)
  base = _rand((300, 26), torch.float32, "cuda", 3)
  x = base.t()                        # not contiguous
  y = _rand((13 * 300 + 1,), torch.float32, "cuda", 4)[1:].view(13, 300)   # 4-byte offset
  np.testing.assert_allclose(_np(f(x[:13], y)), _np(x[:13] * 2 + y), rtol=1e-6, atol=1e-6)


def _add_into(x_ref, acc_ref, o_ref):
  o_ref[...] = acc_ref[...] + x_ref[...]


@cuda
def test_aliased_outputs_leave_the_input_alone():
  f = pl.as_torch_kernel(lambda x, acc: pl.pallas_call(
      _add_into, out_shape=S(x.shape, x.dtype), input_output_aliases={1: 0})(x, acc))
  x, acc = _rand((64,), torch.float32, "cuda", 5), _rand((64,), torch.float32, "cuda", 6)
  before = acc.clone()
  out = f(x, acc)
  np.testing.assert_allclose(_np(out), _np(before + x), rtol=1e-6)
  assert torch.equal(acc, before), "as_torch_kernel is functional: the aliased input is not written"


@cuda
def test_no_host_synchronization_per_call():
  f = pl.as_torch_kernel(axpy)
  x, y = _rand((64, 256), torch.float32, "cuda", 7), _rand((64, 256), torch.float32, "cuda", 8)
  f(x, y)   # the first call compiles (and may copy constants)
  torch.cuda.set_sync_debug_mode("error")
  try:
    for _ in range(3):
      out = f(x, y)
  finally:
    torch.cuda.set_sync_debug_mode("default")
  np.testing.assert_allclose(_np(out), _np(x * 2 + y), rtol=1e-6)


@cuda
def test_runs_on_torchs_current_stream():
  f = pl.as_torch_kernel(axpy)
  x, y = _rand((256, 256), torch.float32, "cuda", 9), _rand((256, 256), torch.float32, "cuda", 10)
  f(x, y)
  s = torch.cuda.Stream()
  s.wait_stream(torch.cuda.current_stream())
  with torch.cuda.stream(s):
    out = f(x, y)
  s.synchronize()
  np.testing.assert_allclose(_np(out), _np(x * 2 + y), rtol=1e-6)


# JAX's own Pallas GPU ops (imports switched to pallax), from torch, against the same op in JAX.
@cuda
@pytest.mark.parametrize("case", cases(), ids=lambda c: c[0])
def test_jax_gpu_ops_from_torch(case):
  name, module, make, args, _ = case
  f = make(load(module), False)
  want = jax.tree.leaves(jax.jit(f)(*args))
  targs = [torch.from_dlpack(jax.device_put(a, jax.devices("gpu")[0])) for a in args]
  got = jax.tree.leaves(pl.as_torch_kernel(f)(*targs))
  for g, w in zip(got, want):
    w = np.asarray(w, np.float32)
    np.testing.assert_allclose(_np(g), w, rtol=2e-3, atol=2e-3 * float(np.abs(w).max()), err_msg=name)


def test_clear_errors():
  f = pl.as_torch_kernel(axpy)
  x = _rand((8, 128), torch.float32, "cpu", 1)
  with pytest.raises(TypeError, match="argument 1 is a ndarray, not a torch.Tensor"):
    f(x, np.ones((8, 128), np.float32))
  g = pl.as_torch_kernel(lambda x, y: jnp.sort(axpy(x, y), axis=0))
  if torch.cuda.is_available():
    with pytest.raises(NotImplementedError, match="sort .* has no torch equivalent"):
      g(x.cuda(), x.cuda())
    with pytest.raises(ValueError, match="on different devices"):
      f(x, x.cuda())


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda), "cpu"])
def test_torch_compile_fullgraph(device):
  f = pl.as_torch_kernel(axpy)
  g = pl.as_torch_kernel(lambda x, y: {"a": axpy(x, y), "b": (axpy(y, x),)})   # a structure

  def model(x, y):
    two = g(x, y)
    return torch.relu(f(x, y)) + two["a"] * two["b"][0]

  x, y = _rand((16, 256), torch.float32, device, 11), _rand((16, 256), torch.float32, device, 12)
  compiled = torch.compile(model, fullgraph=True)
  np.testing.assert_allclose(_np(compiled(x, y)), _np(model(x, y)), rtol=1e-6, atol=1e-6)


# --- gradients through torch.autograd (JAX's ops with custom_vjp backward kernels) -------------

def _grad_cases():
  k = jax.random.split(jax.random.key(4), 6)
  x, w, b = jax.random.normal(k[0], (2, 8, 200)), jax.random.normal(k[1], (200,)), \
      jax.random.normal(k[2], (200,))
  q, kk, v = (jax.random.normal(kk_, (1, 128, 2, 64)) for kk_ in jax.random.split(k[3], 3))
  return [("layer_norm", lambda m: m.layer_norm, (x, w, b)),
          ("rms_norm", lambda m: m.rms_norm, (x, w, b)),
          ("attention", lambda m: lambda q, k, v: m.mha(q, k, v, segment_ids=None, causal=True),
           (q, kk, v))]


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda),
                                    pytest.param("cpu", marks=pytest.mark.interpreter)])
@pytest.mark.parametrize("case", _grad_cases(), ids=lambda c: c[0])
def test_gradients_through_torch_autograd(case, device):
  module, make, args = case
  f = make(load(module))
  out, pullback = jax.vjp(f, *args)
  ct = jax.random.normal(jax.random.key(5), out.shape)
  want = pullback(ct)
  targs = [torch.from_dlpack(a).to(device).clone().requires_grad_() for a in args]
  got_out = pl.as_torch_kernel(f)(*targs)
  (got_out * torch.from_dlpack(ct).to(device)).sum().backward()
  np.testing.assert_allclose(_np(got_out), np.asarray(out), rtol=1e-4, atol=1e-4)
  for t, w in zip(targs, want):
    w = np.asarray(w)
    np.testing.assert_allclose(_np(t.grad), w, rtol=1e-3, atol=1e-3 * float(np.abs(w).max()),
                               err_msg=module)


def test_no_gradient_needed_takes_the_plain_path():
  f = pl.as_torch_kernel(axpy)
  device = "cuda" if torch.cuda.is_available() else "cpu"
  x = _rand((8, 128), torch.float32, device, 1).requires_grad_()
  with torch.no_grad():
    out = f(x, x)
  assert out.grad_fn is None
  with pytest.raises(NotImplementedError, match="jax.custom_vjp"):
    f(x, x)   # axpy has no custom_vjp: its reverse mode is not defined, as in JAX Pallas


def test_64_bit_tensors_need_jax_x64():
  f = pl.as_torch_kernel(axpy)
  for dtype in (torch.float64, torch.int64):
    x = torch.ones((8, 128), dtype=dtype)
    with pytest.raises(ValueError, match=f"argument 0 is {dtype}, which JAX runs as a 32-bit type"):
      f(x, x)


def _tanh_mul_kernel(x_ref, y_ref, o_ref):
  o_ref[...] = jnp.tanh(x_ref[...]) * y_ref[...]


def _tanh_mul_grad_kernel(x_ref, y_ref, g_ref, dx_ref, dy_ref):
  t = jnp.tanh(x_ref[...])
  dx_ref[...] = (1 - t * t) * y_ref[...] * g_ref[...]
  dy_ref[...] = t * g_ref[...]


@jax.custom_vjp
def tanh_mul(x, y):
  """tanh(x) * y in the inputs' own precision, forward and backward as pallas kernels."""
  return pl.pallas_call(_tanh_mul_kernel, out_shape=S(x.shape, x.dtype))(x, y)


def _tanh_mul_fwd(x, y):
  return tanh_mul(x, y), (x, y)


def _tanh_mul_bwd(res, g):
  x, y = res
  return pl.pallas_call(_tanh_mul_grad_kernel, out_shape=(S(x.shape, x.dtype),) * 2)(x, y, g)


tanh_mul.defvjp(_tanh_mul_fwd, _tanh_mul_bwd)


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda),
                                    pytest.param("cpu", marks=pytest.mark.interpreter)])
def test_gradcheck_in_float64(device):
  """torch.autograd.gradcheck (finite differences against the backward kernel) in float64,
  with JAX's 64-bit types enabled while the function is traced. (JAX's norms compute in
  float32 inside their kernels: finite differences cannot check them; the tests above compare
  them with JAX's gradients and torch's own norms.)"""
  f = pl.as_torch_kernel(tanh_mul)
  args = [_rand((5, 37), torch.float64, device, k).requires_grad_() for k in range(2)]
  with jax.enable_x64(True):
    f(*args)   # traced and prepared here; later calls reuse it
  assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda),
                                    pytest.param("cpu", marks=pytest.mark.interpreter)])
@pytest.mark.parametrize("module", ["layer_norm", "rms_norm"])
def test_gradients_match_torchs_own_norms(module, device):
  """The same training step through JAX's op (its custom_vjp backward kernels) and through
  torch's F.layer_norm / F.rms_norm (plus the bias JAX's rms_norm adds)."""
  import torch.nn.functional as F
  n = 300
  ref = {"layer_norm": lambda a, w, b: F.layer_norm(a, (n,), w, b, eps=1e-5),
         "rms_norm": lambda a, w, b: F.rms_norm(a, (n,), w, eps=1e-5) + b}[module]
  f = pl.as_torch_kernel(getattr(load(module), module))
  x, w, b, dout = (_rand(s, torch.float32, device, k) for k, s in
                   enumerate([(2, 8, n), (n,), (n,), (2, 8, n)]))
  grads = {}
  for side, fn in (("pallax", f), ("torch", ref)):
    args = [a.clone().requires_grad_() for a in (x, w, b)]
    grads[side] = torch.autograd.grad(fn(*args), args, dout)
  for g, w_ in zip(grads["pallax"], grads["torch"]):
    np.testing.assert_allclose(_np(g), _np(w_), rtol=1e-4, atol=1e-4 * float(w_.abs().max()))


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda),
                                    pytest.param("cpu", marks=pytest.mark.interpreter)])
def test_a_training_step_under_torch_compile_matches_eager(device):
  """JAX's layer_norm (custom_vjp backward kernels) inside a small torch model: the compiled
  step (fullgraph) gives the eager step's gradients."""
  f = pl.as_torch_kernel(load("layer_norm").layer_norm)
  lin = torch.nn.Linear(300, 300).to(device)

  def step(x, w, b):
    y = lin(f(x, w, b))
    return (y * y).mean()

  x, w, b = (_rand(s, torch.float32, device, k) for k, s in enumerate([(2, 8, 300), (300,), (300,)]))
  grads = {}
  for mode, fn in (("eager", step), ("compiled", torch.compile(step, fullgraph=True))):
    args = [a.clone().requires_grad_() for a in (x, w, b)]
    fn(*args).backward()
    grads[mode] = [a.grad for a in args] + [lin.weight.grad.clone()]
    lin.zero_grad()
  for c, e in zip(grads["compiled"], grads["eager"]):
    np.testing.assert_allclose(_np(c), _np(e), rtol=1e-5, atol=1e-6 * float(e.abs().max()))


# --- Mosaic GPU kernels (plgpu, the Gluon backend) from torch ----------------------------------

hopper = pytest.mark.skipif(not torch.cuda.is_available() or
                            torch.cuda.get_device_capability() < (9, 0), reason="needs a Hopper GPU")


def _jax_on(device, *tensors):
  return [jax.device_put(np.asarray(_np(t)), jax.devices(device)[0]) for t in tensors]


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=hopper),
                                    pytest.param("cpu", marks=pytest.mark.interpreter)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_plgpu_kernels_from_torch_match_the_interpreter(device, dtype):
  """TMA in and out with a partial last block (host-side descriptors), and a K loop of wgmmas
  with partial tiles, against the same kernels in pallax's interpreter."""
  from test_mosaic_gpu_gluon import matmul, scale_rows
  x = _rand((100, 64), dtype, device, 21)
  a, b = _rand((100, 72), dtype, device, 22), _rand((72, 136), dtype, device, 23)
  jdtype = {torch.float16: jnp.float16, torch.bfloat16: jnp.bfloat16}[dtype]
  tol = {torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
  for fn, args in ((scale_rows, (x,)), (matmul, (a, b))):
    got = pl.as_torch_kernel(fn)(*args)
    want = np.asarray(fn(*[j.astype(jdtype) for j in _jax_on("cpu", *args)], interpret=True),
                      np.float32)
    assert got.dtype == dtype and got.device == args[0].device
    # wgmma sums in float32 in its own order: elementwise, relative to the output's scale
    scale = float(np.sqrt(np.mean(want.astype(np.float64) ** 2)))
    np.testing.assert_allclose(_np(got), want, rtol=tol, atol=tol * scale, err_msg=fn.__name__)


@hopper
def test_jax_hopper_matmul_from_torch():
  """JAX's warp-specialized matmul (imports switched), called with torch tensors: XLA's dot."""
  from test_mosaic_gpu_hopper_matmul import config, hopper_matmul
  hm = hopper_matmul(torch.cuda.get_device_properties(0).multi_processor_count)
  cfg = config(hm, 128, 128, 64, 2, None, None, 0)
  f = pl.as_torch_kernel(lambda a, b: hm.matmul(a, b, None, cfg))
  a, b = _rand((1024, 512), torch.float16, "cuda", 24), _rand((512, 768), torch.float16, "cuda", 25)
  want = jax.jit(lambda a, b: jnp.dot(a, b, precision=jax.lax.DotAlgorithmPreset.F16_F16_F32))(
      *[j.astype(jnp.float16) for j in _jax_on("gpu", a, b)])
  np.testing.assert_array_equal(_np(f(a, b)), np.asarray(want, np.float32))


@hopper
def test_jax_attention_mgpu_trains_from_torch():
  """JAX's warp-specialized flash attention, forward and backward (its custom_vjp's plgpu
  kernels) through torch.autograd, against the same functions in JAX on the GPU."""
  from test_mosaic_gpu_attention import attention_module
  am = attention_module()
  cfg = am.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2, block_q_dkv=64,
                        block_kv_dkv=64, block_q_dq=64, block_kv_dq=64)   # no causal backward yet
  attention = lambda q, k, v: am.attention(q, k, v, cfg)   # noqa: E731
  q, k, v, do = (_rand((1, 256, 2, 64), torch.float16, "cuda", s) for s in range(26, 30))
  jq, jk, jv, jdo = (j.astype(jnp.float16) for j in _jax_on("gpu", q, k, v, do))
  out, pullback = jax.jit(lambda *a: jax.vjp(attention, *a))(jq, jk, jv)
  want = [out, *jax.jit(pullback)(jdo)]
  args = [t.clone().requires_grad_() for t in (q, k, v)]
  got_out = pl.as_torch_kernel(attention)(*args)
  got = [got_out, *torch.autograd.grad(got_out, args, do)]
  for g, w in zip(got, want):   # the same kernels; the glue between them is torch's or XLA's
    w = np.asarray(w, np.float32)
    np.testing.assert_allclose(_np(g), w, rtol=2e-3, atol=2e-3 * float(np.abs(w).max()))

"""JAX's own Pallas GPU ops run on pallax, imports aside: in the interpreter (against plain JAX)
and lowered to Triton PTX."""
import jax
import numpy as np
import pytest

import pallax.triton as plgpu
from jax_gpu_ops import WITH_BACKWARD, cases, load

CASES = cases()


@pytest.mark.interpreter
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_interpreter_runs_jax_gpu_op(case):
  name, module, build, args, ref = case
  m = load(module)
  got = np.asarray(build(m, True)(*args))
  want = np.asarray(ref(m))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_jax_gpu_op_lowers_to_ptx(case):
  name, module, build, args, _ = case
  specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
  arts = plgpu.lower(build(load(module), False), *specs, compute_capability=90)
  assert arts and all(".entry" in a.ptx for a in arts)


@pytest.mark.interpreter
@pytest.mark.parametrize("case", [c for c in CASES if c[0] in WITH_BACKWARD], ids=lambda c: c[0])
def test_gradients_through_jax_gpu_op_backward_kernels(case):
  """Their custom_vjp backward passes are Pallas kernels too."""
  name, module, build, args, ref = case
  m = load(module)
  f = build(m, True)
  from jax_gpu_ops import _ln_ref, _rms_ref
  ref_f = {"layer_norm": _ln_ref, "rms_norm": _rms_ref,
           "mha": lambda *a: m.mha_reference(*a, segment_ids=None)}[name]
  argnums = tuple(range(len(args)))
  got = jax.grad(lambda *a: (f(*a) ** 2).sum(), argnums=argnums)(*args)
  want = jax.grad(lambda *a: (ref_f(*a) ** 2).sum(), argnums=argnums)(*args)
  for g, w in zip(got, want):
    assert np.linalg.norm(np.asarray(g) - np.asarray(w)) / np.linalg.norm(np.asarray(w)) < 1e-4


@pytest.mark.parametrize("shape", [(1024, 125), (4, 1024, 125)])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_jax_softmax_op_at_jax_test_shapes_and_tolerances(shape, dtype):
  """JAX's own test of its softmax op (tests/pallas/gpu_ops_test.py): rows of 125 elements,
  masked loads filled with -inf, in 16-bit floats too. Interpreter on a CPU, Triton on a GPU."""
  import jax.numpy as jnp
  m = load("softmax")
  x = jax.random.normal(jax.random.key(0), shape, dtype=jnp.dtype(dtype))
  atol, rtol = {"bfloat16": (1e-2, 1e-4), "float16": (1e-2, 1e-4), "float32": (1e-7, 1e-6)}[dtype]
  np.testing.assert_allclose(np.asarray(m.softmax(x, axis=-1).astype(jnp.float32)),
                             np.asarray(jax.nn.softmax(x, axis=-1).astype(jnp.float32)),
                             atol=atol, rtol=rtol)

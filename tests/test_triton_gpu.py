"""On a GPU (``make gpu-test``): every corpus kernel on the Triton backend agrees with the
interpreter on fresh random inputs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from forced_target import refused_on_forced_target
from kernel_corpus import CASES

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True, scope="module")
def _needs_gpu():
  if jax.devices()[0].platform != "gpu":
    pytest.skip("needs an NVIDIA GPU")


def _rel_err(a, b):
  a = np.asarray(a, np.float64)
  b = np.asarray(b, np.float64)
  if a.size == 0:
    return 0.0
  return float(np.linalg.norm((a - b).ravel()) / max(np.linalg.norm(b.ravel()), 1e-30))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_triton_matches_interpreter(case):
  from pallax._src.triton import launch
  before = launch.LAUNCHES
  for seed in (1, 2):
    args = case.args(jax.random.key(seed))
    with refused_on_forced_target():
      got = jax.block_until_ready(case.build(False)(*args))
    want = case.build(True)(*args)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      assert g.shape == w.shape and g.dtype == w.dtype
      if jnp.issubdtype(g.dtype, jnp.floating) and g.dtype.itemsize <= 2:
        g, w = g.astype(jnp.float32), w.astype(jnp.float32)   # bf16, fp8: NumPy's NaN == NaN
      g, w = np.asarray(g), np.asarray(w)
      assert not np.isnan(g).any() or np.isnan(w).any(), "NaN only in the Triton result"
      if case.tol == 0:
        np.testing.assert_array_equal(g, w)
      else:   # elementwise: relative, with an absolute floor at the output's own scale
        scale = float(np.sqrt(np.mean(np.square(w[np.isfinite(w)], dtype=np.float64)))) if w.size else 0.0
        np.testing.assert_allclose(g, w, rtol=case.tol, atol=case.tol * scale, err_msg=case.name)
  assert launch.LAUNCHES > before, "the Triton backend was not used"


def test_argmax_with_several_nans_gives_the_first():
  # lax's answer here depends on XLA's reduction order (on this GPU it may pick a later NaN), so
  # the Triton result is checked against NumPy's rule instead of the interpreter.
  from kernel_corpus import by_name
  case = by_name("argmax_argmin_nan_ties")
  (x,) = case.args(jax.random.key(3))
  x = x.at[0, 30].set(jnp.nan).at[0, 45].set(jnp.nan).at[6].set(jnp.nan)
  rows, _ = case.build(False)(x)
  rows = np.asarray(rows)
  assert list(rows[:, 0]) == [7, 7, 7] and list(rows[:, 6]) == [0, 0, 0]


@pytest.mark.parametrize("case", __import__("jax_gpu_ops").cases(), ids=lambda c: c[0])
def test_jax_gpu_ops_on_triton_match_interpreter(case):
  from jax_gpu_ops import load
  name, module, build, args, _ = case
  m = load(module)
  with refused_on_forced_target():
    got = np.asarray(jax.block_until_ready(build(m, False)(*args)))
  want = np.asarray(build(m, True)(*args))
  assert _rel_err(got, want) <= 2e-3, (name, _rel_err(got, want))


def test_failing_debug_check_stops_the_program_with_its_message():
  """A failed check is a device assert: it ends the process's CUDA context, so it runs in a
  process of its own."""
  import os
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  script = os.path.join(root, "tests", "gpu_scripts", "failing_check.py")
  env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
  r = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env, timeout=300)
  out = r.stdout + r.stderr
  assert "x must be negative" in out, out[-2000:]
  assert "RESULT: no error raised" not in out, out[-2000:]


def test_int64_uint64_float64_kernels_with_x64():
  """With jax_enable_x64 (a process of its own: the flag is global)."""
  import os
  import subprocess
  import sys
  here = os.path.dirname(os.path.abspath(__file__))
  env = dict(os.environ, PYTHONPATH=os.path.dirname(here) + os.pathsep + os.environ.get("PYTHONPATH", ""))
  r = subprocess.run([sys.executable, os.path.join(here, "gpu_scripts", "x64_kernels.py")],
                     capture_output=True, text=True, env=env, timeout=300)
  assert "RESULT: x64 kernels agree" in r.stdout, (r.stdout + r.stderr)[-3000:]


def test_math_functions_against_lax_in_ulps():
  """Each float32 math function on Triton against lax on the same GPU, on 4096 random inputs of
  its domain, elementwise: within JAX's test tolerance of lax, or as close as lax to the true
  value. The table of the largest distances goes to stdout (pytest -s)."""
  import gpu_math
  keys = iter(jax.random.split(jax.random.key(11), 64))
  cases = {name: (fn, (gpu_math.inputs(next(keys), lo, hi),))
           for name, (fn, lo, hi) in gpu_math.UNARY.items()}
  cases.update({name: (fn, (gpu_math.inputs(next(keys), *r1), gpu_math.inputs(next(keys), *r2)))
                for name, (fn, r1, r2) in gpu_math.BINARY.items()})
  rows, failures = [], []
  for name, (fn, args) in cases.items():
    got, want = gpu_math.run(fn, *args)
    rows.append(gpu_math.report(name, got, want, args))
    bad = gpu_math.misses(name, got, want, args)
    if bad.any():
      k = int(np.argmax(bad))
      failures.append(f"{name}: {int(bad.sum())} misses, e.g. at "
                      f"{[float(np.asarray(a)[k]) for a in args]}: triton {got[k]!r} "
                      f"lax {want[k]!r}")
  print("\n" + "\n".join(rows))
  assert not failures, "\n".join(failures)


def test_math_at_jax_own_test_points():
  """JAX's own Pallas GPU tests of these functions, at their inputs and tolerances."""
  import gpu_math
  x = jnp.asarray(gpu_math.JAX_ELEMENTWISE_INPUTS, jnp.float32)
  for name in gpu_math.JAX_ELEMENTWISE:
    got, want = gpu_math.run(gpu_math.UNARY[name][0], x)
    np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=name)
  xs = jnp.asarray([1, 2, 3, 4], jnp.float32)
  got, want = gpu_math.run(jax.lax.pow, xs, xs)
  np.testing.assert_allclose(got, want, err_msg="pow")
  got, want = gpu_math.run(jax.lax.erf_inv, jnp.asarray(gpu_math.JAX_ERF_INV_INPUTS, jnp.float32))
  np.testing.assert_array_equal(got, want, err_msg="erf_inv")

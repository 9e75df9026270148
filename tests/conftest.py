"""Runs the suite against every backend the machine has.

- On a CPU (CI), kernels run in the interpreter, and every kernel a test runs is also lowered to
  PTX for sm_80 and sm_90 through the Triton backend: a kernel that runs here but does not lower
  fails its test (set PALLAX_TEST_LOWER=0 to skip this).
- On a GPU (``make gpu-test``), kernels run on the Triton backend by default, so the same tests
  check Triton's results against their NumPy references.
- Tests marked ``interpreter`` are about the interpreter's own behaviour (its checks, poison
  values, race detection, semaphores) or use features the Triton backend does not support; they
  always run in the interpreter.
- Every Mosaic GPU (``plgpu``) kernel the interpreter runs is also compiled by the Gluon backend
  for sm_90a on a CPU, and on a GPU run there and compared with the interpreter's outputs
  (``gluon_check.py``).
- Compiled kernels are cached in a temporary directory for the session (``PALLAX_CACHE_DIR``
  unless set).
"""
import atexit
import os
import shutil
import sys
import tempfile
import traceback


def _memory_backed_folder() -> str | None:
  """/dev/shm where it is a roomy tmpfs, else None (the usual temporary folder). Each compiled
  kernel writes a dozen small files (our cache's entry, Triton's own cache with a temporary
  folder per file): on a memory-backed folder than on an ext4 /tmp, lowering 12 small kernels
  for 3 targets took 10-30% less time (4.4-5.8 s against 6.5 s), a few per cent of a whole test
  file (part of tests/test_api.py: 73 s against 75 s). A run's caches reach some hundred MB, so
  a small /dev/shm (Docker's default is 64 MB) is not used."""
  try:
    if os.access("/dev/shm", os.W_OK) and shutil.disk_usage("/dev/shm").free > 4 << 30:
      return "/dev/shm"
  except OSError:
    pass
  return None


def _temporary_kernel_caches():
  """Compiled kernels go to a temporary directory for this test session (removed at its end),
  not to ``~/.cache/pallax`` and ``~/.triton``: a run of the suite compiles thousands of kernels.
  A ``PALLAX_CACHE_DIR`` the user set is kept and used. Set here, at import, before any kernel is
  compiled; pytest-xdist's workers inherit the directory from the process that made it, which
  alone removes it."""
  if "PALLAX_CACHE_DIR" in os.environ:
    return
  root = tempfile.mkdtemp(prefix="pallax-test-cache-", dir=_memory_backed_folder())
  os.environ["PALLAX_CACHE_DIR"] = root
  os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(root, "triton-own"))
  atexit.register(shutil.rmtree, root, ignore_errors=True)


_temporary_kernel_caches()

import jax  # noqa: E402
import pytest  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))

LOWER_FOR = (75, 80, 90)


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "interpreter: about the interpreter's own behaviour, or uses what the Triton "
      "backend does not support; runs in the interpreter on every machine")
  config.addinivalue_line(
      "markers", "gluon_refuses(*why): the Gluon backend refuses a Mosaic GPU kernel of this "
      "test with a NotImplementedError containing one of these words (see gluon_check.py)")


def _on_gpu() -> bool:
  return jax.devices()[0].platform == "gpu"


_lowered: dict = {}   # Params -> None, or why it did not lower


def _lower(params) -> str | None:
  """Why ``params``' kernel does not lower to PTX for each of LOWER_FOR (None: it does)."""
  import gluon_check   # (with_exchange: a kernel under jax.shard_map, as the lowering gives it)
  from pallax._src.triton import codegen
  from pallax._src.triton.compile import compile_kernel
  try:
    return _lowered[params]
  except (KeyError, TypeError):
    pass
  why = None
  for cc in LOWER_FOR:
    try:
      compile_kernel(codegen.generate(gluon_check.with_exchange(params), cc), cc, params.name)
    except NotImplementedError as e:
      if "compute capability" not in str(e):   # fp8 on sm_80 is refused by design
        why = f"sm_{cc}: {type(e).__name__}: {e}"
        break
    except Exception as e:  # noqa: BLE001
      where = traceback.extract_tb(e.__traceback__)[-1]
      why = f"sm_{cc}: {type(e).__name__}: {e} (raised at {where.filename}:{where.lineno})"
      break
  try:
    _lowered[params] = why
  except TypeError:
    pass
  return why


@pytest.fixture(autouse=True)
def _uninitialized_checks(monkeypatch):
  """PALLAX_TEST_UNINIT=1: every kernel the interpreter runs checks for uninitialized data (as
  under pl.enable_debug_checks(), without turning pl.debug_check on), unless the test's
  InterpretParams switch it off. tests/test_uninitialized.py runs the suite's kernels so."""
  if os.environ.get("PALLAX_TEST_UNINIT", "0") == "1":
    from pallax._src.interpret import uninit
    monkeypatch.setattr(uninit, "enabled", lambda params: getattr(
        params.interpret, "check_uninitialized", None) is not False)
  yield


@pytest.fixture(autouse=True)
def _backends(request, monkeypatch):
  from pallax._src import backends
  from pallax._src.interpret import interpreter
  interpreter_only = request.node.get_closest_marker("interpreter") is not None
  gpu = _on_gpu()
  failures = []
  lowering = os.environ.get("PALLAX_TEST_LOWER", "1") != "0"
  if not gpu and lowering:
    import gluon_check
    from pallax._src.interpret import eager
    marker = request.node.get_closest_marker("gluon_refuses")
    monkeypatch.setattr(eager, "run_kernel",
                        gluon_check.checking(eager.run_kernel, failures, marker.args if marker else ()))
  if gpu and interpreter_only:
    # On the host CPU, so that their results are the CI's (a GPU's float32 dots may use tf32).
    # Each Mosaic GPU kernel also runs on the GPU, compared with the interpreter.
    choose = backends.choose
    monkeypatch.setattr(backends, "choose", lambda params, platform: None)
    if lowering:
      import gluon_check
      from pallax._src.interpret import eager
      monkeypatch.setattr(eager, "run_kernel", gluon_check.comparing(eager.run_kernel, failures, choose))
    with jax.default_device(jax.devices("cpu")[0]):
      yield
    _exit_if_context_is_lost(request.node.nodeid)
    assert not failures, "\n".join(dict.fromkeys(failures))
    return
  elif not gpu and not interpreter_only and lowering:
    def lowering_too(run):
      def wrapped(*args, params, **kw):
        why = _lower(params)
        out = run(*args, params=params, **kw)   # a kernel the interpreter refuses may fail both
        if why:
          failures.append(f"pallas_call {params.name} does not lower to Triton: {why}")
        return out
      return wrapped
    monkeypatch.setattr(interpreter, "run", lowering_too(interpreter.run))
    monkeypatch.setattr(interpreter, "run_eager", lowering_too(interpreter.run_eager))
  yield
  if gpu:
    _exit_if_context_is_lost(request.node.nodeid)
  assert not failures, "\n".join(dict.fromkeys(failures))


def _exit_if_context_is_lost(test: str):
  """A device-side assert (a failed check on the GPU) leaves the process's CUDA context unusable:
  every later test would fail too. End this pytest-xdist worker instead; xdist reports the test
  as crashed and starts a fresh worker."""
  try:
    jax.block_until_ready(jax.numpy.ones(2) + 1)
  except Exception as e:  # noqa: BLE001
    print(f"\n{test}: the CUDA context is lost ({str(e).splitlines()[0][:200]}); ending this "
          "worker", file=sys.stderr, flush=True)
    os._exit(3)

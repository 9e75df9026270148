"""pallax and its tests are quiet by default.

- The note that kernels run in the interpreter is shown only where it may surprise (an accelerator
  no backend serves, a ``backend=`` that does not apply), never on a CPU or when the call asked
  for the interpreter, and once per process.
- The test session compiles kernels into a temporary cache, not ``~/.cache/pallax``.
- Loading JAX's deprecated Pallas GPU ops for the tests raises no DeprecationWarning.
"""
import os
import types
import warnings

import pytest

import pallax as pl
from pallax._src import interpreter_note
from pallax._src.gpu import compile as gpu_compile


def params(interpret=False, backend=None):
  """The two fields of a pallas_call's parameters that the note reads."""
  return types.SimpleNamespace(interpret=interpret, backend=backend, name="k")


@pytest.mark.parametrize("interpret", [True, pl.InterpretParams(detect_races=True)], ids=str)
@pytest.mark.parametrize("platform", ["cpu", "cuda", "tpu"])
def test_no_note_when_the_interpreter_was_asked_for(interpret, platform):
  assert interpreter_note.message(params(interpret=interpret), platform) is None
  assert interpreter_note.message(params(interpret=interpret, backend="triton"), platform) is None


def test_no_note_on_a_cpu():
  assert interpreter_note.message(params(), "cpu") is None


@pytest.mark.parametrize("platform", ["cuda", "rocm", "tpu"])
def test_a_note_where_an_accelerator_goes_unused(platform):
  note = interpreter_note.message(params(), platform)
  assert note.startswith("pallax: ") and repr(platform) in note, note
  assert "interpret=True" in note and "triton" in note, note


def test_a_note_when_the_named_backend_does_not_apply():
  note = interpreter_note.message(params(backend="triton"), "cpu")
  assert note is not None and "'triton'" in note and "'cpu'" in note and "interpret=True" in note


def test_each_note_is_printed_once(capsys):
  for _ in range(3):
    interpreter_note.show(params(backend="triton-test-once"), "cpu")
    interpreter_note.show(params(), "cpu")   # no note
  err = capsys.readouterr().err
  assert err.count("'triton-test-once'") == 1, err
  assert err.count("\n") == 1, err


def test_the_session_caches_kernels_outside_the_home_directory():
  cache = os.path.realpath(gpu_compile.cache_dir())
  home_cache = os.path.realpath(os.path.join(os.path.expanduser("~"), ".cache", "pallax"))
  assert cache != home_cache, "tests/conftest.py should point PALLAX_CACHE_DIR at a temporary directory"
  assert os.environ["PALLAX_CACHE_DIR"] == gpu_compile.cache_dir()


@pytest.mark.parametrize("name", ["softmax", "layer_norm", "rms_norm", "attention",
                                  "decode_attention", "paged_attention"])
def test_jax_deprecated_gpu_ops_load_without_warnings(name):
  from jax_gpu_ops import load
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    module = load(name)
  assert callable(getattr(module, name if name != "attention" else "mha", None) or
                  getattr(module, "mqa", None) or getattr(module, "paged_attention", None))
  assert not [w for w in caught if issubclass(w.category, DeprecationWarning)], \
      [str(w.message) for w in caught]

"""Every Python code block of README.md and docs/*.md runs, and the README's examples and the demo
run quietly.

- The ```python blocks of one file run in order in one fresh namespace (a block may use what an
  earlier one defined), on the CPU, in the interpreter (and each pallas_call is also lowered to
  PTX, as for every test; see conftest.py).
- Blocks that import torch run only where torch is installed (a separate test per file, skipped
  without torch); with it, on CPU tensors.
- Blocks whose first line is ``# needs a GPU`` are only compiled here (Python syntax), and run in
  ``make gpu-test`` after the file's other blocks.
- In a fresh Python process, the README's examples print nothing on stderr, and the demo prints
  its sections and nothing on stderr either.
"""
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
GPU_MARK = "# needs a GPU"


def blocks(path: pathlib.Path) -> list[tuple[int, str]]:
  """(first line number, source) of each ```python block of ``path``."""
  text = path.read_text()
  found = []
  for m in re.finditer(r"^```python\n(.*?)^```$", text, re.S | re.M):
    found.append((text[:m.start()].count("\n") + 2, m.group(1)))
  return found


def needs_gpu(src: str) -> bool:
  return src.lstrip().startswith(GPU_MARK)


def needs_torch(src: str) -> bool:
  return re.search(r"^\s*import torch\b", src, re.M) is not None


def run_blocks(path: pathlib.Path, chosen) -> int:
  """Runs the blocks of ``path`` that ``chosen`` accepts, in order, in one namespace, each compiled
  with its file and line so that errors point into the document; how many ran."""
  namespace = {"__name__": f"doc_{path.stem}"}
  ran = 0
  for line, src in blocks(path):
    if chosen(src):
      code = compile("\n" * (line - 1) + src, str(path), "exec")
      exec(code, namespace)   # noqa: S102 - the documents' own examples
      ran += 1
  return ran


def _ids(paths):
  return [str(p.relative_to(ROOT)) for p in paths]


def test_every_page_is_checked():
  names = {p.name for p in DOCS}
  assert {"README.md", "interpreter.md", "triton.md", "mosaic_gpu.md", "pytorch.md",
          "performance.md"} <= names, names
  assert sum(len(blocks(p)) for p in DOCS) >= 10


def plain(src: str) -> bool:
  """Whether a block runs on any machine: it needs neither a GPU nor torch."""
  return not needs_gpu(src) and not needs_torch(src)


PLAIN_DOCS = [p for p in DOCS if any(plain(s) for _, s in blocks(p))]


@pytest.mark.parametrize("path", PLAIN_DOCS, ids=_ids(PLAIN_DOCS))
def test_python_blocks_run(path):
  assert run_blocks(path, plain) > 0


TORCH_DOCS = [p for p in DOCS if any(needs_torch(s) and not needs_gpu(s) for _, s in blocks(p))]


@pytest.mark.parametrize("path", TORCH_DOCS, ids=_ids(TORCH_DOCS))
def test_python_blocks_with_torch_run(path):
  pytest.importorskip("torch")
  assert run_blocks(path, lambda src: not needs_gpu(src)) > 0


GPU_DOCS = [p for p in DOCS if any(needs_gpu(s) for _, s in blocks(p))]


@pytest.mark.parametrize("path", GPU_DOCS, ids=_ids(GPU_DOCS))
def test_gpu_blocks_compile(path):
  for line, src in blocks(path):
    if needs_gpu(src):
      compile("\n" * (line - 1) + src, str(path), "exec")


@pytest.mark.gpu
@pytest.mark.parametrize("path", GPU_DOCS, ids=_ids(GPU_DOCS))
def test_gpu_blocks_run_on_a_gpu(path):
  if any(needs_torch(s) for _, s in blocks(path)):
    pytest.importorskip("torch")
  assert run_blocks(path, lambda src: True) > 0


def _python(args, timeout):
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=timeout)


def _backends_note_policy_wired() -> bool:
  """Whether pallas_call's backend choice asks interpreter_note when to print its note (a hook
  in pallax/_src/backends.py, to be added by its owner); until then a CPU process prints it."""
  import inspect

  from pallax._src import backends
  return "interpreter_note" in inspect.getsource(backends)


quiet_once_wired = pytest.mark.xfail(
    not _backends_note_policy_wired(), strict=True,
    reason="backends.choose still prints the 'no GPU backend applies' note in every CPU process")


@quiet_once_wired
def test_readme_examples_print_nothing_on_stderr(tmp_path):
  script = tmp_path / "readme_examples.py"
  script.write_text(
      "import pathlib, sys\n"
      f"sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
      "import test_docs\n"
      "test_docs.run_blocks(test_docs.ROOT / 'README.md', test_docs.plain)\n")
  done = _python([str(script)], timeout=300)
  assert done.returncode == 0, done.stderr
  assert done.stderr == "", done.stderr


@pytest.fixture(scope="module")
def demo_run():
  return _python(["-m", "demo"], timeout=300)


def test_demo_runs_and_says_what_it_shows(demo_run):
  out = demo_run.stdout
  assert demo_run.returncode == 0, demo_run.stderr
  for needle in ("median of 5 warm calls", "jnp ms", "1. In pallax's interpreter on the CPU",
                 "2. On", "3. The Triton source", "@triton.jit", "All kernels agree"):
    assert needle in out, (needle, out)
  rows = [l for l in out.splitlines() if re.search(r"\s(yes|NO)\s", l)]
  assert len(rows) >= 7 and all(" yes " in r for r in rows), out
  for row in rows:   # the input sizes, and two times in milliseconds
    assert re.search(r"\[[\d,]+\]", row) and len(re.findall(r"\d+\.\d{3}", row)) >= 2, row
  assert "notebook" not in out


@quiet_once_wired
def test_demo_prints_nothing_on_stderr(demo_run):
  assert demo_run.stderr == "", demo_run.stderr

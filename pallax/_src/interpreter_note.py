"""When pallax says that a kernel runs in the interpreter although the user did not ask for it.

The note helps where a user may expect a GPU kernel: the process has an accelerator that no
pallax backend serves (a GPU without ``triton`` installed, a TPU), or the call names a backend
(``backend="triton"``) that does not run on this platform. On a CPU the interpreter is the only
way to run a kernel and the README says so: the note would be noise in every process. It is never
shown when the user chose the interpreter (``interpret=True`` or ``pl.InterpretParams``), and at
most once per process for each reason.
"""
from __future__ import annotations

import functools
import sys


def message(params, platform: str) -> str | None:
  """The note for a kernel of ``params`` that will run in the interpreter on ``platform`` because
  no backend applies; None where no note helps."""
  if params.interpret:
    return None
  if params.backend is not None:
    return (f"pallax: backend {params.backend!r} does not run on platform {platform!r}; kernels "
            "run in pallax's interpreter (pass interpret=True to choose it and silence this note).")
  if platform == "cpu":
    return None
  return (f"pallax: no pallax backend applies on platform {platform!r}; kernels run in pallax's "
          "interpreter (the GPU backends need an NVIDIA GPU and the `triton` package: "
          "pip install 'pallax[triton]'; pass interpret=True to choose the interpreter and "
          "silence this note).")


def show(params, platform: str) -> None:
  """Prints ``message(params, platform)`` on stderr, once per process for each distinct note."""
  note = message(params, platform)
  if note is not None:
    _print_once(note)


@functools.cache   # the cache is the memory of which notes were shown
def _print_once(note: str) -> None:
  print(note, file=sys.stderr)

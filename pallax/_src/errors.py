"""pallax's error class, and errors of checks that fail inside ``jax.jit``.

Under ``jax.jit`` a check fails in a host callback, and XLA reports any exception raised there
as ``JaxRuntimeError: INTERNAL: CpuCallback error calling callback: Traceback ...`` with the
message last. ``reporting(fn)`` wraps such a callback: the exception it raises is remembered
under a number written into the message, and when jaxlib makes the JaxRuntimeError from that
message (``jax_internals.on_runtime_error``) it makes an instance of a class that subclasses
both the original class and JaxRuntimeError instead: ``except pl.KernelCheckError``,
``except IndexError`` and ``except jax.errors.JaxRuntimeError`` all catch it, and its message
is pallax's.

This needs jaxlib to make the error, which it does on JAX's Python dispatch path. After a first
successful call, ``jax.jit`` runs a function without effects through its C++ fast path, which
reports the failure as a ValueError (still with the message, and the original class name in
it); a pallas_call that the interpreter runs therefore declares an effect
(``call_primitive._effects``).
"""
from __future__ import annotations

import collections
import functools
import itertools
import re
import threading

from pallax._src import jax_internals as ji


class KernelCheckError(RuntimeError):
  """A check inside a kernel failed in the interpreter (pl.debug_check, races, semaphores,
  uninitialized data, Mosaic GPU's barriers and copies)."""


KernelCheckError.__module__ = "pallax"


_MARK = re.compile(r"\[pallax error #(\d+)\]")
_PENDING: collections.OrderedDict = collections.OrderedDict()   # number -> exception (a cache:
_PENDING_SIZE = 64                                              # the oldest go first)
_LOCK = threading.Lock()
_COUNTER = itertools.count()


def reporting(fn):
  """``fn`` (a host callback) whose exceptions reach the caller of the jitted function with
  their class and message (see the module docstring)."""
  @functools.wraps(fn)
  def call(*args):
    try:
      return fn(*args)
    except Exception as e:
      n = next(_COUNTER)
      with _LOCK:
        _PENDING[n] = e
        while len(_PENDING) > _PENDING_SIZE:
          _PENDING.popitem(last=False)
      raise _carrier(e, f"{e} [pallax error #{n}]") from None
  return call


def _carrier(e: Exception, message: str) -> Exception:
  """What the callback raises for XLA to report: ``e``'s class with the numbered message (a
  RuntimeError where that class takes other arguments)."""
  try:
    return type(e)(message)
  except Exception:  # noqa: BLE001
    return RuntimeError(message)


@functools.cache
def _with_runtime_error(cls):
  """A subclass of ``cls`` and JaxRuntimeError that prints as ``cls`` (None where Python cannot
  combine them: exceptions with their own memory layout)."""
  def __init__(self, *args):
    del args   # jaxlib's message and code: the message is pallax's
    BaseException.__init__(self, self._pallax_message)

  body = {"__init__": __init__, "__str__": lambda self: str(self.args[0]),
          "error_message": property(lambda self: str(self.args[0])),
          "__module__": cls.__module__, "__qualname__": cls.__qualname__,
          "__doc__": cls.__doc__}
  try:
    return type(cls.__name__, (cls, ji.JaxRuntimeError), body)
  except TypeError:
    return None


def _replace(message: str):
  m = _MARK.search(message)
  if m is None:
    return None
  with _LOCK:
    original = _PENDING.pop(int(m.group(1)), None)
  if original is None:
    return None
  cls = _with_runtime_error(type(original))
  if cls is None:
    return None
  exc = cls.__new__(cls)
  exc._pallax_message = str(original)
  return exc


ji.on_runtime_error(_replace)

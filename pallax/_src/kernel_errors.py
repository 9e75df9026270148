"""How the errors of a ``pallas_call`` name its kernel, the user's source line and the Refs on it."""
from __future__ import annotations

import functools
import inspect


from pallax._src import jax_internals as ji


def kernel_name(kernel, name):
  if name:
    return name
  return getattr(kernel, "__name__", None) or getattr(getattr(kernel, "func", None), "__name__", "kernel")


def _user_frame_of(exc: BaseException) -> str | None:
  tb, frame = exc.__traceback__, None
  while tb is not None:
    f = tb.tb_frame.f_code.co_filename
    if not ji.is_library_file(f):
      frame = f"{f}:{tb.tb_lineno} ({tb.tb_frame.f_code.co_name})"
    tb = tb.tb_next
  return frame


def _refs_on_line(frame: str | None, ref_names: dict[str, str]) -> str:
  """' (x_ref is args[0], o_ref is out[0])' for the kernel parameters named on that line."""
  import linecache
  import re
  if not frame or not ref_names:
    return ""
  m = re.match(r"(.*):(\d+) \(", frame)
  line = linecache.getline(m.group(1), int(m.group(2))) if m else ""
  found = [f"{p} is {o}" for p, o in ref_names.items() if re.search(rf"\b{re.escape(p)}\b", line)]
  return f" ({', '.join(found)})" if found else ""


def reraise(exc: Exception, prefix: str, ref_names: dict[str, str] | None = None):
  """Re-raises ``exc`` with the kernel's name, the user's source line and the Refs on it."""
  frame = _user_frame_of(exc)
  msg = str(exc).split("\n--------------------")[0] + _refs_on_line(frame, ref_names or {})
  where = f" at {frame}" if frame and frame not in msg else ""
  cls = type(exc)
  if cls is ValueError and "Out of bound" in msg:
    cls = IndexError
  if cls not in (ValueError, TypeError, IndexError, NotImplementedError, RuntimeError):
    raise exc
  raise cls(f"{prefix}{where}: {msg}") from exc


def binds(fn, n: int, kw_names=()) -> bool:
  """Whether ``fn`` accepts ``n`` positional and the named keyword arguments (True when its
  signature cannot be read)."""
  try:
    sig = inspect.signature(fn)
  except (TypeError, ValueError):
    return True
  try:
    sig.bind(*range(n), **{k: 0 for k in kw_names})
  except TypeError:
    return False
  return True


def defined_at(fn) -> str | None:
  """'file:line' of a function's definition (through partials), or None."""
  while isinstance(fn, functools.partial):
    fn = fn.func
  code = getattr(fn, "__code__", None)
  return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else None


def label(name: str, kernel) -> str:
  """'k (kernel at file:line)': how the errors of a call's specification name its kernel."""
  where = defined_at(kernel)
  return f"{name} (kernel at {where})" if where else name


def signature_text(fn) -> str:
  try:
    return str(inspect.signature(fn))
  except (TypeError, ValueError):
    return "(...)"

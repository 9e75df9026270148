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


def spaces_by_type(ref_avals, ref_spaces) -> dict[str, str]:
  """{'Ref{float32[8,32]}': 'default'} for the Ref types whose Refs all have one known memory
  space (pallax's Ref types carry none, JAX Pallas's do; its errors print them)."""
  found: dict[str, set] = {}
  for aval, space in zip(ref_avals, ref_spaces):
    found.setdefault(str(aval), set()).add(space)
  return {t: s.pop() for t, s in found.items() if len(s) == 1 and None not in s}


def _with_spaces(msg: str, spaces: dict[str, str]) -> str:
  """JAX's 'Attempting to pass a Ref Ref{...} to a primitive' with the Ref's memory space, as
  JAX Pallas writes it: 'Ref<default>{...}'."""
  for t, space in spaces.items():
    msg = msg.replace(f"Attempting to pass a Ref {t} ",
                      f"Attempting to pass a Ref Ref<{space}>{t[len('Ref'):]} ")
  return msg


def reraise(exc: Exception, prefix: str, ref_names: dict[str, str] | None = None,
            spaces: dict[str, str] | None = None):
  """Re-raises ``exc`` with the kernel's name, the user's source line and the Refs on it
  (``spaces``: memory spaces by Ref type, see ``spaces_by_type``)."""
  frame = _user_frame_of(exc)
  msg = _with_spaces(str(exc).split("\n--------------------")[0], spaces or {})
  msg += _refs_on_line(frame, ref_names or {})
  where = f" at {frame}" if frame and frame not in msg else ""
  cls = type(exc)
  if cls is ValueError and "Out of bound" in msg:
    cls = IndexError
  if cls not in (ValueError, TypeError, IndexError, NotImplementedError, RuntimeError):
    raise exc
  raise cls(f"{prefix}{where}: {msg}") from exc


def bind_error(fn, n: int, kw_names=()) -> str | None:
  """Python's words for why ``fn`` does not accept ``n`` positional and the named keyword
  arguments ('missing 2 required positional arguments: ...'), or None where it does (or its
  signature cannot be read)."""
  try:
    sig = inspect.signature(fn)
  except (TypeError, ValueError):
    return None
  try:
    sig.bind(*range(n), **{k: 0 for k in kw_names})
  except TypeError as e:
    return f"{getattr(fn, '__name__', 'the function')}() {_call_words(sig, n, str(e))}"
  return None


def _call_words(sig, n: int, bind_words: str) -> str:
  """What calling a function of signature ``sig`` with ``n`` positional arguments would say
  (Python's words, which users match), from ``Signature.bind``'s shorter ones."""
  positional = [p for p in sig.parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  if bind_words.startswith("too many positional arguments"):
    return (f"takes {len(positional)} positional argument{'s' * (len(positional) != 1)} but {n} "
            f"{'were' if n != 1 else 'was'} given")
  missing = [f"'{p.name}'" for p in positional[n:] if p.default is p.empty]
  if bind_words.startswith("missing") and missing:
    names = missing[0] if len(missing) == 1 else (
        f"{missing[0]} and {missing[1]}" if len(missing) == 2
        else ", ".join(missing[:-1]) + f", and {missing[-1]}")
    return (f"missing {len(missing)} required positional argument{'s' * (len(missing) != 1)}: "
            f"{names}")
  return bind_words


def binds(fn, n: int, kw_names=()) -> bool:
  """Whether ``fn`` accepts ``n`` positional and the named keyword arguments (True when its
  signature cannot be read)."""
  return bind_error(fn, n, kw_names) is None


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

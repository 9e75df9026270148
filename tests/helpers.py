"""What the test files share: fresh random inputs, and JAX's own kernel modules loaded with
their imports switched to pallax."""
import os
import sys
import types
import warnings
import zlib

import numpy as np


def rand_seeded(seed: int, shape, dtype=np.float32, *, offset: float = 0.0) -> np.ndarray:
  """Random values of ``dtype`` from ``seed``, as a NumPy array: floats from a standard normal
  plus ``offset``; nonzero integers, most within +-150 (non-negative for unsigned types); a
  random mix of bools."""
  dtype = np.dtype(dtype)
  v = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
  if dtype == np.bool_:
    return v > 0
  v = v + np.float32(offset)
  if np.issubdtype(dtype, np.integer):
    v = np.where(v >= 0, np.floor(v * 50) + 1, np.ceil(v * 50) - 1)   # never zero
    info = np.iinfo(dtype)
    v = np.clip(np.abs(v) if info.min == 0 else v, info.min, info.max)
  return v.astype(dtype)


def rand(shape, dtype=np.float32, salt: str = "", *, offset: float = 0.0) -> np.ndarray:
  """Fresh random values keyed by the running test's id, ``salt`` and ``shape``: each test
  (and each parametrization) gets its own inputs, the same on every run."""
  test = os.environ.get("PYTEST_CURRENT_TEST", "test").split(" ")[0]
  seed = zlib.crc32((test + salt + str(tuple(np.atleast_1d(shape)))).encode())
  return rand_seeded(seed, shape, dtype, offset=offset)


def first_line(excinfo) -> str:
  """The first line of a ``pytest.raises`` exception's message."""
  return str(excinfo.value).splitlines()[0]


def load_jax_ops_module(name: str, imports: dict, prefix: str, strict: bool = True,
                        **globals_) -> types.ModuleType:
  """JAX's ``jax/experimental/pallas/ops/gpu/<name>.py`` executed with the import lines of
  ``imports`` replaced (each must occur where ``strict``), ``globals_`` defined first; the module
  is registered as ``<prefix><name>``. JAX deprecated some of these modules; running them is the
  point here, so their deprecation warnings are silenced."""
  import jax.experimental.pallas.ops.gpu as gpu_ops   # tests may read JAX's Pallas
  path = os.path.join(os.path.dirname(gpu_ops.__file__), name + ".py")
  src = open(path).read()
  for old, new in imports.items():
    assert old in src or not strict, (name, old)
    src = src.replace(old, new)
  assert "jax.experimental.pallas" not in src.replace("jax.experimental.pallas.ops", ""), name
  mod = types.ModuleType(prefix + name)
  mod.__file__ = path
  mod.__dict__.update(globals_)
  sys.modules[mod.__name__] = mod
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"jax\.experimental\.pallas\.ops\.gpu\.\w+ is deprecated",
                            category=DeprecationWarning)
    exec(compile(src, path, "exec"), mod.__dict__)
  return mod


def unused_definitions(source: str, layouts: bool = True) -> list[str]:
  """The variables and (with ``layouts``) named layouts a generated kernel module assigns and
  never reads, per function (a property of the code, not of its names: generated code defines
  nothing it does not use). ``layouts=False`` leaves the named layouts out."""
  import ast
  unused = []
  for fn in [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)]:
    read = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    for n in ast.walk(fn):
      targets = n.targets if isinstance(n, ast.Assign) else \
          [n.target] if isinstance(n, ast.AnnAssign) and layouts else []
      unused += [f"{fn.name}: {ast.unparse(n)}" for t in targets
                 if isinstance(t, ast.Name) and t.id not in read and t.id != "_"]
  return unused


def params_of(fn, *args):
  """The Params of the one pallas_call in ``fn(*args)`` (traced, not run)."""
  import jax
  from pallax._src import pallas_call as pcall
  jaxpr = jax.make_jaxpr(fn)(*args)
  (params,) = [e.params["params"] for e in jaxpr.eqns if e.primitive is pcall.pallas_call_p]
  return params

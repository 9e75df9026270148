"""The package's structure rules, read from its source with ``ast`` (no import of pallax):

- no import cycle among pallax's modules, counting imports inside functions (a function-level
  import hides a cycle from Python, not from a reader);
- no private name (``_x``) of one pallax module used by another, by import or attribute;
- modules of ``pallax/_src`` under MAX_MODULE lines, functions under MAX_FUNCTION;
- layers: the Mosaic GPU front end (``mosaic_gpu/``) and the interpreter never import a GPU
  backend; the two backends never import each other; Gluon code lives in ``gluon/``.
"""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "pallax"
MAX_MODULE = 650
MAX_FUNCTION = 60
BACKENDS = ("pallax._src.triton", "pallax._src.gluon")


def _modules() -> dict[str, pathlib.Path]:
  out = {}
  for path in sorted(ROOT.rglob("*.py")):
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    out[name] = path
  return out


MODULES = _modules()
TREES = {name: ast.parse(path.read_text()) for name, path in MODULES.items()}


def _known(name: str) -> str | None:
  """The pallax module ``name`` refers to (a module, or a name inside one), or None."""
  while name and name not in MODULES:
    name = name.rpartition(".")[0]
  return name or None


def _imports(module: str) -> list[tuple[str, ast.AST, dict]]:
  """(imported pallax module, the import node, local alias -> module) for every import in
  ``module``, at any depth."""
  out = []
  for node in ast.walk(TREES[module]):
    if isinstance(node, ast.Import):
      for a in node.names:
        target = _known(a.name)
        if target and target.startswith("pallax"):
          out.append((target, node, {a.asname: target} if a.asname else {}))
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("pallax"):
      for a in node.names:
        sub = _known(f"{node.module}.{a.name}")
        target = sub if sub == f"{node.module}.{a.name}" else _known(node.module)
        if target:
          out.append((target, node, {a.asname or a.name: target} if sub == target else {}))
  return [(t, n, al) for t, n, al in out if t != module]


def _graph() -> dict[str, set[str]]:
  return {m: {t for t, _, _ in _imports(m)} for m in MODULES}


def _cycles(graph) -> list[list[str]]:
  """Strongly connected components of more than one module (Tarjan, iteratively)."""
  index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

  def visit(root):
    work = [(root, iter(sorted(graph[root])))]
    index[root] = low[root] = counter[0]
    counter[0] += 1
    stack.append(root)
    on.add(root)
    while work:
      v, it = work[-1]
      w = next(it, None)
      if w is None:
        work.pop()
        if work:
          low[work[-1][0]] = min(low[work[-1][0]], low[v])
        if low[v] == index[v]:
          comp = []
          while True:
            x = stack.pop()
            on.discard(x)
            comp.append(x)
            if x == v:
              break
          if len(comp) > 1:
            out.append(sorted(comp))
      elif w not in index:
        index[w] = low[w] = counter[0]
        counter[0] += 1
        stack.append(w)
        on.add(w)
        work.append((w, iter(sorted(graph[w]))))
      elif w in on:
        low[v] = min(low[v], index[w])

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def test_no_import_cycles():
  assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
  assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_private_names_across_modules():
  found = []
  for m in MODULES:
    aliases = {}
    for target, node, alias in _imports(m):
      aliases.update(alias)
      if isinstance(node, ast.ImportFrom):
        found += [f"{m} imports {a.name} from {target}" for a in node.names
                  if a.name.startswith("_") and not a.name.startswith("__")]
    for node in ast.walk(TREES[m]):
      if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
          and node.value.id in aliases and node.attr.startswith("_")
          and not node.attr.startswith("__")):
        found.append(f"{m} uses {aliases[node.value.id]}.{node.attr} (line {node.lineno})")
  assert found == []


@pytest.mark.parametrize("module", [m for m in MODULES if m.startswith("pallax._src")])
def test_sizes(module):
  lines = MODULES[module].read_text().count("\n") + 1
  assert lines <= MAX_MODULE, f"{module} has {lines} lines; split it by concern"
  long = [f"{n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in ast.walk(TREES[module])
          if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
          and n.end_lineno - n.lineno + 1 > MAX_FUNCTION]
  assert long == []


def test_layers():
  bad = []
  for m, deps in _graph().items():
    front_end = m.startswith(("pallax._src.mosaic_gpu", "pallax._src.interpret"))
    for d in deps:
      if front_end and d.startswith(BACKENDS):
        bad.append(f"{m} (front end or interpreter) imports the backend module {d}")
      for b, other in (BACKENDS, BACKENDS[::-1]):
        if m.startswith(b) and d.startswith(other):
          bad.append(f"the backend module {m} imports the other backend's {d}")
    if m.startswith("pallax._src.mosaic_gpu") and "triton.experimental.gluon" in MODULES[m].read_text():
      bad.append(f"{m}: Gluon code inside the Mosaic GPU front end (it belongs in pallax/_src/gluon)")
  assert bad == []

"""The package's import graph flows one way (docs/ARCHITECTURE.md): no module imports a
package documented above it, the model library imports no training or input stack, and no
modules import each other in a cycle, within a package or across, imports inside
functions included (an import deferred into a function still makes a cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "transformer"

# Layers, lowest first. A module may import its own package and the layers below its own;
# packages on one layer are peers that do not import each other.
LAYERS: tuple[tuple[str, ...], ...] = (
  ("ops",),
  ("nn", "data"),
  ("decode", "convert"),
  ("tasks",),
  ("evaluators",),
  ("cli",),  # the commands' support modules at the root: cli.py, process_settings.py
  ("train",),
  ("eval",),
  ("research",),
  ("",),  # the package root: the commands (train_main.py, eval_main.py, sweep.py)
)
SUPPORT = ("transformer.cli", "transformer.process_settings")  # the "cli" layer
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}
# Libraries the model library must not need (it is usable without the training stack).
NN_FORBIDDEN = ("absl", "orbax", "grain", "tensorflow_datasets", "ray", "ml_collections")


def _package(module: str) -> str:
  """'transformer.nn.masks' -> 'nn'; 'transformer.cli' -> 'cli' (see LAYERS);
  'transformer.eval_main' -> '' (the root)."""
  if module in SUPPORT:
    return "cli"
  parts = module.split(".")
  if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()):
    return parts[1]
  return ""


def _imports(path: Path) -> list[str]:
  """Every module `path` imports (function-level imports included), as dotted names."""
  tree = ast.parse(path.read_text(encoding="utf-8"))
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found += [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      if node.module == "transformer":  # `from transformer import tasks` names a subpackage
        found += [f"transformer.{alias.name}" for alias in node.names]
      else:
        found.append(node.module)
  return found


def violations(module: str, imported: list[str]) -> list[str]:
  """The imports of `module` that go against the documented direction."""
  own = _package(module)
  bad = []
  for name in imported:
    top = name.split(".")[0]
    if own == "nn" and top in NN_FORBIDDEN:
      bad.append(f"{module} imports {name} (the model library stays free of it)")
    if top != "transformer" or name == "transformer":
      continue
    other = _package(name)
    if other == own:
      continue
    if RANK[other] >= RANK[own]:
      bad.append(f"{module} imports {name} ({other or 'the root'} is not below {own or 'root'})")
  return bad


def _modules(package: Path = PACKAGE) -> list[tuple[str, Path]]:
  out = []
  for path in sorted(package.rglob("*.py")):
    parts = path.relative_to(package.parent).with_suffix("").parts
    if parts[-1] == "__init__":
      parts = parts[:-1]
    out.append((".".join(parts), path))
  return out


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
  """module -> the package's modules it imports. `from a.b import c` imports module a.b.c
  where that is a module, else a.b (the package whose `__init__` defines c)."""
  modules = dict(_modules(package))
  graph = {}
  for module, path in modules.items():
    edges = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
      elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        names = [f"{node.module}.{alias.name}" for alias in node.names]
        names = [n if n in modules else node.module for n in names]
      else:
        continue
      edges |= {n for n in names if n in modules and n != module}
    graph[module] = edges
  return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan), each sorted."""
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  stack: list[str] = []
  found = []

  def visit(v: str) -> None:
    index[v] = low[v] = len(index)
    stack.append(v)
    for w in sorted(graph.get(v, ())):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while not component or component[-1] != v:
        component.append(stack.pop())
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def test_every_package_is_on_a_layer():
  packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
  assert packages == set(RANK) - {"", "cli"}, "add the new package to LAYERS and ARCHITECTURE.md"


def test_imports_follow_the_documented_direction():
  bad = [v for module, path in _modules() for v in violations(module, _imports(path))]
  assert bad == []


@pytest.mark.parametrize(
  ("module", "imported"),
  [
    ("transformer.nn.blocks", ["transformer.train.step"]),  # model library -> training
    ("transformer.nn.models.decoder", ["transformer.data.tokenizers"]),  # peers
    ("transformer.data.datasets", ["transformer.tasks"]),  # data -> tasks
    ("transformer.tasks.lm", ["transformer.train.loop"]),  # tasks -> training
    ("transformer.train.loop", ["transformer.eval.evaluate"]),  # training -> evaluation
    ("transformer.cli", ["transformer.train.loop"]),  # the commands' support -> training
    ("transformer.nn.layers", ["orbax.checkpoint"]),  # model library -> checkpoint library
  ],
)
def test_the_check_catches_a_wrong_way_import(module, imported):
  assert violations(module, imported)


def test_the_check_allows_downward_and_internal_imports():
  assert violations("transformer.train.loop", ["transformer.tasks", "transformer.nn.config"]) == []
  assert violations("transformer.tasks.lm", ["transformer.tasks.base", "jax"]) == []
  assert violations("transformer.cli", ["transformer.process_settings"]) == []
  assert violations("transformer.train.loop", ["transformer.cli"]) == []
  assert violations("transformer.eval_main", ["transformer.cli", "transformer.eval"]) == []


def test_no_import_cycles():
  assert cycles(import_graph()) == []


def test_the_model_config_imports_nothing_from_the_package():
  """Only its own rules module, which imports nothing from the package either."""
  graph = import_graph()
  assert graph["transformer.nn.config"] == {"transformer.nn.config_rules"}
  assert graph["transformer.nn.config_rules"] == set()


def test_the_cycle_check_catches_a_planted_cycle_inside_a_function(tmp_path):
  package = tmp_path / "planted"
  (package / "sub").mkdir(parents=True)
  (package / "__init__.py").write_text("")
  (package / "sub" / "__init__.py").write_text("")
  (package / "a.py").write_text("from planted.sub import b\n")
  (package / "c.py").write_text("import os\n")
  # the way the old ModelConfig reached its registries: an import inside a function
  (package / "sub" / "b.py").write_text("def f():\n  from planted import a\n  return a\n")
  graph = import_graph(package)
  assert graph["planted.a"] == {"planted.sub.b"} and graph["planted.sub.b"] == {"planted.a"}
  assert cycles(graph) == [["planted.a", "planted.sub.b"]]
  (package / "sub" / "b.py").write_text("def f():\n  from planted import c\n  return c\n")
  assert cycles(import_graph(package)) == []


def test_the_cycle_check_catches_the_old_registry_cycle():
  graph = import_graph()
  graph["transformer.nn.config"] = {"transformer.nn.models"}  # as before the boundary check
  assert any("transformer.nn.config" in c and "transformer.nn.models" in c for c in cycles(graph))

"""The package's import graph flows one way (docs/ARCHITECTURE.md): no module imports a
package documented above it, and the model library imports no training or input stack."""

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
  ("train",),
  ("eval",),
  ("research",),
  ("",),  # the package root: cli.py, process_settings.py (entry-point support)
)
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}
# Libraries the model library must not need (it is usable without the training stack).
NN_FORBIDDEN = ("absl", "orbax", "grain", "tensorflow_datasets", "ray", "ml_collections")


def _package(module: str) -> str:
  """'transformer.nn.masks' -> 'nn'; 'transformer.cli' -> '' (the root)."""
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


def _modules() -> list[tuple[str, Path]]:
  out = []
  for path in sorted(PACKAGE.rglob("*.py")):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
      parts = parts[:-1]
    out.append((".".join(parts), path))
  return out


def test_every_package_is_on_a_layer():
  packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
  assert packages == set(RANK) - {""}, "add the new package to LAYERS and docs/ARCHITECTURE.md"


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
    ("transformer.nn.layers", ["orbax.checkpoint"]),  # model library -> checkpoint library
  ],
)
def test_the_check_catches_a_wrong_way_import(module, imported):
  assert violations(module, imported)


def test_the_check_allows_downward_and_internal_imports():
  assert violations("transformer.train.loop", ["transformer.tasks", "transformer.nn.config"]) == []
  assert violations("transformer.tasks.lm", ["transformer.tasks.base", "jax"]) == []
  assert violations("transformer.cli", ["transformer.process_settings"]) == []

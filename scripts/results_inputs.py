"""What docs/RESULTS.md is made from, for scripts/results.py: the manifest's recipes
(scripts/results.toml; its header documents the fields) and what each recipe's workdir
holds: the reported invocation of WORKDIR/runs.jsonl, the final evaluation of
WORKDIR/metrics.jsonl, and WORKDIR/curves.png. Workdirs may be `gs://` URLs (read
through `etils.epath`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import shlex
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from etils import epath

from transformer.data.files import read_jsonl

RUNS_NAME = "runs.jsonl"  # = transformer.train.guard.run_record.RUNS_NAME
METRICS_NAME = "metrics.jsonl"  # = transformer.train.metric_writers.JSONL_NAME
CURVES_NAME = "curves.png"


@dataclasses.dataclass(frozen=True)
class Metric:
  key: str  # the name in metrics.jsonl
  label: str  # what the page calls it
  format: str = ".4g"  # a Python format spec


@dataclasses.dataclass(frozen=True)
class Target:
  metric: str  # a metrics key, or "wall_seconds" (from the run record)
  why: str = ""
  at_most: float | None = None
  at_least: float | None = None
  above: str | None = None  # another recipe's name: beat its value of `metric`


@dataclasses.dataclass(frozen=True)
class Recipe:
  name: str
  title: str
  config: str
  workdir: str
  metrics: tuple[Metric, ...]
  args: tuple[str, ...] = ()
  after: str | None = None
  split: str = "eval"
  about: str = ""
  targets: tuple[Target, ...] = ()

  @property
  def command(self) -> str:
    """The command that reproduces the run, from the repository root."""
    argv = ["python", "train.py", "--config", self.config, "--workdir", self.workdir]
    return shlex.join(argv + list(self.args))


@dataclasses.dataclass(frozen=True)
class Manifest:
  recipes: tuple[Recipe, ...]
  notes: tuple[tuple[str, str], ...] = ()  # (title, text) prose sections


def _fields(cls, table: dict[str, Any], where: str) -> dict[str, Any]:
  """`table` checked against the fields of `cls` (an unknown key is a typo)."""
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(table) - names)
  if unknown:
    raise ValueError(f"{where}: unknown field(s) {unknown}; expected some of {sorted(names)}")
  return dict(table)


def load_manifest(path: str | os.PathLike) -> Manifest:
  """The recipes and notes of a TOML manifest (see scripts/results.toml)."""
  with open(path, "rb") as f:
    data = tomllib.load(f)
  recipes = []
  for i, table in enumerate(data.get("recipe", [])):
    where = f"{path}: recipe {table.get('name', i)!r}"
    fields = _fields(Recipe, table, where)
    fields["metrics"] = tuple(Metric(**_fields(Metric, m, where)) for m in table.get("metrics", []))
    fields["targets"] = tuple(Target(**_fields(Target, t, where)) for t in table.get("targets", []))
    fields["args"] = tuple(table.get("args", ()))
    try:
      recipes.append(Recipe(**fields))
    except TypeError as e:
      raise ValueError(f"{where}: {e}") from None
  names = [r.name for r in recipes]
  if len(set(names)) != len(names):
    raise ValueError(f"{path}: recipe names must be unique; got {names}")
  for recipe in recipes:
    for target in recipe.targets:
      bounds = [b for b in (target.at_most, target.at_least, target.above) if b is not None]
      if len(bounds) != 1:
        raise ValueError(f"{path}: {recipe.name}: a target needs one of at_most, at_least, above")
      if target.above is not None and target.above not in names:
        raise ValueError(f"{path}: {recipe.name}: target above unknown recipe {target.above!r}")
  notes = tuple((n["title"], n["text"].strip()) for n in data.get("notes", []))
  return Manifest(tuple(sorted(recipes, key=lambda r: r.name)), notes)


def _path(root: Path, value: str) -> epath.Path:
  """A manifest path: a URL as is, a relative path under `root`."""
  if "://" in value or os.path.isabs(value):
    return epath.Path(value)
  return epath.Path(root / value)


def pick_run(records: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
  """The invocation the page reports: the last one that completed after training steps,
  else the last one that trained any, else the last one; None without records."""
  for wanted in (
    lambda r: r.get("status") == "completed" and r.get("first_step") is not None,
    lambda r: r.get("first_step") is not None,
    lambda r: True,
  ):
    found = [r for r in records if wanted(r)]
    if found:
      return found[-1]
  return None


def final_metrics(records: Sequence[dict[str, Any]], split: str) -> dict[str, Any] | None:
  """The last metrics.jsonl line of `split` (the final evaluation), None if there is none."""
  found = [r for r in records if r.get("split") == split]
  return max(found, key=lambda r: r.get("step", -1)) if found else None


@dataclasses.dataclass
class Result:
  """What one recipe's workdir holds."""

  recipe: Recipe
  ran: bool  # the workdir exists
  run: dict[str, Any] | None = None  # the reported runs.jsonl record
  legs: int = 0  # records in runs.jsonl
  metrics: dict[str, Any] | None = None  # the final evaluation line
  curves: bytes | None = None  # curves.png

  def value(self, key: str) -> float | None:
    """A metric of the final evaluation, or `wall_seconds` of the run record."""
    source = self.run if key == "wall_seconds" else self.metrics
    value = (source or {}).get(key)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def collect(recipe: Recipe, root: Path) -> Result:
  """Reads a recipe's workdir."""
  workdir = _path(root, recipe.workdir)
  if not workdir.is_dir():
    return Result(recipe, ran=False)
  runs = read_jsonl(workdir / RUNS_NAME)
  curves = workdir / CURVES_NAME
  return Result(
    recipe,
    ran=True,
    run=pick_run(runs),
    legs=len(runs),
    metrics=final_metrics(read_jsonl(workdir / METRICS_NAME), recipe.split),
    curves=curves.read_bytes() if curves.exists() else None,
  )

"""Pretraining in the low-label regime: fine-tuned vs from scratch with 1,000 and 3,000 labels.

`configs/classify_testament.py` (Old vs New Testament, KJV verses) fine-tuned from the
masked-LM encoder of `configs/mlm_bible.py` gains little over the same classifier trained
from scratch with its ~28,000 labelled training verses (docs/RESEARCH.md). Pretraining should
matter most when labels are few (the classic demonstration since ULMFiT and BERT), so this
trains both arms on `data.train_examples=N` verses only:

  python -m transformer.research.low_label [--examples 1000 3000] [--seeds 0 1 2] \\
    [--pretrained runs/mlm_bible] --workdir runs/low_label \\
    [--search_learning_rates 1e-4 3e-4 1e-3 --search_steps 200 600 1200 --extend_edges 2]

  * pretraining: `--pretrained DIR` (default `WORKDIR/mlm_bible`) is used as it is when it
    holds a checkpoint; otherwise `configs/mlm_bible.py` is trained there first, once
    (`--pretrain_steps` updates, default 6,000: the recipe's 1,000 are too few to show the
    payoff, docs/RESEARCH.md; 0 = the recipe's; an interrupted pretraining,
    `train.log` without `done`, resumes on the next call).
  * fine-tuned arm: `--config.init_from=DIR --config.data.tokenizer_from=DIR`;
    from-scratch arm: `--config.data.tokenizer_from=DIR` only, so both read the verses in
    the same 4,000-piece vocabulary and differ only in the initial encoder weights. Both
    are fully fine-tuned (every parameter trains).
  * the subset: `DataConfig.train_examples` draws N training verses from `config.seed`,
    so the two arms of a seed train on the same verses (and the same batch order), and the
    spread over seeds includes the choice of the N verses, not only the initialisation.
  * the budget: by default the same `--steps` updates (600, the full-data recipe's) of
    the recipe's batch (32) for every N and both arms, warmup 10%, cosine to 0, the
    recipe's learning rate: 19 epochs of 1,000 verses, 6.4 of 3,000. The reported number
    is the test accuracy of the final weights (no checkpoint selection, so the test split
    never picks anything); the test split is also evaluated every `--eval_every` steps
    and the JSON keeps that curve, to see whether an arm was still climbing at the end.
  * the search (`--search_learning_rates`, `--search_steps`): the same grid for both arms
    and every N. Each (N, arm) trains every point on `--search_seeds` (default: the first
    seed), evaluated on the validation split, and its final runs use its own best point:
    each arm gets its best learning rate and budget, chosen without the test split. With
    `--extend_edges K`, a best point on an edge of the grid (its largest learning rate,
    say) grows that arm's grid one value past the edge, up to K times: the same rule for
    both arms, so neither is held to a range that suits the other.

Every run is `python -m transformer.train_main` in its own process (the same flags and
process settings as `train.py`), output in `WORKDIR/n<N>/<arm>/lr<LR>_steps<S>/seed<S>/`
(`train.log`, checkpoint, metrics; search runs under `WORKDIR/search/`); a finished run
leaves `result.json` there and is not run again, so a grid extended later trains only its
new points (other settings in the same place, e.g. another `--eval_every`, are an error).
Prints a Markdown table (per N and arm: learning rate, steps, test accuracy per seed, mean
+- sample standard deviation over the seeds, and the fine-tuned minus scratch gap, with
the per-seed gaps) and writes it, the search table, every run's curve, wall and CPU time,
the machine and the load, to `WORKDIR/low_label.json` and `WORKDIR/low_label.md`.
Results: docs/RESEARCH.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import ClassVar

from transformer.research.arms import (
  ARMS,
  arm_overrides,
  extended,  # noqa: F401  (low_label.extended: the grid rule of `search`)
  final_evaluations,
  finished,
  gap_cell,
  grid_search,
  paired_gaps,
  record,
  run_arm,
)
from transformer.research.runs import machine, mean_std, pretrain, train_process

CLASSIFIER = "configs/classify_testament.py"
PRETRAINING = "configs/mlm_bible.py"
BATCH_SIZE = 32  # the classify_testament recipe's


@dataclasses.dataclass(frozen=True)
class Settings:
  """One run's budget besides N, the arm and the seed (the rest is the recipe's)."""

  steps: int = 600  # updates of BATCH_SIZE verses; warmup 10% of them, then cosine to 0
  learning_rate: float = 3e-4  # peak (the recipe's)
  eval_every: int = 150  # interval of the accuracy curve (the final step is always evaluated)
  eval_split: str = "test"  # the recipe's; the search evaluates 'validation'
  min_steps: ClassVar[int] = 1

  def __post_init__(self):
    if self.steps < self.min_steps or self.eval_every < 1:
      raise ValueError(
        f"steps must be >= {self.min_steps}, eval_every >= 1; got {self.steps}, {self.eval_every}"
      )
    if not self.learning_rate > 0:
      raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
    if self.eval_split not in ("test", "validation"):
      raise ValueError(f"eval_split must be 'test' or 'validation', got {self.eval_split!r}")

  @property
  def name(self) -> str:
    return f"lr{self.learning_rate:g}_steps{self.steps}"

  @classmethod
  def search_point(cls, steps: int, learning_rate: float) -> Settings:
    """A point of the search grid: evaluated on the validation split, once, at the end."""
    return cls(steps, learning_rate, eval_every=steps, eval_split="validation")


@dataclasses.dataclass(frozen=True)
class Result:
  examples: int  # labelled training verses (data.train_examples)
  arm: str  # 'fine-tuned' | 'scratch'
  seed: int
  steps: int
  learning_rate: float
  split: str  # the split `accuracy`, `loss` and `curve` are measured on
  accuracy: float  # accuracy of the final weights
  loss: float  # loss of the final weights
  curve: tuple[tuple[int, float], ...]  # (step, accuracy) at every evaluation
  seconds: float  # wall time of the run's process
  cpu_seconds: float  # its user + system CPU time

  def scores(self) -> str:
    """What the run's log line says of its final weights."""
    return f"{self.split} accuracy {100 * self.accuracy:.2f}% (loss {self.loss:.3f})"


def epochs(examples: int, steps: int, batch_size: int = BATCH_SIZE) -> float:
  """Passes over the `examples` training verses that `steps` updates of `batch_size` make."""
  return steps * batch_size / examples


def run_overrides(
  arm: str, examples: int, seed: int, pretrained: str, settings: Settings = Settings()
) -> list[str]:
  """The `--config.*` flags of one classify_testament run (everything else: the recipe)."""
  return arm_overrides(arm, examples, seed, pretrained, settings)


def classify(
  arm: str,
  examples: int,
  seed: int,
  pretrained: str | os.PathLike,
  run_dir: Path,
  settings: Settings = Settings(),
) -> Result:
  """One run in `run_dir`, or the `result.json` it left when it finished before with
  these settings."""
  overrides = run_overrides(arm, examples, seed, str(pretrained), settings)
  measured = dict(steps=settings.steps, learning_rate=settings.learning_rate)
  measured["split"] = settings.eval_split
  fields = finished(run_dir, overrides)
  if fields is not None:
    return Result(**(fields | measured))
  wall, cpu = train_process(CLASSIFIER, run_dir, overrides)
  evals = final_evaluations(run_dir, settings.steps)
  curve = tuple((int(e["step"]), float(e["accuracy"])) for e in evals)
  accuracy, loss = float(evals[-1]["accuracy"]), float(evals[-1]["loss"])
  result = Result(examples, arm, seed, **measured, accuracy=accuracy, loss=loss, curve=curve,
                  seconds=wall, cpu_seconds=cpu)  # fmt: skip
  record(run_dir, result, overrides)
  return result


def summarize(results: list[Result]) -> list[dict]:
  """Per N: each arm's settings, accuracies by seed, mean and std; the gap of the means and
  the per-seed gaps (paired: the same subset and batch order) with their mean and std."""
  out = []
  for n in sorted({r.examples for r in results}):
    entry: dict = {"examples": n, "arms": {}}
    for arm in ARMS:
      runs = sorted((r for r in results if r.examples == n and r.arm == arm), key=lambda r: r.seed)
      if runs:
        mean, std = mean_std([r.accuracy for r in runs])
        entry["arms"][arm] = {
          "steps": runs[0].steps,
          "epochs": epochs(n, runs[0].steps),
          "learning_rate": runs[0].learning_rate,
          "split": runs[0].split,
          "per_seed": {r.seed: r.accuracy for r in runs},
          "mean": mean,
          "std": std,
        }
    if len(entry["arms"]) == len(ARMS):
      entry["gap"], paired = paired_gaps(entry["arms"])
      entry["paired_gaps"] = paired
      entry["paired_gap_mean"], entry["paired_gap_std"] = (
        mean_std(paired) if paired else (math.nan, math.nan)
      )
    out.append(entry)
  return out


def to_markdown(summary: list[dict]) -> str:
  """One row per (N, arm): peak learning rate, steps (epochs), accuracy per seed, mean +-
  std; the gap on the fine-tuned row (difference of the means; per-seed gaps after it)."""
  split = next(iter(summary[0]["arms"].values()))["split"] if summary else "test"
  lines = [
    f"| labelled verses | arm | peak lr | steps (epochs) | {split} accuracy per seed (%) "
    "| mean ± std | gap (points) |",
    "| --- | --- | --- | --- | --- | --- | --- |",
  ]
  for entry in summary:
    for arm, stats in entry["arms"].items():
      seeds = ", ".join(f"{100 * a:.1f}" for _, a in sorted(stats["per_seed"].items()))
      lines.append(
        f"| {entry['examples']:,} | {arm} | {stats['learning_rate']:g} "
        f"| {stats['steps']} ({stats['epochs']:.1f}) | {seeds} "
        f"| {100 * stats['mean']:.1f} ± {100 * stats['std']:.1f} "
        f"| {gap_cell(arm, entry, 100, '+.1f')} |"
      )
  return "\n".join(lines)


def search_markdown(searched: dict) -> str:
  """The search: validation accuracy (mean over the search seeds) of every grid point, per
  N and arm; the chosen point in bold."""
  lines = [
    "| labelled verses | arm | peak lr | steps (epochs) | validation accuracy (%) |",
    "| --- | --- | --- | --- | --- |",
  ]
  for (n, arm), (chosen, points) in searched.items():
    for settings, accuracy in points:
      mark = "**" if settings == chosen else ""
      lines.append(
        f"| {n:,} | {arm} | {settings.learning_rate:g} "
        f"| {settings.steps} ({epochs(n, settings.steps):.1f}) | {mark}{100 * accuracy:.1f}{mark} |"
      )
  return "\n".join(lines)


def search(
  examples: int,
  arm: str,
  learning_rates: list[float],
  steps: list[int],
  seeds: list[int],
  encoder: str | os.PathLike,
  workdir: Path,
  extend: int = 0,
) -> tuple[Settings, list[tuple[Settings, float]], list[Result]]:
  """Trains `arm` at every (learning rate, steps) of the grid for `seeds` on N verses,
  evaluated on the validation split, and picks the best mean validation accuracy (the
  smaller learning rate and budget on a tie). While the pick is on an edge of the grid
  (its largest or smallest learning rate or budget), up to `extend` times, the grid grows
  by one value past that edge (`extended`) and the new points are trained too: the same
  rule for both arms, so neither is held to a range that suits the other.

  Returns the pick, every point with its mean validation accuracy, and the runs."""
  runs = []

  def train(point: Settings, seed: int) -> float:
    runs.append(run_arm(classify, workdir / "search", arm, examples, seed, encoder, point))
    return runs[-1].accuracy

  best, points = grid_search(
    train, Settings.search_point, learning_rates, steps, seeds, extend, f"N={examples} {arm}"
  )
  return best, points, runs


def run(
  examples: list[int],
  seeds: list[int],
  workdir: str | os.PathLike,
  pretrained: str | os.PathLike | None = None,
  settings: Settings = Settings(),
  arms: tuple[str, ...] = ARMS,
  grid: tuple[list[float], list[int]] | None = None,
  search_seeds: list[int] | None = None,
  pretrain_steps: int = 0,
  extend: int = 0,
) -> tuple[list[Result], dict]:
  """Pretrains if needed, then trains every (N, seed, arm) run, smallest N first.

  With a `grid` (learning rates, steps), each (N, arm) first searches it (`search`: on
  `search_seeds`, evaluated on the validation split, extended up to `extend` times past
  an edge) and its final runs use the point it did best at (their curve interval:
  `settings.eval_every`). Returns the final runs and the search
  ((N, arm) -> (chosen, [(point, mean validation accuracy)])).
  """
  for name, values in (("--examples", examples), ("--seeds", seeds)):
    if not values:
      raise ValueError(f"{name}: give at least one value")
  if any(n < 1 for n in examples):
    raise ValueError(f"--examples must be positive integers, got {examples}")
  workdir = Path(workdir)
  given = Path(pretrained) if pretrained else workdir / "mlm_bible"
  encoder = pretrain(given, pretrain_steps, PRETRAINING)
  encoder = encoder.resolve()
  results, searched = [], {}
  for n in examples:
    for arm in arms:
      chosen = settings
      if grid:
        point, points, _ = search(
          n, arm, *grid, search_seeds or seeds[:1], encoder, workdir, extend
        )
        searched[(n, arm)] = (point, points)
        chosen = dataclasses.replace(point, eval_every=settings.eval_every, eval_split="test")
        print(f"  N={n} {arm}: chose lr {chosen.learning_rate:g}, {chosen.steps} steps", flush=True)
      results += [run_arm(classify, workdir, arm, n, seed, encoder, chosen) for seed in seeds]
  return results, searched


def main(argv: list[str] | None = None) -> list[Result]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", required=True, help="runs, low_label.json and low_label.md")
  parser.add_argument("--examples", type=int, nargs="+", default=[1000, 3000], help="labelled N")
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--pretrained", default="", help="mlm_bible workdir; '' = WORKDIR/mlm_bible")
  parser.add_argument(
    "--pretrain_steps", type=int, default=6000, help="when pretraining; 0 = the recipe's 1,000"
  )
  parser.add_argument("--steps", type=int, default=600, help="updates per run (both arms, any N)")
  parser.add_argument("--learning_rate", type=float, default=3e-4, help="peak (both arms)")
  parser.add_argument("--eval_every", type=int, default=150, help="accuracy curve interval")
  parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
  parser.add_argument(
    "--search_learning_rates", type=float, nargs="+", default=[], help="grid (both arms)"
  )
  parser.add_argument("--search_steps", type=int, nargs="+", default=[], help="grid (both arms)")
  parser.add_argument("--search_seeds", type=int, nargs="+", default=None, help="default: 1st")
  parser.add_argument(
    "--extend_edges", type=int, default=0, help="times a search grid grows past an edge pick"
  )
  args = parser.parse_args(argv)
  settings = Settings(args.steps, args.learning_rate, args.eval_every)
  grid = None
  if args.search_learning_rates or args.search_steps:
    grid = (args.search_learning_rates or [args.learning_rate], args.search_steps or [args.steps])
  start, at_start = time.perf_counter(), machine()
  budget = (
    f"search over lr {grid[0]} x steps {grid[1]}"
    if grid
    else f"{args.steps} steps, lr {args.learning_rate:g}"
  )
  print(
    f"low_label: N {args.examples}, seeds {args.seeds}, batch {BATCH_SIZE}, {budget};"
    f" {at_start['cpu']} ({at_start['cores']} cores, {' '.join(at_start['isa'])}),"
    f" load {at_start['load_average']}",
    flush=True,
  )
  results, searched = run(
    args.examples, args.seeds, args.workdir, args.pretrained or None, settings,
    tuple(args.arms), grid, args.search_seeds, args.pretrain_steps, args.extend_edges,
  )  # fmt: skip
  summary = summarize(results)
  table = to_markdown(summary)
  tables = [search_markdown(searched), table] if searched else [table]
  wall = time.perf_counter() - start
  print("\n\n".join(tables))
  print(f"wall time {wall:.0f} s; load average at the end {machine()['load_average']}")
  out = Path(args.workdir)
  report = {
    "command": " ".join(["python -m transformer.research.low_label", *(argv or sys.argv[1:])]),
    "settings": vars(args) | {"batch_size": BATCH_SIZE},
    "machine_at_start": at_start,
    "machine_at_end": machine(),
    "wall_seconds": wall,  # this call (finished runs are read, not rerun)
    "run_seconds": sum(r.seconds for r in results),  # the final runs' own wall times
    "search": [
      {
        "examples": n,
        "arm": arm,
        "chosen": dataclasses.asdict(chosen),
        "points": [dataclasses.asdict(p) | {"validation_accuracy": a} for p, a in points],
      }
      for (n, arm), (chosen, points) in searched.items()
    ],  # fmt: skip
    "summary": summary,
    "runs": [dataclasses.asdict(r) for r in results],
  }
  (out / "low_label.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
  (out / "low_label.md").write_text("\n\n".join(tables) + "\n", encoding="utf-8")
  return results


if __name__ == "__main__":
  main()

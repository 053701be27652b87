"""The two arms of a transfer experiment, fine-tuned from a pretrained run vs from scratch,
as `low_label` and `span_transfer` both run them: one run's `--config.*` flags, its
folder and log line, its `result.json` (a finished run is read, not rerun), its final
evaluation, the paired gaps over seeds and their table cell, and the search of a
learning-rate x steps grid (grown past an edge pick).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from transformer.research.runs import read_evaluations

ARMS = ("fine-tuned", "scratch")


def arm_overrides(
  arm: str, examples: int, seed: int, pretrained: str, settings: Any, **extra: Any
) -> list[str]:
  """The `--config.*` flags of one run of `arm` on `examples` training records with
  `settings` (steps, learning_rate, eval_every, eval_split); `extra` flags follow
  `eval_every`. Both arms read the pretrained run's tokenizer; only 'fine-tuned' starts
  from its weights."""
  if arm not in ARMS:
    raise ValueError(f"arm must be one of {ARMS}, got {arm!r}")
  flags = {
    "data.train_examples": examples,
    "data.tokenizer_from": pretrained,
    "seed": seed,
    "num_train_steps": settings.steps,
    "schedule.warmup_steps": max(1, settings.steps // 10),
    "schedule.learning_rate": settings.learning_rate,
    "eval_every": settings.eval_every,
    **extra,
    "checkpoint_every": settings.steps,
    "keep_checkpoints": 1,
  }
  if settings.eval_split != "test":  # the recipe's split is left unnamed
    flags["data.eval_split"] = settings.eval_split
  if arm == "fine-tuned":
    flags["init_from"] = pretrained
  return [f"--config.{k}={v}" for k, v in flags.items()]


def run_arm(
  train: Callable[..., Any],
  workdir: Path,
  arm: str,
  examples: int,
  seed: int,
  pretrained: Any,
  settings: Any,
) -> Any:
  """`train(arm, examples, seed, pretrained, run_dir, settings)`, an experiment's run (read
  back when it finished before), in its folder `workdir/nN/ARM/SETTINGS/seedS`; prints the
  result's line (its `scores()`, time and curve) and returns it."""
  run_dir = workdir / f"n{examples}" / arm / settings.name / f"seed{seed}"
  r = train(arm, examples, seed, pretrained, run_dir, settings)
  curve = " ".join(f"{step}:{100 * a:.1f}" for step, a in r.curve)
  print(
    f"  N={r.examples} {r.arm} seed {r.seed} (lr {r.learning_rate:g}, {r.steps} steps):"
    f" {r.scores()} in {r.seconds:.0f} s ({r.cpu_seconds:.0f} s CPU); curve {curve}",
    flush=True,
  )
  return r


def finished(run_dir: Path, overrides: list[str]) -> dict[str, Any] | None:
  """The result fields a finished run left in `run_dir/result.json` (its curve as tuples),
  or None; a run there with other `overrides` is an error."""
  done = run_dir / "result.json"
  if not done.exists():
    return None
  fields = json.loads(done.read_text(encoding="utf-8"))
  if fields.pop("overrides", None) != overrides:
    raise ValueError(
      f"{run_dir} holds a run with other settings than {overrides}; use another --workdir"
    )
  fields["curve"] = tuple(tuple(p) for p in fields["curve"])
  return fields


def record(run_dir: Path, result: Any, overrides: list[str]) -> None:
  """Writes `run_dir/result.json`: the `result` dataclass and the flags it ran with."""
  record = dataclasses.asdict(result) | {"overrides": overrides}
  (run_dir / "result.json").write_text(json.dumps(record) + "\n", encoding="utf-8")


def final_evaluations(run_dir: Path, steps: int) -> list[dict]:
  """A finished run's evaluations; the last one must be at its final step `steps`."""
  evals = read_evaluations(run_dir)
  if not evals or evals[-1]["step"] != steps:
    raise RuntimeError(f"{run_dir}: no evaluation at the final step {steps}")
  return evals


def paired_gaps(arms: dict[str, dict]) -> tuple[float, list[float]]:
  """Fine-tuned minus scratch: the gap of the means, and the per-seed gaps (paired: the
  same subset and batch order) over the seeds both arms ran."""
  fine, scratch = (arms[a]["per_seed"] for a in ARMS)
  paired = [fine[seed] - scratch[seed] for seed in fine if seed in scratch]
  return arms["fine-tuned"]["mean"] - arms["scratch"]["mean"], paired


def gap_cell(arm: str, entry: dict, scale: float, spec: str) -> str:
  """The gap column of `arm`'s table row: on the fine-tuned row, when `entry` has one, the
  gap of the means in bold and the per-seed gaps, each times `scale` in format `spec`."""
  if arm != "fine-tuned" or "gap" not in entry:
    return ""
  per_seed = ", ".join(f"{scale * g:{spec}}" for g in entry["paired_gaps"])
  return f"**{scale * entry['gap']:{spec}}** (per seed {per_seed})"


def extended(values: list, chosen, integer: bool = False) -> list | None:
  """`values` (sorted) with one more value past the end that `chosen` sits at, at the ratio
  of the two values there: a step count rounded (600, 1200 -> 2400), a learning rate
  snapped to the 1-3-10 series (3e-4, 1e-3 -> 3e-3 -> 1e-2). None when `chosen` is
  interior, there is a single value, or the new value is not new (or, for step counts,
  below 1)."""
  values = sorted(values)
  if len(values) < 2 or chosen not in (values[0], values[-1]):
    return None
  a, b = (values[-2], values[-1]) if chosen == values[-1] else (values[1], values[0])
  new = b * b / a
  if integer:
    new = int(round(new))
  else:
    decade = math.floor(math.log10(new))
    series = [m * 10.0**e for e in (decade, decade + 1) for m in (1, 3)]
    new = float(f"{min(series, key=lambda v: abs(math.log(v / new))):.1g}")
  if new in values or new < (1 if integer else 0):
    return None
  return sorted({*values, new})


def grid_search(
  train: Callable[[Any, int], float],
  point: Callable[[int, float], Any],
  learning_rates: list[float],
  steps: list[int],
  seeds: list[int],
  extend: int = 0,
  name: str = "",
) -> tuple[Any, list[tuple[Any, float]]]:
  """Runs `train(settings, seed) -> validation accuracy` at every grid point
  (`point(steps, learning_rate) -> settings`) for `seeds`, and picks the best mean (the
  smaller learning rate and budget on a tie). While the pick is on an edge of the grid,
  up to `extend` times, the grid grows one value past that edge (`extended`) and the new
  points are trained too. Returns the pick and every point with its mean, in grid order.
  """
  learning_rates, steps = sorted(learning_rates), sorted(steps)
  trained: dict[Any, float] = {}
  for round_ in range(extend + 1):
    for lr in learning_rates:
      for budget in steps:
        settings = point(budget, lr)
        if settings not in trained:
          trained[settings] = float(np.mean([train(settings, seed) for seed in seeds]))
    order = sorted(trained, key=lambda p: (p.learning_rate, p.steps))
    best = max(order, key=lambda p: (trained[p], -order.index(p)))
    if round_ == extend:
      break
    more_lr = extended(learning_rates, best.learning_rate)
    more_steps = extended(steps, best.steps, integer=True)
    if more_lr is None and more_steps is None:
      break
    learning_rates, steps = more_lr or learning_rates, more_steps or steps
    print(f"  {name}: best on an edge; grid now lr {learning_rates}, steps {steps}")
  return best, [(p, trained[p]) for p in order]

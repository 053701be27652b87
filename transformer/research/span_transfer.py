"""Span-corruption pretraining, then translation with 10% of the parallel data.

The seq2seq counterpart of `low_label`: `configs/span_bible.py` pretrains the translation
model of `configs/translate_en_es.py` with T5's span corruption on the English and
Spanish training verses (monolingual text: no verse next to its translation), and both
arms then train the translation recipe on `data.train_examples=N` pairs only (default
2,800, 10% of the ~28,000 training pairs):

  python -m transformer.research.span_transfer --workdir runs/span_transfer \\
    [--pretrained runs/span_bible] [--examples 2800] [--seeds 0 1 2] \\
    [--search_learning_rates 5e-4 2e-3 --search_steps 600 1200]

  * pretraining: `--pretrained DIR` (default `WORKDIR/span_bible`) is used as it is when
    it holds a checkpoint; otherwise `configs/span_bible.py` is trained there first
    (`--pretrain_steps`, default the recipe's 3,000).
  * fine-tuned arm: `--config.init_from=DIR --config.data.tokenizer_from=DIR` (every
    tensor copied, the embedding without its 100 sentinel rows); from-scratch arm:
    `--config.data.tokenizer_from=DIR` only. Same vocabulary, same N pairs and batch
    order per seed (`train_examples` draws them from `config.seed`), same dropout (the
    recipe's 0.1).
  * the budget: each arm searches the grid of learning rates x steps on the first seed
    (warmup 10%, cosine), evaluated by token accuracy on the validation split, and its
    final runs use its own best point. The reported number is the test BLEU of the final
    weights (beam 4, sacrebleu, as the recipe; the test split picks nothing).

Runs, their reuse (`result.json`) and the report (`WORKDIR/span_transfer.json` and `.md`:
the table, the search, every run's curve, wall and CPU time, the machine and the load)
follow `low_label`. Results: docs/RESEARCH.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import ClassVar

import numpy as np

from transformer.research import arms, low_label
from transformer.research.runs import machine, mean_std, pretrain, train_process

TRANSLATION = "configs/translate_en_es.py"
PRETRAINING = "configs/span_bible.py"


@dataclasses.dataclass(frozen=True)
class Settings(low_label.Settings):
  """`low_label.Settings` with this experiment's budget."""

  steps: int = 1200  # updates; warmup 10% of them, then cosine
  learning_rate: float = 2e-3  # peak (the recipe's)
  eval_every: int = 300  # interval of the accuracy curve (the final step is always evaluated)
  eval_split: str = "test"  # the recipe's (BLEU at the end); the search: 'validation', no BLEU
  min_steps: ClassVar[int] = 10


@dataclasses.dataclass(frozen=True)
class Result:
  examples: int  # training pairs (data.train_examples)
  arm: str  # 'fine-tuned' | 'scratch'
  seed: int
  steps: int
  learning_rate: float
  split: str  # the split the metrics and the curve are measured on
  bleu: float | None  # test BLEU of the final weights (None: the search's validation runs)
  accuracy: float  # token accuracy of the final weights
  nll: float  # nats per target token
  curve: tuple[tuple[int, float], ...]  # (step, token accuracy) at every evaluation
  seconds: float  # wall time of the run's process
  cpu_seconds: float  # its user + system CPU time

  def scores(self) -> str:
    """What the run's log line says of its final weights."""
    bleu = f"BLEU {self.bleu:.2f}, " if self.bleu is not None else ""
    return f"{bleu}{self.split} token accuracy {100 * self.accuracy:.1f}% (NLL {self.nll:.3f})"


def run_overrides(
  arm: str, examples: int, seed: int, pretrained: str, settings: Settings = Settings()
) -> list[str]:
  """The `--config.*` flags of one translate_en_es run (everything else: the recipe)."""
  bleu_every = settings.steps if settings.eval_split == "test" else 0  # final weights, test
  extra = {"evaluate.bleu.every": bleu_every}
  return arms.arm_overrides(arm, examples, seed, pretrained, settings, **extra)


def translate(
  arm: str, examples: int, seed: int, pretrained: str, run_dir: Path, settings: Settings
) -> Result:
  """One run in `run_dir`, or the `result.json` it left when it finished with these
  settings."""
  overrides = run_overrides(arm, examples, seed, str(pretrained), settings)
  fields = arms.finished(run_dir, overrides)
  if fields is not None:
    return Result(**fields)
  wall, cpu = train_process(TRANSLATION, run_dir, overrides)
  evals = arms.final_evaluations(run_dir, settings.steps)
  last = evals[-1]
  bleu = float(last["bleu"]) if settings.eval_split == "test" else None
  if settings.eval_split == "test" and "bleu" not in last:
    raise RuntimeError(f"{run_dir}: no BLEU at the final step {settings.steps}")
  result = Result(
    examples, arm, seed, settings.steps, settings.learning_rate, settings.eval_split, bleu,
    float(last["accuracy"]), float(last["nll"]),
    tuple((int(e["step"]), float(e["accuracy"])) for e in evals), wall, cpu,
  )  # fmt: skip
  arms.record(run_dir, result, overrides)
  return result


def search(
  examples: int,
  arm: str,
  learning_rates: list[float],
  steps: list[int],
  seed: int,
  pretrained: str,
  workdir: Path,
) -> tuple[Settings, list[tuple[Settings, float]]]:
  """Trains `arm` at every grid point on `seed`, evaluated on the validation split; the
  best final token accuracy wins (the smaller learning rate and budget on a tie)."""

  def train(point: Settings, seed: int) -> float:
    r = arms.run_arm(translate, workdir / "search", arm, examples, seed, pretrained, point)
    return r.accuracy

  return arms.grid_search(train, Settings.search_point, learning_rates, steps, [seed])


def summarize(results: list[Result]) -> dict:
  """Each arm's settings, BLEU per seed, mean and std; the gap of the means and the
  per-seed (paired) gaps."""
  out: dict = {"examples": results[0].examples if results else 0, "arms": {}}
  for arm in arms.ARMS:
    runs = sorted((r for r in results if r.arm == arm), key=lambda r: r.seed)
    if runs:
      mean, std = mean_std([r.bleu for r in runs])
      out["arms"][arm] = {
        "steps": runs[0].steps,
        "learning_rate": runs[0].learning_rate,
        "per_seed": {r.seed: r.bleu for r in runs},
        "accuracy": {r.seed: r.accuracy for r in runs},
        "mean": mean,
        "std": std,
      }
  if len(out["arms"]) == len(arms.ARMS):
    out["gap"], out["paired_gaps"] = arms.paired_gaps(out["arms"])
  return out


def to_markdown(summary: dict, searched: dict) -> str:
  """The search (validation token accuracy per point, the pick in bold), then one row per
  arm: learning rate, steps, test BLEU per seed, mean +- std, and the gap."""
  lines = ["| arm | peak lr | steps | validation token accuracy (%) |", "| --- | --- | --- | --- |"]
  for arm, (chosen, points) in searched.items():
    for p, accuracy in points:
      mark = "**" if p == chosen else ""
      score = f"{mark}{100 * accuracy:.1f}{mark}"
      lines.append(f"| {arm} | {p.learning_rate:g} | {p.steps} | {score} |")
  lines += [
    "",
    "| pairs | arm | peak lr | steps | test BLEU per seed | token accuracy (%) "
    "| mean ± std | gap (BLEU) |",
    "| --- | --- | --- | --- | --- | --- | --- | --- |",
  ]
  for arm, stats in summary["arms"].items():
    bleu = ", ".join(f"{b:.2f}" for _, b in sorted(stats["per_seed"].items()))
    acc = ", ".join(f"{100 * a:.1f}" for _, a in sorted(stats["accuracy"].items()))
    lines.append(
      f"| {summary['examples']:,} | {arm} | {stats['learning_rate']:g} | {stats['steps']} "
      f"| {bleu} | {acc} | {stats['mean']:.2f} ± {stats['std']:.2f} "
      f"| {arms.gap_cell(arm, summary, 1, '+.2f')} |"
    )
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[Result]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", required=True, help="runs, span_transfer.json and .md")
  parser.add_argument("--examples", type=int, default=2800, help="training pairs (10%%)")
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--pretrained", default="", help="span_bible workdir; '' = WORKDIR/...")
  parser.add_argument("--pretrain_steps", type=int, default=0, help="when pretraining: 0 = 3,000")
  parser.add_argument("--search_learning_rates", type=float, nargs="+", default=[5e-4, 2e-3])
  parser.add_argument("--search_steps", type=int, nargs="+", default=[600, 1200])
  parser.add_argument("--eval_every", type=int, default=300, help="token-accuracy curve interval")
  parser.add_argument("--arms", nargs="+", default=list(arms.ARMS), choices=list(arms.ARMS))
  args = parser.parse_args(argv)
  if args.examples < 1 or not args.seeds:
    raise ValueError(f"--examples must be >= 1 and --seeds non-empty, got {args}")
  start, at_start = time.perf_counter(), machine()
  print(
    f"span_transfer: N {args.examples}, seeds {args.seeds}, search lr {args.search_learning_rates}"
    f" x steps {args.search_steps}; {at_start['cpu']} ({at_start['cores']} cores,"
    f" {' '.join(at_start['isa'])}), load {at_start['load_average']}",
    flush=True,
  )
  workdir = Path(args.workdir)
  given = Path(args.pretrained) if args.pretrained else workdir / "span_bible"
  pretrained = str(pretrain(given, args.pretrain_steps, PRETRAINING).resolve())
  results, searched = [], {}
  for arm in args.arms:
    point, points = search(
      args.examples, arm, args.search_learning_rates, args.search_steps, args.seeds[0],
      pretrained, workdir,
    )  # fmt: skip
    searched[arm] = (point, points)
    chosen = dataclasses.replace(point, eval_every=args.eval_every, eval_split="test")
    print(f"  {arm}: chose lr {chosen.learning_rate:g}, {chosen.steps} steps", flush=True)
    for seed in args.seeds:
      results.append(arms.run_arm(translate, workdir, arm, args.examples, seed, pretrained, chosen))
  summary = summarize(results)
  table = to_markdown(summary, searched)
  wall = time.perf_counter() - start
  print(table)
  print(f"wall time {wall:.0f} s; load average at the end {machine()['load_average']}")
  report = {
    "command": " ".join(["python -m transformer.research.span_transfer", *(argv or sys.argv[1:])]),
    "settings": vars(args),
    "pretrained": pretrained,
    "machine_at_start": at_start,
    "machine_at_end": machine(),
    "wall_seconds": wall,  # this call (finished runs are read, not rerun)
    "search": {
      arm: {"chosen": dataclasses.asdict(c), "points": [[dataclasses.asdict(p), a] for p, a in ps]}
      for arm, (c, ps) in searched.items()
    },
    "summary": summary,
    "mean_bleu": {a: float(np.mean([r.bleu for r in results if r.arm == a])) for a in args.arms},
    "runs": [dataclasses.asdict(r) for r in results],
  }
  (workdir / "span_transfer.json").write_text(json.dumps(report, indent=2) + "\n")
  (workdir / "span_transfer.md").write_text(table + "\n")
  return results


if __name__ == "__main__":
  main()

"""Race: our default run against nanoGPT's CPU recipe in PyTorch, wall time to a validation loss.

  python benchmarks/race.py                          # one round, target 1.88, ~5 min
  python benchmarks/race.py --rounds 3 --target 1.9
  python benchmarks/race.py --config configs/lm_shakespeare.py --override model.d_ff=384
  python benchmarks/race.py --quick --target 3.6     # 20 updates a side, for tests

The two sides run one after the other, each as its own process (so each pays its imports
and start-up), the order alternating over `--rounds` (round 1: theirs first):

- ours: `python train.py --config CONFIG --workdir TMP [--config.KEY=VALUE ...]` from the
  repository root (`--override KEY=VALUE` becomes `--config.KEY=VALUE`). The clock starts
  at the subprocess launch; `TMP/metrics.jsonl` is polled every 0.1 s and each evaluation
  line (split "eval", key "loss") is timed when it first appears. Total wall: launch to
  exit (the final checkpoint and sample included). The character dataset is prepared
  (TFDS, ~/tensorflow_datasets unless data.data_dir) on the first run ever and reused
  after, so run the race twice if that first run is in it.
- theirs: `benchmarks/nanogpt_torch.py --full-val --out TMP/evals.jsonl` (nanoGPT's
  train.py re-implemented; see its docstring). The time of an evaluation is its own
  `wall_s` (from the script's first statement, torch's import included, interpreter
  start-up of tens of ms not). Total wall: its `train_wall_s`, the end of the training
  loop (the untimed whole-split pass after it left out).

Time to target: the wall time of the first evaluation with loss <= `--target`. A side that
never reaches it is reported with its best evaluation loss and total wall, and the ratio
line then compares total walls, saying so. Ratios are ours / theirs (below 1: ours is
faster); with several rounds also their median.

Caveat, printed with the table: the two validation losses are not measured alike.
nanoGPT's is an estimate over 20 random batches of 12 x 64 characters (noisy, about
+-0.02), evaluated every 250 iterations; ours (configs/lm_shakespeare.py,
eval_batches = 0) is the whole validation split, every eval_every (400) steps. So a race to 1.88 can
be won or lost by the estimate's noise and by the evaluation grids. The last column is a
like-for-like quality figure: both models' loss over their whole validation split, each
character predicted with the context since the start of its 64-character window (ours:
its final evaluation; theirs: `--full-val`).

`--quick` (and the step flags) shrink both runs: --max-iters / --eval-interval /
--eval-iters for theirs, --our-steps (num_train_steps, checkpoint_every) /
--our-eval-every for ours, --warmup for both. Prints Markdown.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata

from transformer.train.machine import cpu_isa

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EVAL_SPLIT = "eval"  # the split of our evaluation lines in metrics.jsonl
POLL_S = 0.1
QUICK = dict(
  max_iters=20, eval_interval=10, eval_iters=2, our_steps=20, our_eval_every=10, warmup=5
)
THEIRS, OURS = "theirs (nanoGPT, PyTorch)", "ours (train.py, JAX)"


def load_average() -> str:
  """The 1, 5 and 15 minute load averages from /proc/loadavg ('?' elsewhere)."""
  try:
    with open("/proc/loadavg") as f:
      return " / ".join(f.read().split()[:3])
  except OSError:
    return "?"


def version(package: str) -> str:
  try:
    return metadata.version(package)
  except metadata.PackageNotFoundError:
    return "not installed"


@dataclass
class Result:
  """One side's run: its evaluations (step, wall s, loss) in order, and its totals."""

  side: str
  load: str  # load averages just before the launch
  evals: list[tuple[int, float, float]] = field(default_factory=list)
  total_s: float = math.nan
  full_val: float = math.nan  # whole-split validation loss at the end
  note: str = ""

  def reached(self, target: float) -> tuple[int, float] | None:
    """(step, wall s) of the first evaluation with loss <= target, or None."""
    return next(((step, t) for step, t, loss in self.evals if loss <= target), None)

  def best(self) -> float:
    return min((loss for _, _, loss in self.evals), default=math.nan)


def watch(cmd: list[str], path: str, log: str) -> tuple[list[tuple[float, dict]], float]:
  """Runs cmd (cwd = the repository), polling the JSON lines of `path` every POLL_S.

  Returns [(seconds from launch when the line was first seen, record)] and the seconds
  from launch to exit; a failed run raises with the end of its output."""
  seen, offset, buf = [], 0, ""
  with open(log, "w") as out:
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    while True:
      done = proc.poll() is not None
      now = time.perf_counter() - start
      if os.path.exists(path):
        with open(path) as f:
          f.seek(offset)
          chunk = f.read()
          offset = f.tell()
        buf += chunk
        *lines, buf = buf.split("\n")  # complete lines only
        seen += [(now, json.loads(ln)) for ln in lines if ln.strip()]
      if done:
        break
      time.sleep(POLL_S)
  if proc.returncode != 0:
    with open(log) as f:
      tail = f.read()[-4000:]
    raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{tail}")
  return seen, now


def run_ours(a: argparse.Namespace, tmp: str) -> Result:
  workdir = os.path.join(tmp, "ours")
  overrides = [f"--config.{kv}" for kv in our_overrides(a)]
  cmd = [sys.executable, "train.py", "--config", a.config, "--workdir", workdir, *overrides]
  r = Result(OURS, load_average())
  seen, r.total_s = watch(cmd, os.path.join(workdir, "metrics.jsonl"), workdir + ".log")
  for t, rec in seen:
    if rec.get("split") == EVAL_SPLIT and "loss" in rec:
      r.evals.append((int(rec["step"]), t, float(rec["loss"])))
  if r.evals:
    r.full_val = r.evals[-1][2]
  with open(os.path.join(workdir, "config.json")) as f:
    eval_batches = json.load(f).get("eval_batches", 0)
  if eval_batches:
    r.note = f"eval_batches = {eval_batches}: its final loss is not over the whole split"
  return r


def our_overrides(a: argparse.Namespace) -> list[str]:
  """KEY=VALUE settings for train.py: the step flags first, then --override."""
  out = []
  if a.our_steps is not None:
    out += [f"num_train_steps={a.our_steps}", f"checkpoint_every={a.our_steps}"]
  if a.our_eval_every is not None:
    out.append(f"eval_every={a.our_eval_every}")
  if a.warmup is not None:
    out.append(f"schedule.warmup_steps={a.warmup}")
  return out + list(a.override)


def their_flags(a: argparse.Namespace) -> list[str]:
  out = []
  for name in ("max_iters", "eval_interval", "eval_iters"):
    if getattr(a, name) is not None:
      out += [f"--{name.replace('_', '-')}", str(getattr(a, name))]
  if a.warmup is not None:
    out += ["--warmup-iters", str(a.warmup)]
  return out


def run_theirs(a: argparse.Namespace, tmp: str) -> Result:
  path = os.path.join(tmp, "theirs.jsonl")
  script = os.path.join("benchmarks", "nanogpt_torch.py")
  cmd = [sys.executable, script, *their_flags(a), "--full-val", "--out", path]
  r = Result(THEIRS, load_average())
  seen, _ = watch(cmd, path, os.path.join(tmp, "theirs.log"))
  for _, rec in seen:
    if "iter" in rec:
      r.evals.append((int(rec["iter"]), float(rec["wall_s"]), float(rec["val_loss"])))
    else:
      r.total_s, r.full_val = rec["train_wall_s"], rec.get("full_val_loss", math.nan)
  return r


def ratio_line(rnd: int, ours: Result, theirs: Result, target: float) -> tuple[str, float]:
  """The round's ours/theirs line and the ratio (time to target, else total walls)."""
  o, t = ours.reached(target), theirs.reached(target)
  if o and t:
    ratio = o[1] / t[1]
    return (
      f"round {rnd}: ours / theirs time to target = {o[1]:.1f} / {t[1]:.1f} = {ratio:.2f}",
      ratio,
    )
  missing = " and ".join(r.side for r, hit in ((ours, o), (theirs, t)) if not hit)
  ratio = ours.total_s / theirs.total_s
  return (
    f"round {rnd}: {missing} did not reach {target}, so this compares total walls, not times"
    f" to target: ours / theirs = {ours.total_s:.1f} / {theirs.total_s:.1f} = {ratio:.2f}",
    ratio,
  )


def table(rounds: list[tuple[Result, Result]], target: float) -> list[str]:
  """Markdown: one row per side and round, then the ratio lines and the evaluations."""
  lines = [
    f"| round | side | load before (1 / 5 / 15 min) | time to val loss <= {target} (s) | at step"
    " | best eval loss | total wall (s) | final whole-split val loss |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for i, pair in enumerate(rounds, 1):
    for r in pair:
      hit = r.reached(target)
      when, step = (f"{hit[1]:.1f}", str(hit[0])) if hit else ("not reached", "-")
      lines.append(
        f"| {i} | {r.side} | {r.load} | {when} | {step} | {r.best():.4f} | {r.total_s:.1f}"
        f" | {r.full_val:.4f} |"
      )
  lines.append("")
  ratios = []
  for i, (ours, theirs) in enumerate(rounds, 1):
    line, ratio = ratio_line(i, ours, theirs, target)
    lines.append(line)
    ratios.append(ratio)
  if len(ratios) > 1:
    lines.append(
      f"median ratio ours / theirs over {len(ratios)} rounds: {statistics.median(ratios):.2f}"
    )
  lines += ["", "Evaluations (step: loss at wall s):"]
  for i, pair in enumerate(rounds, 1):
    for r in pair:
      evals = ", ".join(f"{step}: {loss:.4f} at {t:.1f}" for step, t, loss in r.evals)
      lines.append(f"- round {i}, {r.side}: {evals or 'none'}")
      if r.note:
        lines.append(f"  ({r.note})")
  return lines


CAVEAT = (
  "Caveat: nanoGPT's val loss is an estimate over 20 random batches of 12 x 64 characters"
  " (noisy, about +-0.02; --eval-iters sets the count), every 250 iterations; ours"
  " (configs/lm_shakespeare.py: eval_batches = 0) is the whole validation split, every"
  " eval_every steps. The last column compares both models on their whole validation split alike."
)


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--rounds", type=int, default=1, help="races, order alternating")
  p.add_argument("--target", type=float, default=1.88, help="validation loss to reach")
  p.add_argument("--config", default="configs/lm_shakespeare.py", help="our config")
  p.add_argument(
    "--override", action="append", default=[], metavar="KEY=VALUE", help="our config, repeated"
  )
  p.add_argument("--max-iters", type=int, default=None, help="theirs (default 2000)")
  p.add_argument("--eval-interval", type=int, default=None, help="theirs (default 250)")
  p.add_argument("--eval-iters", type=int, default=None, help="theirs (default 20)")
  p.add_argument("--our-steps", type=int, default=None, help="ours: num_train_steps")
  p.add_argument("--our-eval-every", type=int, default=None, help="ours: eval_every")
  p.add_argument("--warmup", type=int, default=None, help="both sides (default 100 each)")
  p.add_argument("--quick", action="store_true", help=f"unset step flags from {QUICK}")
  a = p.parse_args(argv)
  if a.quick:
    for name, value in QUICK.items():
      if getattr(a, name) is None:
        setattr(a, name, value)
  return a


def main(argv=None):
  a = parse_args(argv)
  print(f"# Race to validation loss <= {a.target}: ours vs nanoGPT (PyTorch)\n")
  print(f"CPU: {cpu_isa()}; {os.cpu_count()} cores")
  print(f"python {sys.version.split()[0]}, jax {version('jax')}, torch {version('torch')}")
  ours_cmd = " ".join(
    ["train.py --config", a.config, *(f"--config.{kv}" for kv in our_overrides(a))]
  )
  print(f"ours: `{ours_cmd}`")
  their_cmd = " ".join(["benchmarks/nanogpt_torch.py", *their_flags(a), "--full-val"])
  print(f"theirs: `{their_cmd}`\n")
  print(CAVEAT + "\n", flush=True)
  rounds = []
  with tempfile.TemporaryDirectory(prefix="race_") as tmp:
    for i in range(a.rounds):
      results = {}
      for side in (THEIRS, OURS) if i % 2 == 0 else (OURS, THEIRS):
        run_dir = os.path.join(tmp, f"round{i + 1}")
        os.makedirs(run_dir, exist_ok=True)
        results[side] = (run_ours if side == OURS else run_theirs)(a, run_dir)
        r = results[side]
        print(f"round {i + 1}, {side}: total {r.total_s:.1f} s, best {r.best():.4f}", flush=True)
      rounds.append((results[OURS], results[THEIRS]))
  print()
  print("\n".join(table(rounds, a.target)))


if __name__ == "__main__":
  main()

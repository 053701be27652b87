"""Hyperparameter sweeps: every point of a config's `sweep()` as its own train.py run.

A config file may define, beside `get_config(arg=None)`,

  def sweep():            # or sweep(arg)
    return [{"schedule.learning_rate": lr} for lr in (3e-4, 1e-3)]

a list of override dicts (a grid, or a seeded random set: the list must be the same on
every call for resuming to work). Then

  python -m transformer.research.sweep --config configs/X.py[:arg] --workdir DIR \
      [--parallel N] [--dry_run] [--override a.b=value ...] [--metric loss]

runs `train.py --config configs/X.py --workdir DIR/<point> --config.a.b=value ...` for each
point (N at a time, output in DIR/<point>/train.log), skips points that already finished
(DIR/<point>/done, written after a run exits 0), and writes DIR/results.csv,
DIR/results.md (overrides, status and final evaluation metrics), DIR/sweep.png (the final
eval `--metric` per point) and DIR/curves.png (all runs' curves overlaid). `--dry_run`
prints one command per point (to launch on a cluster) and runs nothing; `--override`
applies to every point.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import inspect
import io
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

from etils import epath

from transformer.data.files import is_remote, write_atomic
from transformer.train.metric_writers import (
  JSONL_NAME,
  plot_curves,
  png_figure,
  read_jsonl,
  save_png,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN_PY = os.path.join(REPO, "train.py")
DONE = "done"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.,=+-]")


def load_sweep(config: str) -> list[dict[str, Any]]:
  """The override dicts of `sweep()` in the config file `config` ('path.py[:arg]')."""
  path, _, arg = config.partition(":")
  if not os.path.isfile(path):
    raise ValueError(f"--config: no such file {path!r}")
  spec = importlib.util.spec_from_file_location("_sweep_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  fn = getattr(module, "sweep", None)
  if fn is None:
    raise ValueError(f"{path}: defines no sweep() function")
  points = fn(arg or None) if inspect.signature(fn).parameters else fn()
  points = [dict(p) for p in points]
  if not points:
    raise ValueError(f"{path}: sweep() returned no points")
  names = [point_name(p) for p in points]
  if len(set(names)) != len(names):
    raise ValueError(f"{path}: sweep() has duplicate points: {names}")
  return points


def point_name(overrides: Mapping[str, Any]) -> str:
  """A directory name for one point: 'schedule.learning_rate=0.001,model.num_layers=4'."""
  if not overrides:
    return "default"
  return _UNSAFE.sub("_", ",".join(f"{k}={_value(v)}" for k, v in overrides.items()))


def _value(v: Any) -> str:
  return ",".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)


def train_command(
  config: str, workdir: str, overrides: Mapping[str, Any], python: str = sys.executable
) -> list[str]:
  """The train.py command line of one point."""
  cmd = [python, TRAIN_PY, f"--config={config}", f"--workdir={workdir}"]
  return cmd + [f"--config.{k}={_value(v)}" for k, v in overrides.items()]


def is_done(point_dir: str) -> bool:
  return epath.Path(point_dir, DONE).is_file()


def final_eval(point_dir: str) -> dict[str, Any]:
  """The last evaluation record of a run's metrics.jsonl ({} when there is none)."""
  path = os.path.join(point_dir, JSONL_NAME)
  if not epath.Path(path).is_file():
    return {}
  evals = [r for r in read_jsonl(path) if r.get("split") == "eval"]
  return max(evals, key=lambda r: r.get("step", -1)) if evals else {}


def run_points(
  config: str,
  workdir: str,
  points: Sequence[Mapping[str, Any]],
  parallel: int = 1,
  common: Mapping[str, Any] | None = None,
) -> dict[str, str]:
  """Runs the unfinished points, `parallel` at a time; returns {name: status}.

  Status: 'skipped' (finished before), 'done', or 'failed (rc N)'.
  """
  status: dict[str, str] = {}
  pending = []
  for point in points:
    name = point_name(point)
    point_dir = os.path.join(workdir, name)
    if is_done(point_dir):
      status[name] = "skipped"
      print(f"[sweep] {name}: finished before, skipped", flush=True)
    else:
      pending.append((name, point_dir, {**(common or {}), **point}))
  env = dict(os.environ)
  if parallel > 1:  # several runs on one accelerator must not each grab its memory
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  running: dict[str, tuple[subprocess.Popen, Any, str]] = {}
  while pending or running:
    while pending and len(running) < parallel:
      name, point_dir, overrides = pending.pop(0)
      log = open(_local_log(point_dir), "a", encoding="utf-8")  # noqa: SIM115
      cmd = train_command(config, point_dir, overrides)
      print(f"[sweep] {name}: {shlex.join(cmd[1:])}", flush=True)
      proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
      running[name] = (proc, log, point_dir)
    time.sleep(0.2)
    for name, (proc, log, point_dir) in list(running.items()):
      rc = proc.poll()
      if rc is None:
        continue
      log.close()
      _upload_log(log.name, point_dir)
      del running[name]
      if rc == 0:
        write_atomic(os.path.join(point_dir, DONE), f"{time.time():.0f}\n")
        status[name] = "done"
      else:
        status[name] = f"failed (rc {rc})"
      print(f"[sweep] {name}: {status[name]} (log: {point_dir}/train.log)", flush=True)
  return status


def _local_log(point_dir: str) -> str:
  """Where a point's train.log is written while it runs: in the point's folder, or, on
  object storage (which cannot append), a local file uploaded when the point ends."""
  if is_remote(point_dir):
    fd, path = tempfile.mkstemp(prefix="train-", suffix=".log")
    os.close(fd)
    return path
  os.makedirs(point_dir, exist_ok=True)
  return os.path.join(point_dir, "train.log")


def _upload_log(local: str, point_dir: str) -> None:
  """Object storage: appends the local log of a finished point to its train.log."""
  if not is_remote(point_dir):
    return
  remote = epath.Path(point_dir, "train.log")
  before = remote.read_bytes() if remote.exists() else b""
  with open(local, "rb") as f:
    write_atomic(remote, before + f.read())
  os.remove(local)


def results_table(
  workdir: str, points: Sequence[Mapping[str, Any]], status: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
  """One row per point: name, its overrides, status and the final eval metrics."""
  keys = list(dict.fromkeys(k for p in points for k in p))
  rows = []
  for point in points:
    name = point_name(point)
    point_dir = os.path.join(workdir, name)
    row: dict[str, Any] = {"point": name}
    row.update({k: point.get(k, "") for k in keys})
    state = (status or {}).get(name) or ("done" if is_done(point_dir) else "not run")
    row["status"] = state
    last = final_eval(point_dir)
    row["step"] = last.get("step", "")
    row.update({f"eval_{k}": v for k, v in last.items() if k not in ("step", "split")})
    rows.append(row)
  return rows


def _columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
  return list(dict.fromkeys(k for row in rows for k in row))


def write_csv(rows: Sequence[Mapping[str, Any]], path: str) -> str:
  """The rows as a CSV file (one column per key seen, blank where a row lacks it)."""
  text = io.StringIO(newline="")
  writer = csv.DictWriter(text, fieldnames=_columns(rows), restval="")
  writer.writeheader()
  writer.writerows(rows)
  write_atomic(path, text.getvalue())
  return path


def to_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
  cols = _columns(rows)

  def cell(v):
    return f"{v:.4g}" if isinstance(v, float) else str(v)

  lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
  lines += ["| " + " | ".join(cell(row.get(c, "")) for c in cols) + " |" for row in rows]
  return "\n".join(lines)


def plot_metric(
  rows: Sequence[Mapping[str, Any]],
  swept: Sequence[str],
  metric: str,
  out_png: str,
  width_px: int = 800,
  height_px: int = 500,
) -> str | None:
  """Final eval `metric` per point: against the swept value when one numeric key varies
  (log x when it spans 100x or more), else one bar per point. None when no point has it."""
  key = f"eval_{metric}"
  done = [r for r in rows if isinstance(r.get(key), (int, float))]
  if not done:
    return None
  fig = png_figure(width_px, height_px)
  ax = fig.subplots()
  xs = [r.get(swept[0]) for r in done] if len(swept) == 1 else []
  if xs and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs):
    order = sorted(range(len(done)), key=lambda i: xs[i])
    ax.plot([xs[i] for i in order], [done[i][key] for i in order], "-o")
    positive = [x for x in xs if x > 0]
    if len(positive) == len(xs) and max(xs) / min(xs) >= 100:
      ax.set_xscale("log")
    ax.set_xlabel(swept[0])
  else:
    ax.bar(range(len(done)), [r[key] for r in done])
    ax.set_xticks(range(len(done)), [r["point"] for r in done], rotation=30, ha="right")
    ax.tick_params(axis="x", labelsize=7)
  ax.set(ylabel=f"final eval {metric}", title=f"final eval {metric} per point")
  ax.grid(alpha=0.3)
  fig.tight_layout()
  return save_png(fig, out_png)


def write_results(
  workdir: str,
  points: Sequence[Mapping[str, Any]],
  status: Mapping[str, str] | None = None,
  metric: str = "loss",
) -> dict[str, Any]:
  """results.csv, results.md, sweep.png and curves.png in `workdir`; returns the paths."""
  rows = results_table(workdir, points, status)
  swept = [k for k in dict.fromkeys(k for p in points for k in p)]
  varying = [k for k in swept if len({repr(p.get(k)) for p in points}) > 1]
  out = {
    "rows": rows,
    "csv": write_csv(rows, os.path.join(workdir, "results.csv")),
    "markdown": os.path.join(workdir, "results.md"),
  }
  write_atomic(out["markdown"], to_markdown(rows) + "\n")
  out["plot"] = plot_metric(rows, varying or swept, metric, os.path.join(workdir, "sweep.png"))
  runs = [r["point"] for r in rows if epath.Path(workdir, r["point"], JSONL_NAME).is_file()]
  out["curves"] = None
  if runs:
    out["curves"] = plot_curves(
      [os.path.join(workdir, name, JSONL_NAME) for name in runs],
      os.path.join(workdir, "curves.png"),
      labels=runs,
    )
  return out


def _parse_override(text: str) -> tuple[str, str]:
  key, sep, value = text.partition("=")
  if not sep or not key:
    raise argparse.ArgumentTypeError(f"expected a.b=value; got {text!r}")
  return key.removeprefix("config."), value


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    prog="python -m transformer.research.sweep",
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  parser.add_argument("--config", required=True, help="configs/X.py[:arg] defining sweep()")
  parser.add_argument("--workdir", required=True, help="sweep directory (one sub-workdir a point)")
  parser.add_argument("--parallel", type=int, default=1, help="runs at a time")
  parser.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
  parser.add_argument("--metric", default="loss", help="final eval metric of the plot")
  parser.add_argument(
    "--override", type=_parse_override, action="append", default=[],
    help="a.b=value applied to every point (repeatable)",
  )  # fmt: skip
  args = parser.parse_args(argv)
  if args.parallel < 1:
    parser.error(f"--parallel must be >= 1; got {args.parallel}")
  try:
    points = load_sweep(args.config)
  except ValueError as e:
    parser.exit(1, f"error: {e}\n")
  common = dict(args.override)
  workdir = args.workdir.rstrip("/") if is_remote(args.workdir) else os.path.abspath(args.workdir)
  if args.dry_run:
    for point in points:
      cmd = train_command(args.config, os.path.join(workdir, point_name(point)),
                          {**common, **point}, python="python")  # fmt: skip
      print(shlex.join(cmd))
    return 0
  if not is_remote(workdir):  # each point's train.py checks an object-storage workdir
    os.makedirs(workdir, exist_ok=True)
  status = run_points(args.config, workdir, points, args.parallel, common)
  out = write_results(workdir, points, status, args.metric)
  print(to_markdown(out["rows"]))
  print(f"[sweep] wrote {out['csv']}, {out['markdown']}, {out['plot']}, {out['curves']}")
  failed = [name for name, s in status.items() if s.startswith("failed")]
  if failed:
    print(f"[sweep] {len(failed)} point(s) failed: {', '.join(failed)}", file=sys.stderr)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())

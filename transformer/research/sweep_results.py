"""A sweep's results: the final evaluation of every point, as DIR/results.csv,
DIR/results.md, DIR/sweep.png (the chosen metric per point) and DIR/curves.png (every
run's curves overlaid), written by `write_results` when the sweep ends.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Mapping, Sequence
from typing import Any

from etils import epath

from transformer.data.files import read_jsonl, write_atomic
from transformer.research.sweep_points import is_done, point_name
from transformer.train.curves import plot_curves, png_figure, save_png
from transformer.train.metric_writers import JSONL_NAME


def final_evals(point_dir: str) -> dict[str, dict[str, Any]]:
  """{split: its last record} of every evaluation split of a run's metrics.jsonl."""
  path = os.path.join(point_dir, JSONL_NAME)
  if not epath.Path(path).is_file():
    return {}
  last: dict[str, dict[str, Any]] = {}
  for record in read_jsonl(path):
    split = record.get("split")
    if split and split != "train" and record.get("step", -1) >= last.get(split, {}).get("step", -1):
      last[split] = record
  return last


def final_eval(point_dir: str) -> dict[str, Any]:
  """The last evaluation record of a run's metrics.jsonl ({} when there is none)."""
  return final_evals(point_dir).get("eval", {})


def results_table(
  workdir: str, points: Sequence[Mapping[str, Any]], status: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
  """One row per point: name, its overrides, status, the final step and the last value of
  every evaluation metric (`eval_loss`; other splits as `<split>_<name>`)."""
  keys = list(dict.fromkeys(k for p in points for k in p))
  rows = []
  for point in points:
    name = point_name(point)
    point_dir = os.path.join(workdir, name)
    row: dict[str, Any] = {"point": name}
    row.update({k: point.get(k, "") for k in keys})
    state = (status or {}).get(name) or ("done" if is_done(point_dir) else "not run")
    row["status"] = state
    evals = final_evals(point_dir)
    row["step"] = evals.get("eval", {}).get("step", "")
    for split, record in sorted(evals.items(), key=lambda kv: kv[0] != "eval"):
      row.update({f"{split}_{k}": v for k, v in record.items() if k not in ("step", "split")})
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


def metric_column(metric: str) -> str:
  """The table column of a metric: 'eval/loss' -> 'eval_loss' ('loss' means 'eval/loss')."""
  split, sep, key = metric.partition("/")
  return f"{split}_{key}" if sep else f"eval_{metric}"


def plot_metric(
  rows: Sequence[Mapping[str, Any]],
  swept: Sequence[str],
  metric: str,
  out_png: str,
  width_px: int = 800,
  height_px: int = 500,
) -> str | None:
  """Final `metric` ('eval/loss') per point: against the swept value when one numeric key
  varies (log x when it spans 100x or more), else one bar per point. None when no point
  has it."""
  key = metric_column(metric)
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
  label = metric if "/" in metric else f"eval/{metric}"
  ax.set(ylabel=f"final {label}", title=f"final {label} per point")
  ax.grid(alpha=0.3)
  fig.tight_layout()
  return save_png(fig, out_png)


def write_results(
  workdir: str,
  points: Sequence[Mapping[str, Any]],
  status: Mapping[str, str] | None = None,
  metric: str = "eval/loss",
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

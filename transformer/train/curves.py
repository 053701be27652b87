"""Training curves as PNG files: loss (train solid, eval dashed) and learning rate against
step, plus a panel for each of `PANELS` a run logs (a preference run's reward margin, the
held-out exact match), for one run or several overlaid (`plot_curves`), on matplotlib
figures of an exact pixel size drawn without a display (`png_figure`, `save_png`).
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from typing import Any

from etils import epath

from transformer.data.files import is_remote, read_jsonl, write_atomic

PANELS = ("rewards/margins", "exact_match")  # drawn where a run logs them (train and eval)


def plot_curves(
  jsonl_paths: str | os.PathLike | Sequence[str | os.PathLike],
  out_png: str | os.PathLike,
  *,
  labels: Sequence[str] | None = None,
  loss_key: str = "loss",
  lr_key: str = "learning_rate",
  width_px: int = 1200,
  height_px: int = 450,
  dpi: int = 100,
) -> str:
  """Draws loss (train solid, eval dashed), learning rate and the `PANELS` the runs log
  against step to a PNG.

  Args:
    jsonl_paths: one metrics.jsonl path or several (runs overlaid).
    out_png: output file (.png), exactly `width_px` x `height_px` pixels for the two
      panels, `width_px` / 2 wider for each further one.
    labels: one legend label per run (default: the file's directory name).
    loss_key: scalar plotted in the loss panel, for train and eval.
    lr_key: train scalar plotted in the learning-rate panel.

  Returns:
    The PNG path.
  """
  paths = [jsonl_paths] if isinstance(jsonl_paths, (str, os.PathLike)) else list(jsonl_paths)
  if not paths:
    raise ValueError("jsonl_paths must name at least one metrics.jsonl file")
  for path in paths:
    if not epath.Path(path).is_file():
      raise ValueError(f"jsonl_paths: no such file {os.fspath(path)!r}")
  if labels is None:
    labels = [epath.Path(_absolute(p)).parent.name or str(p) for p in paths]
  if len(labels) != len(paths):
    raise ValueError(f"labels must have one entry per path ({len(paths)}); got {len(labels)}")
  if not os.fspath(out_png).endswith(".png"):
    raise ValueError(f"out_png must end with .png; got {os.fspath(out_png)!r}")
  for name, value in (("width_px", width_px), ("height_px", height_px), ("dpi", dpi)):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ValueError(f"{name} must be an int >= 1; got {value!r}")

  runs = [read_jsonl(path) for path in paths]
  extra = [k for k in PANELS if any(_series(r, s, k)[0] for r in runs for s in ("train", "eval"))]
  fig = png_figure(width_px + len(extra) * (width_px // 2), height_px, dpi)
  loss_ax, lr_ax, *extra_axes = fig.subplots(1, 2 + len(extra), squeeze=False)[0]
  for index, (records, label) in enumerate(zip(runs, labels, strict=True)):
    color = f"C{index % 10}"
    for ax, key in ((loss_ax, loss_key), *zip(extra_axes, extra, strict=True)):
      for split, style in (("train", "-"), ("eval", "--o")):
        steps, values = _series(records, split, key)
        if steps:
          ax.plot(steps, values, style, color=color, markersize=3, label=f"{label} {split}")
    steps, values = _series(records, "train", lr_key)
    if steps:
      lr_ax.plot(steps, values, "-", color=color, label=label)
  loss_ax.set(xlabel="step", ylabel=loss_key, title="loss")
  lr_ax.set(xlabel="step", ylabel=lr_key, title="learning rate")
  for ax, key in zip(extra_axes, extra, strict=True):
    ax.set(xlabel="step", ylabel=key, title=key)
  for ax in (loss_ax, lr_ax, *extra_axes):
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize="small")
  fig.tight_layout()
  return save_png(fig, out_png)


def png_figure(width_px: int, height_px: int, dpi: int = 100) -> Any:
  """A matplotlib `Figure` of exactly `width_px` x `height_px` pixels on its own Agg canvas
  (no display, no global backend)."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure

  fig = Figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi)
  FigureCanvasAgg(fig)
  return fig


def save_png(fig: Any, out_png: str | os.PathLike) -> str:
  """Writes `fig` as a PNG at its own size and dpi, atomically; returns the path."""
  buffer = io.BytesIO()
  fig.savefig(buffer, format="png", dpi=fig.dpi)
  write_atomic(out_png, buffer.getvalue())
  return os.fspath(out_png)


def _absolute(path: str | os.PathLike) -> str:
  return os.fspath(path) if is_remote(path) else os.path.abspath(path)


def _series(records: list[dict[str, Any]], split: str, key: str) -> tuple[list, list]:
  points = sorted(
    (r["step"], r[key])
    for r in records
    if r.get("split") == split and isinstance(r.get(key), (int, float))
  )
  return [p[0] for p in points], [p[1] for p in points]

"""Research plots as PNG files (matplotlib's Agg canvas; no display, no global backend).

  posenc_heatmap     the sinusoidal position-encoding table [L, D] (Vaswani et al. 3.5)
  curves             training/evaluation curves of one or several runs, overlaid
                     (`curves.plot_curves` on each run's metrics.jsonl)
  attention_heatmaps the attention maps of one layer, one panel per head
  confusion          a confusion matrix (`evaluators.confusion.write_confusion`)

Every function writes one PNG and returns its path; sizes are given in pixels.

  python -m transformer.research.plots curves RUN1 RUN2 --out curves.png
  python -m transformer.research.plots posenc --d_model 128 --length 100 --out pe.png
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence

import numpy as np
from etils import epath

from transformer.data.files import is_remote
from transformer.nn.positions import sinusoidal_table
from transformer.train.curves import plot_curves, png_figure, save_png
from transformer.train.metric_writers import JSONL_NAME


def _check_png(out_png: str | os.PathLike) -> str:
  out_png = os.fspath(out_png)
  if not out_png.endswith(".png"):
    raise ValueError(f"output must end with .png; got {out_png!r}")
  if not is_remote(out_png):  # object storage has no folders to create
    os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
  return out_png


def posenc_heatmap(
  out_png: str | os.PathLike,
  d_model: int = 128,
  length: int = 100,
  *,
  width_px: int = 900,
  height_px: int = 600,
) -> str:
  """Heatmap of `sinusoidal_table(length, d_model)`: position (rows) x feature (columns)."""
  if d_model < 2 or d_model % 2 or length < 1:
    raise ValueError(f"need an even d_model >= 2 and length >= 1; got {d_model}, {length}")
  out_png = _check_png(out_png)
  table = sinusoidal_table(length, d_model)  # [L, D]
  fig = png_figure(width_px, height_px)
  ax = fig.subplots()
  image = ax.imshow(table, aspect="auto", cmap="RdBu", vmin=-1.0, vmax=1.0)
  ax.set(xlabel="feature (even: sin, odd: cos)", ylabel="position", title="sinusoidal encoding")
  fig.colorbar(image, ax=ax)
  return save_png(fig, out_png)


def metrics_path(run: str | os.PathLike) -> str:
  """A run's metrics.jsonl: `run` is a workdir or the file itself (local or a URL)."""
  run = os.fspath(run)
  path = os.path.join(run, JSONL_NAME) if epath.Path(run).is_dir() else run
  if not epath.Path(path).is_file():
    raise ValueError(f"{run!r}: no {JSONL_NAME} (expected a training workdir or the file)")
  return path


def curves(
  runs: Sequence[str | os.PathLike],
  out_png: str | os.PathLike,
  *,
  labels: Sequence[str] | None = None,
  loss_key: str = "loss",
  width_px: int = 1200,
  height_px: int = 450,
) -> str:
  """Loss (train solid, eval dashed) and learning rate of each run, overlaid."""
  paths = [metrics_path(run) for run in runs]
  return plot_curves(
    paths, _check_png(out_png), labels=labels, loss_key=loss_key,
    width_px=width_px, height_px=height_px,
  )  # fmt: skip


def attention_heatmaps(
  weights: np.ndarray,
  out_png: str | os.PathLike,
  *,
  title: str = "",
  query_labels: Sequence[str] | None = None,
  key_labels: Sequence[str] | None = None,
  panel_px: int = 300,
) -> str:
  """One panel per head of weights [N, T, S] (or [T, S]): queries down, keys across.

  The PNG is (columns * panel_px) x (rows * panel_px + 40) pixels with at most four
  columns. Token labels are drawn when given and there are at most 40 of them.
  """
  weights = np.asarray(weights, np.float32)
  if weights.ndim == 2:
    weights = weights[None]  # [1, T, S]
  if weights.ndim != 3:
    raise ValueError(f"weights must be [N, T, S] or [T, S]; got shape {weights.shape}")
  out_png = _check_png(out_png)
  n = weights.shape[0]
  cols = min(n, 4)
  rows = math.ceil(n / cols)
  fig = png_figure(cols * panel_px, rows * panel_px + 40)
  axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
  for head, ax in enumerate(axes):
    if head >= n:
      ax.axis("off")
      continue
    ax.imshow(weights[head], cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
    ax.set_title(f"head {head}", fontsize=8)
    ax.tick_params(labelsize=5)
    if key_labels is not None and len(key_labels) <= 40:
      ax.set_xticks(range(len(key_labels)), list(key_labels), rotation=90)
    if query_labels is not None and len(query_labels) <= 40:
      ax.set_yticks(range(len(query_labels)), list(query_labels))
  if title:
    fig.suptitle(title, fontsize=9)
  return save_png(fig, out_png)


def confusion(counts: np.ndarray, names: Sequence[str], out_png: str | os.PathLike) -> str:
  """The confusion matrix (true rows, predicted columns) as a PNG; returns its Markdown table."""
  from transformer.evaluators.confusion import write_confusion  # the model stack: keep lazy

  return write_confusion(np.asarray(counts), list(names), _check_png(out_png))


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m transformer.research.plots", description=__doc__)
  sub = parser.add_subparsers(dest="command", required=True)
  p = sub.add_parser("curves", help="loss and learning-rate curves of runs, overlaid")
  p.add_argument("runs", nargs="+", help="workdirs (or metrics.jsonl files)")
  p.add_argument("--out", default="curves.png")
  p.add_argument("--labels", nargs="*", default=None, help="one legend label per run")
  p.add_argument("--loss_key", default="loss", help="scalar of the loss panel")
  p = sub.add_parser("posenc", help="the sinusoidal position-encoding table")
  p.add_argument("--d_model", type=int, default=128)
  p.add_argument("--length", type=int, default=100)
  p.add_argument("--out", default="posenc.png")
  args = parser.parse_args(argv)
  try:
    if args.command == "curves":
      out = curves(args.runs, args.out, labels=args.labels, loss_key=args.loss_key)
    else:
      out = posenc_heatmap(args.out, args.d_model, args.length)
  except ValueError as e:
    parser.exit(1, f"error: {e}\n")
  print(out)


if __name__ == "__main__":
  main()

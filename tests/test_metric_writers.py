"""Metric writers: JSONL + TensorBoard files, resume truncation, console line, plots."""

import glob
import json
import os
import struct
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tensorboard_events
from session_env import PATIENCE_S

from transformer.data.files import read_jsonl
from transformer.train import curves, metric_writers


class _FakeClock:
  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


def _png_size(path):
  with open(path, "rb") as f:
    header = f.read(24)
  assert header[:8] == b"\x89PNG\r\n\x1a\n"
  return struct.unpack(">II", header[16:24])


def _tensorboard_scalars(logdir):
  """{tag: [(step, value)]} as TensorBoard shows it: files in name order, and a
  SessionLog.START at step s (tensorboardX `purge_step`) hides earlier events with step >= s."""
  scalars = {}
  for event in tensorboard_events(logdir):
    if event.HasField("session_log") and event.session_log.status == event.session_log.START:
      scalars = {t: [(s, v) for s, v in pts if s < event.step] for t, pts in scalars.items()}
    for value in event.summary.value:
      scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
  return scalars


def test_writes_jsonl_tensorboard_and_console(tmp_path):
  lines = []
  clock = _FakeClock()
  with metric_writers.MetricWriter(
    tmp_path, is_primary=True, total_steps=100, print_fn=lines.append, clock=clock
  ) as writer:
    writer.write_scalars(10, {"loss": jnp.float32(2.5), "learning_rate": 1e-3})
    clock.now = 10.0
    writer.write_scalars(
      20, {"loss": np.float64(2.0), "tokens_per_sec": 12_345.0, "learning_rate": 2e-3}
    )
    writer.write_scalars(20, {"loss": 2.2, "accuracy": 0.5}, split="eval")
    writer.write_scalars(21, {"loss": float("nan")})
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert records[0] == {"step": 10, "split": "train", "loss": 2.5, "learning_rate": 1e-3}
  assert records[2] == {"step": 20, "split": "eval", "loss": 2.2, "accuracy": 0.5}
  assert records[3]["loss"] is None  # NaN: strict JSON
  assert lines[0] == "step 10/100 | loss 2.5 | lr 1.0e-03"  # no rate yet: no ETA
  assert lines[1] == "step 20/100 | loss 2 | lr 2.0e-03 | 12.3k tok/s | ETA 1:20"
  assert lines[2] == "eval @ step 20 | loss 2.2 | acc 0.5"
  scalars = _tensorboard_scalars(tmp_path / "tensorboard")
  assert scalars["train/loss"][:2] == [(10, 2.5), (20, 2.0)]
  assert scalars["eval/accuracy"] == [(20, 0.5)]


def test_the_writer_does_not_load_pytorch_or_the_cloud_storage_client(tmp_path):
  """tensorboardX imports torch and Cloud Storage's client when they are installed (2 s and
  0.3 s of every run's start); the writer keeps them out, and both still import afterwards."""
  code = (
    "import sys\n"
    "from transformer.train.metric_writers import MetricWriter\n"
    f"with MetricWriter({str(tmp_path)!r}, is_primary=True, print_fn=lambda _: None) as w:\n"
    "  w.write_scalars(1, {'loss': 1.0})\n"
    "  w.write_hparams({'a': 1})\n"
    "  w.write_text(1, 'sample', 'x')\n"
    "assert 'torch' not in sys.modules, 'torch was imported'\n"
    "assert 'google.cloud.storage' not in sys.modules, 'the storage client was imported'\n"
    "import torch\n"
    "from google.cloud import storage\n"
    "assert storage.Client\n"
  )
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, timeout=PATIENCE_S
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert _tensorboard_scalars(tmp_path / "tensorboard")["train/loss"] == [(1, 1.0)]


def test_non_primary_process_writes_nothing(tmp_path):
  printed = []
  with metric_writers.MetricWriter(tmp_path / "w", is_primary=False, print_fn=printed.append) as w:
    w.write_scalars(1, {"loss": 1.0})
    assert w.truncate_after(0) == 0
  assert not (tmp_path / "w").exists() and printed == []
  with pytest.raises(ValueError, match="scalar 'loss'"):  # still validated everywhere
    metric_writers.MetricWriter(tmp_path, is_primary=False).write_scalars(1, {"loss": [1, 2]})


def test_truncate_after_and_resume_continue_the_file_without_duplicates(tmp_path):
  with metric_writers.MetricWriter(tmp_path, is_primary=True, console=False) as writer:
    for step in range(1, 11):
      writer.write_scalars(step, {"loss": 10.0 - step})
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write('{"step": 11, "split": "tr')  # a crash mid-line
  # The run restarts from the checkpoint at step 6 and redoes steps 7..8.
  with metric_writers.MetricWriter(
    tmp_path, is_primary=True, resume_step=6, console=False
  ) as writer:
    writer.write_scalars(7, {"loss": 0.5})
    writer.write_scalars(8, {"loss": 0.25})
    dropped = writer.truncate_after(7)
    writer.write_scalars(8, {"loss": 0.125})
  assert dropped == 1
  records = read_jsonl(tmp_path / "metrics.jsonl")
  assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6, 7, 8]
  assert [r["loss"] for r in records[-2:]] == [0.5, 0.125]
  assert len(glob.glob(str(tmp_path / "tensorboard" / "events.out.tfevents.*"))) == 2
  scalars = _tensorboard_scalars(tmp_path / "tensorboard")["train/loss"]
  assert [s for s, _ in scalars] == [1, 2, 3, 4, 5, 6, 7, 8, 8]  # purge hid the old 7..10
  assert [v for s, v in scalars if s >= 7] == [0.5, 0.25, 0.125]


def _write_run(directory, scale):
  with metric_writers.MetricWriter(directory, is_primary=True, console=False) as writer:
    for step in range(0, 100, 10):
      writer.write_scalars(step, {"loss": scale / (step + 1), "learning_rate": 1e-4 * step})
      if step % 30 == 0:
        writer.write_scalars(step, {"loss": scale / (step + 2)}, split="eval")
  return directory / "metrics.jsonl"


def test_plot_curves_writes_png_of_the_requested_size(tmp_path):
  run_a, run_b = _write_run(tmp_path / "a", 3.0), _write_run(tmp_path / "b", 5.0)
  out = curves.plot_curves([run_a, run_b], tmp_path / "curves.png", width_px=800, height_px=300)
  assert os.path.getsize(out) > 5_000
  assert _png_size(out) == (800, 300)
  single = curves.plot_curves(str(run_a), tmp_path / "one.png", labels=["a"])
  assert _png_size(single) == (1200, 450)
  # The second run is drawn in matplotlib's second colour (C1, orange), the first in C0.
  assert _pixels_of_color(out, (1.0, 0.498, 0.055)) > 200
  assert _pixels_of_color(out, (0.122, 0.467, 0.706)) > 200
  assert _pixels_of_color(single, (1.0, 0.498, 0.055)) == 0


def _pixels_of_color(path, rgb):
  import matplotlib.image

  image = matplotlib.image.imread(path)[..., :3]  # [H, W, 3] floats in [0, 1]
  return int(np.sum(np.all(np.abs(image - np.asarray(rgb)) < 0.02, axis=-1)))


@pytest.mark.parametrize(
  ("call", "field"),
  [
    (lambda w, p: w.write_scalars(-1, {"loss": 1.0}), "step"),
    (lambda w, p: w.write_scalars(1, {"loss": 1.0}, split="train/x"), "split"),
    (lambda w, p: w.write_scalars(1, {"step": 1.0}), "scalar names"),
    (lambda w, p: w.write_scalars(1, {"loss": "high"}), "scalar 'loss'"),
    (lambda w, p: w.truncate_after(-3), "step"),
    (lambda w, p: curves.plot_curves([], p / "x.png"), "jsonl_paths"),
    (lambda w, p: curves.plot_curves(p / "nope.jsonl", p / "x.png"), "jsonl_paths"),
    (lambda w, p: curves.plot_curves(w.jsonl_path, p / "x.jpg"), "out_png"),
    (lambda w, p: curves.plot_curves(w.jsonl_path, p / "x.png", labels=[]), "labels"),
    (lambda w, p: curves.plot_curves(w.jsonl_path, p / "x.png", dpi=0), "dpi"),
    (lambda w, p: metric_writers.MetricWriter(p, is_primary=1), "is_primary"),
    (lambda w, p: metric_writers.MetricWriter(p, is_primary=True, total_steps=-1), "total_steps"),
  ],
)
def test_bad_arguments_raise_value_error_naming_the_field(tmp_path, call, field):
  with metric_writers.MetricWriter(tmp_path, is_primary=True, console=False) as writer:
    writer.write_scalars(1, {"loss": 1.0})
    with pytest.raises(ValueError, match=field):
      call(writer, tmp_path)

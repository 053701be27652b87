"""Metrics out: TensorBoard event files, a JSONL log, a console progress line, and plots.

`MetricWriter(workdir, is_primary=...)` writes each call of `write_scalars(step, scalars,
split)` to
  * TensorBoard (tensorboardX) under `workdir/tensorboard`, tags `"{split}/{name}"`;
  * `workdir/metrics.jsonl`, one object per line: {"step": int, "split": str, **scalars}
    (non-finite values are written as null, so every line is strict JSON);
  * the trackers it was given (`trackers=`, e.g. W&B, `train/tracking.py`);
  * the console, one short line: `step 100/2000 | loss 2.644 | lr 1.0e-03 | 10.3k tok/s |
    MFU 31.2% | ETA 2:21` for train (`format_train_line`: loss, learning rate,
    throughput, MFU where known and the ETA; every other metric goes to the files only),
    `eval @ step 500 | loss 2.003 | ppl 7.41 | acc 0.412` for other splits.
`write_hparams(config)` records the flattened config for TensorBoard's HParams tab (and
the trackers); `write_text(step, tag, text)` a text sample (TensorBoard's Text tab).
Only the primary process (process 0) writes; elsewhere every method is a no-op.

Object-storage workdirs (`gs://...`, through `etils.epath`): such stores cannot append to
an object, and tensorboardX writes only local files (and S3). So the JSONL log is kept in
memory and uploaded whole, and the TensorBoard event file is written to a local staging
folder and uploaded whole to `workdir/tensorboard/`; both at most every `sync_seconds`
(Cloud Storage allows about one write a second per object), at `flush()` (the loop flushes
before each checkpoint) and at `close()`. A killed run loses at most the lines since the
last upload; on resume those lie past the checkpoint and would be dropped anyway. For the
same reason the next run of the workdir on that host removes the killed run's staging
folder (`files.staging_folder`); `close()` removes a run's own.

Resuming: `MetricWriter(..., resume_step=s)` drops JSONL lines with step > s
(`truncate_after`) and asks TensorBoard to purge events after s, so a resumed run
continues both logs without duplicates.

The curves drawn from the JSONL log: `train/curves.py`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from etils import epath

from transformer.data.files import StorageError, is_remote, one_line, staging_folder, write_atomic
from transformer.data.progress import format_duration

JSONL_NAME = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
_SPLIT = re.compile(r"^[A-Za-z0-9_]+$")
# The scalars of the console's evaluation line, with their short names.
EVAL_CONSOLE = {"loss": "loss", "perplexity": "ppl", "accuracy": "acc", "bleu": "bleu"}
# The metric tags TensorBoard's HParams tab shows against the config.
HPARAM_METRICS = ("eval/loss", "eval/accuracy", "eval/perplexity", "train/loss")


# What tensorboardX imports when installed and this writer never uses, both slow to import:
# PyTorch (only to accept torch tensors; the writer is given Python numbers) and Cloud
# Storage's client (for gs:// event files; the writer stages them locally and uploads them
# itself).
_UNUSED_BY_TENSORBOARDX = ("torch", "google.cloud.storage")


def _summary_writer_class():
  """tensorboardX's `SummaryWriter`, imported without the libraries it would load for
  nothing (`_UNUSED_BY_TENSORBOARDX`): `sys.modules[name] = None` makes its `import` fail as
  if the library were absent (tensorboardX's own fallback) while it loads. A library that
  is already imported is left as it is, and every one still imports afterwards."""
  loaded = "tensorboardX.writer" in sys.modules
  blocked = [] if loaded else [m for m in _UNUSED_BY_TENSORBOARDX if m not in sys.modules]
  for name in blocked:
    sys.modules[name] = None
  try:
    from tensorboardX import SummaryWriter
  finally:
    for name in blocked:
      del sys.modules[name]
  return SummaryWriter


class MetricWriter:
  """Scalars to TensorBoard, metrics.jsonl and the console (primary process only).

  Args:
    workdir: run directory; files go to `workdir/metrics.jsonl` and
      `workdir/tensorboard/`.
    is_primary: True on the process that writes (process 0).
    total_steps: the run's length, for the progress percentage and ETA (None: unknown).
    resume_step: the restored step when resuming (None: fresh run).
    console: print a progress line per `write_scalars` call.
    print_fn: console output function.
    clock: seconds, monotonic (for the ETA; tests inject a fake one).
    sync_seconds: object-storage workdirs: the shortest interval between two uploads of
      the logs (`flush` and `close` upload at once).
    trackers: objects with `log(step, scalars, split)`, `text(step, tag, text)`,
      `hparams(config)` and `close(failed)` that get every write too (primary only).
  """

  def __init__(
    self,
    workdir: str | os.PathLike,
    *,
    is_primary: bool,
    total_steps: int | None = None,
    resume_step: int | None = None,
    console: bool = True,
    print_fn: Callable[[str], Any] = print,
    clock: Callable[[], float] = time.monotonic,
    sync_seconds: float = 2.0,
    trackers: Sequence[Any] = (),
  ):
    if not isinstance(is_primary, bool):
      raise ValueError(f"is_primary must be a bool; got {is_primary!r}")
    for name, value in (("total_steps", total_steps), ("resume_step", resume_step)):
      if value is not None and (not _is_int(value) or value < 0):
        raise ValueError(f"{name} must be an int >= 0 or None; got {value!r}")
    self.workdir = os.fspath(workdir)
    self.jsonl_path = os.path.join(self.workdir, JSONL_NAME)
    self.is_primary = is_primary
    self._total_steps, self._console, self._print, self._clock = (
      total_steps,
      console,
      print_fn,
      clock,
    )
    self._last_train: tuple[int, float] | None = None  # (step, time) of the last train line
    self._tb = None
    self._jsonl = None
    self._remote = is_remote(self.workdir)
    self._lines: list[str] = []  # object storage: the whole JSONL log
    self._staging: str | None = None  # object storage: local folder of the event file
    self._sync_seconds, self._last_sync = sync_seconds, -math.inf
    self._trackers = list(trackers) if is_primary else []
    if not is_primary:
      return
    if self._remote:
      jsonl = epath.Path(self.jsonl_path)
      if jsonl.exists():
        text = jsonl.read_text(encoding="utf-8")
        self._lines = [line + "\n" for line in text.splitlines()]
    else:
      os.makedirs(self.workdir, exist_ok=True)
    if resume_step is not None:
      self.truncate_after(resume_step)
    SummaryWriter = _summary_writer_class()  # noqa: N806  (a heavy import, primary only)
    purge = None if resume_step is None else resume_step + 1
    tb_dir = os.path.join(self.workdir, TENSORBOARD_DIR)
    if self._remote:
      self._staging = tb_dir = staging_folder(self.workdir, "tensorboard")
    self._tb = SummaryWriter(
      tb_dir,
      purge_step=purge,
      filename_suffix=f".{time.time_ns()}",  # a restart within the same second gets its own file
    )
    if not self._remote:
      self._jsonl = open(self.jsonl_path, "a", encoding="utf-8")

  def write_scalars(self, step: int, scalars: Mapping[str, Any], split: str = "train") -> None:
    """Writes `scalars` (name -> number or 0-d array) at `step` for `split`."""
    if not _is_int(step) or step < 0:
      raise ValueError(f"step must be an int >= 0; got {step!r}")
    if not isinstance(split, str) or not _SPLIT.match(split):
      raise ValueError(f"split must be a name like 'train' or 'eval'; got {split!r}")
    values = _to_floats(scalars)
    if not self.is_primary:
      return
    step = int(step)
    record = {"step": step, "split": split}
    record.update({k: v if math.isfinite(v) else None for k, v in values.items()})
    if self._remote:
      self._lines.append(json.dumps(record) + "\n")
    else:
      self._jsonl.write(json.dumps(record) + "\n")
      self._jsonl.flush()
    for name, value in values.items():
      self._tb.add_scalar(f"{split}/{name}", value, global_step=step)
    for tracker in self._trackers:
      tracker.log(step, values, split)
    if self._remote and time.monotonic() - self._last_sync >= self._sync_seconds:
      self._upload()
    if self._console:
      self._print(self._console_line(step, values, split))

  def write_hparams(self, config: Mapping[str, Any]) -> dict[str, Any]:
    """Records `config` (nested mappings, flattened to "a.b" names) as the run's
    hyperparameters: TensorBoard's HParams tab (against `HPARAM_METRICS`) and the trackers.
    Returns the flattened values (numbers, str, bool; other values as their repr)."""
    flat = flatten_hparams(config)
    if not self.is_primary:
      return flat
    from tensorboardX.summary import hparams

    for summary in hparams(flat, dict.fromkeys(HPARAM_METRICS, 0.0)):
      self._tb.file_writer.add_summary(summary)
    for tracker in self._trackers:
      tracker.hparams(config)
    return flat

  def write_text(self, step: int, tag: str, text: str) -> None:
    """A text (e.g. a generated sample) at `step`: TensorBoard's Text tab and the trackers."""
    if not _is_int(step) or step < 0:
      raise ValueError(f"step must be an int >= 0; got {step!r}")
    if not isinstance(text, str) or not isinstance(tag, str) or not tag:
      raise ValueError(f"write_text needs a non-empty str tag and a str text; got {tag!r}")
    if not self.is_primary:
      return
    # TensorBoard renders Markdown: an indented block keeps the sample's own line breaks.
    block = "\n".join("    " + line for line in text.split("\n"))
    self._tb.add_text(tag, block, global_step=step)
    for tracker in self._trackers:
      tracker.text(step, tag, text)

  def truncate_after(self, step: int) -> int:
    """Drops metrics.jsonl lines with step > `step` (and unparsable ones); returns the
    number of lines dropped."""
    if not _is_int(step) or step < 0:
      raise ValueError(f"step must be an int >= 0; got {step!r}")
    if not self.is_primary:
      return 0
    if self._remote:
      lines = self._lines
    elif os.path.exists(self.jsonl_path):
      if self._jsonl is not None:
        self._jsonl.flush()
      with open(self.jsonl_path, encoding="utf-8") as f:
        lines = list(f)
    else:
      return 0
    kept, dropped = [], 0
    for line in lines:
      try:
        keep = int(json.loads(line)["step"]) <= step
      except (ValueError, KeyError, TypeError):
        keep = False  # e.g. a line cut short by a crash
        logging.warning("dropping unparsable line in %s: %r", self.jsonl_path, line[:80])
      if keep:
        kept.append(line if line.endswith("\n") else line + "\n")
      else:
        dropped += 1
    if self._remote:
      self._lines = kept
      if dropped:
        write_atomic(self.jsonl_path, "".join(kept))
      return dropped
    write_atomic(self.jsonl_path, "".join(kept))
    if self._jsonl is not None:  # reopen: the old handle points at the replaced file
      self._jsonl.close()
      self._jsonl = open(self.jsonl_path, "a", encoding="utf-8")
    return dropped

  def flush(self) -> None:
    """Writes out what is buffered (on object storage: uploads both logs now)."""
    if self._jsonl is not None:
      self._jsonl.flush()
    if self._tb is not None:
      self._tb.flush()
      if self._remote:
        self._upload()

  def close(self, failed: bool = False) -> None:
    """Closes the files (uploading them to object storage) and the trackers; `failed`: the
    run ended with an error (trackers record it)."""
    for tracker in self._trackers:
      tracker.close(failed)
    self._trackers = []
    if self._jsonl is not None:
      self._jsonl.close()
      self._jsonl = None
    if self._tb is not None:
      self._tb.close()
      if self._remote:
        self._upload()
        shutil.rmtree(self._staging, ignore_errors=True)
      self._tb = None

  def _upload(self) -> None:
    """Object storage: the JSONL log and the event files, each uploaded whole; a failure
    (the storage unreachable past its retries) is a `StorageError`."""
    try:
      write_atomic(self.jsonl_path, "".join(self._lines))
      self._tb.flush()
      remote = epath.Path(self.workdir) / TENSORBOARD_DIR
      for name in sorted(os.listdir(self._staging)):
        with open(os.path.join(self._staging, name), "rb") as f:
          write_atomic(remote / name, f.read())
    except Exception as e:  # the storage clients raise many types (OSError, HTTP, auth)
      raise StorageError(
        f"the metrics could not be written to {self.workdir} ({one_line(e)})"
      ) from None
    self._last_sync = time.monotonic()

  def __enter__(self) -> MetricWriter:
    return self

  def __exit__(self, exc_type: Any, *exc: Any) -> None:
    try:
      self.close(failed=exc_type is not None)
    except StorageError as e:
      if exc_type is None:
        raise
      logging.warning("%s", e)  # the error on its way says more: do not replace it

  def _console_line(self, step: int, values: Mapping[str, float], split: str) -> str:
    if split != "train":
      return format_eval_line(split, step, values)
    now, eta = self._clock(), None
    if self._last_train is not None and self._total_steps and step > self._last_train[0]:
      seconds_per_step = (now - self._last_train[1]) / (step - self._last_train[0])
      eta = max(self._total_steps - step, 0) * seconds_per_step
    self._last_train = (step, now)
    return format_train_line(step, self._total_steps, values, eta)


def format_train_line(
  step: int, total: int | None, scalars: Mapping[str, float], eta_seconds: float | None = None
) -> str:
  """The console's training line: `step 100/2000 | loss 2.644 | lr 1.0e-03 | 10.3k tok/s |
  MFU 31.2% | ETA 2:21`; each part only where its scalar (`loss`, `learning_rate`,
  `tokens_per_sec`, `mfu` as a fraction) or the ETA (seconds) is given and finite (a
  non-finite loss is shown: it is news)."""
  parts = [f"step {step}/{total}" if total else f"step {step}"]
  finite = {k: v for k, v in scalars.items() if math.isfinite(v)}
  if "loss" in scalars:
    parts.append(f"loss {_short(scalars['loss'])}")
  if "learning_rate" in finite:
    parts.append(f"lr {finite['learning_rate']:.1e}")
  if "tokens_per_sec" in finite:
    parts.append(f"{_si(finite['tokens_per_sec'])} tok/s")
  if "mfu" in finite:
    parts.append(f"MFU {100 * finite['mfu']:.1f}%")
  if eta_seconds is not None and math.isfinite(eta_seconds):
    parts.append(f"ETA {format_duration(max(eta_seconds, 0.0))}")
  return " | ".join(parts)


def format_eval_line(split: str, step: int, scalars: Mapping[str, float]) -> str:
  """The console's evaluation line: `eval @ step 500 | loss 2.003 | ppl 7.41 | acc 0.412`
  (those of the scalars of `EVAL_CONSOLE` that are given)."""
  parts = [f"{split} @ step {step}"]
  parts += [f"{short} {_short(scalars[n])}" for n, short in EVAL_CONSOLE.items() if n in scalars]
  return " | ".join(parts)


def flatten_hparams(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  """Nested mappings (or ConfigDicts) -> {"a.b": value}: numbers, str and bool kept, other
  values (None, tuples, lists) as their repr: what TensorBoard's HParams tab can hold."""
  if hasattr(config, "to_dict"):
    config = config.to_dict()
  out: dict[str, Any] = {}
  for key, value in config.items():
    name = f"{prefix}{key}"
    if hasattr(value, "to_dict"):
      value = value.to_dict()
    if isinstance(value, Mapping):
      out |= flatten_hparams(value, name + ".")
    elif isinstance(value, (bool, str, int, float)):
      out[name] = value
    elif isinstance(value, (np.integer, np.floating, np.bool_)):
      out[name] = value.item()
    else:
      out[name] = repr(value)
  return out


def _short(value: float) -> str:
  """4 significant digits (`2.644`, `0.01234`, `1.235e+04`)."""
  return f"{value:.4g}"


def _to_floats(scalars: Mapping[str, Any]) -> dict[str, float]:
  if not isinstance(scalars, Mapping):
    raise ValueError(f"scalars must be a mapping of name -> number; got {type(scalars)}")
  values = {}
  for name, value in scalars.items():
    if not isinstance(name, str) or not name or name in ("step", "split"):
      raise ValueError(f"scalar names must be non-empty str other than step/split; got {name!r}")
    array = np.asarray(value)
    if array.shape != () or not np.issubdtype(array.dtype, np.number):
      raise ValueError(f"scalar {name!r} must be a number or 0-d array; got {value!r}")
    values[name] = float(array)
  return values


def _si(value: float) -> str:
  for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
    if abs(value) >= factor:
      return f"{value / factor:.1f}{suffix}"
  return f"{value:.1f}"


def _is_int(x: Any) -> bool:
  return isinstance(x, (int, np.integer)) and not isinstance(x, bool)

"""The run record: one JSON line per `train.py` invocation, appended to WORKDIR/runs.jsonl.

`metrics.jsonl` says what a run learned; `runs.jsonl` says what each invocation cost and
where it ran, so docs/RESULTS.md can be regenerated from the runs (`scripts/results.py`)
instead of copied by hand. A resumed run appends one line per leg. Each line holds:

  command           the command line as run (`python train.py --config configs/X.py ...`;
                    absolute paths under the current directory made relative), and `argv`
  started, ended    ISO 8601 UTC timestamps of the process start and of the record
  wall_seconds      seconds from the process start (Python start-up and imports included)
                    to the end of training; `wall_from` says which start was used: the
                    kernel's, from field 22 of /proc/self/stat against /proc/uptime, or
                    (no /proc) the import of this module, a second or so later
  cpu_user_seconds, cpu_system_seconds
                    `os.times()` of the process plus its waited-for children
  cpu_model, cpu_family, isa
                    /proc/cpuinfo's model name, its family and model numbers
                    ('family 25, model 17') and which of `ISA_FLAGS` it lists;
                    `cpu_count` the CPUs this process may run on
  load_start, load_end
                    the 1, 5 and 15 minute load averages when `main` started and at the end
  versions          python, jax, jaxlib, flax; `platform`, `device_kind`, `device_count`,
                    `process_count` from JAX
  status            completed | preempted (saved and stopped on SIGTERM) | error (`error`:
                    the exception as one line) | interrupted (Ctrl-C)
  resumed_from      the step the invocation started from (0: a fresh run)
  first_step, last_step
                    the updates trained by this invocation (both null if it trained none,
                    e.g. a rerun of a finished run). After an error, `last_step` is the last
                    evaluation or checkpoint the loop reached, a lower bound.
  final_eval        the final evaluation metrics (`train_and_evaluate`'s result; {} if the
                    run stopped before it)

Usage (`main` in transformer/train/loop.py): `record = RunRecord(sys.argv, workdir)` at the start of
`main`, the loop's hooks wrapped with `record.hooks(hooks)` (the phase hook notes the steps
and calls the caller's own), then `record.finish(metrics=...)` or `record.finish(error=e)`.

Only an invocation that got as far as building the run (past the config check, the
workdir check and the run lock: the loop's "build" phase) is recorded, so a mistyped
command neither creates a workdir nor races the run that holds it. Only process 0 writes
(`jax.process_index() == 0`). On a local disk the line is appended in one write; on object
storage (`gs://...`), which cannot append, the file is read and uploaded whole. Writing
the record never fails a run: any error becomes one `warning:` line on stderr. A process
that ends through `os._exit` (the grace period of a preemption running out) or a kill
leaves no line.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import shlex
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from etils import epath

from transformer.data.files import is_remote, one_line, write_atomic
from transformer.train.machine import ISA_FLAGS, cpu_info, load_average  # noqa: F401  (ISA_FLAGS: re-export)

RUNS_NAME = "runs.jsonl"
_IMPORTED_AT = time.time()  # the start-time fallback where /proc is unavailable


def process_start_time() -> tuple[float, str]:
  """The Unix time this process started, and where that figure came from.

  Linux: the kernel's start time of the process (field 22 of /proc/self/stat, clock ticks
  since boot) against the time since boot (/proc/uptime), both to 10 ms, so the wall time
  includes the interpreter's start and the imports. Elsewhere: the import of this module.
  """
  try:
    with open("/proc/self/stat", encoding="ascii", errors="replace") as f:
      ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, after the command name
    with open("/proc/uptime", encoding="ascii") as f:
      uptime = float(f.read().split()[0])
    age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    if age >= 0.0:
      return time.time() - age, "process start (/proc/self/stat)"
  except (OSError, ValueError, IndexError):
    pass
  return _IMPORTED_AT, "import of transformer.train.guard.run_record"


def command_line(argv: Sequence[str], cwd: str | None = None) -> str:
  """`argv` as a command to paste into a shell at `cwd` (default: the current directory).

  The program is shown as run: a script as `python train.py`, `python -m
  transformer.train_main` for the module (whose argv[0] is its file), an installed command
  by its name; absolute paths under `cwd`, alone or as a flag's value, become relative.
  """
  cwd = os.path.abspath(cwd or os.getcwd())

  def readable(value: str) -> str:
    if os.path.isabs(value) and (value == cwd or value.startswith(cwd + os.sep)):
      return os.path.relpath(value, cwd)
    return value

  def arg(a: str) -> str:
    name, eq, value = a.partition("=")
    return f"{name}={readable(value)}" if eq and name.startswith("-") else readable(a)

  if not argv:
    return ""
  program = argv[0]
  parts = os.path.normpath(os.path.abspath(program)).split(os.sep)
  if parts[-2:] == ["transformer", "train_main.py"]:
    head = ["python", "-m", "transformer.train_main"]
  elif program.endswith(".py"):
    head = ["python", readable(os.path.abspath(program))]
  else:
    head = [os.path.basename(program)]
  return shlex.join(head + [arg(a) for a in argv[1:]])


def _utc(t: float) -> str:
  """A Unix time as ISO 8601 UTC to the second: '2025-01-31T12:00:00Z'."""
  moment = datetime.datetime.fromtimestamp(t, datetime.UTC)
  return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def _json_value(value: Any) -> Any:
  """A metric as JSON: numbers as float (non-finite as null), text and flags as they are."""
  if isinstance(value, (bool, str)) or value is None:
    return value
  try:
    number = float(value)
  except (TypeError, ValueError):
    return repr(value)
  return number if math.isfinite(number) else None


def _jax_facts() -> dict[str, Any]:
  """Versions, platform and devices (JAX is running by the time a run is recorded)."""
  import flax
  import jax
  import jaxlib

  devices = jax.devices()
  return {
    "versions": {
      "python": sys.version.split()[0],
      "jax": jax.__version__,
      "jaxlib": jaxlib.__version__,
      "flax": flax.__version__,
    },
    "platform": jax.default_backend(),
    "device_kind": devices[0].device_kind if devices else None,
    "device_count": jax.device_count(),
    "process_count": jax.process_count(),
  }


def _is_primary() -> bool:
  import jax

  return jax.process_index() == 0


class RunRecord:
  """Collects one invocation's record and appends it to `workdir/runs.jsonl` at the end.

  Args:
    argv: the command line as run (`sys.argv`).
    workdir: the run directory (local or `gs://...`).
    warn: where the one-line warning goes if the record cannot be written.
  """

  def __init__(
    self,
    argv: Sequence[str],
    workdir: str,
    warn: Callable[[str], Any] | None = None,
  ):
    self.argv = list(argv)
    self.command = command_line(self.argv)
    self.workdir = os.fspath(workdir)
    self.process_start, self.start_source = process_start_time()
    self.load_start = load_average()
    self.started = False  # the loop reached "build": the invocation is recorded
    self.resumed_from: int | None = None  # the step of the first "train" phase
    self.reached = 0  # the highest step a phase was entered at
    self.finished_at: int | None = None  # the step of the "finish" phase
    self.written: dict[str, Any] | None = None  # the record, once written
    self._warn = warn or (lambda line: print(line, file=sys.stderr, flush=True))

  @property
  def path(self) -> str:
    """Where the record goes: `workdir/runs.jsonl`."""
    return os.fspath(epath.Path(self.workdir) / RUNS_NAME)

  def phase(self, name: str, step: int) -> None:
    """Notes a phase of the loop (`Hooks.phase`): build, restore, train, eval, save, finish."""
    if name == "build":
      self.started = True
    elif name == "train" and self.resumed_from is None:
      self.resumed_from = int(step)
    elif name == "finish":
      self.finished_at = int(step)
    self.reached = max(self.reached, int(step))

  def hooks(self, hooks: Any) -> Any:
    """`hooks` (a `loop.Hooks`) with a phase hook that calls `self.phase`, then theirs."""
    theirs = hooks.phase

    def phase(name: str, step: int) -> None:
      self.phase(name, step)
      if theirs is not None:
        theirs(name, step)

    return dataclasses.replace(hooks, phase=phase)

  def entry(
    self, metrics: Mapping[str, Any] | None = None, error: BaseException | None = None
  ) -> dict[str, Any]:
    """The record of the invocation ending now with `metrics` or `error`."""
    now = time.time()
    times = os.times()
    metrics = dict(metrics or {})
    if error is not None:
      status = "interrupted" if isinstance(error, KeyboardInterrupt) else "error"
    else:
      status = "preempted" if metrics.get("preempted") else "completed"
    last = self.finished_at if self.finished_at is not None else self.reached
    if status == "preempted" and "step" in metrics:
      last = int(metrics["step"])
    start = self.resumed_from
    trained = start is not None and last > start
    record: dict[str, Any] = {
      "command": self.command,
      "argv": self.argv,
      "host": socket.gethostname(),
      "started": _utc(self.process_start),
      "ended": _utc(now),
      "wall_seconds": round(now - self.process_start, 2),
      "wall_from": self.start_source,
      "cpu_user_seconds": round(times.user + times.children_user, 2),
      "cpu_system_seconds": round(times.system + times.children_system, 2),
      **cpu_info(),
      "load_start": self.load_start,
      "load_end": load_average(),
      **_jax_facts(),
      "status": status,
      "resumed_from": start,
      "first_step": start + 1 if trained else None,
      "last_step": last if trained else None,
      "final_eval": {}
      if error is not None or status == "preempted"
      else {k: _json_value(v) for k, v in sorted(metrics.items())},
    }
    if error is not None:
      record["error"] = one_line(error)
    return record

  def finish(
    self, metrics: Mapping[str, Any] | None = None, error: BaseException | None = None
  ) -> dict[str, Any] | None:
    """Appends the record (process 0, a run that got as far as building); returns it, or
    None if nothing was written. Never raises: a failure is one warning line."""
    if not self.started or self.written is not None:
      return None
    try:
      if not _is_primary():
        return None
      record = self.entry(metrics, error)
      line = json.dumps(record) + "\n"
      if is_remote(self.workdir):
        path = epath.Path(self.path)
        old = path.read_text(encoding="utf-8") if path.exists() else ""
        if old and not old.endswith("\n"):
          old += "\n"
        write_atomic(path, old + line)
      else:
        with open(self.path, "a", encoding="utf-8") as f:
          f.write(line)
      self.written = record
      return record
    except Exception as e:  # a run record must never cost the run
      self._warn(f"warning: run record not written to {self.path}: {one_line(e)}")
      return None

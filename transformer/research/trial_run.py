"""One sweep point's training run as a Tune trial drives it (`tune_sweep.TrainTrial`):
a subprocess, its log, and the evaluations it reports.

`TrialRun` launches `python -m transformer.train_main ... --workdir DIR/<point>` (output
appended to DIR/<point>/train.log; on object storage a local log uploaded at the end),
tails DIR/<point>/metrics.jsonl (`MetricsTail`) and turns each new evaluation into a
result; `stop()` sends SIGTERM (the loop saves a checkpoint) and SIGKILL after
`STOP_GRACE_S`. A run at its last step that exits 0 gets DIR/<point>/done. Nothing here
needs Ray.
"""

from __future__ import annotations

import collections
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import Any

from etils import epath

from transformer.data.files import is_remote, json_objects, read_jsonl, write_atomic
from transformer.research.sweep_points import DONE, is_done, point_name, train_command
from transformer.train.metric_writers import JSONL_NAME

PID_FILE = "sweep_trial.json"  # in DIR/<point>: the host and pid of the running training run
STOP_GRACE_S = 60.0  # after SIGTERM: seconds the run gets to save before SIGKILL


class MetricsTail:
  """The records a growing metrics.jsonl gained since the last `read()`.

  A file that was replaced (a resumed run truncates its log) is read again from its start;
  the caller drops what it has seen. On object storage the whole file is read each time.
  """

  def __init__(self, path: str):
    self.path = path
    self._inode, self._offset, self._partial = None, 0, b""

  def read(self) -> list[dict[str, Any]]:
    if is_remote(self.path):
      return read_jsonl(self.path) if epath.Path(self.path).is_file() else []
    try:
      st = os.stat(self.path)
    except FileNotFoundError:
      return []
    if st.st_ino != self._inode or st.st_size < self._offset:
      self._inode, self._offset, self._partial = st.st_ino, 0, b""
    with open(self.path, "rb") as f:
      f.seek(self._offset)
      chunk = f.read()
    self._offset += len(chunk)
    *lines, self._partial = (self._partial + chunk).split(b"\n")
    return json_objects(lines)


def _running(pid: Any, workdir: str) -> bool:
  """Whether `pid` is alive and is a training run in `workdir` (pids are reused)."""
  if not isinstance(pid, int) or pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass
  try:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
      if f.read().rpartition(")")[2].split()[0] == "Z":
        return False
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      return f"--workdir={workdir}".encode() in f.read().split(b"\0")
  except (OSError, IndexError):
    return True  # no /proc: alive is all that can be told


class TrialRun:
  """One point's training run, its log and what of its metrics was reported."""

  def __init__(self, config: Mapping[str, Any]):
    sweep, self.point = config["sweep"], dict(config["point"])
    self.name = point_name(self.point)
    self.workdir = os.path.join(sweep["workdir"], self.name)
    overrides = {**sweep["common"], **self.point}
    self.total_steps = int(overrides.get("num_train_steps", sweep["num_train_steps"]))
    self.command = train_command(sweep["config"], self.workdir, overrides, python=sys.executable)
    self.cwd = sweep["cwd"] if os.path.isdir(sweep["cwd"]) else None
    self.shared_accelerator = sweep["shared_accelerator"]
    self.metric = sweep["metric"]  # every result must hold it (Tune checks)
    self.tail = MetricsTail(os.path.join(self.workdir, JSONL_NAME))
    self.poll_s = 5.0 if is_remote(self.workdir) else 0.25
    self.proc: subprocess.Popen | None = None
    self.log = None
    self.finished_before = False
    self.reported_step, self.reported_splits = -1, []  # the last evaluation reported
    self.max_step = -1
    self.latest: dict[str, float] = {}
    self.last_result: dict[str, Any] = {}
    self.pending: collections.deque = collections.deque()
    self.node = os.getppid()  # the raylet that started this worker

  # Tune checkpoint: which evaluations were reported.
  def state(self) -> dict[str, Any]:
    return {"reported_step": self.reported_step, "reported_splits": list(self.reported_splits)}

  def restore(self, state: Mapping[str, Any]) -> None:
    self.reported_step = int(state["reported_step"])
    self.reported_splits = list(state["reported_splits"])

  def next_result(self) -> dict[str, Any]:
    """The next evaluation as a Tune result; at the end, the last one with done=True."""
    if self.proc is None and not self.finished_before:
      if is_done(self.workdir):
        self.finished_before = True
        print(f"[sweep] {self.name}: finished before, not run again", flush=True)
      else:
        self._launch()
    while True:
      self._pull()
      if self.pending:
        return self.pending.popleft()
      if self.finished_before or self.proc.poll() is not None:
        self._pull()  # lines written just before the exit
        return self.pending.popleft() if self.pending else self._finish()
      if os.getppid() != self.node:  # the node is gone (a killed sweep): stop, do not finish
        self.stop()
        raise RuntimeError(f"{self.name}: the Ray node of this trial went away; run stopped")
      time.sleep(self.poll_s)

  def _pull(self) -> None:
    for record in self.tail.read():
      step, split = record.get("step"), record.get("split")
      if not isinstance(step, int) or not isinstance(split, str):
        continue
      self.max_step = max(self.max_step, step)
      for key, value in record.items():
        if key not in ("step", "split") and (value is None or isinstance(value, (int, float))):
          self.latest[f"{split}/{key}"] = math.nan if value is None else float(value)
      if split == "train":
        continue
      if step < self.reported_step or (
        step == self.reported_step and split in self.reported_splits
      ):
        continue  # reported before (a restarted trial reads the log from its start)
      if step > self.reported_step:
        self.reported_step, self.reported_splits = step, []
      self.reported_splits.append(split)
      if self.metric in self.latest:  # until the metric's split has been evaluated: wait
        self.last_result = {**self.latest, "step": step}
        self.pending.append(dict(self.last_result))

  def _finish(self) -> dict[str, Any]:
    if not self.finished_before:
      rc = self.proc.returncode
      self._close_log()
      if rc != 0:
        raise RuntimeError(
          f"{self.name}: training exited with status {rc}: {self._last_log_line()} "
          f"(log: {self.workdir}/train.log)"
        )
      if self.max_step < self.total_steps:
        raise RuntimeError(
          f"{self.name}: training stopped at step {self.max_step} of {self.total_steps} "
          "without being asked (preempted?); rerunning the sweep resumes it"
        )
      write_atomic(os.path.join(self.workdir, DONE), f"{time.time():.0f}\n")
      print(f"[sweep] {self.name}: done (step {self.max_step})", flush=True)
    if not self.last_result:
      logged = sorted(k for k in self.latest if not k.startswith("train/"))
      raise RuntimeError(
        f"{self.name}: the run logged no {self.metric!r} (its evaluations logged: "
        f"{', '.join(logged) or 'nothing'}); choose --metric among those"
      )
    return {**self.last_result, "done": True}

  def _launch(self) -> None:
    self._wait_for_earlier_run()
    log_path = _local_log(self.workdir)
    self.log = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 (closed in _close_log)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    self.log.write(f"[sweep] {started} launch: {shlex.join(self.command)}\n")
    self.log.flush()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if self.shared_accelerator:
      env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    self.proc = subprocess.Popen(
      self.command, stdout=self.log, stderr=subprocess.STDOUT, cwd=self.cwd, env=env
    )
    owner = {"host": socket.gethostname(), "pid": self.proc.pid, "started": started}
    write_atomic(os.path.join(self.workdir, PID_FILE), json.dumps(owner) + "\n")
    print(f"[sweep] {self.name}: started pid {self.proc.pid} ({self.workdir})", flush=True)

  def _wait_for_earlier_run(self) -> None:
    """A run left by an earlier sweep process in this workdir (saving after its SIGTERM,
    say) finishes first: two runs in one workdir are refused by the loop's lock."""
    try:
      owner = json.loads(epath.Path(self.workdir, PID_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
      return
    if not isinstance(owner, dict) or owner.get("host") != socket.gethostname():
      return  # another host: the loop's lock decides
    if _running(owner.get("pid"), self.workdir):
      print(f"[sweep] {self.name}: waiting for pid {owner['pid']} to leave it", flush=True)
      while _running(owner.get("pid"), self.workdir):
        time.sleep(0.5)

  def stop(self) -> None:
    """SIGTERM to a run still going (the loop saves a checkpoint), SIGKILL after the grace.
    A run past its last step is finishing (final evaluation, checkpoint): it is waited for."""
    if self.proc is not None and self.proc.poll() is None:
      finishing = self.max_step >= self.total_steps
      if not finishing:
        self.proc.send_signal(signal.SIGTERM)
        line = f"stopped at step {self.max_step} (SIGTERM: the run saves a checkpoint)"
        self.log.write(f"[sweep] {time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")
        self.log.flush()
        print(f"[sweep] {self.name}: {line}", flush=True)
      try:
        self.proc.wait(STOP_GRACE_S)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait()
      if finishing and self.proc.returncode == 0:
        write_atomic(os.path.join(self.workdir, DONE), f"{time.time():.0f}\n")
    self._close_log()

  def _close_log(self) -> None:
    if self.log is not None:
      self.log.close()
      _upload_log(self.log.name, self.workdir)
      self.log = None

  def _last_log_line(self) -> str:
    try:
      text = epath.Path(self.workdir, "train.log").read_bytes().decode("utf-8", "replace")
    except OSError:
      return "no log"
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


def _local_log(point_dir: str) -> str:
  """Where a point's train.log is written while it runs: in the point's folder, or, on
  object storage (which cannot append), a local file uploaded when the run ends."""
  if is_remote(point_dir):
    fd, path = tempfile.mkstemp(prefix="train-", suffix=".log")
    os.close(fd)
    return path
  os.makedirs(point_dir, exist_ok=True)
  return os.path.join(point_dir, "train.log")


def _upload_log(local: str, point_dir: str) -> None:
  """Object storage: appends the local log of an ended run to its train.log."""
  if not is_remote(point_dir):
    return
  remote = epath.Path(point_dir, "train.log")
  before = remote.read_bytes() if remote.exists() else b""
  with open(local, "rb") as f:
    write_atomic(remote, before + f.read())
  os.remove(local)

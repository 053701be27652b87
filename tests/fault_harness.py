"""Fault-injection harness: train.py subprocesses killed at chosen moments.

Shared by tests/test_faults_kill_resume.py (a few trials) and benchmarks/kill_resume.py
(the 20-trial sweep). A `Run` is `python tests/traced_train.py --config
tests/tiny_lm_config.py ...`: train.py with a phase hook installed, so its stderr carries
`phase NAME STEP` lines (build,
restore, train, eval, save, finish); a reader thread timestamps every output line. A
kill is classified by the last phase line before it and by whether an orbax temporary
directory (an asynchronous checkpoint write in flight) existed at that moment.
"""

from __future__ import annotations

import glob
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_CONFIG = os.path.join(REPO, "tests", "tiny_lm_config.py")
TMP_SUFFIX = ".orbax-checkpoint-tmp"

# 40 updates of the tiny LM; checkpoints every 4 (async, the last 3 + the best kept),
# evaluation every 10: checkpoint writes and evaluations fill a good part of the time.
KILL_RUN = (
  "--config.num_train_steps=40",
  "--config.checkpoint_every=4",
  "--config.eval_every=10",
  "--config.eval_batches=4",
  "--config.log_every=5",
)


def child_env(compile_cache: str | None = None, devices: int = 1) -> dict[str, str]:
  """The environment of a training subprocess: unbuffered, `devices` CPU devices,
  and a persistent compilation cache shared by the runs of one trial set."""
  env = dict(os.environ)
  env.update(
    PYTHONUNBUFFERED="1",
    XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
    JAX_PLATFORMS="cpu",
  )
  if compile_cache:
    env.update(
      JAX_COMPILATION_CACHE_DIR=compile_cache,
      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
  return env


def train_command(workdir: str, *overrides: str) -> list[str]:
  return [
    sys.executable,
    os.path.join(REPO, "tests", "traced_train.py"),
    f"--config={TINY_CONFIG}",
    f"--workdir={workdir}",
    *overrides,
  ]


class Run:
  """A training subprocess whose output lines are read, timestamped, as they come."""

  def __init__(self, cmd: list[str], env: dict[str, str]):
    self.started = time.monotonic()
    self.proc = subprocess.Popen(
      cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO
    )
    self.lines: list[tuple[float, str]] = []
    self._changed = threading.Condition()
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  def _read(self) -> None:
    for line in self.proc.stdout:
      with self._changed:
        self.lines.append((time.monotonic(), line.rstrip("\n")))
        self._changed.notify_all()
    with self._changed:
      self._changed.notify_all()

  def wait_for(self, predicate: Callable[[str], bool], timeout: float = 300.0) -> float:
    """Blocks until an output line satisfies `predicate`; returns its time."""
    deadline = time.monotonic() + timeout
    seen = 0
    with self._changed:
      while True:
        for t, line in self.lines[seen:]:
          if predicate(line):
            return t
        seen = len(self.lines)
        if self.proc.poll() is not None and not self._reader.is_alive():
          raise RuntimeError(f"the run ended (status {self.proc.returncode}):\n{self.output()}")
        if time.monotonic() > deadline:
          raise TimeoutError(f"no matching line within {timeout}s:\n{self.output()}")
        self._changed.wait(0.2)

  def phases(self) -> list[tuple[float, str, int]]:
    return [
      (t, line.split()[1], int(line.split()[2]))
      for t, line in list(self.lines)
      if line.startswith("phase ")
    ]

  def phase_at(self, t: float) -> str:
    """The last phase started at or before time `t` ('start' before the first)."""
    names = [name for when, name, _ in self.phases() if when <= t]
    return names[-1] if names else "start"

  def signal(self, sig: int) -> None:
    self.proc.send_signal(sig)

  def wait(self, timeout: float = 600.0) -> int:
    code = self.proc.wait(timeout)
    self._reader.join(timeout)
    return code

  def output(self) -> str:
    return "\n".join(line for _, line in list(self.lines))


def in_flight_writes(workdir: str) -> list[str]:
  """Orbax temporary directories: checkpoint writes not yet committed."""
  return glob.glob(os.path.join(workdir, "checkpoints", f"*{TMP_SUFFIX}*"))


def saved_steps(workdir: str) -> list[int]:
  folder = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(folder):
    return []
  return sorted(int(d) for d in os.listdir(folder) if d.isdigit())


def training_window(run: Run) -> tuple[float, float]:
  """(time of the first `phase train`, time of `phase finish`) of a finished run."""
  phases = run.phases()
  start = next(t for t, name, _ in phases if name == "train")
  end = next(t for t, name, _ in phases if name == "finish")
  return start, end


def interrupt(
  run: Run, workdir: str, delay: float, sig: int = signal.SIGKILL, since: float | None = None
) -> dict:
  """Sends `sig` to `run` `delay` seconds after its first `phase train` line (or after the
  time `since`); returns what the run was doing then: phase, whether a checkpoint write was
  in flight, exit status, the checkpoints on disk."""
  begun = since if since is not None else run.wait_for(lambda ln: ln.startswith("phase train"))
  time.sleep(max(0.0, begun + delay - time.monotonic()))
  writes = in_flight_writes(workdir)
  when = time.monotonic()
  finished = run.proc.poll() is not None
  if not finished:
    run.signal(sig)
  code = run.wait()
  phase = "exited" if finished else run.phase_at(when)
  if writes and not finished:
    phase += "+write"  # an asynchronous checkpoint write was in flight
  return {"phase": phase, "writes": writes, "code": code, "steps": saved_steps(workdir)}


def final_state(workdir: str) -> dict:
  """The newest checkpoint's whole train state as host arrays."""
  from transformer.train.checkpoints import CheckpointManager

  with CheckpointManager(os.path.join(workdir, "checkpoints"), async_save=False) as mngr:
    step = mngr.latest_step()
    return {"step": step, "state": mngr.restore_numpy(step)}


def source_fingerprint() -> str:
  """A hash of the package's source: runs compared bit for bit must run the same code."""
  digest = hashlib.sha256()
  for path in sorted(glob.glob(os.path.join(REPO, "transformer", "**", "*.py"), recursive=True)):
    with open(path, "rb") as f:
      digest.update(path.encode() + f.read())
  return digest.hexdigest()


def bit_equal(a, b) -> list[str]:
  """Paths of the leaves of two pytrees of arrays that differ in dtype, shape or bytes."""
  import jax

  flat_a = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(a)}
  flat_b = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(b)}
  bad = sorted(set(flat_a) ^ set(flat_b))
  for key in sorted(set(flat_a) & set(flat_b)):
    x, y = np.asarray(flat_a[key]), np.asarray(flat_b[key])
    if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
      bad.append(key)
  return bad

"""Kills, preemption and the workdir lock, end to end (train.py subprocesses).

  kills       SIGKILL at seeded random moments, then the same command: bit-exact resume
  preemption  SIGTERM saves the current step and exits 0 within the grace period, or
              exits without it when the grace runs out, the previous checkpoint intact
  lock        a second run on a workdir in use is refused naming the owner; a dead
              owner's lock is recovered

The runs use tests/fault_harness.py (also behind benchmarks/kill_resume.py, the 20-trial
sweep) and share a persistent compilation cache.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import fault_harness as fh
import numpy as np
import pytest
from session_env import PATIENCE_S

pytestmark = pytest.mark.one_worker  # the reference run runs once (conftest.py)

# Kills, preemption and the workdir lock (train.py subprocesses).


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
  """An uninterrupted train.py run of the kill configuration: its final state and the
  length of its training phase after compilation."""
  workdir = str(tmp_path_factory.mktemp("reference") / "run")
  source = fh.source_fingerprint()
  run = fh.Run(fh.train_command(workdir, *fh.KILL_RUN), fh.child_env())
  assert run.wait() == 0, run.output()[-3000:]
  first_step = next(t for t, line in run.lines if line.startswith("step 1/"))
  _, end = fh.training_window(run)
  return {**fh.final_state(workdir), "duration": end - first_step, "source": source}


def _first_update(run: fh.Run) -> float:
  """When the run printed the progress line of its first update (compilation done)."""
  return run.wait_for(lambda line: re.match(r"step \d+/", line) is not None)


def _owner(workdir):
  with open(os.path.join(workdir, "run.lock")) as f:
    return json.load(f)


@pytest.mark.slow
def test_kills_preemption_and_locks_then_resume_is_bit_exact(tmp_path, reference_run):
  """One workdir through: SIGKILL, SIGKILL, SIGTERM with a grace period too short to save,
  a second run refused while the first is stopped, SIGTERM that saves; the same command
  then finishes the run, whose train state equals the uninterrupted run's byte for byte."""
  env = fh.child_env()
  workdir = str(tmp_path / "run")
  command = fh.train_command(workdir, *fh.KILL_RUN)
  rng = np.random.default_rng(2024)
  span = reference_run["duration"]
  kills = []

  # Two SIGKILLs at random moments: nothing is saved on the way out, the lock stays, and
  # the next run takes it over.
  left_lock = False
  for _ in range(2):
    run = fh.Run(command, env)
    delay = float(rng.uniform(0.0, 0.25) * span)  # each run leaves work for the next ones
    killed = fh.interrupt(run, workdir, delay, signal.SIGKILL, since=_first_update(run))
    kills.append(killed["phase"])
    assert "Traceback" not in run.output()
    assert not left_lock or "removed the stale lock" in run.output(), run.output()[-3000:]
    left_lock = killed["code"] == -signal.SIGKILL  # (unless the run had already finished)
    if left_lock:
      assert _owner(workdir)["pid"] == run.proc.pid

  # SIGTERM with a grace period no save fits in: exit 0 at once, the latest complete
  # checkpoint untouched and named.
  run = fh.Run([*command, "--config.preemption_grace_seconds=0.001"], env)
  delay = float(rng.uniform(0.0, 0.15) * span)
  term = fh.interrupt(run, workdir, delay, signal.SIGTERM, since=_first_update(run))
  kills.append(f"SIGTERM {term['phase']}")
  out = run.output()
  assert not left_lock or "removed the stale lock" in out, out[-3000:]
  assert term["code"] == 0, out[-3000:]
  assert term["phase"].split("+")[0] in ("train", "eval", "save"), term  # during training
  match = re.search(
    r"before the checkpoint at step (\d+) was written; exiting without it\. "
    r"The latest complete checkpoint is (step (\d+)|none)",
    out,
  )
  assert match, out[-3000:]
  on_disk = fh.saved_steps(workdir)
  assert on_disk[-1:] == ([int(match[3])] if match[3] else []) and int(match[1]) not in on_disk
  assert not os.path.exists(os.path.join(workdir, "run.lock"))

  # A run in progress (stopped with SIGSTOP so it cannot finish meanwhile) keeps a second
  # run out; that one says who holds the workdir, in one line.
  run = fh.Run(command, env)
  _first_update(run)
  run.signal(signal.SIGSTOP)
  second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=PATIENCE_S)
  run.signal(signal.SIGCONT)
  resumed_at = time.monotonic()
  assert second.returncode == 1
  last = second.stderr.strip().splitlines()[-1]
  assert last.startswith(f"error: workdir {workdir} is in use by process {run.proc.pid} on ")
  assert "train.py" in last and "Traceback" not in second.stderr
  # ... and a SIGTERM makes it save the step it is at and exit 0.
  delay = float(rng.uniform(0.0, 0.15) * span)
  term = fh.interrupt(run, workdir, delay, signal.SIGTERM, since=resumed_at)
  out = run.output()
  assert term["code"] == 0, out[-3000:]
  assert term["phase"].split("+")[0] in ("train", "eval", "save"), term  # during training
  match = re.search(r"SIGTERM: saved a checkpoint at step (\d+)", out)
  assert match, out[-3000:]
  assert fh.saved_steps(workdir)[-1] == int(match[1])
  kills.append(f"SIGTERM {term['phase']}")
  print(f"interruptions: {kills}")

  # The same command finishes the run: bit-exact.
  run = fh.Run(command, env)
  assert run.wait() == 0, run.output()[-3000:]
  assert "resumed from step" in run.output()
  final = fh.final_state(workdir)
  assert final["step"] == reference_run["step"] == 40
  changed = fh.source_fingerprint() != reference_run["source"]
  assert fh.bit_equal(final["state"], reference_run["state"]) == [], (
    kills,
    "transformer/*.py changed while the runs ran" if changed else "same code throughout",
  )

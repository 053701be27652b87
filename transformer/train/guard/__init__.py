"""Fault tolerance, kept behind one guard the training loop enters once.

    with RunGuard(workdir, exp.faults) as guard:      # the workdir's lock, SIGTERM
      ...build, open the checkpoints...
      with guard.watching(ckpt), ckpt:                # several processes: the peer watch
        for done in ...:
          batch = next(train_iter); guard.progress(done)
          state = train_step(state, batch)
          if guard.should_stop(done): guard.save_within_grace(write, done, ckpt); break

The loop asks questions; the machinery lives here (docs/RELIABILITY.md):

  lock.py         one run per workdir: a lock file naming a live process, or a renewed
                  lease on object storage
  preemption.py   SIGTERM on one process, JAX's preemption sync point on several; the
                  grace window the save of the current update must fit in
  startup.py      multi-host start-up (`maybe_initialize`), before anything is built
  same_config.py  the same config on every process, or one line naming the fields
  peers.py        the watch over the peers: a lost or stalled process ends every survivor
                  in one line naming the last good checkpoint; the orderly end
  config.py       `FaultConfig`: the grace period, the peers' and stall timeouts, the
                  storage clients' retries (top-level config fields)
  storage.py      object storage down past its clients' retries (bounded by
                  `storage_retries`): one line naming the step and the latest checkpoint
  abort.py        the coordinator's loss seen from the other processes (a SIGABRT handler)
  nonfinite.py    the NaN/Inf report: the first bad update, never applied nor checkpointed
  run_record.py   one line per invocation in `WORKDIR/runs.jsonl`: what ran, how it ended
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

from transformer.data.files import StorageError, is_remote
from transformer.train.guard import peers, storage
from transformer.train.guard.config import FaultConfig
from transformer.train.guard.lock import run_lock
from transformer.train.guard.nonfinite import NonFinite, NonFiniteError
from transformer.train.guard.preemption import Preemption, run_within

__all__ = ["FaultConfig", "NonFinite", "NonFiniteError", "RunGuard"]


class RunGuard:
  """The lock on `workdir` and the preemption notice for one training run; `watching`
  adds the peer watch and the storage's failures once the checkpoints are open. See the
  module docstring; `faults`: the grace period and the storage clients' retries."""

  def __init__(self, workdir: str, faults: FaultConfig):
    self.workdir = workdir
    self.preemption = Preemption(faults.preemption_grace_seconds)
    self.storage_retries = faults.storage_retries
    self.step = 0  # the update the loop is on
    self._stack = contextlib.ExitStack()
    self._lock: Any = None

  def __enter__(self) -> RunGuard:
    with contextlib.ExitStack() as stack:
      if is_remote(self.workdir):
        storage.limit_retries(self.storage_retries)
        stack.callback(storage.quiet_retries())
      self._lock = stack.enter_context(run_lock(self.workdir))
      stack.enter_context(self.preemption)
      self._stack = stack.pop_all()
    return self

  def __exit__(self, *exc: Any) -> None:
    self._stack.__exit__(*exc)

  @contextlib.contextmanager
  def watching(self, ckpt: Any) -> Iterator[None]:
    """Around the training run, with the checkpoint manager `ckpt` (which the loop
    closes inside, so that its last writes are watched too): a write that fails
    (`StorageError`) becomes one line naming the step and the latest complete
    checkpoint; on object storage the process ends there, status 1, without waiting for
    the storage clients' threads. Several processes: the watch names `ckpt`'s last good
    step in its lines, and the processes leave together at the end."""
    with peers.watching(ckpt.directory):
      try:
        yield
      except StorageError as e:
        line = storage.failure_line(e, self.step, ckpt)
        if not is_remote(self.workdir):
          raise StorageError(line) from e
        print(f"error: {line}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        peers.leave_now(line)  # several processes: the others stop, naming this one
        os._exit(1)

  # -- what the loop asks ------------------------------------------------------------------

  @property
  def source(self) -> str:
    """What sent the stop: 'SIGTERM' or 'the preemption sync point'."""
    return self.preemption.source

  def stopped_before_training(self) -> bool:
    return self.preemption.requested

  def progress(self, step: int) -> None:
    """The loop fetched the batch of update `step` (the stall watch's sign of life)."""
    self.step = step
    peers.progress(step)

  def should_stop(self, step: int) -> bool:
    """Asked after every update (on every process): True when a preemption notice stops
    the run at `step`, the same step on every process."""
    return self.preemption.reached(step)

  def should_stop_evaluation(self) -> bool:
    """Asked before every evaluation batch: True when a notice interrupts it (one process
    only: several could disagree on the batch and deadlock in a collective)."""
    peers.tick()
    return self.preemption.interrupts_evaluation()

  def save_within_grace(self, write: Callable[[], None], step: int, ckpt: Any) -> None:
    """Runs `write` (the save of update `step`, waited for) within what is left of the
    grace period; when it runs out first, exits the process at once (status 0), the
    previous checkpoint staying the latest."""
    if run_within(write, self.preemption.remaining()):
      return
    # Orbax lists a step from the start of its write; on disk, a step folder is complete
    # (writes go to a temporary folder renamed at the end).
    complete = [s for s in ckpt.all_steps() if (ckpt.directory / str(s)).exists()]
    print(
      f"{self.source}: the grace period of {self.preemption.grace:g}s ran out before the "
      f"checkpoint at step {step} was written; exiting without it. The latest complete "
      f"checkpoint is {'step ' + str(max(complete)) if complete else 'none'} in "
      f"{ckpt.directory}; rerun the same command to resume",
      flush=True,
    )
    sys.stderr.flush()
    self._lock.release()
    peers.leave_now(None)  # several processes: the others must not wait for this one
    os._exit(0)  # skips waiting for the unfinished write in the checkpoint thread

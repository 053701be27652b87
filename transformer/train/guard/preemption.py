"""Preemption notices: SIGTERM on one process, JAX's preemption sync point on several.

`Preemption(grace_seconds)` is a context manager the training loop asks, after every
update, whether to stop (`reached(step)`); the loop then saves that step with
`run_within(save, preemption.remaining())` and exits. Grace: schedulers send SIGTERM and
kill the process a fixed time later (30 s on GCE and Kubernetes by default), so the save
must finish inside `grace_seconds`, counted from the notice; a save that cannot is
abandoned and the previous checkpoint stays the latest.

One process: a SIGTERM handler records the time of the notice (the previous handler is
restored on exit). Several processes (`jax.process_count() > 1`): the preemption sync
manager that `jax.distributed.initialize` starts hears SIGTERM on any host, and
`multihost_utils.reached_preemption_sync_point(step)`, called after every update on every
host, turns True on all hosts at the same step, so they save the same step. No Python
handler is installed then: it would replace the sync manager's own. The processes then
leave together (`distributed.watching`); one that must exit at once when the grace period
runs out says so first (`distributed.leave_now`), so the others do not count it as lost.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

import jax


class Preemption:
  """Whether (and since when) the run has been asked to stop; see the module docstring."""

  def __init__(self, grace_seconds: float, multihost: bool | None = None):
    self.grace = grace_seconds
    self.multihost = jax.process_count() > 1 if multihost is None else multihost
    self.noticed_at: float | None = None  # time.monotonic() of the notice
    self.source = "the preemption sync point" if self.multihost else "SIGTERM"
    self._previous = None

  def __enter__(self) -> Preemption:
    if not self.multihost:
      try:
        self._previous = signal.signal(signal.SIGTERM, self._handler)
      except ValueError:  # not the main thread: SIGTERM keeps its default action
        self._previous = None
    return self

  def __exit__(self, *exc) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None

  def _handler(self, signum, frame) -> None:
    if self.noticed_at is None:
      self.noticed_at = time.monotonic()

  @property
  def requested(self) -> bool:
    return self.noticed_at is not None

  def reached(self, step: int) -> bool:
    """Called after every update (on every host): True when the run must stop at `step`."""
    if self.multihost and self.noticed_at is None:
      from jax.experimental import multihost_utils

      if multihost_utils.reached_preemption_sync_point(step):
        self.noticed_at = time.monotonic()
    return self.requested

  def interrupts_evaluation(self) -> bool:
    """True when an evaluation should stop between batches (one process only: several
    hosts could disagree on the batch and deadlock in a collective)."""
    return not self.multihost and self.requested

  def remaining(self) -> float:
    """Seconds left of the grace period (negative once it has run out)."""
    return self.grace - (time.monotonic() - self.noticed_at)


def run_within(fn: Callable[[], None], seconds: float) -> bool:
  """Runs `fn` in a daemon thread for at most `seconds`; True if it finished in time.

  An exception from `fn` is re-raised here. When the time runs out `fn` keeps running
  (a thread cannot be stopped): the caller is expected to exit the process.
  """
  if seconds <= 0:
    return False
  error: list[BaseException] = []

  def target():
    try:
      fn()
    except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
      error.append(e)

  worker = threading.Thread(target=target, name="preemption-save", daemon=True)
  worker.start()
  worker.join(seconds)
  if error:
    raise error[0]
  return not worker.is_alive()

"""The NaN/Inf report: the step records the first update whose inputs, loss, gradients or
update were NaN/Inf on the device (no per-update host sync, nothing applied); `NonFinite`
checks it before every log line, evaluation and save, and stops the run naming the step,
the quantity and the last good checkpoint (or, with `skip`, lets the steps skip and count
such updates). Nothing is ever checkpointed past it.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from transformer.train.checkpoints import CheckpointManager
from transformer.train.parallel import StepRunner


class NonFiniteError(RuntimeError):
  """A NaN or Inf appeared in the inputs, loss, gradients or update."""


@dataclasses.dataclass
class NonFinite:
  """Stops the run at the first update whose inputs, loss, gradients or update were NaN/Inf
  (or, with `skip`, lets the step skip and count them). The step records it on the device
  (no per-update host sync); `record` keeps the device metrics of the updates since the
  last check, so the message can name the quantity. Nothing is checkpointed past it."""

  skip: bool
  runner: StepRunner
  ckpt: CheckpointManager
  pending: dict[int, dict] = dataclasses.field(default_factory=dict)

  def record(self, done: int, metrics: dict) -> None:
    if not self.skip:
      self.pending[done] = metrics

  def check(self, state) -> None:
    if self.skip:
      return
    host = self.runner.host_state(state)
    count, first = jax.device_get((host.nonfinite_count, host.first_nonfinite_step))
    if not int(count):
      self.pending.clear()
      return
    first = int(first)
    what = (
      describe(self.pending[first]) if first in self.pending else "non-finite loss or gradients"
    )
    self.ckpt.wait_until_finished()
    good = self.ckpt.latest_step()
    raise NonFiniteError(
      f"step {first}: {what}; the update was not applied and training stopped; last good "
      f"checkpoint: {'step ' + str(good) if good is not None else 'none'} in "
      f"{self.ckpt.directory} (kept). Rerunning resumes there and meets the same data: lower "
      "the learning rate, fix the data, or set --config.skip_nonfinite=True to skip and "
      "count such updates"
    )


def describe(metrics: dict) -> str:
  """Which of an update's inputs, loss, gradients and update were NaN/Inf."""
  m = {k: float(v) for k, v in jax.device_get(metrics).items()}
  parts = []
  if m.get("nonfinite_inputs", 0.0) or not np.isfinite(m.get("normalizer", 0.0)):
    parts.append("inputs (a NaN/Inf in the batch)")
  if not np.isfinite(m["loss"]):
    parts.append(f"loss ({m['loss']})")
  if not np.isfinite(m["grad_norm"]):
    parts.append(f"gradients (global norm {m['grad_norm']})")
  if not np.isfinite(m["update_norm"]):
    parts.append(f"optimizer update (global norm {m['update_norm']})")
  shown = ", ".join(parts) or "loss or gradients"
  return f"non-finite {shown}" + (f"; loss was {m['loss']:.6g}" if np.isfinite(m["loss"]) else "")

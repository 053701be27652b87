"""What the guard tolerates and for how long: the top-level config fields of `FaultConfig`
(docs/RELIABILITY.md). Read by `train/experiment.py` with the other blocks, and before
that by `startup.py`, whose processes start before the config is validated.
"""

from __future__ import annotations

import dataclasses

from transformer.data.config import fail

DEFAULT_TIMEOUT_S = 180  # seconds without a peer's heartbeat before it counts as lost
DEFAULT_STALL_S = 1800  # seconds without progress anywhere before the stuck process does


@dataclasses.dataclass(frozen=True)
class FaultConfig:
  """Preemption, lost and stalled peers, storage outages."""

  preemption_grace_seconds: float = 25.0  # SIGTERM: seconds to save and exit (< the kill)
  distributed_timeout_s: int = DEFAULT_TIMEOUT_S  # several processes: seconds without a
  # peer's heartbeat before the run stops naming it (the bound on every wait for the others)
  stall_timeout_s: int = DEFAULT_STALL_S  # several processes: seconds without progress
  # anywhere before the stuck process counts as lost (0 = never; must outlast the longest
  # evaluation batch and checkpoint wait; the first update's compilation does not count)
  storage_retries: int = 0  # object storage: attempts per request before a write fails in
  # one line (0 = the clients' own: about 30 s per request, 15 minutes for arrays)

  def __post_init__(self):
    if not self.preemption_grace_seconds > 0:
      fail("preemption_grace_seconds", self.preemption_grace_seconds, "must be > 0")
    if self.distributed_timeout_s < 1:
      fail("distributed_timeout_s", self.distributed_timeout_s, "must be >= 1")
    for name in ("stall_timeout_s", "storage_retries"):
      if getattr(self, name) < 0:
        fail(name, getattr(self, name), "must be >= 0")

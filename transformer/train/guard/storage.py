"""Object storage that stays down: a bounded wait, then one line (docs/RELIABILITY.md §10).

The storage clients retry every request on their own: gcsfs (the metrics, the lease,
orbax's metadata; etils reads `gs://` through it) makes 6 attempts with a backoff of 1, 2,
4, ... seconds capped at 32 (about half a minute per request), tensorstore (orbax's
arrays) 32 (about 15 minutes). An outage shorter than that is ridden out; left alone, a
longer one ends in pages of tracebacks from every thread while the process waits out
tensorstore's budget for orbax's writer threads.

Neither client reads its budget from the environment or from orbax's options:
`limit_retries(n)` (`config.storage_retries`; 0 keeps their own) sets both in code, before
the first checkpoint manager is built. A write that fails past the retries is a
`StorageError`; the guard turns it into one line naming the step and the latest complete
checkpoint (`failure_line`) and, on object storage, ends the process at once (the
writer threads would otherwise hold it until their own retries run out).
"""

from __future__ import annotations

import logging
from typing import Any

from transformer.data.files import StorageError
from transformer.train.checkpoints.storage import CheckpointWriteError, latest

_GCSFS_METHODS = ("_request", "_get_file_request", "_get_file_concurrent")  # the retried ones


def limit_retries(retries: int) -> None:
  """Every object-storage request is tried at most `retries` times (0: the clients' own
  budgets, gcsfs 6 and tensorstore 32)."""
  import gcsfs.core
  from gcsfs.retry import retry_request
  from orbax.checkpoint._src.serialization import tensorstore_utils

  cls = gcsfs.core.GCSFileSystem
  for name in _GCSFS_METHODS:  # decorated when the class was made: decorate them again
    original = getattr(cls, name).__wrapped__
    setattr(cls, name, retry_request(retries=retries or cls.retries)(original))
  for context in (tensorstore_utils._BASE_TS_CONTEXT, tensorstore_utils._DEFAULT_OCDBT_TS_CONTEXT):
    if retries:
      context["gcs_request_retries"] = {"max_retries": retries, "initial_delay": "1s"}
    else:
      context.pop("gcs_request_retries", None)


def quiet_retries() -> Any:
  """Silences gcsfs's log of each request out of retries (a traceback each: the one line
  says it); returns a function that restores it."""
  log = logging.getLogger("gcsfs")
  level = log.level
  log.setLevel(logging.CRITICAL)
  return lambda: log.setLevel(level)


def failure_line(error: StorageError, step: int, ckpt: Any) -> str:
  """The one line of a failed write: a checkpoint's names its step and the latest complete
  checkpoint already; another (the metrics) gets the update and that checkpoint."""
  if isinstance(error, CheckpointWriteError):
    return str(error)
  return (
    f"{error} at update {step}; the latest complete checkpoint is "
    f"{latest(ckpt.directory, ckpt.committed)} in {ckpt.directory} (kept). Restore access "
    "to the storage, then rerun the same command to resume from it"
  )

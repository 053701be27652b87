"""What a checkpoint folder holds, read the way orbax writes it (committed steps, partial
writes), and how its failures read: one line each, never pages of tracebacks.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from transformer.data.files import StorageError, one_line

_PARTIAL_LOCAL = re.compile(r"(\d+)\.orbax-checkpoint-tmp.*")  # a local write in progress


class CheckpointWriteError(StorageError):
  """A checkpoint could not be written (disk full, storage unreachable, ...); it was not
  committed, and the previous checkpoints are kept."""


def committed_steps(directory: str | epath.PathLike) -> list[int]:
  """The steps in `directory` whose write was committed, by orbax's rule: the temporary
  folder renamed to `<step>` (local disks), `<step>/commit_success.txt` written last
  (object storage, no atomic rename). Partial writes are never listed."""
  return sorted(ocp.path.step.checkpoint_steps(directory))


def partial_writes(directory: str | epath.PathLike) -> list[epath.Path]:
  """Folders of checkpoint writes that never committed: `<step>.orbax-checkpoint-tmp-*`
  (local), `<step>/` without `commit_success.txt` (object storage)."""
  directory = epath.Path(directory)
  if not directory.exists():
    return []
  found = []
  for path in directory.iterdir():
    if _PARTIAL_LOCAL.fullmatch(path.name):
      found.append(path)
    elif path.name.isdigit() and not ocp.path.step.is_path_finalized(path):
      found.append(path)
  return sorted(found, key=lambda p: p.name)


def latest(directory: str | epath.PathLike, committed: int | None) -> str:
  """`describe_latest` within 5 s or, when the storage does not answer, 'step N' from
  `committed` (the newest step this process saw committed; 'none' for None)."""
  found = describe_latest(directory, seconds=5.0)
  if found.startswith("unknown"):
    return "none" if committed is None else f"step {committed}"
  return found


def describe_latest(directory: str | epath.PathLike, seconds: float = 10.0) -> str:
  """'step N' (the newest committed step) or 'none', read within `seconds` (the storage
  may be what failed): else 'unknown (...)'."""
  found: list[Any] = []

  def read() -> None:
    try:
      found.append(committed_steps(directory))
    except Exception as e:  # the storage failed again: say so
      found.append(e)

  reader = threading.Thread(target=read, name="checkpoint-listing", daemon=True)
  reader.start()
  reader.join(seconds)
  if not found:
    return f"unknown ({directory} did not answer within {seconds:g}s)"
  if isinstance(found[0], Exception):
    return f"unknown ({one_line(found[0])})"
  return f"step {max(found[0])}" if found[0] else "none"


class OneLineOrbaxErrors(logging.Filter):
  """Orbax's own error records (a failed write, logged with its traceback from each thread
  it crosses) as one line each: `CheckpointWriteError` says what happened."""

  def filter(self, record: logging.LogRecord) -> bool:
    if record.exc_info and f"{os.sep}orbax{os.sep}" in record.pathname:
      error = record.exc_info[1]
      message = record.getMessage().splitlines()[0][:200]
      record.msg, record.args = f"{message} ({one_line(error)})" if error else message, ()
      record.exc_info = record.exc_text = None
    return True


def quiet_orbax_tracebacks() -> None:
  absl_logger = logging.getLogger("absl")  # orbax logs through absl
  if not any(isinstance(f, OneLineOrbaxErrors) for f in absl_logger.filters):
    absl_logger.addFilter(OneLineOrbaxErrors())


def write_failed(
  directory: epath.Path, step: int | None, error: BaseException, committed: int | None
) -> CheckpointWriteError:
  """The error of a failed write of `step`, after removing what it left (process 0; best
  effort: the storage may still be failing): one line naming the step, the error and the
  latest complete checkpoint, which is kept (read from the storage within seconds; if it
  does not answer, `committed`: the newest step this process saw committed)."""
  if jax.process_index() == 0:
    try:
      for path in partial_writes(directory):
        if step is None or path.name.split(".")[0] == str(step):
          path.rmtree(missing_ok=True)
    except Exception as e:  # the storage is still failing: the next run sweeps it
      logging.warning("could not remove the partial checkpoint write: %s", one_line(e))
  what = f"checkpoint step {step}" if step is not None else "a checkpoint"
  return CheckpointWriteError(
    f"{what} could not be written to {directory} ({one_line(error)}); it was not "
    f"committed, and the latest complete checkpoint is {latest(directory, committed)} "
    "(kept). Free space or restore access to the storage, then rerun the same command to "
    "resume from it"
  )

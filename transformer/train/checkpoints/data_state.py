"""The data-iterator states a checkpoint holds: grain's file per process (or, in
checkpoints from before per-process states, one JSON state), and whether this run can
continue from them exactly (`Restored.resumable_data_state`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import jax
from etils import epath

from transformer.train.checkpoints import integrity

LEGACY_DATA_FILE = "metadata"  # the data item of checkpoints written with one JSON state
_DATA_FILE = re.compile(r"process_(\d+)-of-(\d+)\.json")  # grain's file per process


class DataState:
  """A data-iterator state as grain's orbax handler saves and restores it: `get_state()`
  gives the bytes of this process's file, `set_state` takes them back.

  The state is taken when `save` is called (an asynchronous write must not read an
  iterator that has moved on), so this stands in for the iterator itself.
  """

  def __init__(self, state: Any = None):
    self.state = state

  def get_state(self) -> bytes:
    return json.dumps(self.state, indent=1).encode()

  def set_state(self, state: bytes) -> None:
    self.state = json.loads(state.decode())

  def start_prefetch(self) -> None:
    """Called by grain's handler after `set_state`; there is nothing to prefetch."""


@dataclasses.dataclass(frozen=True)
class Restored:
  """What `CheckpointManager.restore` returns."""

  step: int  # the checkpoint's step
  state: Any  # the train state, structured like the target
  data_state: dict[str, Any] | None  # this process's data-iterator state, if it was saved
  # (None also when the checkpoint's data states are those of another process count)
  config: dict[str, Any] | None  # the config, if it was saved
  data_processes: int | None = None  # processes whose data states the checkpoint holds;
  # None: no data state, or one JSON state of a checkpoint from before per-process states
  directory: str = ""  # the checkpoint root it came from

  def resumable_data_state(self) -> dict[str, Any] | None:
    """The data state this run continues from; ValueError when the checkpoint's data
    position cannot be continued exactly by `jax.process_count()` processes."""
    count = jax.process_count()
    where = f"checkpoint step {self.step} in {self.directory}"
    if self.data_processes is not None and self.data_processes != count:
      raise ValueError(
        f"{where} holds the data-iterator states of {self.data_processes} processes and this "
        f"run has {count}: each process resumes its own shard of the data, so a different "
        f"process count would continue on shifted examples; resume with "
        f"{self.data_processes} processes (or start a new workdir)"
      )
    if self.data_processes is None and self.data_state is not None and count > 1:
      raise ValueError(
        f"{where} holds one data-iterator state for all processes (written before states "
        f"were saved per process), which resumes exactly on one process only and this run "
        f"has {count}; resume it with one process"
      )
    return self.data_state


def data_processes(data_dir: epath.Path) -> int | None:
  """How many processes saved the per-process data states in `data_dir` (None: none)."""
  if not data_dir.exists():
    return None
  counts = {int(m.group(2)) for p in data_dir.iterdir() if (m := _DATA_FILE.fullmatch(p.name))}
  if len(counts) != 1:
    found = sorted(p.name for p in data_dir.iterdir())
    raise integrity.Corrupt(f"item 'data' holds no consistent set of process states: {found}")
  return counts.pop()


def data_problem(data_dir: epath.Path, legacy: bool, read_data: bool) -> str | None:
  """What is wrong with the data state this process will read, or None."""
  if legacy:
    path = data_dir / LEGACY_DATA_FILE
  elif read_data:
    path = data_dir / f"process_{jax.process_index()}-of-{jax.process_count()}.json"
  else:
    return None
  try:
    json.loads(path.read_text())
  except Exception as e:
    return f"item 'data' unreadable: {type(e).__name__}: {e}"
  return None

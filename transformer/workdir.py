"""The run directory: creation, a writability check, and a lock against concurrent runs."""

from __future__ import annotations

import json
import logging
import os
import socket
import tempfile

import jax

LOCK_FILE = "run.lock"


def prepare_workdir(workdir: str) -> str:
  """Creates `workdir` if needed and checks it is writable; returns its absolute path."""
  if not workdir:
    raise ValueError("--workdir is required (the folder for checkpoints and metrics)")
  path = os.path.abspath(os.path.expanduser(workdir))
  if os.path.exists(path) and not os.path.isdir(path):
    raise ValueError(f"workdir {path} exists and is not a directory")
  try:
    os.makedirs(path, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path, prefix=".write_test_"):
      pass
  except OSError as e:
    raise ValueError(f"workdir {path} is not writable: {e.strerror or e}") from None
  return path


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


class WorkdirLock:
  """Refuses a second run in a workdir in use; takes over a lock left by a dead process.

  The lock is a file holding the owner's host and pid, created atomically (O_EXCL) by
  process 0. A lock from another host cannot be checked and is respected.
  """

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, LOCK_FILE)
    self.held = False

  def __enter__(self) -> WorkdirLock:
    if jax.process_index() != 0:
      return self
    me = {"host": socket.gethostname(), "pid": os.getpid()}
    for _ in range(2):
      try:
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
      except FileExistsError:
        owner = self._owner()
        same_host = owner.get("host") == me["host"]
        pid = owner.get("pid")
        stale = not owner or (same_host and isinstance(pid, int) and not _alive(pid))
        if stale:  # a dead owner, or a lock file cut short before its owner was written
          logging.warning("removing stale lock %s (owner %s is gone)", self.path, owner or "?")
          os.remove(self.path)
          continue
        raise RuntimeError(
          f"workdir {os.path.dirname(self.path)} is in use by process {pid} on "
          f"{owner.get('host')} (lock file {self.path}); stop that run or use another --workdir"
        ) from None
      with os.fdopen(fd, "w") as f:
        json.dump(me, f)
      self.held = True
      return self
    raise RuntimeError(f"could not take the lock {self.path}")

  def _owner(self) -> dict:
    try:
      with open(self.path, encoding="utf-8") as f:
        return json.load(f)
    except (OSError, ValueError):
      return {}

  def __exit__(self, *exc) -> None:
    if self.held:
      try:
        os.remove(self.path)
      except FileNotFoundError:
        pass
      self.held = False

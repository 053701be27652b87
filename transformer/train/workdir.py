"""The run directory: creation, a writability check, and a lock against concurrent runs."""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import tempfile
import time

import jax

LOCK_FILE = "run.lock"
_UNREADABLE_AFTER_S = 5.0  # an unreadable lock file older than this is stale


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


def _start_ticks(pid: int) -> int | None:
  """The start time of process `pid` (Linux: clock ticks since boot), None if unknown."""
  try:
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
      stat = f.read()
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22, after the command name
  except (OSError, ValueError, IndexError):
    return None


def _describe(owner: dict) -> str:
  started = owner.get("started")
  when = time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(started)) if started else ""
  command = f" ({owner['command']})" if owner.get("command") else ""
  return f"process {owner.get('pid')} on {owner.get('host')}{command}{when}"


class WorkdirLock:
  """Refuses a second run in a workdir in use; takes over a lock left by a dead process.

  The lock is a JSON file holding the owner's host, pid, process start time, command line
  and start date, created atomically (O_EXCL) by process 0. On the same host the owner is
  gone when its pid is dead or now belongs to a process started at another time (a
  restarted container reuses pids); a lock from another host cannot be checked and is
  respected. A stale lock is renamed away (atomic: of two processes recovering it at once,
  one wins) and checked to be the one judged stale before the new lock is created.
  """

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, LOCK_FILE)
    self.held = False

  def __enter__(self) -> WorkdirLock:
    if jax.process_index() != 0:
      return self
    me = {
      "host": socket.gethostname(),
      "pid": os.getpid(),
      "start_ticks": _start_ticks(os.getpid()),
      "command": " ".join([os.path.basename(sys.executable), *sys.argv])[:300],
      "started": time.time(),
    }
    for _ in range(30):
      try:
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        owner = self._read(self.path)
        if not owner and not self._stale(owner, me["host"], self.path):
          time.sleep(0.25)  # being written by a process starting right now: read it again
          continue
        if not self._stale(owner, me["host"], self.path):
          raise RuntimeError(
            f"workdir {os.path.dirname(self.path)} is in use by {_describe(owner)} (lock file "
            f"{self.path}); stop that run or use another --workdir"
          ) from None
        self._remove_stale(owner)
        continue
      with os.fdopen(fd, "w") as f:
        json.dump(me, f)
      self.held = True
      return self
    raise RuntimeError(f"could not take the lock {self.path} (other runs keep taking it)")

  @staticmethod
  def _read(path: str) -> dict:
    try:
      with open(path, encoding="utf-8") as f:
        owner = json.load(f)
      return owner if isinstance(owner, dict) else {}
    except (OSError, ValueError):
      return {}

  @staticmethod
  def _stale(owner: dict, host: str, path: str) -> bool:
    if not owner:  # unreadable: cut short by a kill, or being written right now
      try:
        return time.time() - os.path.getmtime(path) > _UNREADABLE_AFTER_S
      except OSError:
        return True
    pid = owner.get("pid")
    if owner.get("host") != host or not isinstance(pid, int):
      return False
    if not _alive(pid):
      return True
    recorded, now = owner.get("start_ticks"), _start_ticks(pid)
    return recorded is not None and now is not None and recorded != now  # pid reused

  def _remove_stale(self, owner: dict) -> None:
    aside = f"{self.path}.stale-{os.getpid()}"
    try:
      os.rename(self.path, aside)
    except FileNotFoundError:  # another process removed it first
      return
    if self._read(aside) != owner:  # a new owner's lock replaced the stale one: put it back
      try:
        os.link(aside, self.path)
      except FileExistsError:
        pass
      os.remove(aside)
      return
    os.remove(aside)
    logging.warning("removed the stale lock %s (%s is gone)", self.path, _describe(owner))

  def release(self) -> None:
    """Removes the lock file if this object holds it."""
    if self.held:
      try:
        os.remove(self.path)
      except FileNotFoundError:
        pass
      self.held = False

  def __exit__(self, *exc) -> None:
    self.release()

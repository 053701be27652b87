"""The workdir's lock against two runs at once.

On a local disk the lock is a file naming a live process (`WorkdirLock`); on object
storage, where a pid means nothing to the other hosts, it is a lease renewed by a heartbeat
(`LeaseLock`). `run_lock(workdir)` picks the one that fits.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
import uuid

import jax
from etils import epath

from transformer.data.files import is_remote, one_line

LOCK_FILE = "run.lock"
_UNREADABLE_AFTER_S = 5.0  # an unreadable lock file older than this is stale
LEASE_SECONDS = 60.0  # a lease not renewed for this long is stale (object-storage workdirs)
HEARTBEAT_SECONDS = 10.0  # how often a live run renews its lease


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


class LeaseLock:
  """The run lock on object storage: a lease, renewed by a heartbeat while the run lives.

  `workdir/run.lock` is a JSON object: an owner id (unique to this run), host, pid, process
  start time, command line, start date and `heartbeat`, the time of the last renewal,
  rewritten every `heartbeat_s` seconds by a background thread of process 0. A second run
  refuses while the lease is fresh (renewed less than `lease_s` ago), naming the owner and
  the lease's age; a stale one is taken over with a warning. A lease from this host whose
  process is gone (dead pid, or a pid now belonging to a process started at another time)
  is stale at once, as with the local lock. The lease is created with an exclusive create
  (`xb`: Cloud Storage's `ifGenerationMatch=0`), and read back after `settle_s` seconds to
  check that no other run took it meanwhile (stores that ignore the precondition, races
  over a stale lease). Ages are measured with the hosts' clocks, which must agree to well
  within `lease_s`.
  """

  def __init__(
    self,
    workdir: str,
    *,
    lease_s: float = LEASE_SECONDS,
    heartbeat_s: float = HEARTBEAT_SECONDS,
    settle_s: float = 1.0,
  ):
    if not 0 < heartbeat_s < lease_s:
      raise ValueError(f"need 0 < heartbeat_s < lease_s; got {heartbeat_s}, {lease_s}")
    self.path = epath.Path(workdir) / LOCK_FILE
    self.lease_s, self.heartbeat_s, self.settle_s = lease_s, heartbeat_s, settle_s
    self.held = False
    self._me: dict = {}
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

  def __enter__(self) -> LeaseLock:
    if jax.process_index() != 0:
      return self
    host, pid = socket.gethostname(), os.getpid()
    self._me = {
      "owner": f"{host}:{pid}:{uuid.uuid4().hex[:12]}",
      "host": host,
      "pid": pid,
      "start_ticks": _start_ticks(pid),
      "command": " ".join([os.path.basename(sys.executable), *sys.argv])[:300],
      "started": time.time(),
      "heartbeat": time.time(),
    }
    for _ in range(10):
      owner = self._read()
      if owner is not None:
        age = time.time() - float(owner.get("heartbeat") or 0.0)
        if not self._stale(owner, age):
          raise RuntimeError(self._in_use(owner, age))
        self._take_over(owner, age)
      if not self._create():
        continue  # another run created it first: judge its lease
      time.sleep(self.settle_s)
      now = self._read()
      if now is None or now.get("owner") != self._me["owner"]:
        continue  # overwritten by another run taking the same stale lease
      self.held = True
      self._thread = threading.Thread(target=self._heartbeat, name="lease", daemon=True)
      self._thread.start()
      return self
    raise RuntimeError(f"could not take the lease {self.path} (other runs keep taking it)")

  def _in_use(self, owner: dict, age: float) -> str:
    return (
      f"workdir {self.path.parent} is in use by {_describe(owner)}, lease renewed "
      f"{age:.0f}s ago (lease file {self.path}; stale after {self.lease_s:g}s without "
      "renewal); stop that run or use another --workdir"
    )

  def _read(self) -> dict | None:
    """The lease's contents; None when there is none, {} when it is unreadable."""
    try:
      text = self.path.read_text(encoding="utf-8")
    except FileNotFoundError:
      return None
    try:
      owner = json.loads(text)
    except ValueError:
      return {}
    return owner if isinstance(owner, dict) else {}

  def _stale(self, owner: dict, age: float) -> bool:
    if not owner or age > self.lease_s:  # unreadable (objects are written whole) or expired
      return True
    pid = owner.get("pid")
    if owner.get("host") != self._me["host"] or not isinstance(pid, int):
      return False
    if not _alive(pid):
      return True
    recorded, now = owner.get("start_ticks"), _start_ticks(pid)
    return recorded is not None and now is not None and recorded != now  # pid reused

  def _take_over(self, owner: dict, age: float) -> None:
    if self._read() != owner:  # renewed or replaced since it was judged: judge it again
      return
    self.path.unlink(missing_ok=True)
    why = "unreadable" if not owner else f"{_describe(owner)}, last renewed {age:.0f}s ago"
    logging.warning("took over the stale lease %s (%s)", self.path, why)

  def _create(self) -> bool:
    """Creates the lease unless one exists; False when another run's is there."""
    import fsspec  # etils.epath's backend for gs:// and s3:// without TensorFlow

    data = json.dumps(self._me).encode()
    fs, key = fsspec.core.url_to_fs(str(self.path))
    try:
      with fs.open(key, "xb") as f:  # exclusive: Cloud Storage's ifGenerationMatch=0
        f.write(data)
    except FileExistsError:
      return False
    except OSError as e:  # a failed precondition (412): another run created it first
      if "412" in str(e) or "recondition" in str(e):
        return False
      raise
    return True

  def _heartbeat(self) -> None:
    while not self._stop.wait(self.heartbeat_s):
      try:
        owner = self._read()
        if owner is None or owner.get("owner") != self._me["owner"]:
          logging.error(
            "lost the lease %s: it now holds %s; this run no longer owns the workdir",
            self.path,
            _describe(owner) if owner else "nothing",
          )
          self.held = False
          return
        self._me["heartbeat"] = time.time()
        self.path.write_text(json.dumps(self._me), encoding="utf-8")
      except Exception as e:  # a storage hiccup: try again at the next beat
        logging.warning("could not renew the lease %s: %s", self.path, one_line(e))

  def release(self) -> None:
    """Stops the heartbeat and removes the lease if this run still holds it."""
    self._stop.set()
    if self._thread is not None and self._thread is not threading.current_thread():
      self._thread.join(timeout=self.heartbeat_s + 30)
    if self.held:
      self.held = False
      try:
        owner = self._read()
        if owner is not None and owner.get("owner") == self._me["owner"]:
          self.path.unlink(missing_ok=True)
      except Exception as e:  # the run's work is saved; a stale lease is taken over later
        logging.warning("could not remove the lease %s: %s", self.path, one_line(e))

  def __exit__(self, *exc) -> None:
    self.release()


RunLock = WorkdirLock | LeaseLock


def run_lock(workdir: str) -> RunLock:
  """The lock that fits `workdir`: a lease on object storage, a lock file on a local disk."""
  return LeaseLock(workdir) if is_remote(workdir) else WorkdirLock(workdir)

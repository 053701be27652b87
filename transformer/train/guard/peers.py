"""The watch over the peers of a multi-host run: no silent hang when a process is lost or
stuck, and an orderly end (docs/RELIABILITY.md, "Many hosts").

- **Lost.** JAX's coordination service declares a process dead when it sends no heartbeat
  for `config.distributed_timeout_s` seconds (`heartbeat_timeout_seconds`). It runs in
  recoverable mode (`jax_enable_recoverability`): the service does not abort the survivors
  itself, and a thread of every process asks it for the live processes (`get_live_nodes`)
  every second. A process found missing that did not say it was leaving ends every
  survivor with `error: process K of N was lost (...); ... Last good checkpoint: step S in
  DIR; ...` and status `LOST_PEER_STATUS` (75), whatever the main thread is blocked in (a
  collective, a checkpoint barrier, an evaluation). When process 0 itself dies, its
  service goes with it and JAX's client on every other process aborts (`abort.py` writes
  the same line first).
- **Stalled.** A process can be alive (its heartbeats come from a C++ thread) and make no
  progress: a data loader or a file read that never returns, a deadlock. The main thread
  of every process marks its progress (`progress(step)` after fetching each batch,
  `tick()` at each evaluation batch); the same thread publishes it in the key-value store
  once a second. When no process's mark has moved for `config.stall_timeout_s` seconds
  (counted once every process has finished its first update, so the first compilation
  does not count), the processes at the lowest update are the stuck ones (all of them
  when every process is at the same update: a collective or the devices hung). Every
  process then ends with `error: process K of N stalled (alive, but no progress for Ts
  ...); ... Last good checkpoint: ...` and status 75, the stuck ones included: the
  scheduler restarts them all and the run resumes from that checkpoint.
- **An orderly end.** A process that ends (normally, preempted, or with an error) says so
  in the key-value store (`leave`) and waits, at most the timeout, until every process has;
  a process still training when a peer ended with an error stops too, naming it (status
  1). Then the processes other than 0 disconnect and process 0, whose service the others
  talk to, disconnects last.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import jax

from transformer.data.files import one_line
from transformer.train.checkpoints.storage import describe_latest
from transformer.train.guard import abort

LOST_PEER_STATUS = 75  # exit status of the survivors of a lost process (EX_TEMPFAIL)
POLL_S = 1.0  # how often the watch asks for the live processes
KEYS = "transformer"  # key-value store namespace


def last_good_checkpoint(directory: Any) -> str:
  """'step N in DIR' (the newest committed step), 'none in DIR', or why it is unknown;
  bounded to a few seconds (the storage may be what failed)."""
  if directory is None:
    return "unknown (no workdir given)"
  latest = describe_latest(directory, seconds=5.0)
  return latest if latest.startswith("unknown") else f"{latest} in {directory}"


@dataclasses.dataclass
class Group:
  """This process's view of the run's processes (see the module docstring)."""

  client: Any
  me: int
  count: int
  coordinator: str
  timeout: int
  stall_timeout: int = 0  # 0: no stall watch
  checkpoint_dir: Any = None
  leaving: bool = False  # this process is ending
  announced: bool = False  # ... and said so in the key-value store
  exit_status: int = 0  # what it ends with
  step: int = -1  # the update the main thread is on (-1: not training yet)
  first: int = -1  # the first update it was on in this run (-1: not training yet)
  moves: int = 0  # the main thread's marks of progress
  _published: str = ""
  _seen: dict[int, str] = dataclasses.field(default_factory=dict)
  _moved_at: float = 0.0  # time.monotonic() of the last mark seen to move
  _reporting: threading.Lock = dataclasses.field(default_factory=threading.Lock)
  _stop: threading.Event = dataclasses.field(default_factory=threading.Event)
  _watch: threading.Thread | None = None

  def start_watch(self) -> None:
    self._watch = threading.Thread(target=self._run_watch, name="peer-watch", daemon=True)
    self._watch.start()
    if self.me != 0:
      abort.arm(self)

  # -- reports (once per process; the first one exits it) ------------------------------

  def _exit_with(
    self, line: str, status: int, announce: str | None = None, linger: float = 0.0
  ) -> None:
    """Writes `line` and exits with `status`; with `linger`, that many seconds later, the
    watch still answering the others' rendezvous meanwhile (`get_live_nodes` waits for
    every live process), so that they report what this process saw rather than its loss."""
    if not self._reporting.acquire(blocking=False):
      if threading.current_thread() is self._watch:
        return  # the exit is on its way: keep answering the rendezvous until then
      while True:  # another thread is reporting and exiting
        time.sleep(1.0)
    if announce is not None:
      self._announce(announce, quiet=True)
    sys.stdout.flush()
    os.write(2, (line + "\n").encode())
    if linger:
      exit_later = lambda: (time.sleep(linger), os._exit(status))  # noqa: E731
      threading.Thread(target=exit_later, name="exit", daemon=True).start()
      return
    os._exit(status)

  def _last_good(self) -> str:
    return f"Last good checkpoint: {last_good_checkpoint(self.checkpoint_dir)}"

  def report_lost(self, lost: list[int]) -> None:
    if lost == [0] and self.me != 0:
      who = f"process 0 of {self.count} (the coordinator, {self.coordinator})"
      why = "its coordination service no longer answers: killed, crashed, or its host is down"
    else:
      who = f"process {', '.join(map(str, lost))} of {self.count}"
      why = f"no heartbeat for {self.timeout}s: killed, crashed, or its host is down"
    self._exit_with(
      f"error: {who} was lost ({why}); process {self.me} stops too. {self._last_good()}; "
      f"start all {self.count} processes again with the same command to resume from it",
      LOST_PEER_STATUS,
    )

  def report_stalled(self, steps: dict[int, int]) -> None:
    low, high = min(steps.values()), max(steps.values())
    stuck = sorted(i for i, step in steps.items() if step == low)
    if low == high:
      why = f"no process made progress for {self.stall_timeout}s, all at update {low}"
    else:
      ahead = sorted(i for i, step in steps.items() if step == high)
      why = (
        f"alive, but no progress for {self.stall_timeout}s at update {low} while process "
        f"{', '.join(map(str, ahead))} reached update {high}"
      )
    stops = "it stops" if self.me in stuck else f"process {self.me} stops too"
    self._exit_with(
      f"error: process {', '.join(map(str, stuck))} of {self.count} stalled ({why}); "
      f"{stops}. {self._last_good()}; start all {self.count} processes again with the same "
      "command to resume from it",
      LOST_PEER_STATUS,
      linger=10 * POLL_S if self.me in stuck else 0.0,  # the others see the stall first
    )

  def report_stopped(self, stopped: dict[int, str]) -> None:
    index, why = min(stopped.items())
    self._exit_with(
      f"error: process {index} of {self.count} stopped ({why}); process {self.me} stops "
      f"too. {self._last_good()}; fix that and start all {self.count} processes again to "
      "resume from it",
      1,
      announce=f"stopped because process {index} did",
    )

  # -- the watch -------------------------------------------------------------------------

  def _entries(self, folder: str) -> dict[int, str]:
    return {
      int(key.rsplit("/", 1)[-1]): value
      for key, value in self.client.key_value_dir_get(f"{KEYS}/{folder}/")
    }

  def _watch_progress(self, ending: bool) -> None:
    """Publishes this process's mark (update, moves, first update); reports the stuck
    ones when no mark has moved for the stall timeout (module docstring), unless some
    process is `ending` the run. The count starts once every process is past its first
    update, as its own mark says: a process may publish for the first time already stuck
    (a first update loaded from the compilation cache takes less than a poll)."""
    mine = f"{self.step} {self.moves} {self.first}"
    if self.step >= 0 and mine != self._published:
      self.client.key_value_set(f"{KEYS}/progress/{self.me}", mine, allow_overwrite=True)
      self._published = mine
    seen, now = self._entries("progress"), time.monotonic()
    if seen != self._seen:
      self._seen, self._moved_at = seen, now
      return
    past_first = [int(mark.split()[0]) > int(mark.split()[2]) for mark in seen.values()]
    armed = len(seen) == self.count and all(past_first)
    if armed and not ending and now - self._moved_at >= self.stall_timeout:
      self.report_stalled({i: int(mark.split()[0]) for i, mark in seen.items()})

  def _run_watch(self) -> None:
    everyone = list(range(self.count))
    while True:
      try:
        live = set(self.client.get_live_nodes(everyone))  # a rendezvous of the live ones
        said = self._entries("leaving")
        if self.stall_timeout:
          self._watch_progress(ending=self.leaving or bool(said))
      except Exception:
        if self.announced or self._stop.is_set():
          return  # this process's client is shutting down
        if self.me != 0:
          self.report_lost([0])
        return  # process 0 cannot lose its own service
      if self._stop.is_set():
        return
      if self._reporting.locked():  # reported; exiting soon (`_exit_with`'s linger)
        self._stop.wait(POLL_S)
        continue
      lost = [i for i in everyone if i not in live and i not in said]
      if lost:
        self.report_lost(lost)
      errors = {i: why for i, why in said.items() if i != self.me and why != "ok"}
      if errors and not self.leaving:
        self.report_stopped(errors)
      if self.me == 0 and self.leaving and live == {0}:
        return  # the others have disconnected
      self._stop.wait(POLL_S)

  # -- the orderly end -------------------------------------------------------------------

  def _announce(self, status: str, quiet: bool = False) -> None:
    try:
      self.client.key_value_set(f"{KEYS}/leaving/{self.me}", status, allow_overwrite=True)
      self.announced = True
    except Exception:
      if not quiet and self.me != 0:
        self.report_lost([0])  # the coordinator is gone
      if not quiet:
        raise

  def leave(self, status: str | None, wait: bool = True) -> None:
    """Says this process is ending (`status`: None = normally, else why) and, with `wait`,
    waits for the others to say so too, then disconnects in order (module docstring)."""
    if self.leaving:
      return
    self.leaving = True
    self.exit_status = 0 if status is None else 1
    self._announce(status or "ok")
    if not wait:
      return
    deadline = time.monotonic() + self.timeout
    while time.monotonic() < deadline:
      try:
        if len(self._entries("leaving")) == self.count:
          break
      except Exception:  # the service is gone: process 0 was lost
        if self.me != 0:
          self.report_lost([0])
        raise
      time.sleep(0.1)
    if self.me != 0:
      self._stop.set()
      try:
        jax.distributed.shutdown()  # before process 0 stops the service
      except Exception:  # the service went first: nothing left to disconnect from
        pass
      if self._watch is not None:  # its call fails now; a thread left in C++ would abort
        self._watch.join(10.0)  # the interpreter's exit
      abort.disarm()
      return
    if self._watch is not None:  # returns once the others have disconnected
      self._watch.join(min(self.timeout, 60))
    else:  # refused before the watch started: wait for that here
      while time.monotonic() < deadline + 60:
        if set(self.client.get_live_nodes(list(range(self.count)))) == {0}:
          break
        time.sleep(0.05)
    self._stop.set()


_GROUP: Group | None = None  # this process's, once `join` ran (several processes only)


def join(client: Any, coordinator: str, timeout: int, stall: int, workdir: str | None) -> Group:
  """This process's `Group` of the run just started (`startup.maybe_initialize`); it leaves
  at interpreter exit if nothing made it leave before."""
  global _GROUP
  _GROUP = Group(
    client, jax.process_index(), jax.process_count(), coordinator, timeout, stall,
    os.path.join(workdir, "checkpoints") if workdir else None,
  )  # fmt: skip
  atexit.register(_leave_at_exit)  # runs before JAX's own shutdown (registered earlier)
  return _GROUP


def _leave_at_exit() -> None:
  """At interpreter exit, for a process that did not leave through `watching` (an error
  before or outside the training run, or a refused config)."""
  if _GROUP is not None and not _GROUP.leaving:
    _GROUP.leave("it stopped before training (see its output)")


@contextlib.contextmanager
def watching(checkpoint_dir: Any) -> Iterator[None]:
  """Around a training run on several processes: names `checkpoint_dir` in the lost-peer
  line, and leaves in order at the end (an error: saying why). Does nothing on one."""
  g = _GROUP
  if g is None:
    yield
    return
  g.checkpoint_dir = checkpoint_dir
  try:
    yield
  except BaseException as e:
    g.leave(one_line(e))
    raise
  g.leave(None)


def progress(step: int) -> None:
  """The main thread is on update `step` (it fetched its batch); several processes only."""
  if _GROUP is not None:
    _GROUP.first = step if _GROUP.first < 0 else _GROUP.first
    _GROUP.step = step
    _GROUP.moves += 1


def tick() -> None:
  """The main thread moved on within an update (an evaluation batch, a phase)."""
  if _GROUP is not None:
    _GROUP.moves += 1


def leave_now(status: str | None) -> None:
  """Before `os._exit` on several processes: says this process is ending, without waiting."""
  if _GROUP is not None:
    _GROUP.leave(status, wait=False)

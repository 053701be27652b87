"""Multi-host start-up, the same config everywhere, and no silent hang when a peer is lost.

`maybe_initialize(config, workdir)` runs `jax.distributed.initialize()` when the
environment asks for it:

- TRANSFORMER_COORDINATOR (host:port of process 0), TRANSFORMER_NUM_PROCESSES and
  TRANSFORMER_PROCESS_ID: an explicit run (any cluster, and the CPU tests);
- TRANSFORMER_DISTRIBUTED=1: JAX's own cluster detection (Cloud TPU pod slices through the
  VM metadata, Slurm through the job step's SLURM_* variables).

Every process then prints one line to stderr (`distributed: process I of N, coordinator
HOST:PORT, D local device(s), peers timeout Ts`). Explicit variables that are missing, not
integers or out of range, and TRANSFORMER_DISTRIBUTED=1 where JAX detects no cluster, end
the run in one `error:` line (status 1) instead of a traceback. CPU collectives use gloo.
docs/SCALING.md (section "Many hosts") shows the commands; tests/test_scaling_commands.py
runs them.

Then, before anything is built:

- **The same config on every process.** Each process publishes its flattened config and
  workdir in JAX's distributed key-value store and reads everyone's; any difference ends
  every process with one line naming the field(s) and the values (status 1), before a
  collective could hang on mismatched shapes.
- **A watch over the peers** (docs/RELIABILITY.md, "Many hosts"). JAX's coordination
  service declares a process dead when it sends no heartbeat for
  `config.distributed_timeout_s` seconds (`heartbeat_timeout_seconds`). It runs in
  recoverable mode (`jax_enable_recoverability`): the service does not abort the
  survivors itself, and a thread of every process asks it for the live processes
  (`get_live_nodes`) every second. A process found missing that did not say it was
  leaving ends every survivor with `error: process K of N was lost (...); ... Last good
  checkpoint: step S in DIR; ...` and status `LOST_PEER_STATUS` (75), whatever the main
  thread is blocked in (a collective, a checkpoint barrier, an evaluation). When process 0
  itself dies, its service goes with it and JAX's client on every other process aborts at
  once ("Terminating process because the JAX distributed service detected fatal
  errors"); a SIGABRT handler installed here (through ctypes: abort() never returns to
  Python) checks that the coordinator's port no longer answers and writes the same line
  first, with status 75.
- **An orderly end.** A process that ends (normally, preempted, or with an error) says so
  in the key-value store (`leave`) and waits, at most the timeout, until every process has;
  a process still training when a peer ended with an error stops too, naming it (status
  1). Then the processes other than 0 disconnect and process 0, whose service the others
  talk to, disconnects last.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import dataclasses
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import jax

from transformer.data.files import one_line
from transformer.train import same_config

_EXPLICIT = ("TRANSFORMER_COORDINATOR", "TRANSFORMER_NUM_PROCESSES", "TRANSFORMER_PROCESS_ID")
DEFAULT_TIMEOUT_S = 180  # seconds without a peer's heartbeat before it counts as lost
LOST_PEER_STATUS = 75  # exit status of the survivors of a lost process (EX_TEMPFAIL)
POLL_S = 1.0  # how often the watch asks for the live processes
_KEYS = "transformer"  # key-value store namespace


def _fail(message: str) -> None:
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(1)


def _explicit_arguments(coordinator: str) -> dict:
  missing = [name for name in _EXPLICIT[1:] if not os.environ.get(name)]
  if missing:
    verb = "are" if len(missing) > 1 else "is"
    _fail(f"TRANSFORMER_COORDINATOR={coordinator} is set but {' and '.join(missing)} {verb} not")
  try:
    count, index = (int(os.environ[name]) for name in _EXPLICIT[1:])
  except ValueError:
    values = ", ".join(f"{name}={os.environ[name]!r}" for name in _EXPLICIT[1:])
    _fail(f"TRANSFORMER_NUM_PROCESSES and TRANSFORMER_PROCESS_ID must be integers: {values}")
  if not 0 <= index < count:
    _fail(
      f"TRANSFORMER_PROCESS_ID={index} is not in 0 .. {count - 1} "
      f"(TRANSFORMER_NUM_PROCESSES={count})"
    )
  return {"coordinator_address": coordinator, "num_processes": count, "process_id": index}


def timeout_of(config: Any) -> int:
  """`config.distributed_timeout_s` (an int >= 1; the default when absent)."""
  value = DEFAULT_TIMEOUT_S if config is None else config.get("distributed_timeout_s")
  value = DEFAULT_TIMEOUT_S if value is None else value
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    _fail(f"config.distributed_timeout_s={value!r}: must be an int >= 1 (seconds)")
  return value


def maybe_initialize(config: Any = None, workdir: str | None = None) -> None:
  """Initialises jax.distributed if the environment describes a multi-process run, checks
  that every process has the same `config` and `workdir`, and starts the watch over the
  peers (module docstring)."""
  coordinator = os.environ.get("TRANSFORMER_COORDINATOR")
  auto = os.environ.get("TRANSFORMER_DISTRIBUTED") == "1"
  if not (coordinator or auto):
    return
  timeout = timeout_of(config)
  # Collectives between CPU processes (tests, CPU clusters) go through gloo.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  # The service reports a lost process instead of aborting the survivors (our watch does).
  jax.config.update("jax_enable_recoverability", True)
  timeouts = {"heartbeat_timeout_seconds": timeout, "shutdown_timeout_seconds": timeout}
  if coordinator:
    arguments = _explicit_arguments(coordinator)
    try:
      jax.distributed.initialize(**arguments, **timeouts)
    except Exception as e:  # the coordinator never answered, or a peer never came
      _fail(f"could not start the {arguments['num_processes']} processes through the "
            f"coordinator {coordinator}: {one_line(e)}")  # fmt: skip
  else:
    try:
      jax.distributed.initialize(**timeouts)  # Cloud TPU / Slurm auto-detection
    except ValueError as e:  # nothing detected: no coordinator, process count or index
      _fail(
        f"TRANSFORMER_DISTRIBUTED=1 but JAX detected no cluster (a Cloud TPU pod slice or a "
        f"Slurm job step) to take the processes from ({e}); elsewhere set "
        f"{', '.join(_EXPLICIT)} on every process"
      )
  from jax._src import distributed as jax_distributed  # the client and detected address

  state = jax_distributed.global_state
  address = getattr(state, "coordinator_address", None) or coordinator
  print(
    f"distributed: process {jax.process_index()} of {jax.process_count()}, coordinator "
    f"{address}, {jax.local_device_count()} local device(s), peers timeout {timeout}s",
    file=sys.stderr,
    flush=True,
  )
  global _GROUP
  _GROUP = _Group(state.client, jax.process_index(), jax.process_count(), address, timeout)
  _GROUP.checkpoint_dir = os.path.join(workdir, "checkpoints") if workdir else None
  atexit.register(_leave_at_exit)  # runs before JAX's own shutdown (registered earlier)
  if config is not None:  # the same config on every process, before anything is built
    problem = same_config.disagreement(
      _GROUP.client, _GROUP.me, _GROUP.count, _GROUP.timeout, f"{_KEYS}/config", config, workdir
    )
    if problem:
      _fail(problem)
  _GROUP.start_watch()


# ----------------------------------------------------------------------------------------
# The watch over the peers, and the orderly end.


def last_good_checkpoint(directory: Any) -> str:
  """'step N in DIR' (the newest committed step), 'none in DIR', or why it is unknown;
  bounded to a few seconds (the storage may be what failed)."""
  if directory is None:
    return "unknown (no workdir given)"
  from transformer.train.checkpoints import describe_latest  # orbax: only on this path

  latest = describe_latest(directory, seconds=5.0)
  return latest if latest.startswith("unknown") else f"{latest} in {directory}"


@dataclasses.dataclass
class _Group:
  """This process's view of the run's processes (see the module docstring)."""

  client: Any
  me: int
  count: int
  coordinator: str
  timeout: int
  checkpoint_dir: Any = None
  leaving: bool = False  # this process is ending
  announced: bool = False  # ... and said so in the key-value store
  exit_status: int = 0  # what it ends with
  _reporting: threading.Lock = dataclasses.field(default_factory=threading.Lock)
  _stop: threading.Event = dataclasses.field(default_factory=threading.Event)
  _watch: threading.Thread | None = None

  def start_watch(self) -> None:
    self._watch = threading.Thread(target=self._run_watch, name="peer-watch", daemon=True)
    self._watch.start()
    if self.me != 0:
      _arm_abort_handler()

  # -- reports (once per process; the first one exits it) ------------------------------

  def _exit_with(self, line: str, status: int, announce: str | None = None) -> None:
    if not self._reporting.acquire(blocking=False):
      while True:  # another thread is reporting and exiting
        time.sleep(1.0)
    if announce is not None:
      self._announce(announce, quiet=True)
    sys.stdout.flush()
    os.write(2, (line + "\n").encode())
    os._exit(status)

  def report_lost(self, lost: list[int]) -> None:
    if lost == [0] and self.me != 0:
      who = f"process 0 of {self.count} (the coordinator, {self.coordinator})"
      why = "its coordination service no longer answers: killed, crashed, or its host is down"
    else:
      who = f"process {', '.join(map(str, lost))} of {self.count}"
      why = f"no heartbeat for {self.timeout}s: killed, crashed, or its host is down"
    self._exit_with(
      f"error: {who} was lost ({why}); process {self.me} stops too. Last good checkpoint: "
      f"{last_good_checkpoint(self.checkpoint_dir)}; start all {self.count} processes again "
      "with the same command to resume from it",
      LOST_PEER_STATUS,
    )

  def report_stopped(self, stopped: dict[int, str]) -> None:
    index, why = min(stopped.items())
    self._exit_with(
      f"error: process {index} of {self.count} stopped ({why}); process {self.me} stops "
      f"too. Last good checkpoint: {last_good_checkpoint(self.checkpoint_dir)}; fix that "
      f"and start all {self.count} processes again to resume from it",
      1,
      announce=f"stopped because process {index} did",
    )

  # -- the watch -------------------------------------------------------------------------

  def _announcements(self) -> dict[int, str]:
    return {
      int(key.rsplit("/", 1)[-1]): value
      for key, value in self.client.key_value_dir_get(f"{_KEYS}/leaving/")
    }

  def _run_watch(self) -> None:
    everyone = list(range(self.count))
    while True:
      try:
        live = set(self.client.get_live_nodes(everyone))  # a rendezvous of the live ones
        said = self._announcements()
      except Exception:
        if self.announced or self._stop.is_set():
          return  # this process's client is shutting down
        if self.me != 0:
          self.report_lost([0])
        return  # process 0 cannot lose its own service
      if self._stop.is_set():
        return
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
      self.client.key_value_set(f"{_KEYS}/leaving/{self.me}", status, allow_overwrite=True)
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
        if len(self._announcements()) == self.count:
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
      _disarm_abort_handler()
      return
    if self._watch is not None:  # returns once the others have disconnected
      self._watch.join(min(self.timeout, 60))
    else:  # refused before the watch started: wait for that here
      while time.monotonic() < deadline + 60:
        if set(self.client.get_live_nodes(list(range(self.count)))) == {0}:
          break
        time.sleep(0.05)
    self._stop.set()


_GROUP: _Group | None = None


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


def leave_now(status: str | None) -> None:
  """Before `os._exit` on several processes: says this process is ending, without waiting."""
  if _GROUP is not None:
    _GROUP.leave(status, wait=False)


# ----------------------------------------------------------------------------------------
# The coordinator's loss on the other processes: JAX's client aborts the process.

_SIGNAL_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_int)


def _coordinator_answers(address: str) -> bool:
  host, _, port = address.rpartition(":")
  try:
    socket.create_connection((host.strip("[]"), int(port)), timeout=2.0).close()
  except (OSError, ValueError):
    return False
  return True


@_SIGNAL_HANDLER
def _on_abort(signum: int) -> None:
  g = _GROUP
  if g is not None:
    if g.announced:  # this process was ending anyway: the coordinator ended first
      sys.stdout.flush()
      os._exit(g.exit_status)
    if not _coordinator_answers(g.coordinator):
      g.report_lost([0])
  _LIBC.signal(signal.SIGABRT, signal.SIG_DFL)  # any other abort: as before


_LIBC = ctypes.CDLL(None)
_LIBC.signal.restype = ctypes.c_void_p
_LIBC.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]


def _arm_abort_handler() -> None:
  _LIBC.signal(signal.SIGABRT, ctypes.cast(_on_abort, ctypes.c_void_p))


def _disarm_abort_handler() -> None:
  _LIBC.signal(signal.SIGABRT, signal.SIG_DFL)

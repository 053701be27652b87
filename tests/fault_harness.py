"""Fault-injection harness: train.py subprocesses killed at chosen moments.

Shared by tests/test_faults_kill_resume.py (a few trials) and benchmarks/kill_resume.py
(the 20-trial sweep). A `Run` is `python tests/traced_train.py --config
tests/tiny_lm_config.py ...`: train.py with a phase hook installed, so its stderr carries
`phase NAME STEP` lines (build,
restore, train, eval, save, finish); a reader thread timestamps every output line. A
kill is classified by the last phase line before it and by whether an orbax temporary
directory (an asynchronous checkpoint write in flight) existed at that moment.

For the faults of several hosts and of storage (tests/test_faults_multihost.py,
tests/test_faults_storage.py, `benchmarks/kill_resume.py --processes 2`):

  processes(n, workdir, env, *overrides, each=None, wrap=None)   n `jax.distributed`
      processes of one run on this machine (a fresh coordinator port)
  TWO_PROCESS_RUN   the overrides of the two-process fault runs (12 updates, every
      checkpoint kept); committed(workdir): the committed checkpoint steps
  pause_env(env, phase, release)   run as a script, this file is train.py with phase lines
      that stops at `phase` ("NAME STEP") until the file `release` exists
  SmallDisk(path, size)   a tmpfs of `size` mounted at `path` in a user + mount namespace of
      its own: a real disk that fills up (ENOSPC), resized to "free space"
  StorageEmulator(data_dir)   the Cloud Storage emulator on loopback, on disk, that can be
      told to die when the Nth request for some object arrives, and be restarted
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import numpy as np
from session_env import PATIENCE_S, xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_CONFIG = os.path.join(REPO, "tests", "tiny_lm_config.py")
TMP_SUFFIX = ".orbax-checkpoint-tmp"

# 40 updates of the tiny LM; checkpoints every 4 (async, the last 3 + the best kept),
# evaluation every 10: checkpoint writes and evaluations fill a good part of the time.
KILL_RUN = (
  "--config.num_train_steps=40",
  "--config.checkpoint_every=4",
  "--config.eval_every=10",
  "--config.eval_batches=4",
  "--config.log_every=5",
)


# 12 updates of a one-layer tiny LM on two processes: a checkpoint every 2 updates, all of
# them kept (a chain of faulted runs is compared with the reference step by step), an
# evaluation every 4; a lost process is noticed within DISTRIBUTED_TIMEOUT_S.
DISTRIBUTED_TIMEOUT_S = 5
TWO_PROCESS_RUN = (
  "--config.num_train_steps=12",
  "--config.checkpoint_every=2",
  "--config.eval_every=4",
  "--config.eval_batches=2",
  "--config.log_every=2",
  "--config.model.num_layers=1",
  "--config.keep_checkpoints=20",
  f"--config.distributed_timeout_s={DISTRIBUTED_TIMEOUT_S}",
)


def child_env(compile_cache: str | None = None, devices: int = 1) -> dict[str, str]:
  """The environment of a training subprocess: unbuffered, `devices` CPU devices (the
  caller's other XLA flags kept), and a persistent compilation cache: `compile_cache`, or
  the one the environment names (the test session's)."""
  env = dict(os.environ)
  env.update(PYTHONUNBUFFERED="1", XLA_FLAGS=xla_flags(devices), JAX_PLATFORMS="cpu")
  if compile_cache:
    env.update(
      JAX_COMPILATION_CACHE_DIR=compile_cache,
      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
  return env


def train_command(
  workdir: str, *overrides: str, script: str | None = None, config: str = TINY_CONFIG
) -> list[str]:
  """`train.py` with phase lines (tests/traced_train.py, or `script`) on the tiny LM (or
  `config`)."""
  return [
    sys.executable,
    script or os.path.join(REPO, "tests", "traced_train.py"),
    f"--config={config}",
    f"--workdir={workdir}",
    *overrides,
  ]


PAUSABLE = os.path.abspath(__file__)  # `train_command(..., script=PAUSABLE)` + `pause_env`


def pause_env(env: dict[str, str], phase: str, release: str) -> dict[str, str]:
  """`env` for a `PAUSABLE` run that prints `paused NAME STEP` at `phase` ("NAME STEP") and
  waits there (at most 300 s) until the file `release` exists."""
  return dict(env, FAULT_PAUSE_AT=phase, FAULT_PAUSE_RELEASE=release)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def processes(
  count: int,
  workdir: str,
  env: dict[str, str],
  *overrides: str,
  each: list[list[str]] | None = None,
  script: str | None = None,
  config: str = TINY_CONFIG,
  wrap: Callable[[list[str]], list[str]] | None = None,
  envs: list[dict[str, str]] | None = None,
) -> list[Run]:
  """The `count` processes of one run (explicit TRANSFORMER_* variables, a fresh port);
  `each[i]`: more overrides for process i; `envs[i]`: more variables for process i;
  `script`, `config`: as `train_command`'s; `wrap`: applied to each command (`SmallDisk`)."""
  port = free_port()
  runs = []
  for i in range(count):
    variables = dict(
      env,
      **(envs[i] if envs else {}),
      TRANSFORMER_COORDINATOR=f"127.0.0.1:{port}",
      TRANSFORMER_NUM_PROCESSES=str(count),
      TRANSFORMER_PROCESS_ID=str(i),
    )
    more = each[i] if each else []
    cmd = train_command(workdir, *overrides, *more, script=script, config=config)
    runs.append(Run(wrap(cmd) if wrap else cmd, variables))
  return runs


def committed(workdir: str) -> list[int]:
  """The committed checkpoint steps of the run in `workdir`."""
  from transformer.train.checkpoints import committed_steps  # the harness alone stays light

  return committed_steps(os.path.join(workdir, "checkpoints"))


def error_lines(run: Run) -> list[str]:
  """The run's `error:` lines."""
  return [line for line in run.output().splitlines() if line.startswith("error:")]


class Run:
  """A training subprocess whose output lines are read, timestamped, as they come."""

  def __init__(self, cmd: list[str], env: dict[str, str]):
    self.started = time.monotonic()
    self.proc = subprocess.Popen(
      cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO
    )
    self.lines: list[tuple[float, str]] = []
    self._changed = threading.Condition()
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  def _read(self) -> None:
    for line in self.proc.stdout:
      with self._changed:
        self.lines.append((time.monotonic(), line.rstrip("\n")))
        self._changed.notify_all()
    with self._changed:
      self._changed.notify_all()

  def wait_for(self, predicate: Callable[[str], bool], timeout: float = PATIENCE_S) -> float:
    """Blocks until an output line satisfies `predicate`; returns its time."""
    deadline = time.monotonic() + timeout
    seen = 0
    with self._changed:
      while True:
        for t, line in self.lines[seen:]:
          if predicate(line):
            return t
        seen = len(self.lines)
        if self.proc.poll() is not None and not self._reader.is_alive():
          raise RuntimeError(f"the run ended (status {self.proc.returncode}):\n{self.output()}")
        if time.monotonic() > deadline:
          raise TimeoutError(f"no matching line within {timeout}s:\n{self.output()}")
        self._changed.wait(0.2)

  def phases(self) -> list[tuple[float, str, int]]:
    return [
      (t, line.split()[1], int(line.split()[2]))
      for t, line in list(self.lines)
      if line.startswith("phase ")
    ]

  def phase_at(self, t: float) -> str:
    """The last phase started at or before time `t` ('start' before the first)."""
    names = [name for when, name, _ in self.phases() if when <= t]
    return names[-1] if names else "start"

  def signal(self, sig: int) -> None:
    self.proc.send_signal(sig)

  def wait(self, timeout: float = PATIENCE_S) -> int:
    code = self.proc.wait(timeout)
    self._reader.join(timeout)
    return code

  def output(self) -> str:
    return "\n".join(line for _, line in list(self.lines))


def in_flight_writes(workdir: str) -> list[str]:
  """Orbax temporary directories: checkpoint writes not yet committed."""
  return glob.glob(os.path.join(workdir, "checkpoints", f"*{TMP_SUFFIX}*"))


def saved_steps(workdir: str) -> list[int]:
  folder = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(folder):
    return []
  return sorted(int(d) for d in os.listdir(folder) if d.isdigit())


def training_window(run: Run) -> tuple[float, float]:
  """(time of the first `phase train`, time of `phase finish`) of a finished run."""
  phases = run.phases()
  start = next(t for t, name, _ in phases if name == "train")
  end = next(t for t, name, _ in phases if name == "finish")
  return start, end


def interrupt(
  run: Run, workdir: str, delay: float, sig: int = signal.SIGKILL, since: float | None = None
) -> dict:
  """Sends `sig` to `run` `delay` seconds after its first `phase train` line (or after the
  time `since`); returns what the run was doing then: phase, whether a checkpoint write was
  in flight, exit status, the checkpoints on disk."""
  begun = since if since is not None else run.wait_for(lambda ln: ln.startswith("phase train"))
  time.sleep(max(0.0, begun + delay - time.monotonic()))
  writes = in_flight_writes(workdir)
  when = time.monotonic()
  finished = run.proc.poll() is not None
  if not finished:
    run.signal(sig)
  code = run.wait()
  phase = "exited" if finished else run.phase_at(when)
  if writes and not finished:
    phase += "+write"  # an asynchronous checkpoint write was in flight
  return {"phase": phase, "writes": writes, "code": code, "steps": saved_steps(workdir)}


def final_state(workdir: str) -> dict:
  """The newest checkpoint's whole train state as host arrays."""
  from transformer.train.checkpoints import CheckpointManager

  with CheckpointManager(os.path.join(workdir, "checkpoints"), async_save=False) as mngr:
    step = mngr.latest_step()
    return {"step": step, "state": mngr.restore_numpy(step)}


def source_fingerprint() -> str:
  """A hash of the package's source: runs compared bit for bit must run the same code."""
  digest = hashlib.sha256()
  for path in sorted(glob.glob(os.path.join(REPO, "transformer", "**", "*.py"), recursive=True)):
    with open(path, "rb") as f:
      digest.update(path.encode() + f.read())
  return digest.hexdigest()


def bit_equal(a, b) -> list[str]:
  """Paths of the leaves of two pytrees of arrays that differ in dtype, shape or bytes."""
  import jax

  flat_a = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(a)}
  flat_b = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(b)}
  bad = sorted(set(flat_a) ^ set(flat_b))
  for key in sorted(set(flat_a) & set(flat_b)):
    x, y = np.asarray(flat_a[key]), np.asarray(flat_b[key])
    if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
      bad.append(key)
  return bad


class SmallDisk:
  """A tmpfs of `size` (e.g. '2m') mounted at `path` inside a user + mount namespace held
  by a helper process: no root needed where the kernel allows unprivileged user
  namespaces. Commands run on it through `wrap(cmd)` (nsenter); this process reads it
  under `view(path)`; `resize(size)` grows it (space freed)."""

  def __init__(self, path: str, size: str):
    os.makedirs(path, exist_ok=True)
    self.path = path
    script = f'mount -t tmpfs -o size={size} tmpfs "{path}" && echo mounted && exec cat'
    self.holder = subprocess.Popen(
      ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    line = self.holder.stdout.readline().strip()
    if line != "mounted":
      self.close()
      raise OSError(f"cannot mount a tmpfs in a user namespace: {self.holder.stderr.read()}")

  @staticmethod
  def available() -> str | None:
    """None when this machine can make a SmallDisk, else why not."""
    if not (shutil.which("unshare") and shutil.which("nsenter")):
      return "unshare / nsenter (util-linux) are not installed"
    probe = subprocess.run(
      ["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True, text=True
    )
    return None if probe.returncode == 0 else f"no user namespaces: {probe.stderr.strip()}"

  def wrap(self, cmd: list[str]) -> list[str]:
    pid = str(self.holder.pid)
    return ["nsenter", "--target", pid, "--user", "--mount", "--preserve-credentials", *cmd]

  def view(self, path: str) -> str:
    """`path` (under the mount) as this process sees it (through /proc/PID/root)."""
    return f"/proc/{self.holder.pid}/root{os.path.abspath(path)}"

  def resize(self, size: str) -> None:
    subprocess.run(self.wrap(["mount", "-o", f"remount,size={size}", self.path]), check=True)

  def close(self) -> None:
    if self.holder.poll() is None:
      self.holder.stdin.close()
      self.holder.wait(10)


# The Cloud Storage emulator (gcp-storage-emulator) on 127.0.0.1, its objects on disk so
# that it can be killed and restarted. argv: port, bucket, data dir, and optionally a regex
# and a count N: when the Nth request whose URL (unquoted) matches the regex arrives, the
# emulator exits at once (status 3) without answering, as storage that goes away. Its media
# downloads lack the x-goog-generation header that tensorstore's gcs kvstore reads: the
# download handler is wrapped to add it (Cloud Storage sends it).
_EMULATOR = """
import os, re, sys, urllib.parse
from gcp_storage_emulator import server as emulator_server
from gcp_storage_emulator.handlers import objects

_download = objects.download

def download(request, response, storage, *args, **kwargs):
  try:
    obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    response["x-goog-generation"] = str(obj["generation"])
    response["x-goog-metageneration"] = str(obj["metageneration"])
  except Exception:
    pass
  return _download(request, response, storage, *args, **kwargs)

objects.download = download
port, bucket, data_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
pattern, count = (re.compile(sys.argv[4]), int(sys.argv[5])) if len(sys.argv) > 5 else (None, 0)
seen = [0]
_handle = emulator_server.Router.handle

def handle(self, method):
  url = urllib.parse.unquote(self._request_handler.path)
  if pattern is not None and pattern.search(url):
    seen[0] += 1
    if seen[0] >= count:
      print(f"dying at {method} {url}", flush=True)
      os._exit(3)
  return _handle(self, method)

emulator_server.Router.handle = handle
fresh = not os.path.exists(os.path.join(data_dir, ".cloudstorage"))
server = emulator_server.create_server(
  "127.0.0.1", port, in_memory=False, default_bucket=bucket if fresh else None, data_dir=data_dir
)
server.start()
print("ready", flush=True)
try:
  sys.stdin.read()
finally:
  server.stop()
"""


def storage_env(endpoint: str) -> dict[str, str]:
  """Every storage client of a subprocess pointed at the emulator at `endpoint`."""
  return {
    "STORAGE_EMULATOR_HOST": endpoint,  # gcsfs (etils.epath's gs:// backend)
    "TENSORSTORE_GCS_HTTP_URL": endpoint,  # tensorstore's gcs kvstore (orbax arrays)
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",  # no bucket-layout RPCs (no such API here)
    "GCE_METADATA_ROOT": "127.0.0.1:1",  # no credentials: fail the metadata probe at once
    "GOOGLE_CLOUD_PROJECT": "test",
  }


class StorageEmulator:
  """The emulator as a subprocess on a fixed port with its objects in `data_dir`."""

  BUCKET = "bucket"

  def __init__(self, data_dir: str):
    self.data_dir, self.port = data_dir, free_port()
    self.endpoint = f"http://127.0.0.1:{self.port}"
    self.proc: subprocess.Popen | None = None

  def start(self, die_at: tuple[str, int] | None = None) -> None:
    """Starts (or restarts) it; `die_at=(regex, N)`: it dies at the Nth matching request."""
    extra = [die_at[0], str(die_at[1])] if die_at else []
    self.proc = subprocess.Popen(
      [sys.executable, "-c", _EMULATOR, str(self.port), self.BUCKET, self.data_dir, *extra],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=subprocess.DEVNULL,
      text=True,
    )
    if self.proc.stdout.readline().strip() != "ready":
      raise RuntimeError(f"the storage emulator did not start (status {self.proc.wait()})")

  def wait_dead(self, timeout: float) -> str:
    """Blocks until it has died at its request; returns its last line (`dying at ...`)."""
    line = self.proc.stdout.readline().strip()
    self.proc.wait(timeout)
    return line

  def stop(self) -> None:
    if self.proc is not None and self.proc.poll() is None:
      self.proc.stdin.close()
      try:
        self.proc.wait(10)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait()


def _pausing_phase(name: str, step: int) -> None:
  """The phase hook of this file run as a script (see `pause_env`)."""
  print(f"phase {name} {step}", file=sys.stderr, flush=True)
  if os.environ.get("FAULT_PAUSE_AT") == f"{name} {step}":
    print(f"paused {name} {step}", file=sys.stderr, flush=True)
    release, deadline = os.environ["FAULT_PAUSE_RELEASE"], time.monotonic() + PATIENCE_S
    while not os.path.exists(release) and time.monotonic() < deadline:
      time.sleep(0.05)


if __name__ == "__main__":  # train.py with phase lines and an optional pause
  import traced_train

  traced_train.main(_pausing_phase)

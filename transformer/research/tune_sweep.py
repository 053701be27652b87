"""The Ray Tune side of sweeps (`research/sweep.py` plans them): connect, run, restore.

`run(plan, args, config, workdir)` starts a local Ray instance (or joins `--address`) and
runs one Tune trial per point, or `--num_samples` Optuna TPE suggestions. The experiment
lives in DIR/tune; when it is already there (a killed sweep rerun), `Tuner.restore` takes
it up: finished trials are kept, interrupted and failed ones continue.

A trial is `TrainTrial`, a class trainable around `TrialRun`:

  * the training run of its point is `python -m transformer.train_main ... --workdir
    DIR/<point>` in its own process (a fresh JAX per trial; the interpreter of the Ray
    worker, so an installed package works as well as a checkout), output appended to
    DIR/<point>/train.log;
  * `step()` tails DIR/<point>/metrics.jsonl and returns each new evaluation record as a
    result: {'step': N, 'eval/loss': ..., 'eval/accuracy': ..., 'train/loss': ...} (the
    latest value of every split/name), so schedulers act per evaluation;
  * when Tune stops the trial (ASHA), `cleanup()` sends the run SIGTERM and waits: the loop
    treats it as a preemption and saves a checkpoint. The class API is used because its
    `cleanup()` runs before the worker exits; a function trainable's thread is abandoned
    and the worker's exit kills its children without that grace;
  * a trial whose Ray node went away (the raylet that started its worker died: a killed
    sweep driver takes its local instance along) stops its run the same way rather than
    finish it unobserved;
  * a run that ends with exit status 0 at its last step gets DIR/<point>/done. A restarted
    trial whose run is done does not train again, and one that was interrupted resumes
    its training run from the run's own latest checkpoint (the point's workdir is
    a function of its overrides, the same in every invocation);
  * no Tune checkpoints are written (`save_checkpoint` would hold only which evaluations
    were reported): a restarted trial reports its log's evaluations again, which ASHA
    (rungs keyed by trial) and Optuna (one value per step) ignore.

`ResumableASHA` is ASHA on the `step` of the results whose rungs survive a restore: Tune
restores trials and the searcher but not the scheduler's rungs, so each trial added
replays the evaluations its workdir already holds.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import ray
from etils import epath
from ray import tune
from ray.tune.schedulers import AsyncHyperBandScheduler
from ray.tune.search.sample import Domain

from transformer.data.files import is_remote, write_atomic
from transformer.research.sweep_points import DONE, EXPERIMENT, is_done, point_name, train_command
from transformer.train.metric_writers import JSONL_NAME, read_jsonl

PID_FILE = "sweep_trial.json"  # in DIR/<point>: the host and pid of the running training run
STOP_GRACE_S = 60.0  # after SIGTERM: seconds the run gets to save before SIGKILL


# ----------------------------------------------------------------------------------------
# Points.


def _plain(value: Any) -> Any:
  """NumPy scalars (what samplers return) as Python numbers."""
  return value.item() if isinstance(value, np.generic) else value


def random_points(space: Mapping[str, Any], seed: int, num_samples: int) -> list[dict[str, Any]]:
  """`num_samples` points drawn from `space` with a generator seeded by `seed` (repeats
  dropped: each point is one workdir)."""
  rng = np.random.default_rng(seed)
  points: dict[str, dict[str, Any]] = {}
  for _ in range(num_samples):
    point = {
      k: _plain(v.sample(random_state=rng)) if isinstance(v, Domain) else v
      for k, v in space.items()
    }
    points.setdefault(point_name(point), point)
  if len(points) < num_samples:
    print(f"[sweep] random: {num_samples - len(points)} repeated sample(s) dropped", flush=True)
  return list(points.values())


def _optuna_search(seed: int, **kwargs: Any) -> Any:
  try:
    import optuna
    from ray.tune.search.optuna import OptunaSearch
  except ImportError as e:
    raise ValueError(f"--search tpe needs Optuna ({e}): pip install '.[sweep]'") from None
  optuna.logging.set_verbosity(optuna.logging.WARNING)
  logging.getLogger("ray.tune.search.optuna.optuna_search").setLevel(logging.ERROR)
  return OptunaSearch(seed=seed, **kwargs)


def tpe_points(space: Mapping[str, Any], args: Any, num_samples: int) -> list[dict[str, Any]]:
  """The first `num_samples` suggestions of the seeded TPE sampler, before any result:
  what a sweep with the same seed starts with (TPE samples at random, from its seed,
  until it has results)."""
  searcher = _optuna_search(
    args.seed, space={"point": dict(space)}, metric=args.metric, mode=args.mode
  )
  points = []
  for i in range(num_samples):
    suggested = searcher.suggest(f"dry_run_{i}")["point"]
    points.append({k: _plain(suggested.get(k, v)) for k, v in space.items()})
  return points


# ----------------------------------------------------------------------------------------
# Ray.


def _host_port(address: str) -> tuple[str, int]:
  rest = address.removeprefix("ray://")
  host, sep, port = rest.rpartition(":")
  if not sep or not host or not port.isdigit():
    raise ValueError(f"--address {address!r}: expected HOST:PORT, ray://HOST:PORT or auto")
  return host.strip("[]"), int(port)


def connect(address: str | None, num_cpus: int | None, timeout: float) -> None:
  """A local Ray instance for the sweep (address None), or the cluster at `address`.

  An address is first reached over TCP within `timeout` seconds: Ray itself waits for
  minutes before it gives up on an address where nothing answers."""
  quiet = dict(logging_level=logging.WARNING, configure_logging=True)
  os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # Ray reports no usage unless asked
  if address is None:
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **quiet)
    return
  if address != "auto":
    host, port = _host_port(address)
    try:
      socket.create_connection((host, port), timeout=timeout).close()
    except TimeoutError:
      raise ValueError(f"--address {address}: no answer within {timeout:g} s") from None
    except OSError as e:
      reason = e.strerror or str(e) or type(e).__name__
      raise ValueError(f"--address {address}: no Ray cluster reachable ({reason})") from None
  try:
    ray.init(address=address, **quiet)
  except (ConnectionError, RuntimeError, ValueError) as e:
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise ValueError(f"--address {address}: {first}") from None


def _check_resources(resources: Mapping[str, float], local: bool) -> None:
  """A per-trial request the cluster cannot meet at all: an error on the local instance (it
  would wait forever), a warning on a cluster (an autoscaler may add nodes)."""
  have = ray.cluster_resources()
  for name, amount in resources.items():
    key = {"cpu": "CPU", "gpu": "GPU"}.get(name, name)
    if amount > 0 and have.get(key, 0.0) < amount:
      known = ", ".join(f"{k}: {v:g}" for k, v in sorted(have.items()) if ":" not in k)
      line = f"resources per trial: {key} {amount:g} is more than the Ray cluster has ({known})"
      if local:
        raise ValueError(line)
      print(f"[sweep] warning: {line}", file=sys.stderr, flush=True)


def trial_name(trial: Any) -> str:
  return point_name(trial.config["point"])


def trial_dirname(trial: Any) -> str:
  return f"{point_name(trial.config['point'])[:100]}_{trial.trial_id}"


def run(
  plan: Mapping[str, Any], args: Any, config: str, workdir: str
) -> tuple[list[dict[str, Any]], dict[str, str]]:
  """Runs (or resumes) the sweep; returns its points (planned order; TPE's by name) and
  {point name: 'done' | 'stopped early' | 'failed' | 'not run'}."""
  resources = {"cpu": args.cpus_per_trial, "gpu": args.gpus_per_trial}
  resources.update(args.resources_per_trial or {})
  connect(args.address, args.num_cpus, args.connect_timeout)
  try:
    _check_resources(resources, local=args.address is None)
    trainable = tune.with_resources(TrainTrial, resources)
    experiment = os.path.join(workdir, EXPERIMENT)
    if tune.Tuner.can_restore(experiment):
      print(
        f"[sweep] restoring the Tune experiment in {experiment}: finished trials are kept, "
        "the others continue (their runs resume from their checkpoints)",
        flush=True,
      )
      tuner = tune.Tuner.restore(experiment, trainable, resume_errored=True)
    else:
      tuner = _new_tuner(plan, args, config, workdir, trainable, resources)
    grid = tuner.fit()
  finally:
    ray.shutdown()
  return _collect(grid, plan, workdir)


def _new_tuner(
  plan: Mapping[str, Any],
  args: Any,
  config: str,
  workdir: str,
  trainable: Any,
  resources: Mapping[str, float],
) -> tune.Tuner:
  gpus = float(resources.get("gpu", 0.0))
  settings = {
    "config": config,
    "workdir": workdir,
    "common": dict(plan["common"]),
    "num_train_steps": plan["num_train_steps"],
    "cwd": os.getcwd(),
    "metric": args.metric,
    "shared_accelerator": 0 < gpus < 1,  # several trials per GPU: no memory preallocation
  }
  search_alg, num_samples = None, 1
  if plan["search"] == "tpe":
    space, num_samples = dict(plan["space"]), plan["num_samples"]
    search_alg = _optuna_search(args.seed)  # metric and mode come from the TuneConfig
  else:
    space = tune.grid_search([dict(p) for p in plan["points"]])
  scheduler = None
  if args.scheduler == "asha":
    scheduler = ResumableASHA(
      workdir,
      max_t=plan["max_steps"],
      grace_period=plan["grace_period"],
      reduction_factor=args.reduction_factor,
    )
  return tune.Tuner(
    trainable,
    param_space={"point": space, "sweep": settings},
    tune_config=tune.TuneConfig(
      metric=args.metric,
      mode=args.mode,
      search_alg=search_alg,
      scheduler=scheduler,
      num_samples=num_samples,
      max_concurrent_trials=args.parallel or None,
      reuse_actors=False,  # a fresh worker per trial
      trial_name_creator=trial_name,
      trial_dirname_creator=trial_dirname,
    ),
    run_config=tune.RunConfig(
      name=EXPERIMENT,
      storage_path=workdir,
      failure_config=tune.FailureConfig(max_failures=args.max_failures),
      # No Tune checkpoints: the training checkpoints are in the point's workdir, and a
      # restarted trial reports its log's evaluations again (schedulers ignore repeats).
      checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=0, checkpoint_at_end=False),
      verbose=1,
    ),
  )


def _collect(grid: Any, plan: Mapping[str, Any], workdir: str):
  found: dict[str, tuple[dict[str, Any], Any]] = {}
  for result in grid:
    point = dict(result.config["point"])
    found[point_name(point)] = (point, result)
  names = [point_name(p) for p in plan.get("points", [])]
  order = [n for n in names if n in found] + sorted(n for n in found if n not in names)
  missing = [n for n in names if n not in found]
  if missing:  # a restored experiment runs the points it was started with
    print(
      f"[sweep] warning: the experiment in {os.path.join(workdir, EXPERIMENT)} has no trial "
      f"for {len(missing)} point(s) of this sweep ({', '.join(missing)}): start them in "
      "another --workdir",
      file=sys.stderr,
      flush=True,
    )
  status = {}
  for name in order:
    result = found[name][1]
    if result.error is not None:
      status[name] = "failed"
      lines = str(result.error).strip().splitlines() or [type(result.error).__name__]
      print(f"[sweep] {name}: failed: {lines[-1]}", file=sys.stderr, flush=True)
    elif is_done(os.path.join(workdir, name)):
      status[name] = "done"
    elif result.metrics and "step" in result.metrics:
      status[name] = "stopped early"
    else:
      status[name] = "not run"
  return [found[n][0] for n in order], status


# ----------------------------------------------------------------------------------------
# Trials.


class MetricsTail:
  """The records a growing metrics.jsonl gained since the last `read()`.

  A file that was replaced (a resumed run truncates its log) is read again from its start;
  the caller drops what it has seen. On object storage the whole file is read each time.
  """

  def __init__(self, path: str):
    self.path = path
    self._inode, self._offset, self._partial = None, 0, b""

  def read(self) -> list[dict[str, Any]]:
    if is_remote(self.path):
      return read_jsonl(self.path) if epath.Path(self.path).is_file() else []
    try:
      st = os.stat(self.path)
    except FileNotFoundError:
      return []
    if st.st_ino != self._inode or st.st_size < self._offset:
      self._inode, self._offset, self._partial = st.st_ino, 0, b""
    with open(self.path, "rb") as f:
      f.seek(self._offset)
      chunk = f.read()
    self._offset += len(chunk)
    *lines, self._partial = (self._partial + chunk).split(b"\n")
    records = []
    for line in lines:
      try:
        record = json.loads(line)
      except ValueError:
        continue
      if isinstance(record, dict):
        records.append(record)
    return records


def _running(pid: Any, workdir: str) -> bool:
  """Whether `pid` is alive and is a training run in `workdir` (pids are reused)."""
  if not isinstance(pid, int) or pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass
  try:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
      if f.read().rpartition(")")[2].split()[0] == "Z":
        return False
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      return f"--workdir={workdir}".encode() in f.read().split(b"\0")
  except (OSError, IndexError):
    return True  # no /proc: alive is all that can be told


class TrialRun:
  """One point's training run, its log and what of its metrics was reported."""

  def __init__(self, config: Mapping[str, Any]):
    sweep, self.point = config["sweep"], dict(config["point"])
    self.name = point_name(self.point)
    self.workdir = os.path.join(sweep["workdir"], self.name)
    overrides = {**sweep["common"], **self.point}
    self.total_steps = int(overrides.get("num_train_steps", sweep["num_train_steps"]))
    self.command = train_command(sweep["config"], self.workdir, overrides, python=sys.executable)
    self.cwd = sweep["cwd"] if os.path.isdir(sweep["cwd"]) else None
    self.shared_accelerator = sweep["shared_accelerator"]
    self.metric = sweep["metric"]  # every result must hold it (Tune checks)
    self.tail = MetricsTail(os.path.join(self.workdir, JSONL_NAME))
    self.poll_s = 5.0 if is_remote(self.workdir) else 0.25
    self.proc: subprocess.Popen | None = None
    self.log = None
    self.finished_before = False
    self.reported_step, self.reported_splits = -1, []  # the last evaluation reported
    self.max_step = -1
    self.latest: dict[str, float] = {}
    self.last_result: dict[str, Any] = {}
    self.pending: collections.deque = collections.deque()
    self.node = os.getppid()  # the raylet that started this worker

  # Tune checkpoint: which evaluations were reported.
  def state(self) -> dict[str, Any]:
    return {"reported_step": self.reported_step, "reported_splits": list(self.reported_splits)}

  def restore(self, state: Mapping[str, Any]) -> None:
    self.reported_step = int(state["reported_step"])
    self.reported_splits = list(state["reported_splits"])

  def next_result(self) -> dict[str, Any]:
    """The next evaluation as a Tune result; at the end, the last one with done=True."""
    if self.proc is None and not self.finished_before:
      if is_done(self.workdir):
        self.finished_before = True
        print(f"[sweep] {self.name}: finished before, not run again", flush=True)
      else:
        self._launch()
    while True:
      self._pull()
      if self.pending:
        return self.pending.popleft()
      if self.finished_before or self.proc.poll() is not None:
        self._pull()  # lines written just before the exit
        return self.pending.popleft() if self.pending else self._finish()
      if os.getppid() != self.node:  # the node is gone (a killed sweep): stop, do not finish
        self.stop()
        raise RuntimeError(f"{self.name}: the Ray node of this trial went away; run stopped")
      time.sleep(self.poll_s)

  def _pull(self) -> None:
    for record in self.tail.read():
      step, split = record.get("step"), record.get("split")
      if not isinstance(step, int) or not isinstance(split, str):
        continue
      self.max_step = max(self.max_step, step)
      for key, value in record.items():
        if key not in ("step", "split") and (value is None or isinstance(value, (int, float))):
          self.latest[f"{split}/{key}"] = math.nan if value is None else float(value)
      if split == "train":
        continue
      if step < self.reported_step or (
        step == self.reported_step and split in self.reported_splits
      ):
        continue  # reported before (a restarted trial reads the log from its start)
      if step > self.reported_step:
        self.reported_step, self.reported_splits = step, []
      self.reported_splits.append(split)
      if self.metric in self.latest:  # until the metric's split has been evaluated: wait
        self.last_result = {**self.latest, "step": step}
        self.pending.append(dict(self.last_result))

  def _finish(self) -> dict[str, Any]:
    if not self.finished_before:
      rc = self.proc.returncode
      self._close_log()
      if rc != 0:
        raise RuntimeError(
          f"{self.name}: training exited with status {rc}: {self._last_log_line()} "
          f"(log: {self.workdir}/train.log)"
        )
      if self.max_step < self.total_steps:
        raise RuntimeError(
          f"{self.name}: training stopped at step {self.max_step} of {self.total_steps} "
          "without being asked (preempted?); rerunning the sweep resumes it"
        )
      write_atomic(os.path.join(self.workdir, DONE), f"{time.time():.0f}\n")
      print(f"[sweep] {self.name}: done (step {self.max_step})", flush=True)
    if not self.last_result:
      logged = sorted(k for k in self.latest if not k.startswith("train/"))
      raise RuntimeError(
        f"{self.name}: the run logged no {self.metric!r} (its evaluations logged: "
        f"{', '.join(logged) or 'nothing'}); choose --metric among those"
      )
    return {**self.last_result, "done": True}

  def _launch(self) -> None:
    self._wait_for_earlier_run()
    log_path = _local_log(self.workdir)
    self.log = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 (closed in _close_log)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    self.log.write(f"[sweep] {started} launch: {shlex.join(self.command)}\n")
    self.log.flush()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if self.shared_accelerator:
      env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    self.proc = subprocess.Popen(
      self.command, stdout=self.log, stderr=subprocess.STDOUT, cwd=self.cwd, env=env
    )
    owner = {"host": socket.gethostname(), "pid": self.proc.pid, "started": started}
    write_atomic(os.path.join(self.workdir, PID_FILE), json.dumps(owner) + "\n")
    print(f"[sweep] {self.name}: started pid {self.proc.pid} ({self.workdir})", flush=True)

  def _wait_for_earlier_run(self) -> None:
    """A run left by an earlier sweep process in this workdir (saving after its SIGTERM,
    say) finishes first: two runs in one workdir are refused by the loop's lock."""
    try:
      owner = json.loads(epath.Path(self.workdir, PID_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
      return
    if not isinstance(owner, dict) or owner.get("host") != socket.gethostname():
      return  # another host: the loop's lock decides
    if _running(owner.get("pid"), self.workdir):
      print(f"[sweep] {self.name}: waiting for pid {owner['pid']} to leave it", flush=True)
      while _running(owner.get("pid"), self.workdir):
        time.sleep(0.5)

  def stop(self) -> None:
    """SIGTERM to a run still going (the loop saves a checkpoint), SIGKILL after the grace.
    A run past its last step is finishing (final evaluation, checkpoint): it is waited for."""
    if self.proc is not None and self.proc.poll() is None:
      finishing = self.max_step >= self.total_steps
      if not finishing:
        self.proc.send_signal(signal.SIGTERM)
        line = f"stopped at step {self.max_step} (SIGTERM: the run saves a checkpoint)"
        self.log.write(f"[sweep] {time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")
        self.log.flush()
        print(f"[sweep] {self.name}: {line}", flush=True)
      try:
        self.proc.wait(STOP_GRACE_S)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait()
      if finishing and self.proc.returncode == 0:
        write_atomic(os.path.join(self.workdir, DONE), f"{time.time():.0f}\n")
    self._close_log()

  def _close_log(self) -> None:
    if self.log is not None:
      self.log.close()
      _upload_log(self.log.name, self.workdir)
      self.log = None

  def _last_log_line(self) -> str:
    try:
      text = epath.Path(self.workdir, "train.log").read_bytes().decode("utf-8", "replace")
    except OSError:
      return "no log"
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


class TrainTrial(tune.Trainable):
  """A Tune trial: one point's training run (`TrialRun`), a result per evaluation."""

  def setup(self, config: dict[str, Any]) -> None:
    self._run = TrialRun(config)

  def step(self) -> dict[str, Any]:
    return self._run.next_result()

  def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
    del checkpoint_dir  # the training checkpoints live in the point's workdir
    return self._run.state()

  def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
    self._run.restore(checkpoint)

  def cleanup(self) -> None:
    self._run.stop()


def _local_log(point_dir: str) -> str:
  """Where a point's train.log is written while it runs: in the point's folder, or, on
  object storage (which cannot append), a local file uploaded when the run ends."""
  if is_remote(point_dir):
    fd, path = tempfile.mkstemp(prefix="train-", suffix=".log")
    os.close(fd)
    return path
  os.makedirs(point_dir, exist_ok=True)
  return os.path.join(point_dir, "train.log")


def _upload_log(local: str, point_dir: str) -> None:
  """Object storage: appends the local log of an ended run to its train.log."""
  if not is_remote(point_dir):
    return
  remote = epath.Path(point_dir, "train.log")
  before = remote.read_bytes() if remote.exists() else b""
  with open(local, "rb") as f:
    write_atomic(remote, before + f.read())
  os.remove(local)


class ResumableASHA(AsyncHyperBandScheduler):
  """ASHA over the results' `step` whose rungs survive a restored experiment: each trial
  added replays the evaluations its workdir's metrics.jsonl already holds (Tune restores
  trials and searcher, not the scheduler's state). Uses ASHA's bracket bookkeeping
  (`_trial_info`, `_metric_op`) of the pinned Ray version."""

  def __init__(self, workdir: str, **kwargs: Any):
    # A trial at max_t ends by itself (its run finishes and writes `done`); not stopped.
    super().__init__(time_attr="step", stop_last_trials=False, **kwargs)
    self._sweep_workdir = workdir

  def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
    super().on_trial_add(tune_controller, trial)
    split, _, key = self._metric.partition("/")
    path = os.path.join(self._sweep_workdir, point_name(trial.config["point"]), JSONL_NAME)
    if not epath.Path(path).is_file():
      return
    bracket = self._trial_info[trial.trial_id]
    for record in read_jsonl(path):
      value = record.get(key)
      if record.get("split") == split and isinstance(value, (int, float)):
        bracket.on_result(trial, record["step"], self._metric_op * value)

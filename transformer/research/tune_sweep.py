"""The Ray Tune side of sweeps (`research/sweep.py` plans them): connect, run, restore.

`run(plan, args, config, workdir)` starts a local Ray instance (or joins `--address`) and
runs one Tune trial per point, or `--num_samples` Optuna TPE suggestions. The experiment
lives in DIR/tune; when it is already there (a killed sweep rerun), `Tuner.restore` takes
it up: finished trials are kept, interrupted and failed ones continue.

A trial is `TrainTrial`, a class trainable around `TrialRun` (`research/trial_run.py`):

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

import logging
import os
import socket
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import ray
from etils import epath
from ray import tune
from ray.tune.schedulers import AsyncHyperBandScheduler
from ray.tune.search.sample import Domain

from transformer.data.files import read_jsonl
from transformer.research.sweep_points import EXPERIMENT, is_done, point_name
from transformer.research.trial_run import TrialRun
from transformer.train.metric_writers import JSONL_NAME

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

"""Hyperparameter sweeps: every point of a config's `sweep()` as a Ray Tune trial.

A config file may define, beside `get_config(arg=None)`,

  def sweep():            # or sweep(arg)
    return [{"schedule.learning_rate": lr} for lr in (3e-4, 1e-3)]

a list of override dicts (a grid, or a seeded random set: the list must be the same on
every call for resuming to work), and/or

  def search_space():     # or search_space(arg)
    from ray import tune  # inside the function: training itself does not need Ray
    return {"schedule.learning_rate": tune.loguniform(1e-4, 1e-2)}

Tune distributions (or constants) over config field paths, sampled by `--search random`
(seeded; drawn before the sweep starts) or `--search tpe` (Optuna's TPE sampler). Then

  python -m transformer.sweep --config configs/X.py[:arg] --workdir DIR [--cpus_per_trial 1]
      [--address HOST:PORT] [--scheduler asha] [--search grid|random|tpe --num_samples N]

runs each point as a Tune trial (`research/tune_sweep.py`) on a local Ray instance started
for the sweep (or on the cluster at `--address`): the ordinary training run
`python -m transformer.train_main --config configs/X.py --workdir DIR/<point>
--config.a.b=value ...` in its own process (output in DIR/<point>/train.log), its
evaluations reported to Tune as they are written, so `--scheduler asha` stops poor points
early (SIGTERM: the run saves a checkpoint). A finished run gets DIR/<point>/done.
Rerunning the same command after a kill restores the Tune experiment in DIR/tune: finished
trials are kept, interrupted ones resume their training runs from their checkpoints.

Afterwards (`research/sweep_results.py`): DIR/results.csv, DIR/results.md (overrides,
status and final evaluation metrics), DIR/sweep.png (the final `--metric` per point) and
DIR/curves.png (all runs' curves overlaid). `--dry_run` prints one command per point (to
launch elsewhere) and runs nothing; `--override` applies to every point. Bad input ends in
one line naming it.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

from transformer.data.files import is_remote
from transformer.research.sweep_points import point_name, train_command
from transformer.research.sweep_results import to_markdown, write_results
from transformer.train import config_files

SEARCHES = ("grid", "random", "tpe")
SCHEDULERS = ("fifo", "asha")
_METRIC = re.compile(r"^[A-Za-z0-9_]+/[A-Za-z0-9_]+$")
_INSTALL = "pip install -c requirements-lock.txt -e '.[sweep]'"


def load_module(config: str) -> tuple[ModuleType, str | None]:
  """The config file of `config` ('path.py[:arg]') as a module, and its arg."""
  path, _, arg = config.partition(":")
  if not os.path.isfile(path):
    raise ValueError(f"--config: no such file {path!r}")
  return config_files.load_module(path, "_sweep_config"), arg or None


def _call(fn: Any, arg: str | None) -> Any:
  return fn(arg) if inspect.signature(fn).parameters else fn()


def load_sweep(config: str) -> list[dict[str, Any]]:
  """The override dicts of `sweep()` in the config file `config` ('path.py[:arg]')."""
  module, arg = load_module(config)
  return sweep_points(module, arg, config.partition(":")[0])


def sweep_points(module: ModuleType, arg: str | None, path: str) -> list[dict[str, Any]]:
  fn = getattr(module, "sweep", None)
  if fn is None:
    raise ValueError(f"{path}: defines no sweep() function")
  points = [dict(p) for p in _call(fn, arg)]
  if not points:
    raise ValueError(f"{path}: sweep() returned no points")
  names = [point_name(p) for p in points]
  if len(set(names)) != len(names):
    raise ValueError(f"{path}: sweep() has duplicate points: {names}")
  return points


def search_space(module: ModuleType, arg: str | None, path: str) -> dict[str, Any]:
  """`search_space()` of the config module: {field path: Tune distribution or constant}."""
  fn = getattr(module, "search_space", None)
  if fn is None:
    raise ValueError(f"{path}: defines no search_space() function (needed by --search)")
  try:
    space = _call(fn, arg)
  except ImportError as e:  # `from ray import tune` without Ray
    raise ValueError(f"{path}: search_space() needs Ray Tune ({e}): {_INSTALL}") from None
  if not isinstance(space, Mapping) or not space:
    raise ValueError(f"{path}: search_space() must return a non-empty dict; got {space!r}")
  for key, value in space.items():
    if not isinstance(key, str):
      raise ValueError(f"{path}: search_space() keys are config field paths; got {key!r}")
    if isinstance(value, Mapping) and "grid_search" in value:
      raise ValueError(f"{path}: search_space() {key!r}: a grid belongs in sweep()")
  return dict(space)


def check_fields(config: Any, keys: Sequence[str], source: str) -> None:
  """Raises ValueError naming the first of `keys` ('a.b.c') that is not a field of `config`."""
  for key in keys:
    node = config
    for i, part in enumerate(key.split(".")):
      if not hasattr(node, "keys") or part not in node:
        where = ".".join(key.split(".")[:i]) or "the config"
        raise ValueError(f"{source}: {key!r} is not a config field ({where} has no {part!r})")
      node = node[part]


def _parse_override(text: str) -> tuple[str, str]:
  key, sep, value = text.partition("=")
  if not sep or not key:
    raise argparse.ArgumentTypeError(f"expected a.b=value; got {text!r}")
  return key.removeprefix("config."), value


def _parse_resources(text: str) -> dict[str, float]:
  try:
    value = json.loads(text)
  except ValueError:
    value = None
  ok = isinstance(value, dict) and all(
    isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
    for k, v in value.items()
  )
  if not ok:
    raise argparse.ArgumentTypeError(
      f'expected a JSON object of resource amounts >= 0, e.g. {{"cpu": 1, "TPU": 4}}; got {text!r}'
    )
  return {k: float(v) for k, v in value.items()}


class _Parser(argparse.ArgumentParser):
  """Bad flags end in one line (no usage block; --help has it)."""

  def error(self, message: str):
    self.exit(2, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
  p = _Parser(
    prog="python -m transformer.sweep",
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  add = p.add_argument
  add("--config", required=True, help="configs/X.py[:arg] defining sweep() / search_space()")
  add("--workdir", required=True, help="sweep directory (DIR/<point> per trial, DIR/tune)")
  add("--dry_run", action="store_true", help="print the training commands, run nothing")
  add("--override", type=_parse_override, action="append", default=[],
      help="a.b=value applied to every point (repeatable)")  # fmt: skip
  add("--search", choices=SEARCHES, default=None,
      help="grid: the sweep() points (default when sweep() exists); random / tpe: "
           "--num_samples points from search_space()")  # fmt: skip
  add("--num_samples", type=int, default=None, help="random / tpe: points (default 10)")
  add("--seed", type=int, default=0, help="random / tpe: sampler seed")
  add("--metric", default="eval/loss",
      help="split/name the scheduler, TPE and plot use (a bare name: eval/name)")  # fmt: skip
  add("--mode", choices=("min", "max"), default="min", help="whether --metric is minimised")
  add("--scheduler", choices=SCHEDULERS, default="fifo", help="asha: stop poor trials early")
  add("--grace_period", type=int, default=None,
      help="asha: steps before a trial can be stopped (default: the first evaluation)")  # fmt: skip
  add("--reduction_factor", type=float, default=2.0, help="asha: 1/fraction kept per rung")
  add("--parallel", type=int, default=0, help="most trials at a time (0: as resources allow)")
  add("--cpus_per_trial", type=float, default=1.0, help="CPUs reserved per trial")
  add("--gpus_per_trial", type=float, default=0.0, help="GPUs reserved per trial")
  add("--resources_per_trial", type=_parse_resources, default=None,
      help='JSON resources per trial, over the two above: \'{"cpu": 1, "TPU": 4}\'')  # fmt: skip
  add("--address", default=None,
      help="an existing Ray cluster (HOST:PORT, ray://HOST:PORT or auto); default: a "
           "local instance started for the sweep")  # fmt: skip
  add("--num_cpus", type=int, default=None, help="local instance: CPUs (default: all)")
  add("--connect_timeout", type=float, default=10.0, help="--address: seconds to reach it")
  add("--max_failures", type=int, default=0, help="retries of a failed trial (it resumes)")
  return p


def _plan(args: argparse.Namespace, module: ModuleType, arg: str | None) -> dict[str, Any]:
  """What the sweep runs: the search, its points or space, checked against the config."""
  path = args.config.partition(":")[0]
  if not (hasattr(module, "sweep") or hasattr(module, "search_space")):
    raise ValueError(f"{path}: defines neither sweep() nor search_space()")
  search = args.search or ("grid" if hasattr(module, "sweep") else "random")
  common = dict(args.override)
  if search == "grid" and args.num_samples is not None:
    raise ValueError("--num_samples applies to --search random|tpe, not to the sweep() grid")
  num_samples = 10 if args.num_samples is None else args.num_samples
  if num_samples < 1:
    raise ValueError(f"--num_samples must be >= 1; got {num_samples}")
  if not hasattr(module, "get_config"):
    raise ValueError(f"{path}: defines no get_config() function")
  base = _call(module.get_config, arg)
  check_fields(base, list(common), "--override")
  plan: dict[str, Any] = {"search": search, "common": common, "num_samples": num_samples}
  if search == "grid":
    plan["points"] = sweep_points(module, arg, path)
    for point in plan["points"]:
      check_fields(base, list(point), f"{path}: sweep()")
  else:
    plan["space"] = search_space(module, arg, path)
    check_fields(base, list(plan["space"]), f"{path}: search_space()")
  plan["num_train_steps"] = _as_int(
    common.get("num_train_steps", base.num_train_steps), "num_train_steps"
  )
  steps = [plan["num_train_steps"]]
  steps += [
    _as_int(p["num_train_steps"], "num_train_steps")
    for p in plan.get("points", [])
    if "num_train_steps" in p
  ]
  plan["max_steps"] = max(steps)
  every = _as_int(common.get("eval_every", base.eval_every), "eval_every")
  plan["grace_period"] = args.grace_period or min(every or plan["max_steps"], plan["max_steps"])
  return plan


def _as_int(value: Any, what: str) -> int:
  try:
    return int(value)
  except (TypeError, ValueError):
    raise ValueError(f"{what}: expected an integer; got {value!r}") from None


def _tune_sweep():
  """The Ray side (`research/tune_sweep.py`), or ValueError when Ray Tune is not installed."""
  try:
    from transformer.research import tune_sweep
  except ImportError as e:
    raise ValueError(f"sweeps run on Ray Tune, which is not installed ({e}): {_INSTALL}") from None
  return tune_sweep


def main(argv: Sequence[str] | None = None) -> int:
  parser = _parser()
  args = parser.parse_args(argv)
  for name in ("parallel", "max_failures"):
    if getattr(args, name) < 0:
      parser.error(f"--{name} must be >= 0; got {getattr(args, name)}")
  if args.cpus_per_trial < 0 or args.gpus_per_trial < 0:
    parser.error("--cpus_per_trial and --gpus_per_trial must be >= 0")
  if "/" not in args.metric:  # a bare name, as before splits were named: the eval split
    args.metric = f"eval/{args.metric}"
  if not _METRIC.match(args.metric):
    parser.error(
      f"--metric must be split/name as the loop logs it (eval/loss); got {args.metric!r}"
    )
  if args.address is not None and args.num_cpus is not None:
    parser.error("--num_cpus sizes the local Ray instance; a cluster at --address has its own")
  if args.reduction_factor <= 1:
    parser.error(f"--reduction_factor must be > 1; got {args.reduction_factor}")
  try:
    module, arg = load_module(args.config)
    plan = _plan(args, module, arg)
    if plan["search"] == "random":  # drawn now: the points the sweep runs
      plan["points"] = _tune_sweep().random_points(plan["space"], args.seed, plan["num_samples"])
    elif plan["search"] == "tpe" and args.dry_run:
      plan["points"] = _tune_sweep().tpe_points(plan["space"], args, plan["num_samples"])
    if plan["grace_period"] < 1 or plan["grace_period"] > plan["max_steps"]:
      raise ValueError(f"--grace_period must be in [1, {plan['max_steps']}] (steps)")
  except ValueError as e:
    parser.exit(1, f"error: {e}\n")
  workdir = args.workdir.rstrip("/") if is_remote(args.workdir) else os.path.abspath(args.workdir)
  config = _trial_config_path(args.config)
  if args.dry_run:
    if plan["search"] == "tpe":
      print("# tpe: the first suggestions, before any result (later ones follow the results)")
    for point in plan["points"]:
      cmd = train_command(config, os.path.join(workdir, point_name(point)),
                          {**plan["common"], **point}, python="python")  # fmt: skip
      print(shlex.join(cmd))
    return 0
  if not is_remote(workdir):
    os.makedirs(workdir, exist_ok=True)
  try:
    points, status = _tune_sweep().run(plan, args, config=config, workdir=workdir)
  except ValueError as e:
    parser.exit(1, f"error: {e}\n")
  out = write_results(workdir, points, status, args.metric)
  print(to_markdown(out["rows"]))
  print(f"[sweep] wrote {out['csv']}, {out['markdown']}, {out['plot']}, {out['curves']}")
  failed = [name for name, s in status.items() if s.startswith("failed")]
  if failed:
    print(f"[sweep] {len(failed)} point(s) failed: {', '.join(failed)}", file=sys.stderr)
  return 1 if failed else 0


def _trial_config_path(config: str) -> str:
  """`--config` for the trials: absolute when the file is here (trials run elsewhere)."""
  path, sep, arg = config.partition(":")
  return f"{os.path.abspath(path)}{sep}{arg}" if os.path.isfile(path) else config


if __name__ == "__main__":
  sys.exit(main())

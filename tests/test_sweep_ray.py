"""Sweeps on Ray Tune (`python -m transformer.sweep`): a real local Ray instance, real runs.

The end-to-end test runs four points of the tiny LM as Tune trials with ASHA (1 CPU per
trial, two at a time), SIGKILLs the sweep driver once a trial has finished and another
has a checkpoint (that run held with SIGSTOP meanwhile, so the kill finds it half-way on
any machine), reruns the same command and checks that the experiment was restored: the
finished trial was not run again, the interrupted one resumed its training run from its
checkpoint, and the clearly bad point (learning rate 1e-6) was stopped early. The other
tests are cheap: seeded sampling, the trial's log tailing, and the one-line errors.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from PIL import Image
from session_env import PATIENCE_S, xla_flags

from transformer.research import sweep, sweep_points, trial_run, tune_sweep

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(REPO, "tests", "tiny_lm_config.py")

# The tiny LM, 1 layer, a constant learning rate after 2 warmup steps, evaluated and
# checkpointed often. Points 1 and 2 are one run of 4 and of 24 steps: identical through
# step 4 (bit for bit), so ASHA stops neither at the rung they share (4). Point 3 learns
# nothing (learning rate 1e-6) and point 4 less than 1 and 2: ASHA stops both at their
# first evaluation (rungs at steps 4, 8, 16).
CONFIG = f"""
import runpy

_TINY = runpy.run_path({TINY!r})


def get_config(arg=None):
  config = _TINY["get_config"](arg)
  config.num_train_steps = 24
  config.eval_every = 4
  config.eval_batches = 1
  config.checkpoint_every = 8
  config.log_every = 4
  config.model.num_layers = 1
  config.schedule.kind = "constant"
  return config


def sweep():
  return [
    {{"schedule.learning_rate": 1e-2, "num_train_steps": 4}},
    {{"schedule.learning_rate": 1e-2}},
    {{"schedule.learning_rate": 1e-6}},
    {{"schedule.learning_rate": 3e-3}},
  ]


def search_space():
  from ray import tune

  return {{
    "schedule.learning_rate": tune.loguniform(1e-4, 1e-2),
    "model.d_ff": tune.choice([32, 64]),
    "seq_len": 16,
  }}
"""


def _config(tmp_path, text=CONFIG, name="sweep_config.py"):
  path = tmp_path / name
  path.write_text(text)
  return str(path)


def _env(tmp_path):
  env = dict(os.environ)
  env.update(
    XLA_FLAGS=xla_flags(1),  # one device per run
    JAX_PLATFORMS="cpu",
    PYTHONUNBUFFERED="1",
    RAY_USAGE_STATS_ENABLED="0",
  )
  return env


def _launches(point_dir):
  with open(os.path.join(point_dir, "train.log"), encoding="utf-8") as f:
    text = f.read()
  return text.count(" launch: "), text


def _checkpoint_steps(point_dir):
  folder = os.path.join(point_dir, "checkpoints")
  return [int(n) for n in os.listdir(folder) if n.isdigit()] if os.path.isdir(folder) else []


def _eval_steps(point_dir):
  """The steps of the run's evaluations, in log order ([0] before the first)."""
  steps = []
  with open(os.path.join(point_dir, "metrics.jsonl"), encoding="utf-8") as f:
    for line in f:
      if line.endswith("\n"):  # a line being written is left for the next look
        record = json.loads(line)
        steps += [record["step"]] if record["split"] == "eval" else []
  return steps or [0]


def _run_pid(point_dir):
  with open(os.path.join(point_dir, trial_run.PID_FILE), encoding="utf-8") as f:
    return json.load(f)["pid"]


def _size(path):
  with Image.open(path) as image:
    return image.size


def _signal(pid, sig, group=False):
  try:
    (os.killpg if group else os.kill)(pid, sig)
  except ProcessLookupError:
    pass


@pytest.mark.slow
def test_asha_sweep_killed_and_rerun_keeps_finished_trials(tmp_path):
  config = _config(tmp_path)
  workdir = tmp_path / "sweep"
  names = [sweep_points.point_name(p) for p in sweep.load_sweep(config)]
  short, long, bad, _ = (str(workdir / n) for n in names)
  cmd = [
    sys.executable, "-m", "transformer.sweep", f"--config={config}", f"--workdir={workdir}",
    "--scheduler=asha", "--num_cpus=2", "--cpus_per_trial=1", "--parallel=2",
    f"--override=compilation_cache_dir={tmp_path / 'compile_cache'}",
  ]  # fmt: skip
  env = _env(tmp_path)
  log_path = tmp_path / "first.log"
  with open(log_path, "w") as log:
    first = subprocess.Popen(
      cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True
    )
  deadline = time.monotonic() + PATIENCE_S

  def wait_for(condition):
    while not condition():
      assert first.poll() is None, f"the sweep ended before the kill:\n{log_path.read_text()}"
      assert time.monotonic() < deadline, log_path.read_text()
      time.sleep(0.1)

  paused = None
  try:
    # Point 2's run is held (SIGSTOP) once it has a checkpoint, until point 1 has finished:
    # then the driver is killed with point 2 half-way, whatever the machine's speed.
    wait_for(lambda: _checkpoint_steps(long))
    paused = _run_pid(long)
    os.kill(paused, signal.SIGSTOP)
    assert not sweep_points.is_done(long)
    wait_for(lambda: sweep_points.is_done(short))
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    # The Ray processes the driver started die with it (Ray ties them to it); end now what
    # lingers of them, in the driver's process group (the workers have their own groups).
    _signal(first.pid, signal.SIGKILL, group=True)
    _signal(paused, signal.SIGCONT)  # to meet its SIGTERM (or SIGKILL) from the dead node
    paused = None
    second = subprocess.run(
      cmd,
      cwd=REPO,
      env=env,
      capture_output=True,
      text=True,
      timeout=PATIENCE_S,
      start_new_session=True,
    )
  finally:
    if paused is not None:
      _signal(paused, signal.SIGCONT)
    if first.poll() is None:
      _signal(first.pid, signal.SIGKILL, group=True)
  out = second.stdout + second.stderr
  assert second.returncode == 0, out
  assert "restoring the Tune experiment" in second.stdout, out

  # The trial finished before the kill was not run again; the interrupted one resumed.
  launches, _ = _launches(short)
  assert launches == 1 and _eval_steps(short) == [4]
  launches, text = _launches(long)
  assert launches == 2 and "resumed from step" in text, text
  steps = _eval_steps(long)  # the log continues at the checkpoint: no step twice
  assert steps == sorted(set(steps)) and steps[-1] == 24 and sweep_points.is_done(long), steps

  with open(workdir / "results.csv") as f:
    rows = {r["point"]: r for r in csv.DictReader(f)}
  assert list(rows) == names
  assert rows[names[0]]["status"] == "done" and rows[names[0]]["step"] == "4"
  assert rows[names[1]]["status"] == "done" and rows[names[1]]["step"] == "24"
  assert rows[names[2]]["status"] == "stopped early", rows  # ASHA, at its first rung
  assert int(rows[names[2]]["step"]) < 24 and not sweep_points.is_done(bad)
  assert float(rows[names[1]]["eval_loss"]) < float(rows[names[2]]["eval_loss"])
  table = (workdir / "results.md").read_text()
  assert f"| {names[0]} | 0.01 | 4 | done | 4 |" in table, table
  assert _size(workdir / "sweep.png") == (800, 500)
  assert _size(workdir / "curves.png") == (1200, 450)
  assert os.path.isdir(workdir / sweep_points.EXPERIMENT)


def test_seeded_search_gives_the_same_points(tmp_path, capsys):
  config = _config(tmp_path)

  def dry_run(search, seed):
    args = ["--config", config, "--workdir", str(tmp_path / "w"), "--search", search]
    assert sweep.main(args + ["--num_samples", "4", "--seed", str(seed), "--dry_run"]) == 0
    return [line for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]

  for search in ("tpe", "random"):
    first = dry_run(search, seed=3)
    assert first == dry_run(search, seed=3) and first != dry_run(search, seed=4)
    assert len(first) == 4
    for line in first:
      flags = dict(a.split("=", 1) for a in line.split() if a.startswith("--config."))
      assert 1e-4 <= float(flags["--config.schedule.learning_rate"]) <= 1e-2
      assert flags["--config.model.d_ff"] in ("32", "64") and flags["--config.seq_len"] == "16"
  assert not os.path.exists(tmp_path / "w")  # ran nothing


def test_random_points_are_drawn_from_the_seed():
  from ray import tune

  space = {"a": tune.uniform(0, 1), "b": tune.choice(["x", "y"]), "c": 7}
  points = tune_sweep.random_points(space, seed=0, num_samples=3)
  assert points == tune_sweep.random_points(space, seed=0, num_samples=3)
  assert all(0 <= p["a"] <= 1 and p["b"] in ("x", "y") and p["c"] == 7 for p in points)
  assert type(points[0]["a"]) is float  # plain Python numbers in names and commands


def _one_line_error(capsys, argv, code=1):
  with pytest.raises(SystemExit) as exit_info:
    sweep.main(argv)
  err = capsys.readouterr().err.strip()
  assert exit_info.value.code == code and len(err.splitlines()) == 1, err
  return err


def test_bad_flags_are_one_line(tmp_path, capsys):
  argv = ["--config", _config(tmp_path), "--workdir", str(tmp_path / "w"), "--dry_run"]
  err = _one_line_error(capsys, [*argv, "--resources_per_trial", "[1]"], code=2)
  assert "--resources_per_trial: expected a JSON object" in err
  err = _one_line_error(capsys, [*argv, "--metric", "eval/lo ss"], code=2)
  assert "--metric must be split/name" in err
  err = _one_line_error(capsys, [*argv, "--override", "num_train_steps=many"])
  assert "num_train_steps: expected an integer; got 'many'" in err
  err = _one_line_error(capsys, [*argv, "--num_samples", "3"])
  assert "--num_samples applies to --search random|tpe" in err


def test_resources_the_local_instance_lacks_are_one_line(tmp_path):
  cmd = [
    sys.executable, "-m", "transformer.sweep", f"--config={_config(tmp_path)}",
    f"--workdir={tmp_path / 'w'}", "--num_cpus=1", '--resources_per_trial={"cpu": 1, "TPU": 4}',
  ]  # fmt: skip
  result = subprocess.run(cmd, cwd=REPO, env=_env(tmp_path), capture_output=True, text=True,
                          timeout=PATIENCE_S)  # fmt: skip
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert result.returncode == 1 and len(errors) == 1, result.stdout + result.stderr
  assert "resources per trial: TPU 4 is more than the Ray cluster has (CPU: 1" in errors[0]
  assert not os.path.exists(tmp_path / "w" / sweep_points.EXPERIMENT)  # no trial started


def test_unknown_search_space_field_is_one_line(tmp_path, capsys):
  text = CONFIG.replace('"model.d_ff": tune.choice', '"model.d_fff": tune.choice')
  config = _config(tmp_path, text)
  workdir = tmp_path / "w"
  argv = ["--config", config, "--workdir", str(workdir), "--search", "random"]
  err = _one_line_error(capsys, argv)
  assert "search_space()" in err and "'model.d_fff' is not a config field" in err, err
  err = _one_line_error(capsys, [*argv, "--search", "tpe", "--dry_run"])
  assert "'model.d_fff'" in err
  err = _one_line_error(capsys, ["--config", config, "--workdir", str(workdir), "--override",
                                 "optimizer.learning_rate=1"])  # fmt: skip
  assert "--override: 'optimizer.learning_rate' is not a config field" in err, err
  assert not workdir.exists()  # before any trial


def test_unreachable_address_is_one_line(tmp_path, capsys):
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]  # closed again: nothing listens there
  address = f"127.0.0.1:{port}"
  argv = ["--config", _config(tmp_path), "--workdir", str(tmp_path / "w"), "--address", address]
  start = time.monotonic()
  err = _one_line_error(capsys, [*argv, "--connect_timeout", "2"])
  assert f"--address {address}: no Ray cluster reachable" in err, err
  assert time.monotonic() - start < 30
  err = _one_line_error(capsys, [*argv[:-1], "nowhere"])
  assert "expected HOST:PORT" in err, err


def test_metrics_tail_reads_new_records_and_a_replaced_file(tmp_path):
  path = tmp_path / "metrics.jsonl"
  tail = trial_run.MetricsTail(str(path))
  assert tail.read() == []
  path.write_text('{"step": 2, "split": "eval", "loss": 4.0}\n{"step": 3, "spl')
  assert tail.read() == [{"step": 2, "split": "eval", "loss": 4.0}]  # the partial line waits
  with open(path, "a") as f:
    f.write('it": "train", "loss": 3.5}\n')
  assert tail.read() == [{"step": 3, "split": "train", "loss": 3.5}]
  replaced = tmp_path / "new.jsonl"  # a resumed run rewrites the log (write_atomic)
  replaced.write_text('{"step": 2, "split": "eval", "loss": 4.0}\n')
  os.replace(replaced, path)
  assert tail.read() == [{"step": 2, "split": "eval", "loss": 4.0}]


def test_trial_reports_each_evaluation_once(tmp_path):
  settings = dict(config="c.py", workdir=str(tmp_path), common={}, num_train_steps=4,
                  cwd=str(tmp_path), metric="eval/loss", shared_accelerator=False)  # fmt: skip
  run = trial_run.TrialRun({"point": {"a": 1}, "sweep": settings})
  os.makedirs(run.workdir)
  records = [
    {"step": 2, "split": "train", "loss": 4.5},
    {"step": 2, "split": "eval", "loss": 4.0},
    {"step": 2, "split": "eval_ema", "loss": 4.1},
    {"step": 4, "split": "eval", "loss": None},
  ]
  with open(os.path.join(run.workdir, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records[:3])
  run._pull()
  assert [r["step"] for r in run.pending] == [2, 2]
  assert run.pending[0]["eval/loss"] == 4.0 and run.pending[0]["train/loss"] == 4.5
  assert run.pending[1]["eval_ema/loss"] == 4.1
  # A restarted trial (state from its Tune checkpoint) reads the log again: only new ones.
  again = trial_run.TrialRun({"point": {"a": 1}, "sweep": settings})
  again.restore(run.state())
  with open(os.path.join(run.workdir, "metrics.jsonl"), "a") as f:
    f.write(json.dumps(records[3]) + "\n")
  again._pull()
  assert len(again.pending) == 1 and again.pending[0]["step"] == 4
  assert again.pending[0]["eval/loss"] != again.pending[0]["eval/loss"]  # null -> NaN
  # A metric the run never logs: the trial fails naming it and what there is.
  typo = trial_run.TrialRun({"point": {"a": 1}, "sweep": {**settings, "metric": "eval/bleu"}})
  typo.finished_before = True
  typo._pull()
  assert not typo.pending
  with pytest.raises(RuntimeError, match=r"logged no 'eval/bleu' \(.*eval/loss"):
    typo._finish()

"""The training loop: `train_and_evaluate(config, workdir)`.

config -> validated experiment -> `setup.build` (data, model, optimizer, compiled steps)
-> restore the latest checkpoint in `workdir` if any (train state + data position) ->
steps, metrics, evaluations and checkpoints -> final evaluation, curves PNG and whatever
the task does at the end (an LM prints a sample). Rerunning the command continues an
interrupted run exactly.

Faults (docs/RELIABILITY.md): a killed run resumes bit-exactly from its latest checkpoint;
SIGTERM (or, on several processes, JAX's preemption sync point) saves the current step
within `preemption_grace_seconds` and returns; a NaN/Inf update is never applied and
stops the run naming the step, the quantity and the last good checkpoint (or is skipped
and counted with `skip_nonfinite`). `Hooks` let a caller watch the phases of a run, alter
host batches or perturb the step (the fault-injection tests do).

With a parameter EMA (`config.ema_decay`) every evaluation also runs on the EMA weights,
logged as split `eval_ema` (`eval_ema/loss`, ...) and returned as `ema_loss`, ...; a
checkpoint written without an EMA resumes with the EMA starting from its parameters.

The console gets one short line per `log_every` updates (loss, learning rate, tokens/s,
MFU where a peak is known, ETA; everything else goes to TensorBoard, metrics.jsonl and
W&B if configured, `train/tracking.py`). At start (process 0): a parameter overview
(`train/overview.py`), the compiled train step's memory and the MFU inputs
(`train/telemetry.py`); the config goes to TensorBoard's HParams tab. `profile_steps`
traces a window of updates with `jax.profiler` into `workdir/plugins/profile`.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np

from transformer.data.progress import progress
from transformer.tasks import Run
from transformer.train import (
  checkpoints,
  distributed,
  experiment,
  finetune,
  setup,
  telemetry,
  tracking,
)
from transformer.train.curves import plot_curves
from transformer.train.metric_writers import MetricWriter
from transformer.train.overview import parameter_overview
from transformer.train.preemption import Preemption, run_within
from transformer.train.step import copy_params, summarize_eval
from transformer.train.workdir import RunLock, prepare_workdir, run_lock


class NonFiniteError(RuntimeError):
  """A NaN or Inf appeared in the inputs, loss, gradients or update."""


@dataclasses.dataclass(frozen=True)
class Hooks:
  """Where a caller can watch or alter a run; the defaults do nothing."""

  phase: Callable[[str, int], None] | None = None  # (build | restore | train | eval | save |
  # finish, update number) as the loop enters each phase
  batch: Callable[[int, dict], dict] | None = None  # (update number, host batch) -> batch
  perturb: Any = None  # `StepConfig.perturb`, compiled into the train step


class _EvaluationInterrupted(Exception):
  """Internal: a preemption notice arrived during an evaluation."""


def ema_view(state):
  """The state with its EMA weights as the parameters (for evaluation)."""
  if state.ema_params is None:
    raise ValueError("the train state has no EMA of the parameters (config.ema_decay=0)")
  return state.replace(params=state.ema_params)


def evaluate(
  runner,
  state,
  eval_factory,
  max_batches: int = 0,
  should_stop=None,
  total: int | None = None,
  desc: str = "evaluating",
) -> dict:
  """Means over the evaluation split (or its first `max_batches` batches).

  `should_stop()`, checked before each batch, abandons the evaluation when True.
  `total`: the batches one pass over the split yields, for the progress lines (with an
  ETA) that a long evaluation prints under `desc` (process 0).
  """
  totals: dict[str, float] = {}
  batches = eval_factory()
  if max_batches:
    batches = itertools.islice(batches, max_batches)
    total = min(max_batches, total) if total else max_batches
  for batch in progress(batches, total, desc, enabled=jax.process_index() == 0):
    if should_stop is not None and should_stop():
      raise _EvaluationInterrupted
    sums = jax.device_get(runner.eval(state, batch))
    for k, v in sums.items():
      totals[k] = totals.get(k, 0.0) + float(v)
  if not totals:
    raise ValueError("the evaluation split produced no batches")
  return summarize_eval(totals)


@dataclasses.dataclass
class _Context:
  """What the loop's helpers share."""

  config: ml_collections.ConfigDict
  s: setup.Setup
  ckpt: checkpoints.CheckpointManager
  writer: MetricWriter | None
  preemption: Preemption
  lock: RunLock
  hooks: Hooks
  workdir: str
  flops_per_count: float = 0.0  # training FLOPs per unit the task counts (MFU)
  peak_flops: float | None = None  # of one device; None: no MFU
  profile: telemetry.ProfileWindow | None = None

  @property
  def exp(self) -> experiment.Experiment:
    return self.s.exp

  def phase(self, name: str, step: int) -> None:
    if self.hooks.phase is not None:
      self.hooks.phase(name, step)

  def run_view(self, state) -> Run:
    """The model as the task's evaluations see it."""
    return Run(
      model=self.s.model,
      params=self.s.runner.host_state(state).params,
      info=self.s.info,
      eval_factory=self.s.eval_factory,
      eval_batches=self.exp.eval.eval_batches,
      workdir=self.workdir,
      step=int(jax.device_get(self.s.runner.host_state(state).step)),
    )


def train_and_evaluate(
  config: ml_collections.ConfigDict, workdir: str, hooks: Hooks | None = None
) -> dict[str, float]:
  """Trains the model `config` describes in `workdir`; returns the final eval metrics.

  A preempted run returns {'preempted': 1.0, 'step': N} after saving step N.
  """
  exp = experiment.validate(config, workdir)  # a pretrained init_from: its record there
  tracking.check_available(exp.wandb)
  hooks = hooks or Hooks()
  workdir = prepare_workdir(workdir)
  if exp.loop.compilation_cache_dir:  # reuse compiled steps across runs and restarts
    jax.config.update("jax_compilation_cache_dir", exp.loop.compilation_cache_dir)
  with run_lock(workdir) as lock, Preemption(exp.loop.preemption_grace_seconds) as preemption:
    if hooks.phase is not None:
      hooks.phase("build", 0)
    s = setup.build(exp, workdir, perturb=hooks.perturb)
    setup.check_same_model(workdir, s.model_cfg)
    ckpt = checkpoints.CheckpointManager(
      os.path.join(workdir, "checkpoints"),
      max_to_keep=exp.checkpoint.keep_checkpoints,
      best_metric=f"eval_{exp.checkpoint.best_metric}" if exp.checkpoint.best_metric else None,
      best_mode=exp.checkpoint.best_mode,
    )
    c = _Context(config, s, ckpt, None, preemption, lock, hooks, workdir)
    with distributed.watching(ckpt.directory), ckpt:  # several processes: leave in order
      return _train(c)


def _train(c: _Context) -> dict[str, float]:
  is_primary = jax.process_index() == 0
  s, loop = c.s, c.exp.loop
  state = s.state
  c.phase("restore", 0)
  target = s.runner.state_target(jax.eval_shape(lambda: state))
  restored = c.ckpt.restore(target, optional=("ema_params",))
  if restored is not None:
    state = restored.state
    if c.exp.ema.enabled and state.ema_params is None:
      state = state.replace(ema_params=copy_params(state.params))
      print(f"checkpoint step {restored.step} has no parameter EMA: it starts from its weights")
    data_state = restored.resumable_data_state()  # this process's position; refuses another count
    if data_state is not None:
      s.train_iter.set_state(data_state)
    print(f"resumed from step {restored.step} ({c.ckpt.directory})")
  elif loop.init_from:
    params = finetune.load_init_from(loop.init_from, state.params, s.model_cfg.vocab_size)
    state = state.replace(params=params)
    state = state.replace(opt_state=s.tx.init(state.params))
    if c.exp.ema.enabled:  # the EMA starts from the loaded weights
      state = state.replace(ema_params=copy_params(state.params))
  if is_primary:
    checkpoints.write_config(c.config, c.workdir)
    setup.save_model_config(c.workdir, s.model_cfg)
  start = int(jax.device_get(state.step))
  if c.preemption.requested:  # SIGTERM while building: nothing new to save
    print(f"{c.preemption.source} before training started: nothing new to save; stopped")
    return {"preempted": 1.0, "step": float(start)}
  tracker = tracking.WandbTracker.start(c.exp.wandb, c.workdir, c.config, is_primary)
  c.writer = MetricWriter(
    c.workdir,
    is_primary=is_primary,
    total_steps=loop.num_train_steps,
    resume_step=start if restored is not None else None,
    trackers=[tracker] if tracker is not None else [],
  )
  with c.writer:
    c.writer.write_hparams(c.config)
    state = s.runner.place_state(state)
    if start < loop.num_train_steps:
      _report_start(c, state)
    c.profile = telemetry.ProfileWindow(
      c.workdir, c.exp.telemetry.profile_steps, start + 1, is_primary
    )
    try:
      final_metrics, state = _loop(c, state, start)
    finally:
      c.profile.close()
    c.phase("finish", int(final_metrics.get("step", loop.num_train_steps)))
    c.ckpt.wait_until_finished()
    c.writer.flush()
    if is_primary:
      plot_curves([c.writer.jsonl_path], os.path.join(c.workdir, "curves.png"))
    if not final_metrics.get("preempted") and is_primary:
      view = c.run_view(state)
      texts = c.exp.task.after_training(view, c.exp.eval.extras(loop.seed))
      for tag, text in (texts or {}).items():
        c.writer.write_text(view.step, tag, text)
  return final_metrics


def _report_start(c: _Context, state) -> None:
  """Once before the first update: the parameter overview, the compiled train step's
  memory (compiling the step the loop then runs) and the MFU inputs (printed by process 0)."""
  s, tele = c.s, c.exp.telemetry
  primary = jax.process_index() == 0
  overview = parameter_overview(s.runner.host_state(state).params)
  compiled = s.runner.lower_train(state, setup.zeros_batch(s.info)).compile()
  memory = telemetry.memory_summary(compiled)
  c.flops_per_count = c.exp.task.flops_per_count(s.model_cfg, s.info)
  c.peak_flops, why = telemetry.peak_flops(
    tele.peak_flops, tele.measure_peak_flops, s.model_cfg.dtype
  )
  if primary:
    print(overview.table())
    print(memory or "compiled train step: the backend reports no memory analysis")
    print(telemetry.flops_summary(c.flops_per_count, c.peak_flops, why, jax.device_count()))


def _save(c: _Context, state, metrics=None) -> int:
  host = c.s.runner.host_state(state)
  step = int(jax.device_get(host.step))
  if step not in c.ckpt.all_steps():
    data_state = c.s.train_iter.get_state()
    c.ckpt.save(step, host, data_state=data_state, config=c.config, metrics=metrics)
  return step


def _describe_nonfinite(metrics: dict) -> str:
  """Which of the step's inputs, loss, gradients and update were NaN/Inf."""
  m = {k: float(v) for k, v in jax.device_get(metrics).items()}
  parts = []
  if m.get("nonfinite_inputs", 0.0) or not np.isfinite(m.get("tokens", 0.0)):
    parts.append("inputs (a NaN/Inf in the batch)")
  if not np.isfinite(m["loss"]):
    parts.append(f"loss ({m['loss']})")
  if not np.isfinite(m["grad_norm"]):
    parts.append(f"gradients (global norm {m['grad_norm']})")
  if not np.isfinite(m["update_norm"]):
    parts.append(f"optimizer update (global norm {m['update_norm']})")
  shown = ", ".join(parts) or "loss or gradients"
  return f"non-finite {shown}" + (f"; loss was {m['loss']:.6g}" if np.isfinite(m["loss"]) else "")


def _check_finite(c: _Context, state, pending: dict) -> None:
  """Stops the run at the first update whose inputs, loss, gradients or update were NaN/Inf.

  The step records it on the device (no per-step host sync); the update was not applied,
  and no checkpoint is written past it. `pending` holds the (device) metrics of the
  updates since the last check, so the message can name the quantity.
  """
  if c.exp.loop.skip_nonfinite:
    return
  host = c.s.runner.host_state(state)
  count, first = jax.device_get((host.nonfinite_count, host.first_nonfinite_step))
  if not int(count):
    pending.clear()
    return
  first = int(first)
  what = _describe_nonfinite(pending[first]) if first in pending else "non-finite loss or gradients"
  c.ckpt.wait_until_finished()
  good = c.ckpt.latest_step()
  raise NonFiniteError(
    f"step {first}: {what}; the update was not applied and training stopped; last good "
    f"checkpoint: {'step ' + str(good) if good is not None else 'none'} in {c.ckpt.directory} "
    "(kept). Rerunning resumes there and meets the same data: lower the learning rate, fix "
    "the data, or set --config.skip_nonfinite=True to skip and count such updates"
  )


def _periodic_eval(c: _Context, state, done: int) -> dict:
  """Loss metrics on the evaluation split, plus the task's own when they are due (and the
  loss metrics of the EMA weights, as `ema_<name>`)."""
  ev = c.exp.eval
  runner = c.s.runner
  metrics = evaluate(
    runner,
    state,
    c.s.eval_factory,
    ev.eval_batches,
    c.preemption.interrupts_evaluation,
    total=c.s.info.eval_batches,
    desc=f"evaluating at step {done}",
  )
  extras = ev.extras(c.exp.loop.seed)
  metrics |= c.exp.task.during_training(c.run_view(state), extras, done, c.exp.loop.num_train_steps)
  c.writer.write_scalars(done, metrics, split="eval")
  return metrics | _ema_eval(c, state, done, c.preemption.interrupts_evaluation)


def _ema_eval(c: _Context, state, done: int, should_stop=None, log: bool = True) -> dict:
  """The EMA weights' loss metrics (logged as split `eval_ema`); {} without an EMA."""
  if not c.exp.ema.enabled:
    return {}
  ev = c.exp.eval
  metrics = evaluate(
    c.s.runner,
    ema_view(state),
    c.s.eval_factory,
    ev.eval_batches,
    should_stop,
    total=c.s.info.eval_batches,
    desc=f"evaluating the EMA at step {done}",
  )
  if log:
    c.writer.write_scalars(done, metrics, split="eval_ema")
  return {f"ema_{k}": v for k, v in metrics.items()}


def _save_within_grace(c: _Context, state, done: int) -> None:
  """Saves step `done` and waits for it or, if the grace period runs out first, exits the
  process at once (status 0), the previous checkpoint staying the latest."""

  def save():
    _save(c, state)
    c.ckpt.wait_until_finished()

  c.phase("save", done)
  if run_within(save, c.preemption.remaining()):
    return
  # Orbax lists a step from the start of its write; on disk, a step folder is complete
  # (writes go to a temporary folder renamed at the end).
  complete = [step for step in c.ckpt.all_steps() if (c.ckpt.directory / str(step)).exists()]
  print(
    f"{c.preemption.source}: the grace period of {c.preemption.grace:g}s ran out before the "
    f"checkpoint at step {done} was written; exiting without it. The latest complete "
    f"checkpoint is {'step ' + str(max(complete)) if complete else 'none'} in "
    f"{c.ckpt.directory}; rerun the same command to resume",
    flush=True,
  )
  sys.stderr.flush()
  c.lock.release()
  distributed.leave_now(None)  # several processes: the others must not wait for it
  os._exit(0)  # skips waiting for the unfinished write in the checkpoint thread


def _log(c: _Context, state, done: int, metrics, counts: dict, pending: dict) -> None:
  """One progress line: the step's metrics and the throughput since the last line."""
  metrics = jax.device_get(metrics)
  _check_finite(c, state, pending)
  now = time.perf_counter()
  elapsed = max(now - counts["time"], 1e-9)
  scalars = {k: float(v) for k, v in metrics.items() if k != "nonfinite_inputs"}
  scalars["tokens_per_sec"] = counts["tokens"] * jax.process_count() / elapsed
  scalars["examples_per_sec"] = counts["examples"] * jax.process_count() / elapsed
  if c.peak_flops is not None and c.flops_per_count:
    scalars["mfu"] = telemetry.mfu(
      c.flops_per_count, scalars["tokens_per_sec"], c.peak_flops, jax.device_count()
    )
  if c.exp.loop.skip_nonfinite:
    host = c.s.runner.host_state(state)
    scalars["nonfinite_skipped"] = int(jax.device_get(host.nonfinite_count))
  c.writer.write_scalars(done, scalars)
  counts.update(time=now, tokens=0.0, examples=0)


def _loop(c: _Context, state, start: int):
  loop, ev, ck = c.exp.loop, c.exp.eval, c.exp.checkpoint
  runner, task = c.s.runner, c.exp.task
  total = loop.num_train_steps
  eval_metrics: dict[str, float] = {}
  pending: dict[int, dict] = {}  # update -> device metrics since the last NaN check
  counts = {"time": time.perf_counter(), "tokens": 0.0, "examples": 0}
  c.phase("train", start)
  for step in range(start, total):
    done = step + 1
    c.profile.before(done)
    batch = next(c.s.train_iter)
    if c.hooks.batch is not None:
      batch = c.hooks.batch(done, batch)
    counts["tokens"] += task.count(batch)
    counts["examples"] += len(next(iter(batch.values())))
    state, metrics = runner.train(state, batch)
    c.profile.after(done, state)
    if not loop.skip_nonfinite:
      pending[done] = metrics
    if c.preemption.reached(done):
      break
    if done % loop.log_every == 0 or done == total or done == start + 1:
      _log(c, state, done, metrics, counts, pending)
    is_eval = done == total or (ev.eval_every and done % ev.eval_every == 0)
    paused = time.perf_counter()  # evaluations and saves do not count in the throughput
    if is_eval:
      _check_finite(c, state, pending)
      c.phase("eval", done)
      try:
        eval_metrics = _periodic_eval(c, state, done)
      except _EvaluationInterrupted:
        break
      c.phase("train", done)
    if done % ck.checkpoint_every == 0 or done == total:
      _check_finite(c, state, pending)  # never checkpoint past a NaN
      ranked = {f"eval_{k}": v for k, v in eval_metrics.items()} if is_eval else None
      if ck.best_metric and ranked is None:
        ranked = {f"eval_{ck.best_metric}": float("nan")}
      c.phase("save", done)
      c.writer.flush()  # metrics up to a checkpoint reach object storage with it
      _save(c, state, ranked)
      c.phase("train", done)
    counts["time"] += time.perf_counter() - paused
  else:  # the loop ran to its end (or there was nothing left to do)
    if start >= total:  # already finished: evaluate the restored state again
      eval_metrics = evaluate(runner, state, c.s.eval_factory, ev.eval_batches)
      eval_metrics |= _ema_eval(c, state, start, log=False)
    return eval_metrics, state
  # A preemption notice: save this step (never past a NaN) within the grace period.
  _check_finite(c, state, pending)
  _save_within_grace(c, state, done)
  print(
    f"{c.preemption.source}: saved a checkpoint at step {done} in {c.ckpt.directory} and "
    "stopped; rerun the same command to resume"
  )
  return {"preempted": 1.0, "step": float(done)}, state

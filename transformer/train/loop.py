"""The training loop, `train_and_evaluate(config, workdir)`, top to bottom; and `main`,
the command (`python train.py`, `transformer-train`), at the end. Copy this file to fork it:
`update`, one optimizer update, is defined here and handed to the machinery that compiles
it, so a copy's changed `update` is the one its run trains with.

  validate the config -> guard the run (lock, SIGTERM, peers) -> build (`setup.build`:
  data, model, optimizer, `update` compiled on the mesh) -> restore the latest checkpoint
  (train state + data position) or load `init_from` -> for each update: next batch, the
  compiled `update`, then the periodic actions (`train/actions.py`: log, evaluate, save)
  -> curves PNG and the evaluators that run at the end (an LM's sample). Rerunning the
  command continues an interrupted run exactly.

Faults (docs/RELIABILITY.md) are the business of one `RunGuard` (`train/guard/`), entered
once and asked questions: a killed run resumes bit-exactly from its latest checkpoint;
SIGTERM (or JAX's preemption sync point) saves the current update within
`preemption_grace_seconds` and returns {'preempted': 1.0, 'step': N}; a lost or stalled
peer ends every process in one line; a NaN/Inf update is never applied and stops the run
naming the step, the quantity and the last good checkpoint (or is skipped and counted
with `skip_nonfinite`). `Hooks` let a caller watch the phases of a run and alter host
batches (the fault-injection tests do; nothing of them is compiled into the step).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from transformer import cli
from transformer.tasks.base import Batch
from transformer.train import (
  actions,
  checkpoints,
  compile_cache,
  dry_run,
  experiment,
  finetune,
  setup,
  step,
  telemetry,
  tracking,
)
from transformer.train.actions import ema_view, evaluate
from transformer.train.curves import plot_curves
from transformer.train.guard import RunGuard
from transformer.train.guard.run_record import RunRecord
from transformer.train.guard.startup import maybe_initialize
from transformer.train.metric_writers import MetricWriter
from transformer.train.step import StepConfig, TrainState, copy_params
from transformer.train.workdir import prepare_workdir


def update(state: TrainState, batch: Batch, *, cfg: StepConfig) -> tuple[TrainState, dict]:
  """One optimizer update: the mean gradient of the task's loss over the global batch
  (`step.gradients`), then the optimizer's step with its NaN/Inf and empty-update guards,
  the EMA and the logged metrics (`step.apply_gradients`). Change it here to fork the
  update (gradient noise, a second optimizer, ...). It runs compiled (`train/parallel.py`:
  jit over the mesh with the state's shardings, donating the state, or pmap), so it is pure
  and returns a state of the structure, shapes and dtypes it received."""
  grads, sums = step.gradients(state, batch, cfg)
  return step.apply_gradients(state, grads, sums, batch, cfg)


@dataclasses.dataclass(frozen=True)
class Hooks:
  """Where a caller can watch or alter a run; the defaults do nothing."""

  phase: Callable[[str, int], None] | None = None  # (build | restore | train | eval | save |
  # finish, update number) as the loop enters each phase
  batch: Callable[[int, dict], dict] | None = None  # (update number, host batch) -> batch

  def enter(self, name: str, step: int) -> None:
    if self.phase is not None:
      self.phase(name, step)


def train_and_evaluate(
  config: ml_collections.ConfigDict, workdir: str, hooks: Hooks | None = None
) -> dict[str, float]:
  """Trains the model `config` describes in `workdir`; returns the final eval metrics.

  A preempted run returns {'preempted': 1.0, 'step': N} after saving update N.
  """
  exp = experiment.validate(config, workdir)  # a pretrained init_from: its record there
  tracking.check_available(exp.wandb)
  hooks = hooks or Hooks()
  workdir = prepare_workdir(workdir)
  is_primary = jax.process_index() == 0
  with RunGuard(workdir, exp.faults) as guard:  # lock, SIGTERM, peers, storage
    hooks.enter("build", 0)
    s = setup.build(exp, workdir, update=update)  # `s.exp`: the task as built (a teacher)
    setup.check_same_model(workdir, s.model_cfg)
    c, total = s.exp.checkpoint, s.exp.loop.num_train_steps
    ckpt = checkpoints.CheckpointManager(
      os.path.join(workdir, "checkpoints"),
      max_to_keep=c.keep_checkpoints,
      best_metric=f"eval_{c.best_metric}" if c.best_metric else None,
      best_mode=c.best_mode,
    )
    # A failed write becomes one line; `ckpt` waits for its writes and closes at the end.
    with guard.watching(ckpt), ckpt:
      hooks.enter("restore", 0)
      state, resumed = _restore_or_init(s.exp, s, ckpt)
      if is_primary:
        checkpoints.write_config(config, workdir)
        setup.save_model_config(workdir, s.model_cfg)
      start = int(jax.device_get(state.step))
      if guard.stopped_before_training():  # SIGTERM while building: nothing new to save
        print(f"{guard.source} before training started: nothing new to save; stopped")
        return {"preempted": 1.0, "step": float(start)}
      tracker = tracking.WandbTracker.start(exp.wandb, workdir, config, is_primary)
      writer = MetricWriter(
        workdir,
        is_primary=is_primary,
        total_steps=total,
        resume_step=start if resumed else None,
        trackers=[tracker] if tracker is not None else [],
      )
      with writer:
        writer.write_hparams(config)
        # The compiled update: `runner.train_step` is `jax.jit(update)` with the state's
        # and the batch's shardings on the mesh, donating the state (or its `jax.pmap`
        # over the local devices), built as the state is placed.
        state = s.runner.place_state(state)
        # The parameter overview, the compiled step's memory and the MFU inputs.
        flops, peak = telemetry.report_start(s, state) if start < total else (0.0, None)
        acts = actions.for_run(
          s,
          config=config,
          workdir=workdir,
          start=start,
          ckpt=ckpt,
          writer=writer,
          should_stop_evaluation=guard.should_stop_evaluation,
          flops_per_count=flops,
          peak_flops=peak,
        )
        state, metrics = _train(s, state, start, acts, guard, ckpt, hooks)

        # The end: curves, and the evaluators that run at the end (an LM's sample).
        hooks.enter("finish", int(metrics.get("step", total)))
        acts.evaluation.wait_for_ahead()
        ckpt.wait_until_finished()
        writer.flush()
        if is_primary:
          plot_curves([writer.jsonl_path], os.path.join(workdir, "curves.png"))
          if not metrics.get("preempted"):
            acts.evaluation.finish(state)
          if s.cache_folder:
            print(compile_cache.summary(s.cache_folder))
      return metrics


def _train(s: setup.Setup, state, start: int, acts: actions.Actions, guard, ckpt, hooks: Hooks):
  """The updates from `start` on, each followed by the actions due; returns (the state,
  the last evaluation's metrics), or after a preemption notice saves the update it came
  in (within the grace), (the state, {'preempted': 1.0, 'step': N})."""
  runner, total = s.runner, s.exp.loop.num_train_steps
  metrics: dict[str, float] = {}
  stopped_at = None  # the update a preemption notice stopped the run after
  hooks.enter("train", start)
  try:
    for done in range(start + 1, total + 1):
      acts.profile.before(done)
      batch = next(s.train_iter)
      guard.progress(done)
      if hooks.batch is not None:
        batch = hooks.batch(done, batch)
      acts.throughput.add(batch)
      state, step_metrics = runner.train_step(state, runner.place_batch(batch))
      step_metrics = runner.unreplicate(step_metrics)
      acts.profile.after(done, state)
      acts.nonfinite.record(done, step_metrics)
      if guard.should_stop(done):
        stopped_at = done
        break
      if acts.log.due(done):
        acts.nonfinite.check(state)
        acts.log.run(state, done, step_metrics)
      if done == start + 1:  # the evaluation step and the final sample compile meanwhile
        acts.evaluation.compile_ahead(state, setup.zeros_batch(s.info, train=False))
      with acts.throughput.paused():  # evaluations and saves do not count in the throughput
        evaluated = None
        if acts.evaluation.due(done):
          acts.nonfinite.check(state)
          hooks.enter("eval", done)
          evaluated = acts.evaluation.run(state, done)
          if evaluated is None:  # a preemption notice arrived during it
            stopped_at = done
            break
          metrics = evaluated
          hooks.enter("train", done)
        if acts.save.due(done):
          acts.nonfinite.check(state)  # never checkpoint past a NaN
          hooks.enter("save", done)
          acts.save.run(state, done, evaluated)
          hooks.enter("train", done)
  finally:
    acts.profile.close()

  if stopped_at is not None:  # save this update (never past a NaN) within the grace
    acts.nonfinite.check(state)
    hooks.enter("save", stopped_at)
    guard.save_within_grace(lambda: acts.save.save(state, wait=True), stopped_at, ckpt)
    print(
      f"{guard.source}: saved a checkpoint at step {stopped_at} in "
      f"{ckpt.directory} and stopped; rerun the same command to resume"
    )
    return state, {"preempted": 1.0, "step": float(stopped_at)}
  if start >= total:  # already finished: evaluate the restored state again
    return state, _evaluate_again(s.exp, runner, s, state, start)
  return state, metrics


def _restore_or_init(exp: experiment.Experiment, s: setup.Setup, ckpt) -> tuple[Any, bool]:
  """(the state to train from, whether it was resumed): the latest checkpoint's, with this
  process's data position; else `init_from`'s weights; else the fresh initial state."""
  state = s.state
  target = s.runner.state_target(jax.eval_shape(lambda: state))
  restored = ckpt.restore(target, optional=("ema_params", "empty_count"))
  if restored is not None:
    state = restored.state
    if state.empty_count is None:  # a checkpoint written before empty updates were counted
      state = state.replace(empty_count=jnp.zeros((), jnp.int32))
    if exp.ema.enabled and state.ema_params is None:
      state = state.replace(ema_params=copy_params(state.params))
      print(f"checkpoint step {restored.step} has no parameter EMA: it starts from its weights")
    data_state = restored.resumable_data_state()  # this process's position; refuses another count
    if data_state is not None:
      s.train_iter.set_state(data_state)
    print(f"resumed from step {restored.step} ({ckpt.directory})")
    return state, True
  if exp.loop.init_from:
    image_size = s.model_cfg.image_size if exp.task.images else None  # a DINOv2's resampled
    params = finetune.load_init_from(
      exp.loop.init_from, state.params, s.model_cfg.vocab_size, image_size
    )
    state = state.replace(params=params, opt_state=s.tx.init(params))
    if exp.ema.enabled:  # the EMA starts from the loaded weights
      state = state.replace(ema_params=copy_params(params))
  return state, False


def _evaluate_again(exp: experiment.Experiment, runner, s: setup.Setup, state, step: int) -> dict:
  """The loss metrics (and the EMA's, as `ema_<name>`) of a run that had already finished."""
  metrics = evaluate(runner, state, s.eval_factory, exp.eval.eval_batches)
  if exp.ema.enabled:
    desc = f"evaluating the EMA at step {step}"
    batches, total = exp.eval.eval_batches, s.info.eval_batches
    ema = evaluate(runner, ema_view(state), s.eval_factory, batches, None, total, desc)
    metrics |= {f"ema_{k}": v for k, v in ema.items()}
  return metrics


# The command: `python train.py` (and `transformer-train`) ----------------------------------


def define_flags() -> None:
  """`--config` and `--workdir`; a command calls this once, before its flags are parsed."""
  config_flags.DEFINE_config_file("config", None, "experiment config file", lock_config=True)
  flags.DEFINE_string("workdir", None, "run directory (checkpoints, metrics)")
  flags.mark_flags_as_required(["config", "workdir"])
  dry_run.define_flags()


def main(argv: list[str], hooks: Hooks | None = None) -> None:
  """Trains `--config` in `--workdir` (resuming from its latest checkpoint); a bad input
  ends in one line. Every invocation that gets as far as building the run appends its
  record (command, wall and CPU time, CPU ISA, load, versions, steps, final metrics) to
  WORKDIR/runs.jsonl, whether it completed, was preempted or stopped with an error."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config, workdir = flags.FLAGS.config, flags.FLAGS.workdir
  record = RunRecord(sys.argv, workdir)  # the load average at start
  if not flags.FLAGS["verbosity"].present:  # library INFO logs (orbax) only with -v 0
    logging.set_verbosity(logging.WARNING)
  cli.apply_process_settings()  # before JAX starts: CPU allocator and XLA flags
  if flags.FLAGS.dry_run:  # compile for --target, print whether it fits, train nothing
    with cli.errors_in_one_line():
      f = flags.FLAGS
      sys.exit(
        dry_run.main(config, workdir, dry_run.target(f.target, f.target_devices, f.target_hbm_gib))
      )
  maybe_initialize(config, workdir)  # several processes: same config, peer watch
  hooks = record.hooks(hooks or Hooks())
  with cli.errors_in_one_line():
    try:
      metrics = train_and_evaluate(config, workdir, hooks)
    except BaseException as e:  # recorded before its line, which stays the last printed
      record.finish(error=e)
      raise
    record.finish(metrics=metrics)

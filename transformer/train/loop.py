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
SIGTERM (or, on several processes, JAX's preemption sync point) saves the current update
within `preemption_grace_seconds` and returns {'preempted': 1.0, 'step': N}; a lost or
stalled peer ends every process in one line; a NaN/Inf update is never applied and stops
the run naming the step, the quantity and the last good checkpoint (or is skipped and
counted with `skip_nonfinite`). `Hooks` let a caller
watch the phases of a run and alter host batches (the fault-injection tests do; nothing of
them is compiled into the step).

With a parameter EMA (`config.ema_decay`) every evaluation also runs on the EMA weights,
logged as split `eval_ema` and returned as `ema_loss`, ...; a checkpoint written without
an EMA resumes with the EMA starting from its parameters.

The console gets one short line per `log_every` updates (loss, learning rate, tokens/s,
MFU where a peak is known, ETA; everything else goes to TensorBoard, metrics.jsonl and
W&B if configured, `train/tracking.py`). At start (process 0): a parameter overview, the
compiled train step's memory and the MFU inputs; the config goes to TensorBoard's HParams
tab. `profile_steps` traces a window of updates with `jax.profiler`.
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
from transformer.tasks import Run
from transformer.tasks.base import Batch
from transformer.train import (
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
from transformer.train.actions import Evaluate, Log, Save, Throughput, ema_view, evaluate
from transformer.train.curves import plot_curves
from transformer.train.guard import NonFinite, RunGuard
from transformer.train.guard.run_record import RunRecord
from transformer.train.guard.startup import maybe_initialize
from transformer.train.metric_writers import MetricWriter
from transformer.train.overview import parameter_overview
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
  loop = exp.loop
  is_primary = jax.process_index() == 0
  with RunGuard(workdir, exp.faults) as guard:  # lock, SIGTERM, peers, storage
    # Build, then restore the latest checkpoint (or start from `init_from`).
    hooks.enter("build", 0)
    s = setup.build(exp, workdir, update=update)
    exp, runner = s.exp, s.runner  # the task as built (e.g. with a distillation teacher)
    setup.check_same_model(workdir, s.model_cfg)
    ckpt = checkpoints.CheckpointManager(
      os.path.join(workdir, "checkpoints"),
      max_to_keep=exp.checkpoint.keep_checkpoints,
      best_metric=f"eval_{exp.checkpoint.best_metric}" if exp.checkpoint.best_metric else None,
      best_mode=exp.checkpoint.best_mode,
    )
    with guard.watching(ckpt):  # peers, storage failures; closes `ckpt` at the end
      hooks.enter("restore", 0)
      state, resumed = _restore_or_init(exp, s, ckpt)
      if is_primary:
        checkpoints.write_config(config, workdir)
        setup.save_model_config(workdir, s.model_cfg)
      start, total = int(jax.device_get(state.step)), loop.num_train_steps
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
        state = runner.place_state(state)

        def view(state) -> Run:  # the model as the evaluators see it
          host = runner.host_state(state)
          return Run(s.model, host.params, s.info, s.eval_factory, exp.eval.eval_batches,
                     workdir, int(jax.device_get(host.step)))  # fmt: skip

        flops_per_count, peak = _report_start(exp, s, state) if start < total else (0.0, None)
        profile = telemetry.ProfileWindow(
          workdir, exp.telemetry.profile_steps, start + 1, is_primary
        )

        # The periodic actions (train/actions.py).
        throughput = Throughput(exp.task)
        nonfinite = NonFinite(loop.skip_nonfinite, runner, ckpt)
        log = Log(loop.log_every, start + 1, total, writer, throughput, runner,
                  loop.skip_nonfinite, flops_per_count, peak, s.info.sources)  # fmt: skip
        evaluation = Evaluate(exp, runner, s.eval_factory, s.info.eval_batches, writer, view,
                              should_stop=guard.should_stop_evaluation,
                              sources=s.info.eval_sources)  # fmt: skip
        save = Save(exp.checkpoint.checkpoint_every, total, exp.checkpoint.best_metric, ckpt,
                    runner, s.train_iter, config, writer)  # fmt: skip

        # The updates.
        metrics: dict[str, float] = {}
        stopped_at = None  # the update a preemption notice stopped the run after
        hooks.enter("train", start)
        try:
          for done in range(start + 1, total + 1):
            profile.before(done)
            batch = next(s.train_iter)
            guard.progress(done)
            if hooks.batch is not None:
              batch = hooks.batch(done, batch)
            throughput.add(batch)
            state, step_metrics = runner.train_step(state, runner.place_batch(batch))
            step_metrics = runner.unreplicate(step_metrics)
            profile.after(done, state)
            nonfinite.record(done, step_metrics)
            if guard.should_stop(done):
              stopped_at = done
              break
            if log.due(done):
              nonfinite.check(state)
              log.run(state, done, step_metrics)
            if done == start + 1:  # the evaluation step and the final sample compile meanwhile
              evaluation.compile_ahead(state, setup.zeros_batch(s.info, train=False))
            with throughput.paused():  # evaluations and saves do not count in the throughput
              evaluated = None
              if evaluation.due(done):
                nonfinite.check(state)
                hooks.enter("eval", done)
                evaluated = evaluation.run(state, done)
                if evaluated is None:  # a preemption notice arrived during it
                  stopped_at = done
                  break
                metrics = evaluated
                hooks.enter("train", done)
              if save.due(done):
                nonfinite.check(state)  # never checkpoint past a NaN
                hooks.enter("save", done)
                save.run(state, done, evaluated)
                hooks.enter("train", done)
        finally:
          profile.close()

        if stopped_at is not None:  # save this update (never past a NaN) within the grace
          nonfinite.check(state)
          hooks.enter("save", stopped_at)
          guard.save_within_grace(lambda: save.save(state, wait=True), stopped_at, ckpt)
          print(
            f"{guard.source}: saved a checkpoint at step {stopped_at} in "
            f"{ckpt.directory} and stopped; rerun the same command to resume"
          )
          metrics = {"preempted": 1.0, "step": float(stopped_at)}
        elif start >= total:  # already finished: evaluate the restored state again
          metrics = _evaluate_again(exp, runner, s, state, start)

        # The end: curves, and the evaluators that run at the end (an LM's sample).
        hooks.enter("finish", int(metrics.get("step", total)))
        evaluation.wait_for_ahead()
        ckpt.wait_until_finished()
        writer.flush()
        if is_primary:
          plot_curves([writer.jsonl_path], os.path.join(workdir, "curves.png"))
        if not metrics.get("preempted") and is_primary:
          evaluation.finish(state)  # the evaluators that run at the end (an LM's sample)
        if is_primary and s.cache_folder:
          print(compile_cache.summary(s.cache_folder))
      return metrics


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


def _report_start(exp: experiment.Experiment, s: setup.Setup, state) -> tuple[float, Any]:
  """Once before the first update: the parameter overview, the compiled train step's
  memory (compiling the step the loop then runs) and the MFU inputs (printed by process
  0). Returns (training FLOPs per unit the task counts, the peak FLOP/s of one device)."""
  tele = exp.telemetry
  overview = parameter_overview(s.runner.host_state(state).params)
  compiled = s.runner.lower_train(state, setup.zeros_batch(s.info)).compile()
  memory = telemetry.memory_summary(compiled)
  flops_per_count = exp.task.flops_per_count(s.model_cfg, s.info)
  peak, why = telemetry.peak_flops(tele.peak_flops, tele.measure_peak_flops, s.model_cfg.dtype)
  if jax.process_index() == 0:
    print(overview.table())
    print(memory or "compiled train step: the backend reports no memory analysis")
    print(telemetry.flops_summary(flops_per_count, peak, why, jax.device_count()))
  return flops_per_count, peak


def _evaluate_again(exp: experiment.Experiment, runner, s: setup.Setup, state, step: int) -> dict:
  """The loss metrics (and the EMA's, as `ema_<name>`) of a run that had already finished."""
  metrics = evaluate(runner, state, s.eval_factory, exp.eval.eval_batches)
  if exp.ema.enabled:
    desc = f"evaluating the EMA at step {step}"
    ema = evaluate(runner, ema_view(state), s.eval_factory, exp.eval.eval_batches,
                   total=s.info.eval_batches, desc=desc)  # fmt: skip
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

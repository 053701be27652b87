"""The training loop: `train_and_evaluate(config, workdir)`.

config -> validated parts -> data (grain iterators) -> model + optimizer -> restore the
latest checkpoint in `workdir` if any (train state + data position) -> steps, metrics,
evaluations and checkpoints -> final evaluation, curves PNG and (for LMs) a text sample.
Rerunning the same command continues an interrupted run exactly.

Faults (docs/RELIABILITY.md): a killed run resumes bit-exactly from its latest checkpoint;
SIGTERM (or, on several processes, JAX's preemption sync point) saves the current step
within `preemption_grace_seconds` and returns; a NaN/Inf update is never applied and
stops the run naming the step, the quantity and the last good checkpoint (or is skipped
and counted with `skip_nonfinite`). `debug_inject_nan_at_step` poisons one update for
tests; `TRANSFORMER_TRACE_PHASES=1` prints `phase NAME STEP` lines to stderr for the
fault-injection harness (benchmarks/kill_resume.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from transformer.data import masking
from transformer.data.datasets import DataInfo, make_datasets
from transformer.nn import partitioning
from transformer.nn.config import ModelConfig
from transformer.nn.models import build_model
from transformer.tasks import evals as evaluation
from transformer.tasks.registry import TOKEN_KEY, init_inputs
from transformer.train import checkpoints, experiment, finetune, schedules
from transformer.train.metric_writers import MetricWriter, plot_curves
from transformer.train.optimizer import create_optimizer
from transformer.train.parallel import StepRunner
from transformer.train.preemption import Preemption, run_within
from transformer.train.step import (
  StepConfig,
  TrainState,
  create_train_state,
  summarize_eval,
)
from transformer.train.workdir import WorkdirLock, prepare_workdir

MODEL_CONFIG_FILE = "model_config.json"


class NonFiniteError(RuntimeError):
  """A NaN or Inf appeared in the loss or gradients."""


def zeros_batch(
  info: DataInfo, train: bool = True, rows: int | None = None
) -> dict[str, np.ndarray]:
  """A batch of zeros with the data's shapes (for init and compilation)."""
  out = {}
  for key, (shape, dtype) in info.batch_shapes(train).items():
    shape = (rows or shape[0], *shape[1:])
    out[key] = np.zeros(shape, dtype)
  return out


def init_params(model, kind: str, info: DataInfo, seed: int) -> Any:
  """Float32 parameters of `model`, shaped by one row of the data."""
  args, kwargs = init_inputs(kind, zeros_batch(info, rows=1))
  rng = jax.random.PRNGKey(seed)
  return jax.jit(lambda r: model.init(r, *args, **kwargs))(rng)["params"]


def load_model_config(workdir: str) -> ModelConfig:
  """The finalized model config a run saved in its workdir."""
  path = os.path.join(workdir, MODEL_CONFIG_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: no saved model config (is {workdir} a training workdir?)")
  try:
    with open(path, encoding="utf-8") as f:
      fields = json.load(f)
  except (OSError, ValueError) as e:
    raise ValueError(f"{path}: unreadable saved model config ({e})") from None
  if not isinstance(fields, dict):
    raise ValueError(f"{path}: the saved model config is not a JSON object")
  return ModelConfig(**fields)


def _write_json_atomic(path: str, value: Any) -> None:
  """Writes JSON via a temporary file and a rename: a kill leaves the old file or the new."""
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(value, f, indent=2)
  os.replace(tmp, path)


def _check_model_matches(workdir: str, model_cfg: ModelConfig) -> None:
  """A workdir holding another model's checkpoints is an error naming the fields."""
  path = os.path.join(workdir, MODEL_CONFIG_FILE)
  if not os.path.exists(path):
    return
  saved = load_model_config(workdir).to_dict()
  current = model_cfg.to_dict()
  structural = ("scan_layers",)  # changes the parameter tree: never compatible
  ignore = (
    "dropout_rate",
    "attention_dropout_rate",
    "attention_impl",
    "attention_chunk_size",
    "dtype",
    "remat_policy",
  )
  diffs = [
    f"model.{k}: checkpoint {saved.get(k)!r} vs config {v!r}"
    for k, v in current.items()
    if k not in ignore and (saved.get(k) != v or k in structural and saved.get(k) != v)
  ]
  if diffs:
    raise ValueError(
      f"{workdir} holds a run of a different model ({'; '.join(diffs)}); "
      "use another --workdir or the same model settings"
    )


class _EvaluationInterrupted(Exception):
  """Internal: a preemption notice arrived during an evaluation."""


def evaluate(
  runner: StepRunner, state: TrainState, eval_factory, max_batches: int = 0, should_stop=None
) -> dict:
  """Means over the evaluation split (or its first `max_batches` batches).

  `should_stop()`, checked before each batch, abandons the evaluation when True.
  """
  totals: dict[str, float] = {}
  for i, batch in enumerate(eval_factory()):
    if max_batches and i >= max_batches:
      break
    if should_stop is not None and should_stop():
      raise _EvaluationInterrupted
    sums = jax.device_get(runner.eval(state, batch))
    for k, v in sums.items():
      totals[k] = totals.get(k, 0.0) + float(v)
  if not totals:
    raise ValueError("the evaluation split produced no batches")
  return summarize_eval(totals)


INJECT_WHERE = ("inputs", "loss", "grads")


def validate(config: ml_collections.ConfigDict) -> experiment.Experiment:
  """`experiment.validate` plus the fault-handling loop fields; ValueError names the field."""
  exp = experiment.validate(config)
  loop = exp.loop
  grace = loop["preemption_grace_seconds"]
  if not grace > 0:  # also rejects NaN
    raise ValueError(f"config.preemption_grace_seconds={grace!r}: must be > 0")
  at, where = loop["debug_inject_nan_at_step"], loop["debug_inject_nan_in"]
  if at == 0 or at < -1:
    raise ValueError(f"config.debug_inject_nan_at_step={at!r}: must be -1 (off) or >= 1")
  if where not in INJECT_WHERE:
    raise ValueError(f"config.debug_inject_nan_in={where!r}: must be one of {INJECT_WHERE}")
  if at > 0 and where == "inputs" and exp.data.kind == "classification":
    raise ValueError(
      "config.debug_inject_nan_in='inputs': data kind 'classification' has no floating-point "
      "input to poison; use 'loss' or 'grads'"
    )
  return exp


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Trains the model `config` describes in `workdir`; returns the final eval metrics.

  A preempted run returns {'preempted': 1.0, 'step': N} after saving step N.
  """
  exp = validate(config)
  loop = exp.loop
  workdir = prepare_workdir(workdir)
  if loop["compilation_cache_dir"]:  # reuse compiled steps across runs and restarts
    jax.config.update("jax_compilation_cache_dir", loop["compilation_cache_dir"])
  with WorkdirLock(workdir) as lock, Preemption(loop["preemption_grace_seconds"]) as preemption:
    return _train(config, exp, loop, workdir, lock, preemption)


@dataclasses.dataclass
class Setup:
  """Everything built from a config before the first step."""

  exp: experiment.Experiment
  info: DataInfo
  train_iter: Any
  eval_factory: Any
  model_cfg: ModelConfig
  model: Any
  tx: Any
  runner: StepRunner
  state: TrainState  # freshly initialised (not yet restored)


def build(config: ml_collections.ConfigDict, workdir: str, exp=None) -> Setup:
  """Data, model, optimizer, compiled steps and an initial state for `config`."""
  exp = validate(config) if exp is None else exp
  loop = exp.loop
  train_iter, eval_factory, info = make_datasets(
    exp.data, workdir, loop["batch_size"], loop["seq_len"], loop["seed"]
  )
  if loop["init_from"]:
    finetune.check_init_tokenizer(loop["init_from"], info)
  model_cfg = experiment.finalize_model(exp, info.vocab_size, info.num_classes)
  longest = max(info.seq_len, info.target_seq_len)
  if model_cfg.family != "vit" and longest > model_cfg.max_len:
    raise ValueError(f"config.seq_len={longest} exceeds config.model.max_len={model_cfg.max_len}")
  model = build_model(model_cfg)
  kind = exp.data.kind
  schedule = schedules.create_schedule(**exp.schedule)
  params = init_params(model, kind, info, loop["seed"])
  tx = create_optimizer(exp.optimizer, schedule, params)
  inject = (loop["debug_inject_nan_at_step"], loop["debug_inject_nan_in"])
  step_cfg = StepConfig(
    model=model,
    tx=tx,
    kind=kind,
    label_smoothing=loop["label_smoothing"],
    z_loss=loop["z_loss"],
    grad_accum_steps=loop["grad_accum_steps"],
    schedule=schedule,
    inject_nonfinite=inject if inject[0] > 0 and inject[1] != "inputs" else None,
    mlm_max_predictions=masking.max_selected(exp.data.mask_rate, info.seq_len)
    if kind == "mlm"
    else None,
  )
  mesh = partitioning.make_mesh(exp.mesh)
  runner = StepRunner(step_cfg, loop["parallelism"], mesh, exp.rules)
  runner.check_batch_size(
    info.batch_size // loop["grad_accum_steps"], "batch_size / grad_accum_steps"
  )
  runner.check_batch_size(info.eval_batch_size, "data.eval_batch_size")
  state = create_train_state(params, tx, jax.random.PRNGKey(loop["seed"] + 1))
  return Setup(exp, info, train_iter, eval_factory, model_cfg, model, tx, runner, state)


_TRACE = os.environ.get("TRANSFORMER_TRACE_PHASES") == "1"


def _phase(name: str, step: int) -> None:
  """`phase NAME STEP` on stderr when TRANSFORMER_TRACE_PHASES=1 (fault-injection harness)."""
  if _TRACE:
    print(f"phase {name} {step}", file=sys.stderr, flush=True)


def _train(config, exp, loop, workdir, lock, preemption) -> dict[str, float]:
  is_primary = jax.process_index() == 0
  _phase("build", 0)
  s = build(config, workdir, exp)
  _check_model_matches(workdir, s.model_cfg)
  ckpt = checkpoints.CheckpointManager(
    os.path.join(workdir, "checkpoints"),
    max_to_keep=loop["keep_checkpoints"],
    best_metric=f"eval_{loop['best_metric']}" if loop["best_metric"] else None,
    best_mode=loop["best_mode"],
  )
  with ckpt:
    state = s.state
    _phase("restore", 0)
    restored = ckpt.restore(s.runner.state_target(jax.eval_shape(lambda: state)))
    if restored is not None:
      state = restored.state
      if restored.data_state is not None:
        s.train_iter.set_state(restored.data_state)
      print(f"resumed from step {restored.step} ({ckpt.directory})")
    elif loop["init_from"]:
      state = state.replace(params=finetune.load_init_from(loop["init_from"], state.params))
      state = state.replace(opt_state=s.tx.init(state.params))
    if is_primary:
      checkpoints.write_config(config, workdir)
      _write_json_atomic(os.path.join(workdir, MODEL_CONFIG_FILE), s.model_cfg.to_dict())
    start = int(jax.device_get(state.step))
    if preemption.requested:  # SIGTERM while building: nothing new to save
      print(f"{preemption.source} before training started: nothing new to save; stopped")
      return {"preempted": 1.0, "step": float(start)}
    writer = MetricWriter(
      workdir,
      is_primary=is_primary,
      total_steps=loop["num_train_steps"],
      resume_step=start if restored is not None else None,
    )
    with writer:
      state = s.runner.place_state(state)
      final_metrics, state = _loop(s, state, ckpt, writer, preemption, lock, config, start)
    _phase("finish", int(final_metrics.get("step", loop["num_train_steps"])))
    ckpt.wait_until_finished()
  if is_primary:
    plot_curves([writer.jsonl_path], os.path.join(workdir, "curves.png"))
  if final_metrics.get("preempted"):
    return final_metrics
  if exp.data.kind == "lm" and loop["sample_tokens"] and is_primary:
    _print_sample(s.model, s.runner.host_state(state).params, s.info, loop)
  return final_metrics


def _save(ckpt, runner, state, train_iter, config, metrics=None) -> int:
  host = runner.host_state(state)
  step = int(jax.device_get(host.step))
  if step not in ckpt.all_steps():
    ckpt.save(step, host, data_state=train_iter.get_state(), config=config, metrics=metrics)
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


def _check_finite(runner, state, loop, ckpt, pending: dict) -> None:
  """Stops the run at the first update whose inputs, loss, gradients or update were NaN/Inf.

  The step records it on the device (no per-step host sync); the update was not applied,
  and no checkpoint is written past it. `pending` holds the (device) metrics of the
  updates since the last check, so the message can name the quantity.
  """
  if loop["skip_nonfinite"]:
    return
  host = runner.host_state(state)
  count, first = jax.device_get((host.nonfinite_count, host.first_nonfinite_step))
  if not int(count):
    pending.clear()
    return
  first = int(first)
  what = _describe_nonfinite(pending[first]) if first in pending else "non-finite loss or gradients"
  ckpt.wait_until_finished()
  good = ckpt.latest_step()
  raise NonFiniteError(
    f"step {first}: {what}; the update was not applied and training stopped; last good "
    f"checkpoint: {'step ' + str(good) if good is not None else 'none'} in {ckpt.directory} "
    "(kept). Rerunning resumes there and meets the same data: lower the learning rate, fix "
    "the data, or set --config.skip_nonfinite=True to skip and count such updates"
  )


def _periodic_eval(s: Setup, state, done: int, writer: MetricWriter, preemption) -> dict:
  """Loss metrics on the evaluation split, plus BLEU for translation when it is due."""
  loop = s.exp.loop
  metrics = evaluate(
    s.runner, state, s.eval_factory, loop["eval_batches"], preemption.interrupts_evaluation
  )
  total = loop["num_train_steps"]
  if s.exp.data.kind == "seq2seq" and loop["bleu_every"]:
    if done % loop["bleu_every"] == 0 or done == total:
      beam = loop["bleu_beam_size"]
      result = evaluation.bleu(
        s.model,
        s.runner.host_state(state).params,
        s.info.tokenizer,
        s.eval_factory(),
        loop["eval_batches"],
        method="beam" if beam > 1 else "greedy",
        beam_size=max(beam, 1),
      )
      metrics["bleu"] = result["bleu"]
  writer.write_scalars(done, metrics, split="eval")
  return metrics


def _poison_inputs(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The batch with a NaN in the first element of every floating-point array."""
  out = dict(batch)
  for key, value in batch.items():
    if np.issubdtype(np.asarray(value).dtype, np.floating):
      out[key] = np.array(value, copy=True)
      out[key].reshape(-1)[0] = np.nan
  return out


def _save_within_grace(s: Setup, state, ckpt, preemption, lock, config, done: int) -> None:
  """Saves step `done` and waits for it or, if the grace period runs out first, exits the
  process at once (status 0), the previous checkpoint staying the latest."""

  def save():
    _save(ckpt, s.runner, state, s.train_iter, config)
    ckpt.wait_until_finished()

  _phase("save", done)
  if run_within(save, preemption.remaining()):
    return
  # Orbax lists a step from the start of its write; on disk, a step folder is complete
  # (writes go to a temporary folder renamed at the end).
  complete = [step for step in ckpt.all_steps() if (ckpt.directory / str(step)).exists()]
  print(
    f"{preemption.source}: the grace period of {preemption.grace:g}s ran out before the "
    f"checkpoint at step {done} was written; exiting without it. The latest complete "
    f"checkpoint is {'step ' + str(max(complete)) if complete else 'none'} in "
    f"{ckpt.directory}; rerun the same command to resume",
    flush=True,
  )
  sys.stderr.flush()
  lock.release()
  os._exit(0)  # skips waiting for the unfinished write in the checkpoint thread


def _loop(s: Setup, state, ckpt, writer, preemption, lock, config, start):
  loop, runner, train_iter, kind = s.exp.loop, s.runner, s.train_iter, s.exp.data.kind
  total = loop["num_train_steps"]
  token_key = TOKEN_KEY[kind]
  poison_at = loop["debug_inject_nan_at_step"] if loop["debug_inject_nan_in"] == "inputs" else -1
  eval_metrics: dict[str, float] = {}
  pending: dict[int, dict] = {}  # update -> device metrics since the last NaN check
  last_time, tokens_since, examples_since = time.perf_counter(), 0.0, 0
  _phase("train", start)
  for step in range(start, total):
    done = step + 1
    batch = next(train_iter)
    if done == poison_at:
      batch = _poison_inputs(batch)
    rows = len(batch[token_key])
    tokens_since += rows if kind == "image" else float(np.count_nonzero(batch[token_key] > 0))
    examples_since += rows
    state, metrics = runner.train(state, batch)
    if not loop["skip_nonfinite"]:
      pending[done] = metrics
    if preemption.reached(done):
      break
    if done % loop["log_every"] == 0 or done == total or done == start + 1:
      metrics = jax.device_get(metrics)
      _check_finite(runner, state, loop, ckpt, pending)
      now = time.perf_counter()
      elapsed = max(now - last_time, 1e-9)
      scalars = {k: float(v) for k, v in metrics.items() if k != "nonfinite_inputs"}
      scalars["tokens_per_sec"] = tokens_since * jax.process_count() / elapsed
      scalars["examples_per_sec"] = examples_since * jax.process_count() / elapsed
      if loop["skip_nonfinite"]:
        scalars["nonfinite_skipped"] = int(jax.device_get(runner.host_state(state).nonfinite_count))
      writer.write_scalars(done, scalars)
      last_time, tokens_since, examples_since = now, 0.0, 0
    is_eval = done == total or (loop["eval_every"] and done % loop["eval_every"] == 0)
    if is_eval:
      _check_finite(runner, state, loop, ckpt, pending)
      _phase("eval", done)
      try:
        eval_metrics = _periodic_eval(s, state, done, writer, preemption)
      except _EvaluationInterrupted:
        break
      _phase("train", done)
    if done % loop["checkpoint_every"] == 0 or done == total:
      _check_finite(runner, state, loop, ckpt, pending)  # never checkpoint past a NaN
      ranked = {f"eval_{k}": v for k, v in eval_metrics.items()} if is_eval else None
      if loop["best_metric"] and ranked is None:
        ranked = {f"eval_{loop['best_metric']}": float("nan")}
      _phase("save", done)
      _save(ckpt, runner, state, train_iter, config, ranked)
      _phase("train", done)
  else:  # the loop ran to its end (or there was nothing left to do)
    if start >= total:  # already finished: evaluate the restored state again
      eval_metrics = evaluate(runner, state, s.eval_factory, loop["eval_batches"])
    return eval_metrics, state
  # A preemption notice: save this step (never past a NaN) within the grace period.
  _check_finite(runner, state, loop, ckpt, pending)
  _save_within_grace(s, state, ckpt, preemption, lock, config, done)
  print(
    f"{preemption.source}: saved a checkpoint at step {done} in {ckpt.directory} and stopped; "
    "rerun the same command to resume"
  )
  return {"preempted": 1.0, "step": float(done)}, state


def _print_sample(model, params, info: DataInfo, loop: dict) -> None:
  prompt = loop["sample_prompt"] or "\n"
  max_new = min(loop["sample_tokens"], model.config.max_len - len(info.tokenizer.encode(prompt)))
  (sample,) = evaluation.sample_texts(
    model,
    params,
    info.tokenizer,
    [prompt],
    max_new_tokens=max_new,
    temperature=loop["sample_temperature"],
    seed=loop["seed"],
  )
  print(f"--- sample ({max_new} tokens, temperature {loop['sample_temperature']}) ---")
  print(prompt + sample["sample"])

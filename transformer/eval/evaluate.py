"""Evaluating a trained workdir: `evaluate(workdir, step=None, ...)`.

Rebuilds the run from the config saved in the workdir (`train/setup.py`, as training does),
restores a checkpoint (the latest unless `step` is given) and computes the evaluation
metrics the training loop logs, over the same evaluation batches, plus those of the run's
evaluators (`evaluators.for_eval`: the config's `evaluators`, else the task's own): text
samples for LMs, corpus BLEU for translation, a confusion matrix for classifiers. Results
are written to `eval_step_<N>.json` in the workdir.

`ema=True` (`eval.py --ema`) evaluates the exponential moving average of the parameters
that a run with `config.ema_decay` > 0 keeps in its checkpoints, in place of the trained
parameters, for every metric; results go to `eval_step_<N>_ema.json`.

`merge_lora=True` (`eval.py --merge_lora`, runs with `model.lora_rank` > 0): the
evaluators (decoding: samples, BLEU; confusion matrices) run on the plain model with the
adapters merged into its weights (`nn.lora.merge_lora`); the loss metrics are computed by
the compiled step, on base + adapters (the same function up to float rounding).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import ml_collections
from etils import epath

from transformer import evaluators
from transformer.data.files import one_line, write_atomic
from transformer.evaluators.bleu import BleuOptions
from transformer.evaluators.sample import SampleOptions
from transformer.nn import lora
from transformer.nn.models import build_model
from transformer.tasks import Run
from transformer.train import checkpoints, experiment, setup
from transformer.train.actions import ema_view
from transformer.train.actions import evaluate as evaluate_loss
from transformer.train.moved_fields import upgrade
from transformer.train.workdir import absolute

# Fields older runs saved that no longer exist (they were for tests only): ignored.
RETIRED_FIELDS = ("debug_inject_nan_at_step", "debug_inject_nan_in")

# The evaluators' options from eval.py where they differ from training's: every sample
# drawn at temperature 1, translations decoded with a beam of 4.
EVAL_OPTIONS = {"sample": SampleOptions(temperature=1.0), "bleu": BleuOptions(beam_size=4)}


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The experiment config a run saved as `config.json`, completed with today's defaults
  (with fields that moved since at their new places: `moved_fields.upgrade`).

  `workdir` is a local folder or an object-storage URL (`gs://...`)."""
  path = epath.Path(workdir) / "config.json"
  try:
    text = path.read_text(encoding="utf-8")
  except FileNotFoundError:
    raise FileNotFoundError(f"{path}: no saved config (is {workdir} a training workdir?)") from None
  except Exception as e:  # storage clients raise many types (OSError, HTTP, auth, import)
    raise ValueError(f"{path}: unreadable: {one_line(e)}") from None
  saved = upgrade(json.loads(text))
  config = experiment.default_config()
  config.task = experiment.task_block(saved.get("data", {}).get("kind", config.data.kind))
  with config.unlocked():
    for block, values in saved.items():
      if isinstance(values, dict):
        _fill(config[block], values, f"{path}: unknown field {block}.")
      elif block in RETIRED_FIELDS:
        continue
      elif block in config:
        config[block] = values
      else:
        raise ValueError(f"{path}: unknown field {block}")
  return config


def _fill(block: ml_collections.ConfigDict, values: dict[str, Any], unknown: str) -> None:
  """Sets `block`'s fields from a saved block (nested blocks too; lists back to tuples)."""
  for key, value in values.items():
    if key not in block:
      raise ValueError(f"{unknown}{key}")
    if isinstance(value, dict):
      _fill(block[key], value, f"{unknown}{key}.")
    else:
      block[key] = tuple(value) if isinstance(value, list) else value


def restore(
  workdir: str, step: int | None = None, ema: bool = False
) -> tuple[setup.Setup, Any, int]:
  """The run's setup, the restored (host) train state and its step.

  `ema`: the run must keep an EMA of its parameters (checked before anything is built).
  """
  workdir = absolute(workdir)
  exp = experiment.validate(load_config(workdir), workdir)
  if ema and not exp.ema.enabled:
    raise ValueError(
      f"--ema: the run in {workdir} keeps no EMA of its parameters (its config.ema_decay is 0)"
    )
  s = setup.build(exp, workdir)
  setup.check_same_model(workdir, s.model_cfg)
  ckpt_dir = os.path.join(workdir, "checkpoints")
  with checkpoints.CheckpointManager(ckpt_dir, max_to_keep=None, async_save=False) as mgr:
    if not mgr.all_steps():
      raise FileNotFoundError(f"{ckpt_dir}: no checkpoint to evaluate")
    target = s.runner.state_target(jax.eval_shape(lambda: s.state))
    restored = mgr.restore(target, step, optional=("ema_params", "empty_count"))
  if restored is None:
    raise FileNotFoundError(f"{ckpt_dir}: no valid checkpoint to evaluate")
  if ema and restored.state.ema_params is None:
    raise ValueError(
      f"--ema: checkpoint step {restored.step} in {ckpt_dir} was written before the run kept "
      "an EMA of its parameters; evaluate a later step"
    )
  return s, restored.state, restored.step


def evaluate(
  workdir: str,
  step: int | None = None,
  eval_batches: int | None = None,
  options: dict[str, Any] | None = None,
  ema: bool = False,
  merge_lora: bool = False,
  chat: bool = False,
) -> dict[str, Any]:
  """Metrics of the checkpoint at `step` (default: latest) on the evaluation split.

  `options`: evaluator name -> its `Options` (default: `EVAL_OPTIONS`, else its defaults).
  `ema`: of the EMA of the parameters instead of the parameters (a run with ema_decay).
  `merge_lora`: the evaluators run on the adapters merged into the weights.
  `chat`: each sample prompt as a user turn of the pretrained tokenizer's chat template.
  """
  options = EVAL_OPTIONS | (options or {})
  workdir = absolute(workdir)
  if merge_lora and not experiment.validate(load_config(workdir), workdir).model.lora_rank:
    raise ValueError(f"--merge_lora: the run in {workdir} has no LoRA adapters (lora_rank 0)")
  s, state, step = restore(workdir, step, ema)
  if ema:
    state = ema_view(state)
  if chat:  # a pretrained tokenizer's chat template around each prompt
    if not hasattr(s.info.tokenizer, "chat_prompt"):
      raise ValueError(f"--chat: the run in {workdir} has no pretrained tokenizer (init_from hf:)")
    sample = options["sample"]
    prompts = tuple(s.info.tokenizer.chat_prompt(p) for p in sample.prompts)
    options = options | {"sample": dataclasses.replace(sample, prompts=prompts)}
  chosen = evaluators.for_eval(s.exp.eval.evaluators, s.exp.task, options)
  for evaluator in chosen:  # bad options fail before any evaluation work
    evaluator.check(s.model_cfg, s.info.tokenizer)
  placed = s.runner.place_state(state) if s.runner.parallelism == "pmap" else state
  batches = s.exp.eval.eval_batches if eval_batches is None else eval_batches
  metrics = evaluate_loss(s.runner, placed, s.eval_factory, batches, total=s.info.eval_batches)
  result: dict[str, Any] = {"step": step, "split": s.exp.data.eval_split, **metrics}
  if ema:
    result["weights"] = "ema"
  model, params = s.model, state.params
  if merge_lora:
    params, merged = lora.merge_lora(params, s.model.config)
    model = build_model(merged)
    result["lora"] = "merged"
  run = Run(model, params, s.info, s.eval_factory, batches, workdir, step)
  for evaluator in chosen:
    result |= evaluator.run(run)
  if jax.process_index() == 0:
    name = f"eval_step_{step}_ema.json" if ema else f"eval_step_{step}.json"
    write_atomic(os.path.join(workdir, name), json.dumps(result, indent=2))
  return result

"""Evaluating a trained workdir: `evaluate(workdir, step=None, ...)`.

Rebuilds the run from the config saved in the workdir (`train/setup.py`, as training does),
restores a checkpoint (the latest unless `step` is given) and computes the evaluation
metrics the training loop logs, over the same evaluation batches, plus what the run's task
offers (`Task.evaluate`): text samples for LMs, corpus BLEU for translation, a confusion
matrix for classifiers. Results are written to `eval_step_<N>.json` in the workdir.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import ml_collections
from etils import epath

from transformer.data.files import write_atomic
from transformer.tasks import EvalOptions, Run
from transformer.train import checkpoints, experiment, setup
from transformer.train.loop import evaluate as evaluate_loss
from transformer.train.workdir import absolute, one_line

# Fields older runs saved that no longer exist (they were for tests only): ignored.
RETIRED_FIELDS = ("debug_inject_nan_at_step", "debug_inject_nan_in")


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The experiment config a run saved as `config.json`, completed with today's defaults.

  `workdir` is a local folder or an object-storage URL (`gs://...`)."""
  path = epath.Path(workdir) / "config.json"
  try:
    text = path.read_text(encoding="utf-8")
  except FileNotFoundError:
    raise FileNotFoundError(f"{path}: no saved config (is {workdir} a training workdir?)") from None
  except Exception as e:  # storage clients raise many types (OSError, HTTP, auth, import)
    raise ValueError(f"{path}: unreadable: {one_line(e)}") from None
  saved = json.loads(text)
  config = experiment.default_config()
  with config.unlocked():
    for block, values in saved.items():
      if isinstance(values, dict):
        for key, value in values.items():
          if key not in config[block]:
            raise ValueError(f"{path}: unknown field {block}.{key}")
          config[block][key] = tuple(value) if isinstance(value, list) else value
      elif block in RETIRED_FIELDS:
        continue
      elif block in config:
        config[block] = values
      else:
        raise ValueError(f"{path}: unknown field {block}")
  return config


def restore(workdir: str, step: int | None = None) -> tuple[setup.Setup, Any, int]:
  """The run's setup, the restored (host) train state and its step."""
  workdir = absolute(workdir)
  exp = experiment.validate(load_config(workdir))
  s = setup.build(exp, workdir)
  setup.check_same_model(workdir, s.model_cfg)
  ckpt_dir = os.path.join(workdir, "checkpoints")
  with checkpoints.CheckpointManager(ckpt_dir, max_to_keep=None, async_save=False) as mgr:
    if not mgr.all_steps():
      raise FileNotFoundError(f"{ckpt_dir}: no checkpoint to evaluate")
    target = s.runner.state_target(jax.eval_shape(lambda: s.state))
    restored = mgr.restore(target, step)
  if restored is None:
    raise FileNotFoundError(f"{ckpt_dir}: no valid checkpoint to evaluate")
  return s, restored.state, restored.step


def evaluate(
  workdir: str,
  step: int | None = None,
  eval_batches: int | None = None,
  options: EvalOptions | None = None,
) -> dict[str, Any]:
  """Metrics of the checkpoint at `step` (default: latest) on the evaluation split."""
  options = options or EvalOptions()
  workdir = absolute(workdir)
  s, state, step = restore(workdir, step)
  task = s.exp.task
  task.check_options(options, s.model_cfg, s.info.tokenizer)
  placed = s.runner.place_state(state) if s.runner.parallelism == "pmap" else state
  batches = s.exp.eval.eval_batches if eval_batches is None else eval_batches
  metrics = evaluate_loss(s.runner, placed, s.eval_factory, batches)
  result: dict[str, Any] = {"step": step, "split": s.exp.data.eval_split, **metrics}
  run = Run(s.model, state.params, s.info, s.eval_factory, batches, workdir, step)
  result |= task.evaluate(run, options)
  if jax.process_index() == 0:
    write_atomic(os.path.join(workdir, f"eval_step_{step}.json"), json.dumps(result, indent=2))
  return result

"""Evaluating a trained workdir: `evaluate(workdir, step=None)`.

Rebuilds the run from the config saved in the workdir, restores a checkpoint (the latest
unless `step` is given) and computes the evaluation metrics the training loop logs, over
the same evaluation batches. Results are printed and written to `eval_step_<N>.json`.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import ml_collections

from transformer import experiment, train_lib
from transformer.training import checkpoints


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The experiment config a run saved as `config.json`, completed with today's defaults."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: no saved config (is {workdir} a training workdir?)")
  with open(path, encoding="utf-8") as f:
    saved = json.load(f)
  config = experiment.default_config()
  with config.unlocked():
    for block, values in saved.items():
      if isinstance(values, dict):
        for key, value in values.items():
          if key not in config[block]:
            raise ValueError(f"{path}: unknown field {block}.{key}")
          config[block][key] = tuple(value) if isinstance(value, list) else value
      else:
        config[block] = values
  return config


def evaluate(workdir: str, step: int | None = None, eval_batches: int | None = None) -> dict[str, Any]:
  """Metrics of the checkpoint at `step` (default: latest) on the evaluation split."""
  workdir = os.path.abspath(workdir)
  config = load_config(workdir)
  setup = train_lib.build(config, workdir)
  saved_model = train_lib.load_model_config(workdir)
  if saved_model != setup.model_cfg:
    raise ValueError(f"{workdir}: the saved model config differs from the rebuilt one")
  ckpt_dir = os.path.join(workdir, "checkpoints")
  with checkpoints.CheckpointManager(ckpt_dir, max_to_keep=None, async_save=False) as mgr:
    if not mgr.all_steps():
      raise FileNotFoundError(f"{ckpt_dir}: no checkpoint to evaluate")
    target = setup.runner.state_target(jax.eval_shape(lambda: setup.state))
    restored = mgr.restore(target, step)
  if restored is None:
    raise FileNotFoundError(f"{ckpt_dir}: no valid checkpoint to evaluate")
  state = setup.runner.place_state(restored.state) if setup.runner.parallelism == "pmap" else restored.state
  batches = config.eval_batches if eval_batches is None else eval_batches
  metrics = train_lib.evaluate(setup.runner, state, setup.eval_factory, batches)
  result = {"step": restored.step, "split": setup.exp.data.eval_split, **metrics}
  out = os.path.join(workdir, f"eval_step_{restored.step}.json")
  if jax.process_index() == 0:
    with open(out, "w", encoding="utf-8") as f:
      json.dump(result, f, indent=2)
  return result

"""Evaluating a trained workdir: `evaluate(workdir, step=None, ...)`.

Rebuilds the run from the config saved in the workdir, restores a checkpoint (the latest
unless `step` is given) and computes the evaluation metrics the training loop logs, over
the same evaluation batches, plus what suits the family:

  lm               loss and perplexity; text samples from prompts (`sample_texts`)
  seq2seq          corpus BLEU of detokenized outputs with sacrebleu (`bleu`; beam search)
  classification,  accuracy and a confusion matrix (`confusion_matrix`, table and PNG)
  image

Results are printed and written to `eval_step_<N>.json` in the workdir.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import ml_collections

from transformer.tasks import evals as evaluation
from transformer.train import checkpoints, experiment
from transformer.train import loop as train_lib


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


def restore(workdir: str, step: int | None = None) -> tuple[train_lib.Setup, Any, int]:
  """The run's setup, the restored (host) train state and its step."""
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
  return setup, restored.state, restored.step


def evaluate(
  workdir: str,
  step: int | None = None,
  eval_batches: int | None = None,
  *,
  prompts: tuple[str, ...] = (),
  num_samples: int = 1,
  max_new_tokens: int = 200,
  temperature: float = 1.0,
  top_k: int = 0,
  top_p: float = 1.0,
  bleu_method: str = "beam",
  beam_size: int = 4,
) -> dict[str, Any]:
  """Metrics of the checkpoint at `step` (default: latest) on the evaluation split."""
  workdir = os.path.abspath(workdir)
  setup, state, step = restore(workdir, step)
  kind = setup.exp.data.kind
  if prompts and kind != "lm":
    raise ValueError(f"--prompt is for language models; this run trains {kind!r}")
  if prompts:  # bad prompts fail before any evaluation work
    evaluation.check_prompts(
      setup.info.tokenizer, list(prompts), max_new_tokens, setup.model_cfg.max_len
    )
  placed = setup.runner.place_state(state) if setup.runner.parallelism == "pmap" else state
  batches = setup.exp.loop["eval_batches"] if eval_batches is None else eval_batches
  metrics = train_lib.evaluate(setup.runner, placed, setup.eval_factory, batches)
  result: dict[str, Any] = {"step": step, "split": setup.exp.data.eval_split, **metrics}
  params = state.params
  if prompts:
    result["samples"] = evaluation.sample_texts(
      setup.model,
      params,
      setup.info.tokenizer,
      list(prompts),
      num_samples=num_samples,
      max_new_tokens=max_new_tokens,
      temperature=temperature,
      top_k=top_k,
      top_p=top_p,
    )
  if kind == "seq2seq":
    result.update(
      evaluation.bleu(
        setup.model,
        params,
        setup.info.tokenizer,
        setup.eval_factory(),
        batches,
        method=bleu_method,
        beam_size=beam_size,
      )
    )
  if kind in ("classification", "image"):
    counts = evaluation.confusion_matrix(setup.model, params, kind, setup.eval_factory(), batches)
    names = list(setup.info.label_names) or [str(i) for i in range(len(counts))]
    png = os.path.join(workdir, f"confusion_step_{step}.png")
    result["confusion_matrix"] = counts.tolist()
    result["confusion_table"] = (
      evaluation.write_confusion(counts, names, png) if jax.process_index() == 0 else ""
    )
  out = os.path.join(workdir, f"eval_step_{step}.json")
  if jax.process_index() == 0:
    with open(out, "w", encoding="utf-8") as f:
      json.dump(result, f, indent=2)
  return result

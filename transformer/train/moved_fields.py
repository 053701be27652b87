"""Config fields that have moved: refused at their old place, carried over in saved configs.

`MOVED` maps each old place to its new one. `refuse(config)` fails, when a config is
validated, in one line naming the new place of the first field a config sets at its old one.
`upgrade(saved)` moves them in a config a run saved before (`eval/evaluate.load_config`),
so its workdir can still be evaluated and resumed.

  task.FIELD               the task's options (`Task.Options`; `config.task`)
  evaluate.NAME.FIELD      evaluator NAME's options (`Evaluator.Options`; `config.evaluate`)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import ml_collections

from transformer import evaluators, tasks
from transformer.data.config import DataConfig, fail

MOVED = {
  "label_smoothing": "task.label_smoothing",
  "z_loss": "task.z_loss",
  "data.mask_rate": "task.mask_rate",
  "data.whole_word_masking": "task.whole_word_masking",
  "data.teacher": "task.teacher",
  "data.distill_temperature": "task.temperature",
  "data.distill_alpha": "task.alpha",
  "bleu_every": "evaluate.bleu.every",
  "bleu_beam_size": "evaluate.bleu.beam_size",
  "sample_prompt": "evaluate.sample.prompts",
  "sample_tokens": "evaluate.sample.max_new_tokens",
  "sample_temperature": "evaluate.sample.temperature",
  "harness_tasks": "evaluate.harness.tasks",
  "harness_every": "evaluate.harness.every",
  "harness_limit": "evaluate.harness.limit",
  "harness_fewshot": "evaluate.harness.num_fewshot",
}

# Old fields whose value changed form at the new place: old value -> new value.
_CONVERTED: dict[str, Callable[[Any], Any]] = {
  "sample_prompt": lambda text: (text,) if text else (),  # one text -> the prompts
  "bleu_beam_size": lambda beam: max(beam, 1),  # 0 meant greedy, as 1 does
}


def refuse(config: ml_collections.ConfigDict) -> None:
  """One line for the first field `config` sets at its old place, naming the new one."""
  for old, new in MOVED.items():
    block, _, name = old.rpartition(".")
    values = config.get(block, {}) if block else config
    if name in values:
      fail(old, values[name], f"has moved: set config.{new}")


def _takes(new: str, kind: str) -> bool:
  """Whether the run of task `kind` has the field at `new` (a task option of its task, or
  an evaluator's option)."""
  *blocks, field = new.split(".")
  if blocks == ["task"]:
    options = tasks.get(kind).Options
  else:
    options = evaluators.EVALUATORS[blocks[1]].Options
  return field in {f.name for f in dataclasses.fields(options)}


def upgrade(saved: dict[str, Any]) -> dict[str, Any]:
  """A config saved (as JSON) before fields moved, with each moved field at its new place;
  a task option the run's task does not take (it had no effect) is dropped."""
  saved = {k: dict(v) if isinstance(v, dict) else v for k, v in saved.items()}
  if isinstance(saved.get("evaluate"), dict):
    saved["evaluate"] = {k: dict(v) for k, v in saved["evaluate"].items()}
  kind = saved.get("data", {}).get("kind", DataConfig.kind)
  for old, new in MOVED.items():
    block, _, name = old.rpartition(".")
    values = saved.get(block, {}) if block else saved
    if name not in values:
      continue
    value = values.pop(name)
    if _takes(new, kind):
      *path, field = new.split(".")
      place = saved
      for key in path:
        place = place.setdefault(key, {})
      place[field] = _CONVERTED.get(old, lambda v: v)(value)
  return saved

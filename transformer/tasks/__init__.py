"""Tasks: one module per training objective, and the registry that maps a config to one.

  lm              tasks/lm.py              decoder: next-token prediction, samples
  mlm             tasks/mlm.py             encoder: masked-LM pretraining (BERT)
  classification  tasks/classification.py  encoder: one label per text
  seq2seq         tasks/seq2seq.py         encoder-decoder: translation, BLEU
  image           tasks/image.py           ViT: image classification
  span_corruption tasks/span_corruption.py encoder-decoder: T5 span-corruption pretraining
  prefix_lm       tasks/prefix_lm.py       decoder: bidirectional prefix, causal suffix
  distill         tasks/distill.py         decoder: knowledge distillation from a frozen teacher
  sft             tasks/sft.py             decoder: chat fine-tuning, loss on the assistant turns
  preference      tasks/preference.py      decoder: DPO, IPO, hinge, SimPO, ORPO on pairs

`get(name)` returns the task class; `create(data_config, seq_len, options)` the task of a
run, with `options` an instance of the class's `Options` (the run's `config.task.*`).
A new task is one file with a `Task` subclass (and its `Options`, if it has settings) and
one entry in `TASKS`.
"""

from __future__ import annotations

from typing import Any

from transformer.data.config import DataConfig
from transformer.tasks.base import CrossEntropyOptions, Run, Task
from transformer.tasks.classification import TextClassification
from transformer.tasks.distill import Distillation
from transformer.tasks.image import ImageClassification
from transformer.tasks.lm import LanguageModeling
from transformer.tasks.mlm import MaskedLanguageModeling
from transformer.tasks.preference import Preference
from transformer.tasks.prefix_lm import PrefixLanguageModeling
from transformer.tasks.seq2seq import SequenceToSequence
from transformer.tasks.sft import ChatFineTuning
from transformer.tasks.span_corruption import SpanCorruption

TASKS: dict[str, type[Task]] = {
  cls.name: cls
  for cls in (
    LanguageModeling,
    MaskedLanguageModeling,
    TextClassification,
    SequenceToSequence,
    ImageClassification,
    SpanCorruption,
    PrefixLanguageModeling,
    Distillation,
    ChatFineTuning,
    Preference,
  )
}


def get(name: str) -> type[Task]:
  """The task class registered as `name` (`data.kind` of a config)."""
  if name not in TASKS:
    raise ValueError(f"config.data.kind={name!r}: must be one of {', '.join(TASKS)} (tasks)")
  return TASKS[name]


def create(data: DataConfig, seq_len: int, options: Any = None) -> Task:
  """The task a run's data config names, with its `options` (None = the task's defaults)
  and what its data settings imply."""
  return get(data.kind).create(data, seq_len, options)


__all__ = ["TASKS", "CrossEntropyOptions", "Run", "Task", "create", "get"]

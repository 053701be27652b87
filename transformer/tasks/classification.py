"""Text classification with an encoder (BERT fine-tuning): one label per text.

Batches: inputs ([CLS] first), segment_ids, positions [B, T]; label [B] (-1 on padding
rows of evaluation batches, which get weight 0).

Rows are `[CLS] text` with the project's tokenizers. With a pretrained vocabulary
(`data.tokenizer='pretrained'`) that has a SEP token they are `[CLS] text [SEP]`, the rows
BERT was pretrained on, in the vocabulary's own ids (a truncated text keeps its [SEP]).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import grain

from transformer.data import features, pipeline
from transformer.data.config import DataConfig, fail
from transformer.data.spec import I32, DataContext, DataSpec
from transformer.nn import models
from transformer.nn.config import ModelConfig
from transformer.tasks.base import token_batch
from transformer.tasks.labels import Classifying, labels_and_weights


def row_sep_id(data: DataConfig, tokenizer: Any) -> int | None:
  """The id that ends each row: a pretrained vocabulary's own SEP where it has one, else
  None (the project's tokenizers keep `[CLS] text` rows, so their runs are unchanged)."""
  if data.tokenizer != "pretrained":
    return None
  return tokenizer.present_specials().get("sep")  # convert.tokenizers.PretrainedTokenizer


def _build(c: DataContext, train: bool, rows: int) -> grain.IterDataset:
  b, source, sep = c.batching(train, rows), c.source(train), row_sep_id(c.cfg, c.tok)
  example = features.Classification(
    c.tok, c.seq_len, c.text_key, c.label_key, b.overlong, c.splits.name, sep
  )
  return pipeline.batches(pipeline.examples(source, b).map(example), len(source), b)


def _shapes(rows: int, s: int, t: int, image_shape) -> dict:
  del t, image_shape
  return {
    "inputs": ((rows, s), I32),
    "segment_ids": ((rows, s), I32),
    "positions": ((rows, s), I32),
    "label": ((rows,), I32),
  }


@dataclasses.dataclass(frozen=True)
class TextClassification(Classifying):
  name = "classification"
  families = ("encoder",)
  pretrained: bool = False  # a pretrained vocabulary: rows may end with its [SEP]

  @classmethod
  def create(cls, data: DataConfig, seq_len: int, options=None) -> TextClassification:
    del seq_len
    return cls(pretrained=data.tokenizer == "pretrained", options=options)

  def check(self, model: ModelConfig, data: DataConfig) -> None:
    super().check(model, data)
    if data.source not in ("labelled", "tfds", "hf"):
      rule = "data.kind 'classification' reads 'labelled', 'tfds' or 'hf' data"
      fail("data.source", data.source, rule)

  def data_spec(self) -> DataSpec:
    return DataSpec(
      build=_build,
      shapes=_shapes,
      labelled=True,
      # [CLS] (+ [SEP]: counted for any pretrained vocabulary, an upper bound without one)
      row_budget=lambda counts, s, t: [(counts[0] + 1 + self.pretrained, s)],
    )

  def loss(self, model, batch, deterministic, frozen):
    del frozen
    return self.cross_entropy(*self.forward(model, batch, deterministic))

  def forward(self, model, batch, deterministic):
    logits = model(
      batch["inputs"],
      segment_ids=batch["segment_ids"],
      positions=batch["positions"],
      deterministic=deterministic,
    )  # [B, C]
    return logits, *labels_and_weights(batch)

  def init_args(self, batch):
    return (batch["inputs"],), {
      "segment_ids": batch["segment_ids"],
      "positions": batch["positions"],
    }

  def flops_per_count(self, model, info) -> float:  # a classifier head, not the MLM head
    return models.flops_per_token(model, info.seq_len, mlm_predictions=0)

  def text_batch(self, tokenizer, text: str, max_len: int):
    return token_batch(tokenizer, text, max_len)

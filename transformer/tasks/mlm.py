"""Masked-LM pretraining for encoders (BERT): predict the masked tokens.

Batches [B, T]: inputs (corrupted: 80% [MASK], 10% random, 10% kept), targets (original),
weights f32 (1 = predicted), segment_ids, positions; rows are [CLS] text [SEP] segments,
packed. The head runs only at the scored positions, padded to `max_predictions` per row
(BERT's max_predictions_per_seq = `masking.max_selected(mask_rate, T)`); a batch row that
scores more is refused on the host.

  config.task.mask_rate           fraction of tokens predicted (80% MASK, 10% random, 10% kept)
  config.task.whole_word_masking  select whole words ('##' pieces, or pieces without '▁')
  (and the cross-entropy's label_smoothing and z_loss)
"""

from __future__ import annotations

import dataclasses
import functools

import grain
import jax.numpy as jnp
import numpy as np

from transformer.data import features, masking, pipeline
from transformer.data.config import DataConfig, fail
from transformer.data.spec import DataContext, DataSpec
from transformer.nn import models
from transformer.nn.config import ModelConfig
from transformer.tasks.base import CrossEntropyOptions, Task, token_batch
from transformer.tasks.lm import KEYS, token_shapes


@dataclasses.dataclass(frozen=True)
class MLMOptions(CrossEntropyOptions):
  """`config.task.*` of masked-LM pretraining."""

  mask_rate: float = 0.15  # fraction of tokens predicted (BERT's 15%)
  whole_word_masking: bool = False  # select whole words, not pieces

  def __post_init__(self):
    super().__post_init__()
    if not 0.0 < self.mask_rate < 1.0:
      fail("task.mask_rate", self.mask_rate, "must be in (0, 1)")


def _build(c: DataContext, train: bool, rows: int, options: MLMOptions) -> grain.IterDataset:
  """Rows of [CLS] text [SEP] segments, masked per row after packing (evaluation masks are
  fixed by the seed)."""
  mask = features.Mask(c.tok, options.mask_rate, options.whole_word_masking)
  b, source, lengths = c.batching(train, rows), c.source(train), {"inputs": c.seq_len}
  if c.streams:  # [CLS] window of T - 2 tokens [SEP]; sharded, then shuffled per host
    starts = pipeline.window_starts(source, c.seq_len - 2, train, c.splits.name)
    ds = pipeline.ordered(pipeline.shard(starts, b.loader), b)
    ds = ds.map(features.MLMWindow(source, c.seq_len)).map(pipeline.Pad(lengths))
    total = len(starts)
  else:
    example = features.MLMExample(c.tok, c.seq_len, c.text_key, b.overlong, c.splits.name)
    ds = pipeline.to_rows(pipeline.examples(source, b).map(example), lengths, b)
    total = len(source)
  return pipeline.batches(ds.random_map(mask, seed=b.seed_for("mask")), total, b)


@dataclasses.dataclass(frozen=True)
class MaskedLanguageModeling(Task):
  name = "mlm"
  families = ("encoder",)
  Options = MLMOptions
  # Logits only at up to this many scored positions per row (None: at all positions).
  max_predictions: int | None = None

  @classmethod
  def create(cls, data: DataConfig, seq_len: int, options=None) -> MaskedLanguageModeling:
    options = options or MLMOptions()
    return cls(masking.max_selected(options.mask_rate, seq_len), options=options)

  def check(self, model: ModelConfig, data: DataConfig) -> None:
    super().check(model, data)
    if model.num_classes:
      fail("model.num_classes", model.num_classes, "must be 0 for masked-LM training")
    if data.tokenizer == "pretrained":  # masking assumes the special ids 0..6
      fail("data.tokenizer", data.tokenizer, "masked-LM corruption is not supported with it yet")

  def data_spec(self) -> DataSpec:
    return DataSpec(
      build=functools.partial(_build, options=self.options),
      shapes=token_shapes(KEYS),
      window=lambda s, t: s - 2,  # [CLS] window [SEP]
      packing_key="segment_ids",
      row_budget=lambda counts, s, t: [(counts[0] + 2, s)],  # [CLS] + [SEP]
    )

  def loss(self, model, batch, deterministic, frozen):
    del frozen
    return self.cross_entropy(*self.forward(model, batch, deterministic))

  def forward(self, model, batch, deterministic):
    targets, weights, predict = batch["targets"], batch["weights"], None
    if self.max_predictions is not None:
      scored_first = jnp.argsort(weights <= 0, axis=-1, stable=True)  # [B, T]
      predict = scored_first[:, : self.max_predictions]  # [B, P]; weight 0 where a row has fewer
      targets = jnp.take_along_axis(targets, predict, axis=-1)
      weights = jnp.take_along_axis(weights, predict, axis=-1)
    logits = model(
      batch["inputs"],
      segment_ids=batch["segment_ids"],
      positions=batch["positions"],
      deterministic=deterministic,
      predict_positions=predict,
    )  # [B, T or P, V]
    return logits, targets, weights

  def init_args(self, batch):
    return (batch["inputs"],), {
      "segment_ids": batch["segment_ids"],
      "positions": batch["positions"],
    }

  def flops_per_count(self, model, info) -> float:
    return models.flops_per_token(model, info.seq_len, mlm_predictions=self.max_predictions)

  def check_batch(self, batch) -> None:
    if self.max_predictions is None:
      return
    most = int(np.max(np.sum(np.asarray(batch["weights"]) > 0, axis=-1), initial=0))
    if most > self.max_predictions:
      raise ValueError(
        f"an MLM batch row scores {most} positions, more than the {self.max_predictions} the "
        "train step predicts per row (task.mask_rate x seq_len); the batch does not come from "
        "transformer.data's MLM masking"
      )

  def text_batch(self, tokenizer, text: str, max_len: int):
    return token_batch(tokenizer, text, max_len)

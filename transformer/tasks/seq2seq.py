"""Sequence-to-sequence training for encoder-decoders (translation): the loss (corpus BLEU:
the `bleu` evaluator, which reads the references `eval_references` gives).

Batches: inputs, inputs_segment_ids, inputs_positions [B, S]; targets (end with EOS; the
model shifts them right), targets_segment_ids, targets_positions, weights f32 [B, T].
Training packs source and target jointly (example k of a row is segment k on both sides);
evaluation keeps one pair per row so outputs decode per example.

BLEU scores the decoded sources against the raw target text of the evaluation split, not
the detokenized target ids: `eval_references` reads the evaluation records in the order
the evaluation batches hold them (this host's shard in source order, `pipeline.records`;
padding rows only at the end), so no key is added to the batches and the compiled steps
see the same batch.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import grain
import numpy as np

from transformer.data import features, pipeline, sources
from transformer.data.config import DataConfig, fail
from transformer.data.spec import F32, I32, DataContext, DataSpec
from transformer.nn.config import ModelConfig
from transformer.tasks.base import Task, token_labels

INPUT_KEYS = ("inputs", "inputs_segment_ids", "inputs_positions")
TARGET_KEYS = ("targets", "targets_segment_ids", "targets_positions")


def batch_features(ex: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Packed / padded `features.Translation` rows -> the batch keys (adds `weights`)."""
  out = {k: ex[k] for pair in zip(INPUT_KEYS, TARGET_KEYS, strict=True) for k in pair}
  out["weights"] = (ex["targets_segment_ids"] > 0).astype(np.float32)
  return out


def _build(c: DataContext, train: bool, rows: int) -> grain.IterDataset:
  """Training packs inputs and targets jointly; evaluation keeps one pair per row so that
  outputs decode per example."""
  b, source, cfg = c.batching(train, rows), c.source(train), c.cfg
  pair = features.Translation(
    c.tok, c.seq_len, c.target_len, cfg.source_column, cfg.target_column, b.overlong, c.splits.name
  )
  lengths = {"inputs": c.seq_len, "targets": c.target_len}
  ds = pipeline.to_rows(pipeline.examples(source, b).map(pair), lengths, b)
  return pipeline.batches(ds.map(batch_features), len(source), b)


def eval_references(cfg: DataConfig, workdir: str | os.PathLike | None = None) -> Iterator[str]:
  """The raw target text of this host's evaluation records, in evaluation-batch order."""
  split = sources.open_splits(cfg, workdir, paired=True).eval
  shard = pipeline.records(split, pipeline.Loader())  # the eval pipeline's records, in order
  for k in range(len(shard)):
    _, record = shard[k]
    yield features.text_of(record, cfg.target_column)


def seq2seq_shapes(rows: int, s: int, t: int, image_shape) -> dict:
  """Shapes of encoder-decoder batches: inputs [B, S], targets and weights [B, T] (every
  key of training and evaluation batches; BLEU's references come from the split)."""
  del image_shape
  shapes = {k: ((rows, s), I32) for k in INPUT_KEYS}
  shapes |= {k: ((rows, t), I32) for k in TARGET_KEYS}
  return shapes | {"weights": ((rows, t), F32)}


@dataclasses.dataclass(frozen=True)
class EncoderDecoderTask(Task):
  """The step and analysis of batches with the keys above (this task, span corruption)."""

  families = ("seq2seq",)
  count_key = "targets_segment_ids"

  def loss(self, model, batch, deterministic, frozen):
    del frozen
    return self.cross_entropy(*self.forward(model, batch, deterministic))

  def forward(self, model, batch, deterministic):
    """Teacher-forced logits [B, T, V] of an encoder-decoder (bound), targets and weights."""
    logits = model(
      batch["inputs"],
      batch["targets"],
      inputs_segment_ids=batch["inputs_segment_ids"],
      targets_segment_ids=batch["targets_segment_ids"],
      inputs_positions=batch["inputs_positions"],
      targets_positions=batch["targets_positions"],
      deterministic=deterministic,
    )  # [B, T, V]
    return logits, batch["targets"], batch["weights"]

  def init_args(self, batch):
    segment_ids = {k: batch[k] for k in ("inputs_segment_ids", "targets_segment_ids")}
    return (batch["inputs"], batch["targets"]), segment_ids

  def attention_masks(self, batch):
    """Valid queries and keys per attention module: encoder, decoder self and cross."""
    source = batch["inputs_segment_ids"] > 0
    target = batch["targets_segment_ids"] > 0

    def masks(name: str):
      if name.startswith("encoder"):
        return source, source
      return (target, source) if name.endswith("cross_attention") else (target, target)

    return masks

  def attention_labels(self, batch, tokenizer):
    """Source tokens label the encoder's queries and keys and the cross-attention keys."""
    source = token_labels(batch["inputs"], tokenizer)

    def labels(name: str):
      if name.startswith("encoder"):
        return source, source
      return None, source if name.endswith("cross_attention") else None

    return labels


@dataclasses.dataclass(frozen=True)
class SequenceToSequence(EncoderDecoderTask):
  name = "seq2seq"
  evaluators = ("bleu",)

  def check(self, model: ModelConfig, data: DataConfig) -> None:
    super().check(model, data)
    if data.source not in ("pairs", "tfds", "hf"):
      fail("data.source", data.source, "data.kind 'seq2seq' reads 'pairs', 'tfds' or 'hf' data")

  def data_spec(self) -> DataSpec:
    return DataSpec(
      build=_build,
      shapes=seq2seq_shapes,
      paired=True,
      packing_key="targets_segment_ids",
      row_budget=lambda counts, s, t: [(counts[0] + 1, s), (counts[1] + 1, t)],  # + EOS
    )

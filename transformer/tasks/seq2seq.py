"""Sequence-to-sequence training for encoder-decoders (translation): loss and corpus BLEU.

Batches: inputs, inputs_segment_ids, inputs_positions [B, S]; targets (end with EOS; the
model shifts them right), targets_segment_ids, targets_positions, weights f32 [B, T].
Training packs source and target jointly (example k of a row is segment k on both sides);
evaluation keeps one pair per row so outputs decode per example.
"""

from __future__ import annotations

import dataclasses

import grain

from transformer.data import pipeline
from transformer.data.config import DataConfig
from transformer.data.spec import F32, I32, DataContext, DataSpec
from transformer.nn.config import ModelConfig
from transformer.tasks import evals
from transformer.tasks.base import EvalOptions, Extras, Run, Task, fail, token_labels

INPUT_KEYS = ("inputs", "inputs_segment_ids", "inputs_positions")
TARGET_KEYS = ("targets", "targets_segment_ids", "targets_positions")


def _build(c: DataContext, train: bool, rows: int) -> grain.IterDataset:
  return pipeline.seq2seq_dataset(
    c.source(train),
    c.tok,
    inputs_len=c.seq_len,
    targets_len=c.target_len,
    batch_size=rows,
    train=train,
    packed=c.cfg.packing,
    source_key=c.cfg.source_column,
    target_key=c.cfg.target_column,
    source_name=c.splits.name,
    **c.common(),
  )


def seq2seq_shapes(rows: int, s: int, t: int, image_shape) -> dict:
  """Shapes of encoder-decoder batches: inputs [B, S], targets and weights [B, T]."""
  del image_shape
  shapes = {k: ((rows, s), I32) for k in INPUT_KEYS}
  shapes |= {k: ((rows, t), I32) for k in TARGET_KEYS}
  return shapes | {"weights": ((rows, t), F32)}


def seq2seq_forward(model, variables, batch, deterministic, rngs):
  """Teacher-forced logits [B, T, V] of an encoder-decoder, its targets and weights."""
  logits = model.apply(
    variables,
    batch["inputs"],
    batch["targets"],
    inputs_segment_ids=batch["inputs_segment_ids"],
    targets_segment_ids=batch["targets_segment_ids"],
    inputs_positions=batch["inputs_positions"],
    targets_positions=batch["targets_positions"],
    deterministic=deterministic,
    rngs=rngs,
  )  # [B, T, V]
  return logits, batch["targets"], batch["weights"]


def seq2seq_init_args(batch):
  """`model.init` arguments of an encoder-decoder."""
  return (batch["inputs"], batch["targets"]), {
    "inputs_segment_ids": batch["inputs_segment_ids"],
    "targets_segment_ids": batch["targets_segment_ids"],
  }


def seq2seq_attention_masks(batch):
  """Valid queries and keys per attention module: encoder, decoder self and cross."""
  source = batch["inputs_segment_ids"] > 0
  target = batch["targets_segment_ids"] > 0

  def masks(name: str):
    if name.startswith("encoder"):
      return source, source
    return (target, source) if name.endswith("cross_attention") else (target, target)

  return masks


def seq2seq_attention_labels(batch, tokenizer):
  """Source tokens label the encoder's queries and keys and the cross-attention keys."""
  source = token_labels(batch["inputs"], tokenizer)

  def labels(name: str):
    if name.startswith("encoder"):
      return source, source
    return None, source if name.endswith("cross_attention") else None

  return labels


@dataclasses.dataclass(frozen=True)
class SequenceToSequence(Task):
  name = "seq2seq"
  families = ("seq2seq",)
  count_key = "targets_segment_ids"

  def check(self, model: ModelConfig, data: DataConfig) -> None:
    super().check(model, data)
    if data.source not in ("pairs", "tfds"):
      fail("data.source", data.source, "data.kind 'seq2seq' reads 'pairs' or 'tfds' data")

  def data_spec(self) -> DataSpec:
    return DataSpec(
      build=_build,
      shapes=seq2seq_shapes,
      paired=True,
      packing_key="targets_segment_ids",
      row_budget=lambda counts, s, t: [(counts[0] + 1, s), (counts[1] + 1, t)],  # + EOS
    )

  def forward(self, model, variables, batch, deterministic, rngs):
    return seq2seq_forward(model, variables, batch, deterministic, rngs)

  def init_args(self, batch):
    return seq2seq_init_args(batch)

  def during_training(self, run: Run, extras: Extras, done: int, total: int) -> dict:
    if not extras.bleu_every or (done % extras.bleu_every and done != total):
      return {}
    beam = extras.bleu_beam_size
    result = evals.bleu(
      run.model,
      run.params,
      run.info.tokenizer,
      run.eval_factory(),
      run.eval_batches,
      method="beam" if beam > 1 else "greedy",
      beam_size=max(beam, 1),
    )
    return {"bleu": result["bleu"]}

  def evaluate(self, run: Run, options: EvalOptions) -> dict:
    return evals.bleu(
      run.model,
      run.params,
      run.info.tokenizer,
      run.eval_factory(),
      run.eval_batches,
      method=options.bleu_method,
      beam_size=options.beam_size,
    )

  def attention_masks(self, batch):
    return seq2seq_attention_masks(batch)

  def attention_labels(self, batch, tokenizer):
    return seq2seq_attention_labels(batch, tokenizer)

"""Sequence-to-sequence training for encoder-decoders (translation): loss and corpus BLEU.

Batches: inputs, inputs_segment_ids, inputs_positions [B, S]; targets (end with EOS; the
model shifts them right), targets_segment_ids, targets_positions, weights f32 [B, T].
Training packs source and target jointly (example k of a row is segment k on both sides);
evaluation keeps one pair per row so outputs decode per example.

BLEU (during training every `bleu_every` updates, and from eval.py) scores the decoded
sources against the raw target text of the evaluation split, not the detokenized target
ids: `eval_references` reads the evaluation records in the order the evaluation batches
hold them (this host's shard in source order, `pipeline.records`; padding rows only at
the end), so no key is added to the batches and the compiled steps see the same batch.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import grain
import jax

from transformer.data import features, pipeline, sources
from transformer.data.config import DataConfig, fail
from transformer.data.spec import F32, I32, DataContext, DataSpec
from transformer.nn.config import ModelConfig
from transformer.tasks import evals
from transformer.tasks.base import EvalOptions, Extras, Run, Task, token_labels

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


def eval_references(cfg: DataConfig, workdir: str | os.PathLike | None = None) -> Iterator[str]:
  """The raw target text of this host's evaluation records, in evaluation-batch order."""
  split = sources.open_splits(cfg, workdir, paired=True).eval
  shard = pipeline.records(split, pipeline.Loader())  # the eval pipeline's records, in order
  for k in range(len(shard)):
    _, record = shard[k]
    yield features.text_of(record, cfg.target_column)


def seq2seq_bleu(run: Run, method: str, beam_size: int) -> dict:
  """`evals.bleu` of the run's evaluation batches against the split's raw references."""
  return evals.bleu(
    run.model,
    run.params,
    run.info.tokenizer,
    run.eval_factory(),
    run.eval_batches,
    references=eval_references(run.info.config, run.workdir),
    method=method,
    beam_size=beam_size,
    total=run.info.eval_batches,
  )


def seq2seq_shapes(rows: int, s: int, t: int, image_shape) -> dict:
  """Shapes of encoder-decoder batches: inputs [B, S], targets and weights [B, T] (every
  key of training and evaluation batches; BLEU's references come from the split)."""
  del image_shape
  shapes = {k: ((rows, s), I32) for k in INPUT_KEYS}
  shapes |= {k: ((rows, t), I32) for k in TARGET_KEYS}
  return shapes | {"weights": ((rows, t), F32)}


def seq2seq_forward(model, batch, deterministic):
  """Teacher-forced logits [B, T, V] of an encoder-decoder (bound), its targets and weights."""
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

  def forward(self, model, batch, deterministic):
    return seq2seq_forward(model, batch, deterministic)

  def init_args(self, batch):
    return seq2seq_init_args(batch)

  def during_training(self, run: Run, extras: Extras, done: int, total: int) -> dict:
    if not extras.bleu_every or (done % extras.bleu_every and done != total):
      return {}
    beam = extras.bleu_beam_size
    result = seq2seq_bleu(run, "beam" if beam > 1 else "greedy", max(beam, 1))
    if jax.process_index() == 0:  # the console line, with what a reader needs to compare
      print(
        f"BLEU @ step {done} | {result['bleu']:.2f} on {run.info.config.eval_split} "
        f"({result['bleu_method']}; sacrebleu {result['bleu_signature']})",
        flush=True,
      )
    return {"bleu": result["bleu"]}

  def evaluate(self, run: Run, options: EvalOptions) -> dict:
    return seq2seq_bleu(run, options.bleu_method, options.beam_size)

  def attention_masks(self, batch):
    return seq2seq_attention_masks(batch)

  def attention_labels(self, batch, tokenizer):
    return seq2seq_attention_labels(batch, tokenizer)

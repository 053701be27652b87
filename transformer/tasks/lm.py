"""Next-token prediction for decoder-only models (GPT): loss and perplexity (text samples:
the `sample` evaluator).

Batches [B, T] (int32 unless noted): inputs, targets (the next tokens), weights f32,
segment_ids (1, 2, ... per packed example, 0 = padding), positions (restart per example).
From a token stream (source 'text', or `data.windows`): windows of T + 1 tokens (nanoGPT);
from records: [BOS] text [EOS] examples, packed or padded into rows.
"""

from __future__ import annotations

import dataclasses

import grain

from transformer.data import features, pipeline
from transformer.data.spec import F32, I32, DataContext, DataSpec
from transformer.tasks.base import Task, token_batch

KEYS = ("inputs", "targets", "weights", "segment_ids", "positions")
MODEL_KEYS = ("positions", "segment_ids")  # what the decoder reads besides the inputs


def token_shapes(keys: tuple[str, ...]):
  """Shapes of batches whose every key is [B, T] (weights float32, the rest int32)."""

  def shapes(rows: int, s: int, t: int, image_shape) -> dict:
    del t, image_shape
    return {k: ((rows, s), F32 if k == "weights" else I32) for k in keys}

  return shapes


def decoder_forward(model, batch, deterministic, keys: tuple[str, ...] = MODEL_KEYS):
  """Next-token logits [B, T, V] of a decoder (bound) fed `batch[keys]`; targets, weights."""
  extra = {k: batch[k] for k in keys}
  logits = model(batch["inputs"], **extra, deterministic=deterministic)  # [B, T, V]
  return logits, batch["targets"], batch["weights"]


def _build(c: DataContext, train: bool, rows: int) -> grain.IterDataset:
  b, source = c.batching(train, rows), c.source(train)
  if c.streams:  # windows of T + 1 tokens: every start (training), contiguous (evaluation)
    starts = pipeline.window_starts(source, c.seq_len, train, c.splits.name)
    ds = pipeline.windows(starts, b).map(features.Windows(source, c.seq_len))
    return pipeline.batches(ds, len(starts), b)
  example = features.LMExample(c.tok, c.seq_len, c.text_key, b.overlong, c.splits.name)
  lengths = {"inputs": c.seq_len, "targets": c.seq_len}
  ds = pipeline.to_rows(pipeline.examples(source, b).map(example), lengths, b)
  return pipeline.batches(ds.map(features.lm_batch_features), len(source), b)


@dataclasses.dataclass(frozen=True)
class LanguageModeling(Task):
  name = "lm"
  families = ("decoder",)
  prompts = True
  evaluators = ("sample",)

  def data_spec(self) -> DataSpec:
    return DataSpec(
      build=_build,
      shapes=token_shapes(KEYS),
      window=lambda s, t: s,
      packing_key="segment_ids",
      row_budget=lambda counts, s, t: [(counts[0] + 2, s + 1)],  # BOS + EOS; T + 1 tokens
    )

  def loss(self, model, batch, deterministic, frozen):
    del frozen
    return self.cross_entropy(*self.forward(model, batch, deterministic))

  def forward(self, model, batch, deterministic):
    return decoder_forward(model, batch, deterministic)

  def init_args(self, batch):
    return (batch["inputs"],), {k: batch[k] for k in MODEL_KEYS}

  def text_batch(self, tokenizer, text: str, max_len: int):
    return token_batch(tokenizer, text, max_len)

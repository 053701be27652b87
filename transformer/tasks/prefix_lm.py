"""Prefix-LM pretraining for decoder-only models (Raffel et al. 2020, 3.2.1; UniLM).

Each row is a window of T + 1 tokens of the text, cut at a uniformly random point p in
[1, T - 1]: the first p input tokens are the prefix, seen bidirectionally (every prefix
token attends to every other), the rest is predicted causally. The loss covers the suffix
only: the predictions of tokens p .. T (input positions p - 1 .. T - 1), so no position
is trained to predict a token it can see.

Batches [B, T]: inputs, targets (next tokens), weights f32 (1 on the suffix), segment_ids
(0 = padding), positions, prefix_mask (1 on the prefix).
"""

from __future__ import annotations

import dataclasses

import grain
import numpy as np

from transformer.data import pipeline
from transformer.data.config import DataConfig, fail
from transformer.data.spec import DataContext, DataSpec
from transformer.nn.config import ModelConfig
from transformer.tasks.base import Task
from transformer.tasks.lm import decoder_forward, token_shapes

KEYS = ("inputs", "targets", "weights", "segment_ids", "positions", "prefix_mask")
MODEL_KEYS = ("positions", "segment_ids", "prefix_mask")  # what the decoder reads with inputs


def split_window(window: np.ndarray, seq_len: int, prefix: int) -> dict[str, np.ndarray]:
  """The row of a window of <= T + 1 tokens whose first `prefix` inputs are the prefix."""
  inputs, targets = window[:-1], window[1:]  # [<= T]
  n = len(inputs)
  t = np.arange(seq_len)  # [T]
  valid = t < n
  return {
    "inputs": np.pad(inputs, (0, seq_len - n)).astype(np.int32),
    "targets": np.pad(targets, (0, seq_len - n)).astype(np.int32),
    "weights": (valid & (t >= prefix - 1)).astype(np.float32),
    "segment_ids": valid.astype(np.int32),
    "positions": np.where(valid, t, 0).astype(np.int32),
    "prefix_mask": (valid & (t < prefix)).astype(np.int32),
  }


@dataclasses.dataclass(frozen=True)
class _Split:
  """A window start -> one prefix-LM row, cut at a random point (grain `random_map`)."""

  tokens: np.ndarray  # int32 [N], the split's token stream
  seq_len: int

  def __call__(self, start: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    window = self.tokens[start : start + self.seq_len + 1]  # [<= T + 1]
    n = len(window) - 1
    prefix = int(rng.integers(1, n)) if n > 1 else 1
    return split_window(window, self.seq_len, prefix)


def _build(c: DataContext, train: bool, rows: int) -> grain.IterDataset:
  b, tokens = c.batching(train, rows), c.source(train)
  starts = pipeline.window_starts(tokens, c.seq_len, train, c.splits.name)
  split = _Split(tokens, c.seq_len)
  ds = pipeline.windows(starts, b).random_map(split, seed=b.seed_for("prefix"))
  return pipeline.batches(ds, len(starts), b)


@dataclasses.dataclass(frozen=True)
class PrefixLanguageModeling(Task):
  name = "prefix_lm"
  families = ("decoder",)

  def check(self, model: ModelConfig, data: DataConfig) -> None:
    super().check(model, data)
    if not data.uses_windows:
      fail("data.windows", data.windows, "prefix_lm reads the text as one token stream")

  def data_spec(self) -> DataSpec:
    return DataSpec(build=_build, shapes=token_shapes(KEYS), window=lambda s, t: s)

  def loss(self, model, batch, deterministic, frozen):
    del frozen
    return self.cross_entropy(*self.forward(model, batch, deterministic))

  def forward(self, model, batch, deterministic):
    return decoder_forward(model, batch, deterministic, MODEL_KEYS)

  def init_args(self, batch):
    return (batch["inputs"],), {k: batch[k] for k in MODEL_KEYS}

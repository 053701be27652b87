"""T5 span corruption: encoder-decoder pretraining on plain text (Raffel et al. 2020, 3.1.4).

A window of L tokens of the text is noised: about `config.task.noise_density` of its
tokens (0.15), in spans of mean length `config.task.mean_span_length` (3), are dropped.
The inputs are the window with each dropped span replaced by one sentinel; the targets are
the sentinels, each followed by the span it stands for. Both end in EOS:

  window   a b c d e f g h
  inputs   a <s0> d e <s1> h EOS
  targets  <s0> b c <s1> f g EOS

The split into spans follows T5's `random_spans_noise_mask`: round(L * density) noise
tokens in round(noise / mean_span) spans, noise and non-noise lengths each a uniformly
random composition, interleaved starting with non-noise. L is the longest window whose
inputs fit S and targets fit T (T5's `compute_input_and_target_lengths`). Sentinel k is
id `tokenizer.vocab_size + k`: the model's vocabulary holds `NUM_SENTINELS` ids above the
tokenizer's. Batches have the seq2seq keys (one example per row, padded).
"""

from __future__ import annotations

import dataclasses

import grain
import numpy as np

from transformer.data import pipeline
from transformer.data.config import DataConfig, fail
from transformer.data.spec import DataContext, DataSpec
from transformer.data.tokenizers import EOS_ID
from transformer.nn.config import ModelConfig
from transformer.tasks.base import CrossEntropyOptions
from transformer.tasks.seq2seq import EncoderDecoderTask, seq2seq_shapes

NUM_SENTINELS = 100  # T5's extra ids


@dataclasses.dataclass(frozen=True)
class SpanOptions(CrossEntropyOptions):
  """`config.task.*` of span corruption (defaults: Raffel et al. 2020, Table 7's best)."""

  noise_density: float = 0.15  # fraction of each window's tokens dropped
  mean_span_length: float = 3.0  # mean length of a dropped span, in tokens

  def __post_init__(self):
    super().__post_init__()
    if not 0.0 < self.noise_density < 1.0:
      fail("task.noise_density", self.noise_density, "must be in (0, 1)")
    if not 1.0 <= self.mean_span_length < float("inf"):
      fail("task.mean_span_length", self.mean_span_length, "must be a number >= 1")


def _counts(length: int, density: float, mean_span: float) -> tuple[int, int]:
  """(noise tokens, noise spans) of a window of `length` tokens."""
  noise = min(max(int(round(length * density)), 1), length - 1)
  spans = max(int(round(noise / mean_span)), 1)
  return noise, spans


def window_length(inputs_len: int, targets_len: int, density: float, mean_span: float) -> int:
  """The longest window L whose inputs (L - noise + spans + EOS) fit `inputs_len` and whose
  targets (noise + spans + EOS) fit `targets_len`."""
  best = 0
  for length in range(2, 8 * inputs_len):
    noise, spans = _counts(length, density, mean_span)
    if length - noise + spans + 1 <= inputs_len and noise + spans + 1 <= targets_len:
      best = length
    elif length - noise + spans + 1 > inputs_len:
      break
  if best < 2:
    raise ValueError(f"no window fits inputs of {inputs_len} and targets of {targets_len} tokens")
  return best


def _segment(total: int, parts: int, rng: np.random.Generator) -> np.ndarray:
  """A uniformly random composition of `total` into `parts` positive lengths: int [parts]."""
  cuts = np.sort(rng.choice(np.arange(1, total), size=parts - 1, replace=False))
  return np.diff(np.concatenate([[0], cuts, [total]]))


def noise_mask(
  length: int,
  rng: np.random.Generator,
  density: float = SpanOptions.noise_density,
  mean_span: float = SpanOptions.mean_span_length,
) -> np.ndarray:
  """bool [length]: True at dropped tokens (T5's `random_spans_noise_mask`)."""
  noise, spans = _counts(length, density, mean_span)
  spans = min(spans, noise, length - noise)
  noise_lengths = _segment(noise, spans, rng)  # [spans]
  keep_lengths = _segment(length - noise, spans, rng)  # [spans]
  runs = np.stack([keep_lengths, noise_lengths], axis=1).reshape(-1)  # keep, noise, keep, ...
  flags = np.tile([False, True], spans)
  return np.repeat(flags, runs)


def corrupt(tokens: np.ndarray, mask: np.ndarray, first_sentinel: int) -> tuple[np.ndarray, ...]:
  """(inputs, targets) of `tokens` [L] with the spans where `mask` is True dropped.

  Span k becomes sentinel `first_sentinel + k` in the inputs; the targets are each
  sentinel followed by its span. Both end in EOS.
  """
  starts = mask & ~np.concatenate([[False], mask[:-1]])  # [L] first token of each span
  sentinel = first_sentinel + np.cumsum(starts) - 1  # [L] span number -> id
  inputs = np.where(starts, sentinel, tokens)[~mask | starts]  # [L - noise + spans]
  dropped = np.flatnonzero(mask)  # [noise]
  first = starts[dropped]  # [noise] True where a span begins
  targets = np.insert(tokens[dropped], np.flatnonzero(first), sentinel[dropped][first])
  eos = np.array([EOS_ID], np.int32)
  return (
    np.concatenate([inputs.astype(np.int32), eos]),
    np.concatenate([np.asarray(targets, np.int32), eos]),
  )


@dataclasses.dataclass(frozen=True)
class _Corrupt:
  """A window start -> one padded seq2seq example (grain `random_map`)."""

  tokens: np.ndarray  # int32 [N], the split's token stream
  length: int  # window L
  inputs_len: int  # S
  targets_len: int  # T
  first_sentinel: int
  density: float
  mean_span: float

  def __call__(self, start: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    window = self.tokens[start : start + self.length]  # [<= L]
    mask = noise_mask(len(window), rng, self.density, self.mean_span)
    inputs, targets = corrupt(window, mask, self.first_sentinel)
    out = {}
    for side, ids, width in (
      ("inputs", inputs, self.inputs_len),
      ("targets", targets, self.targets_len),
    ):
      valid = np.arange(width) < len(ids)  # [width]
      out[side] = np.pad(ids, (0, width - len(ids))).astype(np.int32)
      out[f"{side}_segment_ids"] = valid.astype(np.int32)
      out[f"{side}_positions"] = np.where(valid, np.arange(width), 0).astype(np.int32)
    out["weights"] = out["targets_segment_ids"].astype(np.float32)
    return out


@dataclasses.dataclass(frozen=True)
class SpanCorruption(EncoderDecoderTask):
  name = "span_corruption"
  extra_vocab = NUM_SENTINELS
  Options = SpanOptions

  @property
  def density(self) -> float:
    return self.options.noise_density

  @property
  def mean_span(self) -> float:
    return self.options.mean_span_length

  def check(self, model: ModelConfig, data: DataConfig) -> None:
    super().check(model, data)
    if not data.uses_windows:
      fail("data.windows", data.windows, "span_corruption reads the text as one token stream")
    if data.tokenizer == "pretrained":  # sentinels go above the tokenizer's ids, not T5's
      fail("data.tokenizer", data.tokenizer, "span corruption is not supported with it yet")

  def data_spec(self) -> DataSpec:
    return DataSpec(
      build=self._build,
      shapes=seq2seq_shapes,
      window=lambda s, t: window_length(s, t, self.density, self.mean_span),
    )

  def _build(self, c: DataContext, train: bool, rows: int) -> grain.IterDataset:
    b, tokens = c.batching(train, rows), c.source(train)
    length = window_length(c.seq_len, c.target_len, self.density, self.mean_span)
    starts = pipeline.window_starts(tokens, length, train, c.splits.name)
    corrupt_fn = _Corrupt(
      tokens, length, c.seq_len, c.target_len, c.tok.vocab_size, self.density, self.mean_span
    )
    ds = pipeline.windows(starts, b).random_map(corrupt_fn, seed=b.seed_for("noise"))
    return pipeline.batches(ds, len(starts), b)

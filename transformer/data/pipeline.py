"""grain input pipelines: one entry function per model family, numpy batches out.

Every entry function takes a random-access source (a TFDS data source, or any sequence
of records) and returns a `grain.IterDataset`; `iter()` of it is a
`grain.DatasetIterator` whose `get_state()` / `set_state()` (or
`grain.checkpoint.CheckpointSave/Restore` under orbax) resume a run on exactly the
batches it would have seen.

Training (`train=True`): records are sharded per host (`source[i::process_count]`,
disjoint, together covering the data), shuffled with the seed (a fresh permutation each
epoch), repeated `num_epochs` times (None: forever), transformed, packed or padded and
batched with `drop_remainder`. Evaluation (`train=False`): the host's shard in source
order, every example exactly once, in the same number of batches on every host: the
last batches are filled with padding rows (weights 0, segment ids 0, label -1).

Batch keys (B per-host batch, T seq_len, S inputs length; int32 unless noted):
  lm:             inputs, targets (next tokens), weights f32, segment_ids, positions  [B, T]
  mlm:            inputs (corrupted), targets (original), weights f32 (1 = predict),
                  segment_ids, positions  [B, T]
  classification: inputs ([CLS] first), segment_ids, positions [B, T]; label [B]
  seq2seq:        inputs, inputs_segment_ids, inputs_positions [B, S]; targets (end in EOS),
                  targets_segment_ids, targets_positions, weights f32 [B, T]
  image:          image f32 [B, H, W, C] (normalised); label [B]  (`image_pipeline.py`)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import grain
import numpy as np

from transformer.data import features, packing
from transformer.data.tokenizers import Tokenizer


@dataclasses.dataclass(frozen=True)
class Loader:
  """How records are read: host shard, epochs, processes, prefetching, overlong policy."""

  process_index: int | None = None  # this host; None = jax.process_index()
  process_count: int | None = None  # hosts; None = jax.process_count()
  num_epochs: int | None = None  # training passes over the data; None = repeat forever
  num_workers: int = 0  # grain worker processes (0: transform in this process)
  worker_buffer: int = 2  # batches each worker (or the prefetch thread) keeps ready
  read_threads: int = 4  # threads reading and transforming records ahead of batching
  read_buffer: int = 128  # records read ahead
  packing_bins: int | None = None  # rows filled at once by the packer; None = batch size
  overlong: str = "truncate"  # example longer than the row: truncate | skip | error

  def host(self) -> tuple[int, int]:
    index, count = self.process_index, self.process_count
    if index is None or count is None:
      import jax

      index = jax.process_index() if index is None else index
      count = jax.process_count() if count is None else count
    if not 0 <= index < count:
      raise ValueError(f"process_index {index} outside [0, process_count={count})")
    return index, count


def ceil_div(a: int, b: int) -> int:
  return -(-a // b)


def derive_seed(seed: int, tag: str) -> int:
  """An independent 32-bit seed per use (`shuffle`, `mask`, ...) from the run seed."""
  return int(np.random.SeedSequence([seed, *tag.encode()]).generate_state(1)[0])


def _with_index(index: int, record: Any) -> tuple[int, Any]:
  return index, record


def records(source: Sequence, loader: Loader) -> grain.MapDataset:
  """(source index, record) pairs of this host's shard (the building blocks below are public
  so that a task can assemble its own pipeline)."""
  index, count = loader.host()
  return grain.MapDataset.source(source).map_with_index(_with_index)[index::count]


def shard(ds: grain.MapDataset, loader: Loader) -> grain.MapDataset:
  index, count = loader.host()
  return ds[index::count]


def shuffled(ds: grain.MapDataset, seed: int, loader: Loader) -> grain.MapDataset:
  return ds.shuffle(derive_seed(seed, "shuffle")).repeat(loader.num_epochs)


def to_iter(ds: grain.MapDataset, loader: Loader) -> grain.IterDataset:
  options = grain.ReadOptions(
    num_threads=loader.read_threads, prefetch_buffer_size=loader.read_buffer
  )
  return ds.to_iter_dataset(options)


def prefetched(ds: grain.IterDataset, loader: Loader) -> grain.IterDataset:
  if loader.num_workers > 0:
    from absl import flags

    if not flags.FLAGS.is_parsed():  # grain's workers read absl flags; outside an absl app
      flags.FLAGS.mark_as_parsed()  # (tests, notebooks) use their defaults.
    options = grain.MultiprocessingOptions(
      num_workers=loader.num_workers, per_worker_buffer_size=loader.worker_buffer
    )
    return ds.mp_prefetch(options)
  return grain.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=loader.worker_buffer)


def train_batches(ds: grain.IterDataset, batch_size: int, loader: Loader) -> grain.IterDataset:
  return prefetched(ds.batch(batch_size, drop_remainder=True), loader)


class _PaddedRows:
  """Row i of `ds`, or a padding row (zeros, label -1) for i >= len(ds)."""

  def __init__(self, ds: grain.MapDataset, template: dict[str, np.ndarray]):
    self._ds = ds
    self._pad = {k: np.full_like(v, -1 if k == "label" else 0) for k, v in template.items()}

  def __call__(self, i: int) -> dict[str, np.ndarray]:
    return self._ds[i] if i < len(self._ds) else self._pad


def eval_batches(
  rows: grain.MapDataset, total: int, batch_size: int, loader: Loader
) -> grain.IterDataset:
  """Batches of this host's `rows` (its shard of `total`), padded to the same count on all hosts."""
  _, count = loader.host()
  num_batches = ceil_div(ceil_div(total, count), batch_size)
  if not len(rows):
    raise ValueError("evaluation split is empty")
  padded = grain.MapDataset.range(num_batches * batch_size).map(_PaddedRows(rows, rows[0]))
  return prefetched(to_iter(padded.batch(batch_size), loader), loader)


def token_stream(
  source: Sequence | np.ndarray,
  tokenizer: Tokenizer,
  text_key: str | tuple[str, ...] = "text",
  separator: str = "",
) -> np.ndarray:
  """The split's texts joined in source order and tokenized: int32 [N].

  Several `text_key`s: every record's first column, then every record's second, ... (a
  table of sentence pairs becomes the text of one language, then of the other: no pair is
  side by side). `separator` ends each text ('\n' for one sentence per record; text
  chunks already end where the next one starts). An integer array is taken to be a token
  stream already and returned as is.
  """
  if isinstance(source, np.ndarray):
    return source.astype(np.int32, copy=False)
  keys = (text_key,) if isinstance(text_key, str) else text_key
  parts = []
  for key in keys:
    records = features.read_records(source, range(len(source)))
    parts.extend(features.text_of(record, key) + separator for _, record in records)
  return tokenizer.encode_array("".join(parts))


def window_starts(tokens: np.ndarray, span: int, train: bool, name: str) -> grain.MapDataset:
  """Window start indices: every start (train), or contiguous non-overlapping (eval)."""
  if len(tokens) < span + 1:
    raise ValueError(f"{name}: {len(tokens)} tokens are too few for windows of {span + 1}")
  if train:
    return grain.MapDataset.range(len(tokens) - span)
  return grain.MapDataset.range(0, len(tokens) - 1, span)


def _packed_or_padded(
  ds: grain.MapDataset,
  lengths: dict[str, int],
  batch_size: int,
  packed: bool,
  seed: int,
  loader: Loader,
) -> grain.IterDataset:
  """Training rows of variable-length examples: skip Nones, then pack or pad to `lengths`."""
  it = to_iter(ds, loader)  # Drops the None of skipped examples.
  if packed:
    bins = loader.packing_bins or batch_size
    return packing.pack(it, lengths, bins, seed=derive_seed(seed, "pack"))
  return it.map(_Pad(lengths))


def _finish_examples(
  ds: grain.MapDataset,
  lengths: dict[str, int],
  finalize: Callable[[dict], dict],
  batch_size: int,
  packed: bool,
  seed: int,
  loader: Loader,
) -> grain.IterDataset:
  """Training tail for variable-length examples: skip Nones, pack or pad, finalize, batch."""
  it = _packed_or_padded(ds, lengths, batch_size, packed, seed, loader).map(finalize)
  return train_batches(it, batch_size, loader)


@dataclasses.dataclass(frozen=True)
class _Pad:
  lengths: dict[str, int]

  def __call__(self, ex: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return packing.pad_example(ex, self.lengths)


def eval_policy(loader: Loader) -> str:
  return "truncate" if loader.overlong == "skip" else loader.overlong  # Eval sees every example.


def lm_dataset(
  source: Sequence,
  tokenizer: Tokenizer,
  *,
  seq_len: int,
  batch_size: int,
  train: bool,
  seed: int = 0,
  windows: bool = True,
  packed: bool = True,
  text_key: str = "text",
  source_name: str = "",
  loader: Loader = Loader(),
) -> grain.IterDataset:
  """Decoder-only LM batches (keys inputs, targets, weights, segment_ids, positions).

  `windows=True`: the split is one token stream (`source` may be that stream, int32
  [N]); training samples windows of T + 1 tokens at every start (nanoGPT), evaluation
  takes contiguous non-overlapping windows, so every token is predicted once.
  `windows=False`: each record is [BOS] text [EOS], packed (or padded) into rows.
  """
  if windows:
    tokens = token_stream(source, tokenizer, text_key)
    starts = window_starts(tokens, seq_len, train, source_name)
    if not train:
      return eval_batches(
        shard(starts, loader).map(features.Windows(tokens, seq_len)),
        len(starts),
        batch_size,
        loader,
      )
    # Shuffle, then deal windows to hosts: the global batch is the same set of windows
    # whatever the number of processes (multi-host runs reproduce single-host losses).
    ds = shard(shuffled(starts, seed, loader), loader).map(features.Windows(tokens, seq_len))
    return train_batches(to_iter(ds, loader), batch_size, loader)
  lengths = {"inputs": seq_len, "targets": seq_len}
  if not train:
    example = features.LMExample(tokenizer, seq_len, text_key, eval_policy(loader), source_name)
    rows = records(source, loader).map(example).map(_Pad(lengths)).map(features.lm_batch_features)
    return eval_batches(rows, len(source), batch_size, loader)
  example = features.LMExample(tokenizer, seq_len, text_key, loader.overlong, source_name)
  ds = shuffled(records(source, loader), seed, loader).map(example)
  return _finish_examples(ds, lengths, features.lm_batch_features, batch_size, packed, seed, loader)


def mlm_dataset(
  source: Sequence,
  tokenizer: Tokenizer,
  *,
  seq_len: int,
  batch_size: int,
  train: bool,
  seed: int = 0,
  windows: bool = False,
  packed: bool = True,
  mask_rate: float = 0.15,
  whole_word: bool = False,
  text_key: str = "text",
  source_name: str = "",
  loader: Loader = Loader(),
) -> grain.IterDataset:
  """Masked-LM batches (keys inputs, targets, weights, segment_ids, positions); rows are
  [CLS] text [SEP] segments.

  Masks are drawn per row after packing; evaluation masks are fixed by `seed`.
  `windows=True` cuts the token stream (`source` may be that stream, int32 [N]) into
  windows of T - 2 tokens instead of using records.
  """
  mask = features.Mask(tokenizer, mask_rate, whole_word)
  lengths = {"inputs": seq_len}
  mask_seed = derive_seed(seed, "mask")
  if windows:
    tokens = token_stream(source, tokenizer, text_key)
    starts = window_starts(tokens, seq_len - 2, train, source_name)
    ds = shard(starts, loader)
    ds = shuffled(ds, seed, loader) if train else ds
    rows = (
      ds.map(features.MLMWindow(tokens, seq_len))
      .map(_Pad(lengths))
      .random_map(mask, seed=mask_seed)
    )
    if not train:
      return eval_batches(rows, len(starts), batch_size, loader)
    return train_batches(to_iter(rows, loader), batch_size, loader)
  if not train:
    example = features.MLMExample(tokenizer, seq_len, text_key, eval_policy(loader), source_name)
    rows = records(source, loader).map(example).map(_Pad(lengths)).random_map(mask, seed=mask_seed)
    return eval_batches(rows, len(source), batch_size, loader)
  example = features.MLMExample(tokenizer, seq_len, text_key, loader.overlong, source_name)
  ds = shuffled(records(source, loader), seed, loader).map(example)
  it = _packed_or_padded(ds, lengths, batch_size, packed, seed, loader)
  return train_batches(it.random_map(mask, seed=mask_seed), batch_size, loader)


def classification_dataset(
  source: Sequence,
  tokenizer: Tokenizer,
  *,
  seq_len: int,
  batch_size: int,
  train: bool,
  seed: int = 0,
  text_key: str = "text",
  label_key: str = "label",
  source_name: str = "",
  loader: Loader = Loader(),
  sep_id: int | None = None,
) -> grain.IterDataset:
  """Text classification batches (keys inputs, segment_ids, positions, label), one text per
  row: `[CLS] text`, or `[CLS] text [SEP]` where `sep_id` is set."""
  policy = loader.overlong if train else eval_policy(loader)
  example = features.Classification(
    tokenizer, seq_len, text_key, label_key, policy, source_name, sep_id
  )
  if not train:
    return eval_batches(records(source, loader).map(example), len(source), batch_size, loader)
  ds = shuffled(records(source, loader), seed, loader).map(example)
  return train_batches(to_iter(ds, loader), batch_size, loader)


def seq2seq_dataset(
  source: Sequence,
  tokenizer: Tokenizer,
  *,
  inputs_len: int,
  targets_len: int,
  batch_size: int,
  train: bool,
  source_key: str,
  target_key: str,
  seed: int = 0,
  packed: bool = True,
  source_name: str = "",
  loader: Loader = Loader(),
) -> grain.IterDataset:
  """Encoder-decoder batches (keys inputs, inputs_segment_ids, inputs_positions, targets,
  targets_segment_ids, targets_positions, weights); one shared tokenizer.

  Training packs inputs and targets jointly (example k of a row is segment k on both
  sides); evaluation keeps one pair per row so outputs can be decoded per example.
  """
  lengths = {"inputs": inputs_len, "targets": targets_len}
  policy = loader.overlong if train else eval_policy(loader)
  pair = features.Translation(
    tokenizer, inputs_len, targets_len, source_key, target_key, policy, source_name
  )
  if not train:
    rows = records(source, loader).map(pair).map(_Pad(lengths)).map(features.seq2seq_batch_features)
    return eval_batches(rows, len(source), batch_size, loader)
  ds = shuffled(records(source, loader), seed, loader).map(pair)
  return _finish_examples(
    ds, lengths, features.seq2seq_batch_features, batch_size, packed, seed, loader
  )

"""grain input pipelines: the task-neutral steps each task builds its batches from.

A task (transformer/tasks) turns a random-access source (a TFDS data source, or any
sequence of records) into a `grain.IterDataset` of numpy batches with these steps: this
host's records or token-stream windows in training order (`examples`, `windows`), its own
per-example transform, rows of fixed length (`to_rows`: packed or padded), then batches
(`batches`). `Batching` carries what the steps read besides the data. `iter()` of the
result is a `grain.DatasetIterator` whose `get_state()` / `set_state()` (or
`grain.checkpoint.CheckpointSave/Restore` under orbax) resume a run on exactly the
batches it would have seen.

Training (`train=True`): records are sharded per host (`source[i::process_count]`,
disjoint, together covering the data), shuffled with the seed (a fresh permutation each
epoch), repeated `num_epochs` times (None: forever), transformed, packed or padded and
batched with `drop_remainder`. Evaluation (`train=False`): the host's shard in source
order, every example exactly once, in the same number of batches on every host: the
last batches are filled with padding rows (weights 0, segment ids 0, label -1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
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


@dataclasses.dataclass(frozen=True)
class Batching:
  """How one split becomes batches: what the steps below read besides the data."""

  rows: int  # B, rows per batch on this host
  train: bool  # True: shuffled, repeated, full batches; False: one padded pass in order
  seed: int = 0  # the run seed; each use derives its own (`derive_seed`)
  loader: Loader = Loader()
  packed: bool = True  # training examples of variable length are packed (else padded)

  @property
  def overlong(self) -> str:
    """The overlong policy of this split: evaluation sees every example ('skip' truncates)."""
    if not self.train and self.loader.overlong == "skip":
      return "truncate"
    return self.loader.overlong

  def seed_for(self, tag: str) -> int:
    return derive_seed(self.seed, tag)


def ceil_div(a: int, b: int) -> int:
  return -(-a // b)


def derive_seed(seed: int, tag: str) -> int:
  """An independent 32-bit seed per use (`shuffle`, `mask`, ...) from the run seed."""
  return int(np.random.SeedSequence([seed, *tag.encode()]).generate_state(1)[0])


@dataclasses.dataclass(frozen=True)
class _WithIndex:
  """(index, record) -> (the record's index in the source, record): a later epoch reads
  the source at index + epoch x n (grain wraps it around), and errors name the record."""

  n: int

  def __call__(self, index: int, record: Any) -> tuple[int, Any]:
    return index % self.n, record


def records(source: Sequence, loader: Loader) -> grain.MapDataset:
  """(source index, record) pairs of this host's shard, in source order."""
  index, count = loader.host()
  return grain.MapDataset.source(source).map_with_index(_WithIndex(len(source)))[index::count]


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


def ordered(ds: grain.MapDataset, b: Batching) -> grain.MapDataset:
  """`ds` shuffled and repeated for training (`shuffled`); as it is for evaluation."""
  return shuffled(ds, b.seed, b.loader) if b.train else ds


def examples(source: Sequence, b: Batching) -> grain.MapDataset:
  """(source index, record) pairs of this host's shard, in the order of `b`'s split."""
  return ordered(records(source, b.loader), b)


def windows(starts: grain.MapDataset, b: Batching) -> grain.MapDataset:
  """This host's window starts, in the order of `b`'s split.

  Shuffled before they are dealt to hosts: the global batch is the same set of windows
  whatever the number of processes (multi-host runs reproduce single-host losses).
  """
  return shard(ordered(starts, b), b.loader)


@dataclasses.dataclass(frozen=True)
class Pad:
  """An example -> one row of `lengths` (`packing.pad_example`)."""

  lengths: dict[str, int]

  def __call__(self, ex: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return packing.pad_example(ex, self.lengths)


def to_rows(
  ds: grain.MapDataset, lengths: dict[str, int], b: Batching
) -> grain.MapDataset | grain.IterDataset:
  """Variable-length examples as rows of `lengths`: one padded example per row for
  evaluation; for training, skipped examples (None) dropped, then packed (`b.packed`) or
  padded."""
  if not b.train:
    return ds.map(Pad(lengths))
  it = to_iter(ds, b.loader)  # Drops the None of skipped examples.
  if b.packed:
    bins = b.loader.packing_bins or b.rows
    return packing.pack(it, lengths, bins, seed=b.seed_for("pack"))
  return it.map(Pad(lengths))


def batches(ds: grain.MapDataset | grain.IterDataset, total: int, b: Batching) -> grain.IterDataset:
  """Batches of `b.rows` rows of `ds`: training batches, or evaluation batches of `ds`, this
  host's share of `total` examples (`eval_batches`)."""
  if not b.train:
    return eval_batches(ds, total, b.rows, b.loader)
  if isinstance(ds, grain.MapDataset):
    ds = to_iter(ds, b.loader)
  return train_batches(ds, b.rows, b.loader)

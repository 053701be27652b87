"""`make_datasets`: one call from a `DataConfig` to training and evaluation iterators.

The training loop needs no family details: it gets a checkpointable training iterator,
a factory of finite evaluation iterators, and a `DataInfo` (vocabulary, classes, shapes,
per-host batch size, up-front data statistics). Everything that can fail on bad input
(missing files, malformed rows, an overlong example under `overlong='error'`) fails
here, in the calling process, before any worker starts.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grain
import numpy as np
from etils import epath

from transformer.data import features, hf_source, images, mixture, packing, pipeline, sources
from transformer.data.config import DataConfig
from transformer.data.progress import progress
from transformer.data.spec import DataContext, DataSpec, Shapes
from transformer.data.tokenizers import Tokenizer

_IMAGE_STAT_EXAMPLES = 10_000
_PROBE_BATCHES = 8  # batches drawn to measure packing efficiency


@dataclasses.dataclass
class DataInfo:
  """What the model and the loop need to know about the data."""

  config: DataConfig
  spec: DataSpec  # the task's batch description
  tokenizer: Tokenizer | None  # None for images
  vocab_size: int  # tokenizer.vocab_size (ids 0..6 are PAD BOS EOS UNK MASK CLS SEP); 0 for images
  num_classes: int  # labelled tasks; 0 otherwise
  label_names: tuple[str, ...]
  image_shape: tuple[int, ...] | None  # [H, W, C] for images
  batch_size: int  # rows per batch on this host (global batch / process_count)
  eval_batch_size: int  # rows per evaluation batch on this host
  seq_len: int  # T (inputs length S for seq2seq)
  target_seq_len: int  # seq2seq targets length T (= seq_len otherwise)
  train_examples: int  # records (or stream windows) in the training split, all hosts
  eval_examples: int  # records (or stream windows) in the evaluation split, all hosts
  eval_batches: int  # batches one evaluation pass yields on every host
  stats: dict[str, Any]  # overlong counts, unknown characters, packing efficiency, image stats
  # a mixture (data/mixture.py): name -> (its evaluation-iterator factory, batches), and
  # what the training log reports of its sources
  eval_sources: dict[str, tuple[Callable, int]] = dataclasses.field(default_factory=dict)
  sources: mixture.Sources | None = None

  def batch_shapes(self, train: bool = True) -> Shapes:
    """Key -> (shape, dtype) of every batch (fixed shapes; compile once)."""
    rows = self.batch_size if train else self.eval_batch_size
    return self.spec.shapes(rows, self.seq_len, self.target_seq_len, self.image_shape)


def make_datasets(
  data_config: DataConfig | Any,
  spec: DataSpec,
  workdir: str | os.PathLike,
  batch_size: int,
  seq_len: int,
  seed: int,
  process_index: int | None = None,
  process_count: int | None = None,
) -> tuple[grain.DatasetIterator, Callable[[], Iterator[dict[str, np.ndarray]]], DataInfo]:
  """Training iterator, evaluation-iterator factory and `DataInfo` for a task's batches.

  Args:
    data_config: a `DataConfig` or a mapping / ConfigDict of its fields.
    spec: the task's `DataSpec` (`transformer.tasks.get(name).data_spec(cfg)`).
    workdir: the run directory; trained tokenizers are cached under `workdir/tokenizers`.
    batch_size: global batch size; each host yields `batch_size // process_count` rows.
    seq_len: T (the inputs length S for seq2seq; targets use `target_seq_len` or T).
      Ignored for images.
    seed: seeds shuffling, packing, masking, augmentation and the `train_examples` subset.
    process_index, process_count: this host and the number of hosts (default: jax's).

  Returns:
    `(train_iter, eval_iter_factory, info)`: `train_iter` is a checkpointable
    `grain.DatasetIterator` (infinite unless `num_epochs` is set); each call of
    `eval_iter_factory()` gives a fresh pass over the evaluation split.
  """
  cfg = DataConfig.from_mapping(data_config)
  loader = pipeline.Loader(
    process_index,
    process_count,
    num_epochs=cfg.num_epochs,
    num_workers=cfg.num_workers,
    worker_buffer=cfg.prefetch,
    overlong=cfg.overlong,
  )
  _, count = loader.host()
  eval_batch = cfg.eval_batch_size or batch_size
  for name, b in (("batch_size", batch_size), ("eval_batch_size", eval_batch)):
    if b % count:
      raise ValueError(f"{name} {b} is not divisible by process_count {count}")
  sizes = dict(loader=loader, rows=batch_size // count, eval_rows=eval_batch // count,
               seq_len=seq_len, seed=seed)  # fmt: skip
  if cfg.mixture:
    train_ds, eval_factory, info = mixture.build(cfg, spec, workdir, _single, **sizes)
  else:
    train_ds, eval_factory, info = _single(cfg, spec, workdir, **sizes)
  hidden = ("config", "spec", "tokenizer", "eval_sources", "sources")
  logging.info("data: %s", {k: v for k, v in vars(info).items() if k not in hidden})
  return _closed_at_exit(iter(train_ds)), eval_factory, info


def _single(
  cfg: DataConfig,
  spec: DataSpec,
  workdir: str | os.PathLike,
  *,
  loader: pipeline.Loader,
  rows: int,
  eval_rows: int,
  seq_len: int,
  seed: int,
  splits: sources.Splits | None = None,
  tok: Tokenizer | None = None,
) -> tuple[grain.IterDataset, Callable[[], Iterator[dict[str, np.ndarray]]], DataInfo]:
  """One source's training batches, evaluation-iterator factory and `DataInfo`; `splits`
  and `tok` when the caller opened them (a mixture's sources share one tokenizer)."""
  per_host, eval_per_host, count = rows, eval_rows, loader.host()[1]
  splits = splits or sources.open_splits(
    cfg, workdir, paired=spec.paired, images=spec.images, labelled=spec.labelled,
    conversations=spec.conversations, preference=spec.preference,
  )  # fmt: skip
  c = DataContext(cfg, splits, None, seq_len, cfg.target_seq_len or seq_len, seed, loader)
  windows = spec.uses_windows(cfg)
  if spec.images:
    if cfg.image_size:
      splits.image_shape = (cfg.image_size, cfg.image_size, splits.image_shape[-1])
    if None in splits.image_shape:
      raise ValueError(f"{splits.name}: images vary in size {splits.image_shape}; set image_size")
    c.image_mean, c.image_std, stats = _image_stats(cfg, splits, loader.host()[0] == 0)
  else:
    c.tok = tok or sources.tokenizer_for(cfg, splits, workdir)
    stats = (
      {} if windows else sources.scan(cfg, splits, c.tok, spec.row_budget, seq_len, c.target_len)
    )
  stats.update(splits.stats)
  if cfg.train_examples:  # after the tokenizer and statistics: they see the whole split
    if windows:
      raise ValueError(
        f"DataConfig.train_examples={cfg.train_examples}: subsets whole records, but this "
        "task reads the training split as one token stream (windows); use 0"
      )
    splits.train = training_subset(splits.train, cfg.train_examples, seed, splits.name)
  if windows:
    c.streams = _token_streams(cfg, splits, c.tok, c.text_key, workdir, stats)
  train_ds, eval_ds = spec.build(c, True, per_host), spec.build(c, False, eval_per_host)
  if cfg.packing and not windows and spec.packing_key:
    probe = dataclasses.replace(c, loader=dataclasses.replace(loader, num_workers=0))
    it = iter(spec.build(probe, True, per_host))
    stats["packing_efficiency"] = float(
      np.mean(
        [packing.packing_efficiency(next(it)[spec.packing_key]) for _ in range(_PROBE_BATCHES)]
      )
    )
    it.close()
  n_train, n_eval = len(c.source(True)), len(c.source(False))
  if windows:
    span = spec.window(seq_len, c.target_len)
    n_train, n_eval = n_train - span, len(range(0, n_eval - 1, span))
  info = DataInfo(
    config=cfg,
    spec=spec,
    tokenizer=c.tok,
    vocab_size=c.tok.vocab_size if c.tok else 0,
    num_classes=len(splits.label_names) if spec.labelled else 0,
    label_names=splits.label_names,
    image_shape=splits.image_shape,
    batch_size=per_host,
    eval_batch_size=eval_per_host,
    seq_len=seq_len,
    target_seq_len=c.target_len,
    train_examples=n_train,
    eval_examples=n_eval,
    eval_batches=pipeline.ceil_div(pipeline.ceil_div(n_eval, count), eval_per_host),
    stats=stats,
  )
  return train_ds, lambda: _closed_at_exit(iter(eval_ds)), info


def _token_streams(
  cfg: DataConfig,
  splits: sources.Splits,
  tok: Tokenizer,
  text_key: str,
  workdir: str | os.PathLike,
  stats: dict[str, Any],
) -> dict[str, np.ndarray]:
  """Each split as one token stream. Local text and sentence pairs are joined as text (pairs:
  both columns, one sentence per line); `hf` records are documents, each ended with EOS and
  the stream cached (`hf_source.token_stream`, `stats['{split}_token_cache']`)."""
  named = (("train", splits.train), ("eval", splits.eval))
  if cfg.source != "hf":
    keys, sep = (splits.text_keys, "\n") if cfg.source == "pairs" else (text_key, "")
    return {s: pipeline.token_stream(src, tok, keys, sep) for s, src in named}
  folder = cfg.token_cache or epath.Path(workdir) / "token_cache"
  streams = {}
  for split, src in named:
    streams[split], hit = hf_source.token_stream(src, tok, splits.text_keys, folder)
    stats[f"{split}_token_cache"] = "read" if hit else "written"
    logging.info("%s [%s]: %d tokens, cache %s", splits.name, split, len(streams[split]),
                 "read" if hit else f"written to {folder}")  # fmt: skip
  return streams


class Subset(Sequence):
  """Records `indices` of `source`, in that order, as a random-access source (grain reads
  `__getitem__`; `features.read_records` reads `__getitems__` in bulk where `source` can)."""

  def __init__(self, source: Sequence, indices: Sequence[int]):
    self.source, self.indices = source, np.asarray(indices, dtype=np.int64)

  def __len__(self) -> int:
    return len(self.indices)

  def __getitem__(self, i: int) -> Any:
    return self.source[int(self.indices[i])]

  def __getitems__(self, positions: Sequence[int]) -> list[Any]:
    picked = [int(self.indices[i]) for i in positions]
    bulk = getattr(self.source, "__getitems__", None)
    return list(bulk(picked)) if bulk else [self.source[i] for i in picked]


def subset_indices(n: int, k: int, seed: int) -> np.ndarray:
  """`k` distinct indices of `range(n)`, drawn from `seed` and sorted (source order).

  The draw depends on `seed` only (`derive_seed(seed, 'train_examples')`, independent of
  the shuffle, packing and mask seeds derived from the same run seed): two runs with the
  same `config.seed` (a fine-tuned and a from-scratch arm) train on the same records.
  """
  rng = np.random.default_rng(pipeline.derive_seed(seed, "train_examples"))
  return np.sort(rng.choice(n, size=k, replace=False))


def training_subset(source: Sequence, k: int, seed: int, name: str = "") -> Subset:
  """`DataConfig.train_examples`: a fixed random `k` of the training records (low-label
  runs), chosen before host sharding, shuffling and batching, so every host and every
  epoch sees the same `k` records; `k` above the split's size is an error."""
  n = len(source)
  if k > n:
    raise ValueError(
      f"DataConfig.train_examples={k} exceeds the {n} records of the training split"
      f"{f' of {name}' if name else ''}"
    )
  return Subset(source, subset_indices(n, k, seed))


_LIVE_ITERATORS: weakref.WeakSet = weakref.WeakSet()


def _closed_at_exit(it: grain.DatasetIterator) -> grain.DatasetIterator:
  """Registers `it` to be closed before interpreter teardown (prefetch threads / workers)."""
  _LIVE_ITERATORS.add(it)
  return it


def _already_closed() -> None:
  pass


@atexit.register
def _close_live_iterators() -> None:
  # Stop prefetch threads / worker processes while modules are intact. grain's
  # `__del__` closes again during interpreter teardown, when its module globals are
  # already None, and prints "Exception ignored ..."; the instance-level no-op spares that.
  # A mixture's iterator holds its sources' iterators: each is closed the same way.
  def close(it: Any) -> None:
    for parent in getattr(it, "_parents", ()):
      close(parent)
    with contextlib.suppress(Exception):
      it.close()
      it.close = _already_closed

  for it in list(_LIVE_ITERATORS):
    close(it)


def _image_stats(
  cfg: DataConfig, splits: sources.Splits, primary: bool = True
) -> tuple[tuple[float, ...], tuple[float, ...], dict]:
  if cfg.image_mean is not None and cfg.image_std is not None:
    return cfg.image_mean, cfg.image_std, {}
  indices = list(sources.spaced(splits.train, _IMAGE_STAT_EXAMPLES))
  records = features.read_records(splits.train, indices)
  records = progress(records, len(indices), "image statistics", enabled=primary)
  sample = (np.asarray(r["image"]) for _, r in records)
  mean, std = images.channel_stats(im if im.ndim == 3 else im[..., None] for im in sample)
  mean, std = cfg.image_mean or mean, cfg.image_std or std
  return mean, std, {"image_mean": mean, "image_std": std}

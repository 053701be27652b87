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

from transformer.data import features, images, packing, pipeline, sources
from transformer.data.config import DataConfig
from transformer.data.tokenizers import Tokenizer

_IMAGE_STAT_EXAMPLES = 10_000
_PACKING_PROBE_BATCHES = 8


@dataclasses.dataclass
class DataInfo:
  """What the model and the loop need to know about the data."""

  config: DataConfig
  tokenizer: Tokenizer | None  # None for images
  vocab_size: int  # tokenizer.vocab_size (ids 0..6 are PAD BOS EOS UNK MASK CLS SEP); 0 for images
  num_classes: int  # classification / image; 0 otherwise
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

  def batch_shapes(self, train: bool = True) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Key -> (shape, dtype) of every batch (fixed shapes; compile once)."""
    b = self.batch_size if train else self.eval_batch_size
    t, s = self.target_seq_len, self.seq_len
    i32, f32 = np.dtype(np.int32), np.dtype(np.float32)
    if self.config.kind == "image":
      return {"image": ((b, *self.image_shape), f32), "label": ((b,), i32)}
    if self.config.kind == "classification":
      return {
        "inputs": ((b, s), i32),
        "segment_ids": ((b, s), i32),
        "positions": ((b, s), i32),
        "label": ((b,), i32),
      }
    if self.config.kind == "seq2seq":
      shapes = {k: ((b, s), i32) for k in ("inputs", "inputs_segment_ids", "inputs_positions")}
      shapes |= {k: ((b, t), i32) for k in ("targets", "targets_segment_ids", "targets_positions")}
      return shapes | {"weights": ((b, t), f32)}
    return {
      k: ((b, s), f32 if k == "weights" else i32) for k in pipeline.BATCH_KEYS[self.config.kind]
    }


@dataclasses.dataclass
class _Context:
  """What the per-family dataset constructors share."""

  cfg: DataConfig
  splits: sources.Splits
  tok: Tokenizer | None
  seq_len: int
  target_len: int
  seed: int
  loader: pipeline.Loader
  streams: dict[str, np.ndarray] = dataclasses.field(
    default_factory=dict
  )  # windows: split -> tokens
  image_mean: tuple[float, ...] = ()
  image_std: tuple[float, ...] = ()

  def source(self, train: bool) -> Sequence:
    split = "train" if train else "eval"
    if split in self.streams:
      return self.streams[split]
    return self.splits.train if train else self.splits.eval

  @property
  def text_key(self) -> str:
    return "text" if self.cfg.source == "labelled" else self.splits.text_keys[0]

  @property
  def label_key(self) -> str:
    return self.cfg.label_column if self.cfg.source == "tfds" else "label"

  def common(self) -> dict[str, Any]:
    return {"seed": self.seed, "loader": self.loader}

  def text_common(self) -> dict[str, Any]:
    return {**self.common(), "seq_len": self.seq_len, "source_name": self.splits.name}


def _lm(c: _Context, train: bool, b: int) -> grain.IterDataset:
  return pipeline.lm_dataset(
    c.source(train),
    c.tok,
    batch_size=b,
    train=train,
    windows=c.cfg.uses_windows,
    packed=c.cfg.packing,
    text_key=c.text_key,
    **c.text_common(),
  )


def _mlm(c: _Context, train: bool, b: int) -> grain.IterDataset:
  return pipeline.mlm_dataset(
    c.source(train),
    c.tok,
    batch_size=b,
    train=train,
    windows=c.cfg.uses_windows,
    packed=c.cfg.packing,
    text_key=c.text_key,
    mask_rate=c.cfg.mask_rate,
    whole_word=c.cfg.whole_word_masking,
    **c.text_common(),
  )


def _classification(c: _Context, train: bool, b: int) -> grain.IterDataset:
  return pipeline.classification_dataset(
    c.source(train),
    c.tok,
    batch_size=b,
    train=train,
    text_key=c.text_key,
    label_key=c.label_key,
    **c.text_common(),
  )


def _seq2seq(c: _Context, train: bool, b: int) -> grain.IterDataset:
  return pipeline.seq2seq_dataset(
    c.source(train),
    c.tok,
    inputs_len=c.seq_len,
    targets_len=c.target_len,
    batch_size=b,
    train=train,
    packed=c.cfg.packing,
    source_key=c.cfg.source_column,
    target_key=c.cfg.target_column,
    source_name=c.splits.name,
    **c.common(),
  )


def _image(c: _Context, train: bool, b: int) -> grain.IterDataset:
  return pipeline.image_dataset(
    c.source(train),
    batch_size=b,
    train=train,
    mean=c.image_mean,
    std=c.image_std,
    crop_padding=c.cfg.crop_padding,
    flip=c.cfg.horizontal_flip,
    label_key=c.label_key,
    image_size=c.cfg.image_size,
    **c.common(),
  )


_FAMILIES = {
  "lm": _lm,
  "mlm": _mlm,
  "classification": _classification,
  "seq2seq": _seq2seq,
  "image": _image,
}


def make_datasets(
  data_config: DataConfig | Any,
  workdir: str | os.PathLike,
  batch_size: int,
  seq_len: int,
  seed: int,
  process_index: int | None = None,
  process_count: int | None = None,
) -> tuple[grain.DatasetIterator, Callable[[], Iterator[dict[str, np.ndarray]]], DataInfo]:
  """Training iterator, evaluation-iterator factory and `DataInfo` for any family.

  Args:
    data_config: a `DataConfig` or a mapping / ConfigDict of its fields.
    workdir: the run directory; trained tokenizers are cached under `workdir/tokenizers`.
    batch_size: global batch size; each host yields `batch_size // process_count` rows.
    seq_len: T (the inputs length S for seq2seq; targets use `target_seq_len` or T).
      Ignored for images.
    seed: seeds shuffling, packing, masking and augmentation.
    process_index, process_count: this host and the number of hosts (default: jax's).

  Returns:
    `(train_iter, eval_iter_factory, info)`: `train_iter` is a checkpointable
    `grain.DatasetIterator` (infinite unless `num_epochs` is set); each call of
    `eval_iter_factory()` gives a fresh pass over the evaluation split.
  """
  cfg = DataConfig.from_mapping(data_config)
  loader = pipeline.Loader(
    process_index=process_index,
    process_count=process_count,
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
  per_host, eval_per_host = batch_size // count, eval_batch // count
  splits = sources.open_splits(cfg, workdir)
  c = _Context(cfg, splits, None, seq_len, cfg.target_seq_len or seq_len, seed, loader)
  windows = cfg.uses_windows and cfg.kind in ("lm", "mlm")
  if cfg.kind == "image":
    if cfg.image_size:
      splits.image_shape = (cfg.image_size, cfg.image_size, splits.image_shape[-1])
    if None in splits.image_shape:
      raise ValueError(f"{splits.name}: images vary in size {splits.image_shape}; set image_size")
    c.image_mean, c.image_std, stats = _image_stats(cfg, splits)
  else:
    c.tok = sources.tokenizer_for(cfg, splits, workdir)
    stats = {} if windows else sources.scan(cfg, splits, c.tok, seq_len, c.target_len)
  if windows:
    c.streams = {
      s: pipeline.token_stream(src, c.tok, c.text_key)
      for s, src in (("train", splits.train), ("eval", splits.eval))
    }
  family = _FAMILIES[cfg.kind]
  train_ds, eval_ds = family(c, True, per_host), family(c, False, eval_per_host)
  if cfg.packing and not windows and cfg.kind in ("lm", "mlm", "seq2seq"):
    key = "targets_segment_ids" if cfg.kind == "seq2seq" else "segment_ids"
    probe = dataclasses.replace(c, loader=dataclasses.replace(loader, num_workers=0))
    it = iter(family(probe, True, per_host))
    stats["packing_efficiency"] = float(
      np.mean([packing.packing_efficiency(next(it)[key]) for _ in range(_PACKING_PROBE_BATCHES)])
    )
    it.close()
  n_train, n_eval = len(c.source(True)), len(c.source(False))
  if windows:
    span = seq_len if cfg.kind == "lm" else seq_len - 2
    n_train, n_eval = n_train - span, len(range(0, n_eval - 1, span))
  info = DataInfo(
    config=cfg,
    tokenizer=c.tok,
    vocab_size=c.tok.vocab_size if c.tok else 0,
    num_classes=len(splits.label_names) if cfg.kind in ("classification", "image") else 0,
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
  logging.info(
    "data: %s",
    {k: v for k, v in dataclasses.asdict(info).items() if k not in ("config", "tokenizer")},
  )
  return _closed_at_exit(iter(train_ds)), lambda: _closed_at_exit(iter(eval_ds)), info


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
  for it in list(_LIVE_ITERATORS):
    with contextlib.suppress(Exception):
      it.close()
      it.close = _already_closed


def _image_stats(
  cfg: DataConfig, splits: sources.Splits
) -> tuple[tuple[float, ...], tuple[float, ...], dict]:
  if cfg.image_mean is not None and cfg.image_std is not None:
    return cfg.image_mean, cfg.image_std, {}
  indices = sources.spaced(splits.train, _IMAGE_STAT_EXAMPLES)
  sample = (np.asarray(r["image"]) for _, r in features.read_records(splits.train, indices))
  mean, std = images.channel_stats(im if im.ndim == 3 else im[..., None] for im in sample)
  mean, std = cfg.image_mean or mean, cfg.image_std or std
  return mean, std, {"image_mean": mean, "image_std": std}

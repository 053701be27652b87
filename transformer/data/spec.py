"""What a task asks of the data package: `DataSpec`, and the `DataContext` it builds from.

The data package knows no task. Each task (transformer/tasks) describes its batches with a
`DataSpec`: which columns it reads, whether records are images, whether examples carry
labels, how long a token-stream window is, how a record is checked against the row
length, and the function that turns a split into a `grain.IterDataset` of batches.
`make_datasets(data_config, spec, ...)` does the rest (splits, tokenizer, statistics).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import grain
import numpy as np

from transformer.data import pipeline, sources
from transformer.data.config import DataConfig
from transformer.data.tokenizers import Tokenizer

# key -> (shape, dtype) of one batch
Shapes = dict[str, tuple[tuple[int, ...], np.dtype]]
I32, F32 = np.dtype(np.int32), np.dtype(np.float32)


@dataclasses.dataclass
class DataContext:
  """What a task's dataset builder reads: the opened splits, tokenizer and settings."""

  cfg: DataConfig
  splits: sources.Splits
  tok: Tokenizer | None  # None for images
  seq_len: int  # T (inputs length S for encoder-decoder tasks)
  target_len: int  # targets length of encoder-decoder tasks (= seq_len otherwise)
  seed: int
  loader: pipeline.Loader
  streams: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # windows: tokens
  image_mean: tuple[float, ...] = ()
  image_std: tuple[float, ...] = ()

  def source(self, train: bool) -> Sequence:
    """The split's records, or its token stream (int32 [N]) when the task reads windows."""
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

  def batching(self, train: bool, rows: int) -> pipeline.Batching:
    """The `pipeline.Batching` of a split: `rows` per batch, this run's seed and loader."""
    return pipeline.Batching(rows, train, self.seed, self.loader, self.cfg.packing)


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """A task's batches, as the data package needs to know them."""

  # (context, train, rows) -> batches of `rows` rows (train: infinite/epochs; eval: one pass)
  build: Callable[[DataContext, bool, int], grain.IterDataset]
  # (rows, S, T, image_shape) -> key -> (shape, dtype) of every batch
  shapes: Callable[[int, int, int, tuple[int, ...] | None], Shapes]
  images: bool = False  # records hold images: no tokenizer, channel statistics
  labelled: bool = False  # examples carry a class label: num_classes comes from the data
  paired: bool = False  # records are (source_column, target_column) text pairs
  conversations: bool = False  # text_column holds conversations: lists of {role, content}
  preference: bool = False  # records are (prompt, chosen, rejected): text or conversations
  # Token-stream windows (source 'text', or `data.windows`): (S, T) -> tokens per window;
  # None = this task reads whole records only.
  window: Callable[[int, int], int] | None = None
  packing_key: str | None = None  # segment-id key whose fill measures packing efficiency
  # (token counts per text column, S, T) -> [(tokens needed, row limit)] for the overlong scan
  row_budget: Callable[[list[int], int, int], list[tuple[int, int]]] | None = None

  def uses_windows(self, cfg: DataConfig) -> bool:
    return self.window is not None and cfg.uses_windows

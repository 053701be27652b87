"""`DataConfig.mixture`: training on several sources at once, in fixed proportions.

  config.data.mixture = (
      ({"name": "plays", "source": "text", "path": "data/tinyshakespeare.txt.gz"}, 0.7),
      ({"name": "verses", "source": "labelled", "path": BIBLE, "text_column": "en"}, 0.3),
  )

Each entry is (a data block, its weight): the fields in `SOURCE_FIELDS` of one source
(`name` names it in logs and metrics; default: its path's last part; `config.py`
checks the entries), over the parent
block's others (task, tokenizer, packing, loader), which every source shares. Weights are
positive numbers, normalised to proportions.

`datasets.make_datasets` builds each source's batches as for a single source, with one
tokenizer trained on all of them (`texts`), and mixes the training batches with grain's
`IterDataset.mix`: a deterministic, stratified interleave, so every window of batches
holds each source in its proportion to within one batch (weights are kept to 1%:
`proportions`), and the mixture's position with every source's is part of the
checkpointed iterator state, so a resume continues exactly. Each source repeats on its own
(a fresh shuffle per epoch). `batches_drawn(n, proportions)` counts the batches each source
gave to the first n; the training log shows them as `data/<name>/epochs` (for windows and
unpacked records; packed rows hold several examples). Evaluation reads every source's
evaluation split in turn (`loss`) and each alone (`<name>/loss`, ...).
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grain

from transformer.data import features, sources
from transformer.data.config import DataConfig, source_name


def proportions(weights: Sequence[float]) -> list[int]:
  """The integer proportions grain mixes by: the smallest weight scaled to 100."""
  smallest = min(weights)
  return [int(w * 100 / smallest) for w in weights]


def batches_drawn(n: int, parts: Sequence[int]) -> list[int]:
  """How many of the first `n` mixed batches each source gave (grain's interleave)."""
  remaining, left, out = sum(parts), n, []
  for p in parts:
    rest = (left * (remaining - p)) // remaining
    out.append(left - rest)
    remaining, left = remaining - p, rest
  return out


@dataclasses.dataclass(frozen=True)
class Sources:
  """What the training log reports of a mixture (`DataInfo.sources`)."""

  names: tuple[str, ...]
  parts: tuple[int, ...]  # grain's integer proportions
  rows: int  # rows per batch on this host
  examples: tuple[int, ...]  # training examples (records or windows) of each, all hosts
  counts_examples: tuple[bool, ...]  # a row is one example (windows, unpacked records)
  hosts: int = 1

  def scalars(self, batches: int) -> dict[str, float]:
    """`data/<name>/epochs` of each source after `batches` mixed batches per host (those
    whose rows are examples), and `data/<name>/batches`."""
    out = {}
    for name, drawn, n, exact in zip(self.names, batches_drawn(batches, self.parts),
                                     self.examples, self.counts_examples, strict=True):  # fmt: skip
      out[f"data/{name}/batches"] = float(drawn)
      if exact and n:
        out[f"data/{name}/epochs"] = drawn * self.rows * self.hosts / n
    return out


class Texts(Sequence):
  """Several sources' training records as one sequence of {'text': ...} (each record's text
  columns joined by newlines), for training the mixture's one tokenizer."""

  def __init__(self, parts: Sequence[tuple[Sequence, Sequence[str]]]):
    self.parts = list(parts)
    self.starts = [0]
    for source, _ in self.parts:
      self.starts.append(self.starts[-1] + len(source))

  def __len__(self) -> int:
    return self.starts[-1]

  def __getitem__(self, i: int) -> dict[str, str]:
    return self.__getitems__([i])[0]

  def __getitems__(self, indices: Sequence[int]) -> list[dict[str, str]]:
    """The records at `indices`, each source's read in bulk (`features.read_records`)."""
    wanted: dict[int, list[tuple[int, int]]] = {}  # source -> [(position in out, its index)]
    for n, i in enumerate(indices):
      if not 0 <= i < len(self):
        raise IndexError(i)
      k = bisect.bisect_right(self.starts, i) - 1
      wanted.setdefault(k, []).append((n, i - self.starts[k]))
    out: list[dict[str, str]] = [{} for _ in indices]
    for k, items in wanted.items():
      source, keys = self.parts[k]
      records = features.read_records(source, [j for _, j in items])
      for (n, _), (_, record) in zip(items, records, strict=True):
        out[n] = {"text": "\n".join(features.text_of(record, key) for key in keys)}
    return out


def build(cfg: DataConfig, spec: Any, workdir: Any, build_one: Callable, **kwargs: Any) -> tuple:
  """(mixed training batches, evaluation-iterator factory, DataInfo) of `cfg.mixture`.

  `build_one(cfg, spec, workdir, splits=, tok=, **kwargs) -> (train batches, eval factory,
  info)` builds one source (`datasets._single`); every source gets the one tokenizer
  trained on all their training records (none for images)."""
  entries = [
    (source_name(dict(f)), cfg.replace(mixture=(), **{k: v for k, v in f if k != "name"}), w)
    for f, w in cfg.mixture
  ]
  opened = [
    sources.open_splits(
      c,
      workdir,
      paired=spec.paired,
      images=spec.images,
      labelled=spec.labelled,
      conversations=spec.conversations,
      preference=spec.preference,
    )  # fmt: skip
    for _, c, _ in entries
  ]
  tok = None
  if not spec.images:
    key = hashlib.sha256("|".join(s.key for s in opened).encode()).hexdigest()[:16]
    texts = Texts([(s.train, s.text_keys) for s in opened])
    tok = sources.tokenizer_for(cfg, sources.Splits(texts, texts, "mixture", f"mix-{key}"), workdir)
  built = [build_one(c, spec, workdir, splits=s, tok=tok, **kwargs) for (_, c, _), s in
           zip(entries, opened, strict=True)]  # fmt: skip
  infos = [info for _, _, info in built]
  names = tuple(name for name, _, _ in entries)
  for name, info in zip(names[1:], infos[1:], strict=True):
    labels_differ = spec.labelled and info.label_names != infos[0].label_names
    if labels_differ or info.image_shape != infos[0].image_shape:
      raise ValueError(
        f"DataConfig.mixture: source {name!r} has labels {info.label_names} / images "
        f"{info.image_shape}, source {names[0]!r} {infos[0].label_names} / {infos[0].image_shape}"
      )
  weights = [w for _, _, w in entries]
  train = grain.IterDataset.mix([t for t, _, _ in built], weights)
  factories = [f for _, f, _ in built]
  windows = spec.uses_windows(cfg)
  exact = tuple(windows or not (cfg.packing and spec.packing_key) for _ in entries)
  info = dataclasses.replace(
    infos[0],
    config=cfg,
    train_examples=sum(i.train_examples for i in infos),
    eval_examples=sum(i.eval_examples for i in infos),
    eval_batches=sum(i.eval_batches for i in infos),
    stats={
      "sources": {
        n: {"weight": w, "train_examples": i.train_examples, **i.stats}
        for n, w, i in zip(names, weights, infos, strict=True)
      }
    },  # fmt: skip
    eval_sources={n: (f, i.eval_batches) for n, f, i in zip(names, factories, infos, strict=True)},
    sources=Sources(
      names,
      tuple(proportions(weights)),
      infos[0].batch_size,
      tuple(i.train_examples for i in infos),
      exact,
    ),  # fmt: skip
  )
  return train, lambda: _Chain([f() for f in factories]), info


class _Chain(Iterator):
  """The evaluation passes of every source, one after another."""

  def __init__(self, parts: list):
    self.parts, self._it = parts, itertools.chain.from_iterable(parts)

  def __next__(self):
    return next(self._it)

  def close(self) -> None:
    for part in self.parts:
      part.close()

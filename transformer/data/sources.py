"""Opening a `DataConfig`'s data and inspecting it before any pipeline runs.

`open_splits` prepares a local builder (or opens a prepared TFDS dataset by name) and
returns the training and evaluation data sources; `tokenizer_for` trains or loads the
tokenizer on the training split; `scan` checks a sample of each split for examples that
do not fit the row and for characters outside a character vocabulary.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from etils import epath

from transformer.data import builders, features, files, hf_source, image_builders, tfds_compat
from transformer.data.config import DataConfig
from transformer.data.tokenizers import (
  CharTokenizer,
  Tokenizer,
  get_tokenizer,
  load_tokenizer,
  tokenizer_filename,
)


@dataclasses.dataclass
class Splits:
  train: Sequence
  eval: Sequence
  name: str  # names the data in errors: a local path, or the TFDS name
  key: str  # identifies the data for caching tokenizers
  label_names: tuple[str, ...] = ()
  image_shape: tuple[int, ...] | None = None
  text_keys: tuple[str, ...] = ("text",)
  stats: dict[str, Any] = dataclasses.field(default_factory=dict)  # e.g. bad records skipped


def open_splits(
  cfg: DataConfig,
  workdir: str | os.PathLike | None = None,
  *,
  paired: bool = False,
  images: bool = False,
  labelled: bool = False,
  conversations: bool = False,
  preference: bool = False,
) -> Splits:
  """Prepares (local builders) or opens (TFDS names) the two splits as data sources.

  `workdir` holds files a source writes at first use (`sklearn_digits`: IDX files in
  `workdir/datasets/sklearn_digits/`). `paired`: the task reads (source, target) text
  columns; `images`: it reads the `image` feature; `labelled`: a class label (`hf`);
  `conversations`: its text column holds conversations (`hf`); `preference`: it reads
  (prompt, chosen, rejected) records (`hf`).
  """
  path, d = cfg.resolved_path(), cfg.data_dir
  if cfg.source == "tfds":
    return _open_tfds(cfg, paired, images)
  if cfg.source == "hf":
    opened = hf_source.open_hf(cfg, paired, images, labelled, conversations, preference)
    return Splits(name=cfg.path, **opened)
  if cfg.source == "text":
    b = builders.text_corpus(
      path, d, validation_fraction=cfg.validation_fraction, test_fraction=cfg.test_fraction
    )
  elif cfg.source == "pairs":
    b = builders.sentence_pairs(
      path,
      [cfg.source_column, cfg.target_column],
      d,
      validation_fraction=cfg.validation_fraction,
      test_fraction=cfg.test_fraction,
    )
  elif cfg.source == "labelled":
    b = builders.labelled_text(
      path,
      cfg.text_column,
      cfg.label_column,
      d,
      label_names=cfg.label_names,
      validation_fraction=cfg.validation_fraction,
      test_fraction=cfg.test_fraction,
    )
  elif cfg.source == "sklearn_digits":
    if workdir is None or files.is_remote(workdir):
      raise ValueError(
        "DataConfig.source 'sklearn_digits' writes its IDX files under a local workdir; "
        f"got {workdir!r}"
      )
    path = Path(workdir) / "datasets" / "sklearn_digits"
    b = image_builders.sklearn_digits(path, d, validation_fraction=cfg.validation_fraction)
  elif cfg.source == "idx":
    b = image_builders.idx_images(
      path, d, label_names=cfg.label_names, validation_fraction=cfg.validation_fraction
    )
  else:
    b = image_builders.image_folder(
      path, d, validation_fraction=cfg.validation_fraction, test_fraction=cfg.test_fraction
    )
  feats = b.info.features
  splits = Splits(
    train=_split(b, cfg.train_split, str(path)),
    eval=_split(b, cfg.eval_split, str(path)),
    name=str(path),
    key=f"{b.name}-{b.builder_config.name}",
    label_names=tuple(feats["label"].names) if "label" in feats else (),
    image_shape=tuple(feats["image"].shape) if "image" in feats else None,
  )
  if cfg.source == "pairs":
    splits.text_keys = (cfg.source_column, cfg.target_column)
  return splits


def _split(builder: Any, split: str, name: str) -> Sequence:
  available = list(builder.info.splits)
  if split.split("[")[0] not in available:
    raise ValueError(f"{name}: no split {split!r}; prepared splits: {available}")
  return builder.as_data_source(split=split)


def _open_tfds(cfg: DataConfig, paired: bool, images: bool) -> Splits:
  """A standard TFDS dataset by name, prepared as array_record (`tfds_compat`: the
  workarounds for TFDS without TensorFlow; one-line errors naming the `tfds build`
  command for a dataset that is not prepared)."""
  builder = tfds_compat.builder(cfg.path, cfg.data_dir)
  opened = []
  for split in (cfg.train_split, cfg.eval_split):
    try:
      opened.append(tfds_compat.data_source(builder, split))
    except Exception as e:  # TFDS raises several types for "not prepared here".
      raise tfds_compat.not_ready(builder, split, e) from e
  feats = builder.info.features
  label = feats[cfg.label_column] if cfg.label_column in feats else None
  text_keys = (cfg.source_column, cfg.target_column) if paired else (cfg.text_column,)
  for key in (*(() if images else text_keys), *(("image",) if images else ())):
    if key not in feats:
      raise ValueError(
        f"TFDS dataset {cfg.path!r} has no feature {key!r}; features: {sorted(feats.keys())}"
      )
  return Splits(
    train=opened[0],
    eval=opened[1],
    name=cfg.path,
    key=cfg.path,
    label_names=tuple(getattr(label, "names", None) or ()),
    image_shape=tuple(feats["image"].shape) if images else None,
    text_keys=text_keys,
  )


def spaced(source: Sequence, limit: int) -> Iterator[int]:
  """Up to `limit` evenly spaced record indices, in order."""
  n = len(source)
  return iter(range(0, n, max(1, -(-n // limit)))) if n else iter(())


def tokenizer_for(cfg: DataConfig, splits: Splits, workdir: str | os.PathLike) -> Tokenizer:
  """The tokenizer cached in `workdir/tokenizers/<data key>/`, else trained (or copied).

  With `cfg.tokenizer_from` and no cached tokenizer yet, the tokenizer of that workdir
  (or that file) is copied into this workdir's cache instead of training one, so a
  fine-tuning run reads text exactly as the run it starts from did. Either workdir may
  be an object-storage URL (`gs://...`).
  """
  cache = epath.Path(workdir) / "tokenizers" / _key_dir(splits.key)
  filename = tokenizer_filename(cfg.tokenizer, cfg.vocab_size, cfg.spm_model_type)
  if cfg.tokenizer_from and not (cache / filename).exists():
    source = find_tokenizer(cfg.tokenizer_from, filename, splits.key)
    tok = load_tokenizer(source)
    tok.save(cache / filename)
    logging.info("tokenizer %s (vocab %d) copied from %s", filename, tok.vocab_size, source)
    return tok

  def texts() -> Iterator[str]:
    for _, record in features.read_records(
      splits.train, spaced(splits.train, cfg.tokenizer_train_examples)
    ):
      for key in splits.text_keys:
        yield features.text_of(record, key)

  return get_tokenizer(cfg.tokenizer, cache, texts, cfg.vocab_size, cfg.spm_model_type)


def _key_dir(key: str) -> str:
  return re.sub(r"[^\w.+-]", "_", key)


def find_tokenizer(where: str | os.PathLike, filename: str, key: str = "") -> epath.Path:
  """The tokenizer file `where` names (a local path or a URL): the file itself, or
  `filename` in a workdir's cache.

  A workdir's `tokenizers/<data key>/<filename>` is preferred; otherwise the one file
  called `filename` under `tokenizers/`. None or several: an error listing what exists.
  """
  p = epath.Path(where).expanduser()
  if p.is_file():
    return p
  root = p / "tokenizers" if (p / "tokenizers").is_dir() else p
  if not root.is_dir():
    raise FileNotFoundError(f"DataConfig.tokenizer_from={str(where)!r}: no such file or folder")
  exact = root / _key_dir(key) / filename
  if key and exact.exists():
    return exact
  found = sorted(root.glob(f"*/{filename}")) + sorted(root.glob(filename))
  if len(found) == 1:
    return found[0]
  listed = [*root.glob("*"), *root.glob("*/*")]  # no `**`: object storage lists by prefix
  present = sorted(str(f.relative_to(root)) for f in listed if f.is_file())
  what = "several" if found else "no"
  raise (ValueError if found else FileNotFoundError)(
    f"DataConfig.tokenizer_from={str(where)!r}: {what} {filename} under {root} "
    f"(tokenizer, vocab_size and spm_model_type must match the run it comes from); "
    f"present: {present or 'nothing'}"
  )


def scan(
  cfg: DataConfig,
  splits: Splits,
  tok: Tokenizer,
  row_budget: Callable[[list[int], int, int], list[tuple[int, int]]] | None,
  seq_len: int,
  target_len: int,
) -> dict[str, Any]:
  """Counts overlong examples in a sample of each split (raises under 'error').

  `row_budget(token_counts, seq_len, target_len)` is the task's rule: for the token counts
  of a record's text columns, the (tokens needed, row limit) pairs it must satisfy.
  """
  stats: dict[str, Any] = {}
  for split, source in (("train", splits.train), ("eval", splits.eval)):
    over, seen = 0, 0
    for i, record in features.read_records(source, spaced(source, cfg.scan_examples)):
      if row_budget is None:
        break
      counts = [len(tok.encode_array(features.text_of(record, k))) for k in splits.text_keys]
      sizes = row_budget(counts, seq_len, target_len)
      seen += 1
      if any(n > limit for n, limit in sizes):
        over += 1
        if cfg.overlong == "error":
          raise ValueError(
            f"{features.where(splits.name, i, record)}: too long for the row: "
            f"(tokens, limit) = {sizes}"
          )
    stats[f"{split}_overlong"] = (over, seen)
    if over:
      logging.warning(
        "%s [%s]: %d of %d sampled examples exceed the row length (%s)",
        splits.name,
        split,
        over,
        seen,
        cfg.overlong,
      )
  if isinstance(tok, CharTokenizer):
    unknown: Counter[str] = Counter()
    for _, record in features.read_records(splits.eval, spaced(splits.eval, cfg.scan_examples)):
      unknown += tok.unknown_chars(features.text_of(record, splits.text_keys[0]))
    stats["eval_unknown_chars"] = dict(unknown)
    if unknown:
      logging.warning(
        "%s: characters outside the vocabulary map to UNK: %s", splits.name, dict(unknown)
      )
  return stats

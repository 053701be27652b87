"""TFDS builders that turn local text files and tables into array_record datasets.

Each builder is a `tfds.core.GeneratorBasedBuilder`; its config names the source files,
and the config name ends in a fingerprint of the files' content and the settings, so a
changed file or setting prepares a fresh dataset instead of reusing a stale one.
Datasets are written as array_record (no TensorFlow needed) in source order, and read back
with `builder.as_data_source()` or `tfds.data_source('local_text_corpus/<name>', ...)`.

All source parsing happens in `_split_generators`, before anything is written, so bad
input (missing file, undecodable bytes, malformed row, empty corpus) raises in the
calling process with the file and line in the message.

Split rules (deterministic, documented in docs/DATA.md):
  * text corpus: the files, concatenated in sorted order, are cut into contiguous
    character ranges: the first `1 - validation_fraction - test_fraction` of the
    characters is `train`, then `validation`, then `test`; each cut moves forward to
    the next line start. Examples are line-aligned chunks of at most `chunk_chars`
    characters (longer lines are cut), so joining a split's texts in order restores it.
  * tables (sentence pairs, labelled text): a row goes to `test` if
    `crc32(key) / 2**32 < test_fraction`, else to `validation` if below
    `test_fraction + validation_fraction`, else `train`; the key is the row's first
    chosen column (the source sentence / the text), so duplicates share a split.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
import re
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from transformer.data import files

VERSION = tfds.core.Version("1.0.0")
SPLITS = ("train", "validation", "test")


@dataclasses.dataclass
class LocalConfig(tfds.core.BuilderConfig):
  """Shared settings of the local builders; `path` is a file or folder."""

  path: str = ""
  validation_fraction: float = 0.05  # share of the data in the validation split
  test_fraction: float = 0.05  # share of the data in the test split

  @classmethod
  def pending(cls, path: str | os.PathLike, validation: float, test: float, **fields: Any):
    """The config of `path`, to be named by `prepare_named` once its files are hashed."""
    fractions = {"validation_fraction": validation, "test_fraction": test}
    return cls(name="pending", path=str(path), **fractions, **fields)


class LocalBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Base: array_record output in source order, splits from `_parse()`."""

  VERSION = VERSION
  builder_config: LocalConfig

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    # TFDS's default probes `importlib_resources`, which it does not install; the
    # module file is what it would find anyway (used only to look for checksums.tsv).
    return epath.Path(inspect.getfile(cls))

  def _features(self) -> tfds.features.FeaturesDict:
    """The example features; each builder below defines its own (abstract here)."""
    raise NotImplementedError(f"{type(self).__name__} must define _features")

  def _parse(self) -> dict[str, list[dict[str, Any]]]:
    """Reads and validates the source: split -> examples in source order (abstract here)."""
    raise NotImplementedError(f"{type(self).__name__} must define _parse")

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      description=f"Local data from {self.builder_config.path}",
      features=self._features(),
      disable_shuffling=True,  # Keep source order: a text split is a stream.
    )

  def _split_generators(self, dl_manager: Any) -> dict[str, Iterator[tuple[int, dict]]]:
    del dl_manager
    splits = self._parse()
    return {name: self._generate_examples(examples) for name, examples in splits.items()}

  def _generate_examples(self, examples: list[dict[str, Any]]) -> Iterator[tuple[int, dict]]:
    yield from enumerate(examples)


def _check_fractions(validation_fraction: float, test_fraction: float) -> None:
  if not (0 <= validation_fraction < 1 and 0 <= test_fraction < 1):
    raise ValueError(
      f"split fractions must lie in [0, 1): {validation_fraction=}, {test_fraction=}"
    )
  if validation_fraction + test_fraction >= 1:
    raise ValueError(
      f"validation_fraction + test_fraction must be < 1, got {validation_fraction + test_fraction}"
    )


def hash_split(key: str, validation_fraction: float, test_fraction: float) -> str:
  """The split of a table row with this key (see the module docstring)."""
  u = zlib.crc32(key.encode("utf-8")) / 2**32
  if u < test_fraction:
    return "test"
  if u < test_fraction + validation_fraction:
    return "validation"
  return "train"


def nonempty_splits(
  splits: dict[str, list], path: str, validation_fraction: float, test_fraction: float
) -> dict[str, list]:
  """Drops splits with a zero fraction; raises if a requested split came out empty."""
  wanted = {"train": True, "validation": validation_fraction > 0, "test": test_fraction > 0}
  for name, want in wanted.items():
    if want and not splits[name]:
      raise ValueError(f"{path}: too little data for a non-empty {name!r} split")
  return {name: ex for name, ex in splits.items() if wanted[name]}


# ----------------------------------------------------------------------------- text corpus


@dataclasses.dataclass
class TextCorpusConfig(LocalConfig):
  chunk_chars: int = 16_384  # largest example, in characters (line-aligned where possible)


def chunk_lines(text: str, chunk_chars: int) -> Iterator[tuple[int, str]]:
  """Splits `text` into `(first_line_number, chunk)`; chunks end at line ends if they can."""
  line, start = 1, 0
  while start < len(text):
    end = min(start + chunk_chars, len(text))
    if end < len(text):
      cut = text.rfind("\n", start, end)
      if cut >= start:
        end = cut + 1
    chunk = text[start:end]
    yield line, chunk
    line += chunk.count("\n")
    start = end


class LocalTextCorpus(LocalBuilder):
  """A text file or a folder of `.txt` / `.txt.gz` files -> {'text', 'file', 'line'}."""

  BUILDER_CONFIG_CLASS = TextCorpusConfig
  builder_config: TextCorpusConfig

  def _features(self) -> tfds.features.FeaturesDict:
    return tfds.features.FeaturesDict(
      {"text": tfds.features.Text(), "file": tfds.features.Text(), "line": np.int64}
    )

  def _parse(self) -> dict[str, list[dict[str, Any]]]:
    cfg = self.builder_config
    root = files.existing(cfg.path)
    paths = files.text_files(root)
    texts = [files.read_text(p) for p in paths]
    total = sum(len(t) for t in texts)
    if not any(t.strip() for t in texts):
      raise ValueError(f"{cfg.path}: empty corpus (no non-whitespace text)")
    stream = "".join(texts)
    cuts = [0]
    for frac in (1 - cfg.validation_fraction - cfg.test_fraction, 1 - cfg.test_fraction):
      cut = max(int(total * frac), cuts[-1])
      if 0 < cut < total and stream[cut - 1] != "\n":  # Move forward to a line start.
        nl = stream.find("\n", cut)
        cut = total if nl < 0 else nl + 1
      cuts.append(cut)
    cuts.append(total)
    splits: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    offset = 0
    for p, text in zip(paths, texts, strict=True):
      rel = p.name if p == root else str(p.relative_to(root))
      for name, lo, hi in zip(SPLITS, cuts[:-1], cuts[1:], strict=True):
        a, b = max(lo - offset, 0), min(hi - offset, len(text))
        if a >= b:
          continue
        first_line = text.count("\n", 0, a) + 1 if a else 1
        for line, chunk in chunk_lines(text[a:b], cfg.chunk_chars):
          splits[name].append({"text": chunk, "file": rel, "line": first_line + line - 1})
      offset += len(text)
    return nonempty_splits(splits, cfg.path, cfg.validation_fraction, cfg.test_fraction)


# ----------------------------------------------------------------------------- tables


@dataclasses.dataclass
class TableConfig(LocalConfig):
  columns: tuple[str, ...] = ()  # columns kept, by header name (sentence pairs)
  text_column: str = "text"  # labelled text: the text column
  label_column: str = "label"  # labelled text: the label column
  label_names: tuple[str, ...] | None = None  # labels in id order; None = sorted unique values
  delimiter: str | None = None  # None: tab for .tsv, comma (CSV quoting) otherwise


def _read_rows(cfg: TableConfig, columns: Sequence[str]) -> list[tuple[int, dict[str, str]]]:
  rows, empty = [], []
  for line, row in files.read_table(cfg.path, columns, cfg.delimiter):
    if any(not row[c].strip() for c in columns):
      empty.append(line)
      continue
    rows.append((line, row))
  if empty:
    logging.warning(
      "%s: skipped %d row(s) with an empty %s field (lines %s%s)",
      cfg.path,
      len(empty),
      "/".join(columns),
      empty[:10],
      " ..." if len(empty) > 10 else "",
    )
  if not rows:
    raise ValueError(f"{cfg.path}: no data rows with non-empty {list(columns)}")
  return rows


class LocalSentencePairs(LocalBuilder):
  """A TSV / CSV of aligned sentences -> {column: text for each chosen column, 'line'}."""

  BUILDER_CONFIG_CLASS = TableConfig
  builder_config: TableConfig

  def _features(self) -> tfds.features.FeaturesDict:
    feats = {c: tfds.features.Text() for c in self.builder_config.columns}
    return tfds.features.FeaturesDict({**feats, "line": np.int64})

  def _parse(self) -> dict[str, list[dict[str, Any]]]:
    cfg = self.builder_config
    if len(cfg.columns) < 2 or "line" in cfg.columns:
      raise ValueError(f"sentence pairs need >= 2 columns other than 'line', got {cfg.columns}")
    splits: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    for line, row in _read_rows(cfg, cfg.columns):
      split = hash_split(row[cfg.columns[0]], cfg.validation_fraction, cfg.test_fraction)
      splits[split].append({**row, "line": line})
    return nonempty_splits(splits, cfg.path, cfg.validation_fraction, cfg.test_fraction)


class LocalLabelledText(LocalBuilder):
  """A TSV / CSV with a text and a label column -> {'text', 'label', 'line'}."""

  BUILDER_CONFIG_CLASS = TableConfig
  builder_config: TableConfig

  @functools.cached_property
  def _rows(self) -> list[tuple[int, dict[str, str]]]:
    cfg = self.builder_config
    return _read_rows(cfg, (cfg.text_column, cfg.label_column))

  @functools.cached_property
  def label_names(self) -> tuple[str, ...]:
    cfg = self.builder_config
    if cfg.label_names is not None:
      return tuple(cfg.label_names)
    return tuple(sorted({row[cfg.label_column] for _, row in self._rows}))

  def _features(self) -> tfds.features.FeaturesDict:
    return tfds.features.FeaturesDict(
      {
        "text": tfds.features.Text(),
        "label": tfds.features.ClassLabel(names=self.label_names),
        "line": np.int64,
      }
    )

  def _parse(self) -> dict[str, list[dict[str, Any]]]:
    cfg = self.builder_config
    ids = {name: i for i, name in enumerate(self.label_names)}
    splits: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    for line, row in self._rows:
      text, label = row[cfg.text_column], row[cfg.label_column]
      if label not in ids:
        raise ValueError(f"{cfg.path}:{line}: label {label!r} is not one of {list(ids)}")
      split = hash_split(text, cfg.validation_fraction, cfg.test_fraction)
      splits[split].append({"text": text, "label": ids[label], "line": line})
    return nonempty_splits(splits, cfg.path, cfg.validation_fraction, cfg.test_fraction)


# ----------------------------------------------------------------------------- preparing


def config_name(path: str | os.PathLike, digest: str, name: str | None = None) -> str:
  """`<name or file stem>_<digest>`, restricted to the characters TFDS accepts."""
  stem = name or Path(path).name.split(".")[0]
  return f"{re.sub(r'[^A-Za-z0-9_.+-]', '_', stem)}_{digest}"


class _DropCustomConfigNotice(logging.Filter):
  """TFDS warns "Using custom data configuration: ..." for each config its class does not
  list, as every local dataset's (it names the files): only that record is dropped."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Using custom data configuration")


def prepare(
  builder_cls: type[LocalBuilder], config: LocalConfig, data_dir: str | os.PathLike | None
) -> tfds.core.DatasetBuilder:
  """Builds (once) and returns the dataset; later calls with the same config reuse it."""
  _check_fractions(config.validation_fraction, config.test_fraction)
  notice, absl_logger = _DropCustomConfigNotice(), logging.getLogger("absl")  # TFDS logs there
  absl_logger.addFilter(notice)
  try:
    builder = builder_cls(config=config, data_dir=data_dir, file_format="array_record")
    try:
      builder.download_and_prepare()
    except FileExistsError:  # another process renamed the same dataset into place first
      builder = builder_cls(config=config, data_dir=data_dir, file_format="array_record")
  finally:
    absl_logger.removeFilter(notice)
  return builder


def prepare_named(
  builder_cls: type[LocalBuilder],
  config: LocalConfig,
  paths: Sequence[Path],
  data_dir: str | os.PathLike | None,
  name: str | None,
  *extra: object,
  content: bool = True,
) -> tfds.core.DatasetBuilder:
  """`prepare` named by `config_name`, with a digest of `paths`, the config's settings and
  `extra` (`files.fingerprint`): changed files or settings prepare a new dataset."""
  digest = files.fingerprint(paths, settings(config), *extra, content=content)
  config.name = config_name(config.path, digest, name)
  return prepare(builder_cls, config, data_dir)


def settings(config: LocalConfig) -> tuple:
  skip = {f.name for f in dataclasses.fields(tfds.core.BuilderConfig)} | {"path"}
  return tuple(
    (f.name, getattr(config, f.name)) for f in dataclasses.fields(config) if f.name not in skip
  )


def text_corpus(
  path: str | os.PathLike,
  data_dir: str | os.PathLike | None = None,
  *,
  name: str | None = None,
  validation_fraction: float = 0.05,
  test_fraction: float = 0.05,
  chunk_chars: int = 16_384,
) -> tfds.core.DatasetBuilder:
  """Prepares a text file / folder as a `local_text_corpus` dataset (see module doc)."""
  paths = files.text_files(path)
  cfg = TextCorpusConfig.pending(path, validation_fraction, test_fraction, chunk_chars=chunk_chars)
  return prepare_named(LocalTextCorpus, cfg, paths, data_dir, name)


def sentence_pairs(
  path: str | os.PathLike,
  columns: Sequence[str],
  data_dir: str | os.PathLike | None = None,
  *,
  name: str | None = None,
  validation_fraction: float = 0.05,
  test_fraction: float = 0.05,
  delimiter: str | None = None,
) -> tfds.core.DatasetBuilder:
  """Prepares a TSV / CSV of aligned sentences as a `local_sentence_pairs` dataset."""
  paths = [files.existing(path)]
  table = {"columns": tuple(columns), "delimiter": delimiter}
  cfg = TableConfig.pending(path, validation_fraction, test_fraction, **table)
  return prepare_named(LocalSentencePairs, cfg, paths, data_dir, name)


def labelled_text(
  path: str | os.PathLike,
  text_column: str,
  label_column: str,
  data_dir: str | os.PathLike | None = None,
  *,
  label_names: Sequence[str] | None = None,
  delimiter: str | None = None,
  name: str | None = None,
  validation_fraction: float = 0.05,
  test_fraction: float = 0.05,
) -> tfds.core.DatasetBuilder:
  """Prepares a TSV / CSV with text and label columns as a `local_labelled_text` dataset."""
  paths = [files.existing(path)]
  labels = None if label_names is None else tuple(label_names)
  table = {"text_column": text_column, "label_column": label_column, "label_names": labels}
  cfg = TableConfig.pending(path, validation_fraction, test_fraction, **table, delimiter=delimiter)
  return prepare_named(LocalLabelledText, cfg, paths, data_dir, name)

"""`DataConfig`: everything about a dataset that is not batch size, length or seed.

A frozen dataclass; `DataConfig.from_mapping(config.data)` accepts an ml_collections
`ConfigDict` (or any mapping) with a subset of the fields and rejects unknown ones.
`PRESETS` names ready configurations for the data shipped in `data/`; a relative `data/...`
path is found in the checkout or, after `pip install .`, in the installed copy
(`shipped_root`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
from collections.abc import Mapping, Sequence
from numbers import Integral, Real
from pathlib import Path
from typing import Any, NoReturn

from transformer.data.image_builders import FASHION_MNIST_LABELS
from transformer.data.packing import OVERLONG_POLICIES

SOURCES = ("text", "pairs", "labelled", "idx", "image_folder", "sklearn_digits", "tfds", "hf")
IMAGE_SOURCES = ("idx", "image_folder", "sklearn_digits")  # sources whose records are images
TOKENIZERS = ("char", "byte", "sentencepiece", "pretrained", "none")
REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout, when the package runs from one
SHARE = ("share", "transformer")  # where `pip install .` puts configs/ and data/ (pyproject)


def fail(field: str, value: Any, rule: str) -> NoReturn:
  """Raises the one-line `ValueError` of a run-config field: `config.FIELD=VALUE: RULE`
  (the value on one line, cut at 80 characters). Tasks and the experiment config use it;
  the model config has its own (`ModelConfig.FIELD=...`, `nn.config.fail`)."""
  if hasattr(value, "to_dict"):
    value = value.to_dict()  # a ConfigDict's repr is multi-line YAML
  shown = repr(value).replace("\n", " ")
  shown = shown if len(shown) <= 80 else shown[:77] + "..."
  raise ValueError(f"config.{field}={shown}: {rule}")


@functools.cache
def shipped_root() -> Path:
  """The folder holding the shipped `configs/` and `data/`: the repository when the package
  runs from a checkout (editable installs included), else `<prefix>/share/transformer` of the
  installed distribution (pyproject's data-files)."""
  if (REPO_ROOT / "configs").is_dir() and (REPO_ROOT / "data").is_dir():
    return REPO_ROOT
  here = Path(__file__).resolve()
  for dist in importlib.metadata.distributions(name="transformer"):
    files = {Path(f.locate()).resolve() for f in dist.files or ()}
    if here not in files:
      continue  # another installation of the package
    for file in files:
      if file.parts[-4:] == (*SHARE, "data", "README.md"):
        return file.parents[1]
  return REPO_ROOT


def resolve_shipped(path: str | Path) -> Path:
  """`path` as given if it exists or is absolute, else inside `shipped_root()` (for
  `data/...` and `configs/...`)."""
  p = Path(path).expanduser()
  if p.exists() or p.is_absolute():
    return p
  return shipped_root() / p


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """What to read and how to turn it into batches. Invalid values raise `ValueError`."""

  kind: str = "lm"  # the task (a name in transformer/tasks): lm, mlm, seq2seq, image, ...
  # text | pairs | labelled | idx | image_folder | sklearn_digits | tfds | hf
  source: str = "text"
  # local file / folder, TFDS name ('wmt14_translate/de-en'); hf: a folder, file or glob of
  # .parquet / .jsonl / .arrow files (local or gs://), or a Hub dataset name
  path: str = "data/tinyshakespeare.txt.gz"
  # prepared TFDS datasets (None = ~/tensorflow_datasets); hf: the datasets cache (None = HF_HOME's)
  data_dir: str | None = None
  hf_config: str = ""  # hf: the Hub dataset's configuration ('' = its default)
  train_split: str = "train"  # split to train on (TFDS split syntax allowed: 'train[:90%]')
  train_examples: int = 0  # train on a random subset of this many records, per seed; 0 = all
  eval_split: str = "validation"  # split evaluated by the eval iterators
  validation_fraction: float = 0.05  # local text / tables / image folders: share for validation
  test_fraction: float = 0.05  # local text / tables / image folders: share for test
  text_column: str = "text"  # table column / TFDS feature with the text (lm, mlm, classification)
  label_column: str = "label"  # table column / TFDS feature with the label
  label_names: tuple[str, ...] | None = None  # label values in id order; None = sorted / from TFDS
  source_column: str = "en"  # seq2seq: column / feature of the source language
  target_column: str = "es"  # seq2seq: column / feature of the target language
  image_column: str = "image"  # hf: the column holding images (image tasks)
  max_bad_fraction: float = 0.001  # hf: stop if more of a split has nulls / unknown labels
  token_cache: str = ""  # hf token streams (windows) kept here; '' = WORKDIR/token_cache
  tokenizer: str = "char"  # char | byte | sentencepiece | pretrained | none (images)
  vocab_size: int = 8000  # sentencepiece vocabulary size (char / byte: fixed by the data)
  spm_model_type: str = "unigram"  # sentencepiece: unigram | bpe
  tokenizer_train_examples: int = 300_000  # records (evenly spaced) the tokenizer is trained on
  tokenizer_from: str = ""  # workdir / tokenizer file to reuse instead of training; '' = train
  target_seq_len: int | None = None  # seq2seq target length T; None = seq_len (inputs length S)
  # lm/mlm/span_corruption from a token stream (source 'pairs': every source-column text,
  # then every target-column one, one per line); None = True for source 'text'
  windows: bool | None = None
  packing: bool = True  # pack examples into rows (lm without windows, mlm, seq2seq training)
  overlong: str = "truncate"  # example longer than the row: truncate | skip | error (counted)
  image_mean: tuple[float, ...] | None = None  # per-channel mean on [0, 1]; None = from train
  image_std: tuple[float, ...] | None = None  # per-channel std on [0, 1]; None = from train
  image_size: int | None = None  # resize + centre-crop images to this square; None = as stored
  crop_padding: int = 0  # image training: random crop after zero padding by this many pixels
  horizontal_flip: bool = False  # image training: random left-right flips
  eval_batch_size: int | None = None  # None = the training batch size
  num_epochs: int | None = None  # training passes; None = repeat forever
  num_workers: int = 0  # grain worker processes
  prefetch: int = 2  # batches kept ready ahead of the training loop
  scan_examples: int = 2000  # records checked up front for length / unknown characters
  # ((source fields, weight), ...): train on several sources in proportion (data/mixture.py)
  mixture: tuple = ()

  def __post_init__(self):
    for name, value, allowed in (
      ("source", self.source, SOURCES),
      ("tokenizer", self.tokenizer, TOKENIZERS),
      ("overlong", self.overlong, OVERLONG_POLICIES),
      ("spm_model_type", self.spm_model_type, ("unigram", "bpe")),
    ):
      if value not in allowed:
        raise ValueError(f"DataConfig.{name} must be one of {allowed}, got {value!r}")
    if self.mixture:
      object.__setattr__(self, "mixture", normalized_mixture(self.mixture))
    if not 0 <= self.max_bad_fraction < 1:
      raise ValueError(
        f"DataConfig.max_bad_fraction must lie in [0, 1), got {self.max_bad_fraction}"
      )
    if self.vocab_size < 16:
      raise ValueError(f"DataConfig.vocab_size must be >= 16, got {self.vocab_size}")
    if self.image_size is not None and self.image_size < 1:
      raise ValueError(f"DataConfig.image_size must be positive, got {self.image_size}")
    if self.tokenizer_from and self.tokenizer == "none":
      raise ValueError("DataConfig: tokenizer_from needs a tokenizer (not 'none')")
    if self.tokenizer == "pretrained" and not self.tokenizer_from:
      raise ValueError("DataConfig: tokenizer 'pretrained' needs tokenizer_from (its workdir)")
    if isinstance(self.train_examples, bool) or not isinstance(self.train_examples, Integral):
      raise ValueError(f"DataConfig.train_examples must be an integer, got {self.train_examples!r}")
    if self.train_examples < 0:
      raise ValueError(
        f"DataConfig.train_examples must be >= 0 (0 = the whole training split), "
        f"got {self.train_examples}"
      )
    if self.num_workers < 0 or self.prefetch < 1 or self.crop_padding < 0:
      raise ValueError("DataConfig: num_workers and crop_padding must be >= 0, prefetch >= 1")

  @classmethod
  def from_mapping(cls, values: Mapping[str, Any] | DataConfig) -> DataConfig:
    """From a dict / ConfigDict (`to_dict()` is used when present); lists become tuples."""
    if isinstance(values, DataConfig):
      return values
    if hasattr(values, "to_dict"):
      values = values.to_dict()
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
      raise ValueError(f"DataConfig: unknown field(s) {unknown}; known: {sorted(names)}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})

  def replace(self, **changes: Any) -> DataConfig:
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @property
  def uses_windows(self) -> bool:
    return self.source == "text" if self.windows is None else self.windows

  def resolved_path(self) -> Path:
    """`path` as given if it exists, else in the shipped tree (`data/...`: the checkout's or
    the installed copy; `resolve_shipped`)."""
    return resolve_shipped(self.path)


# The fields a mixture entry may set: where one source's records are and how to read them.
SOURCE_FIELDS = (
  "name", "source", "path", "data_dir", "hf_config", "train_split", "eval_split",
  "validation_fraction", "test_fraction", "text_column", "label_column", "label_names",
  "source_column", "target_column", "image_column", "max_bad_fraction", "token_cache",
  "train_examples", "windows",
)  # fmt: skip


def normalized_mixture(mixture: Any) -> tuple[tuple[tuple[tuple[str, Any], ...], float], ...]:
  """The mixture as ((fields as sorted (key, value) pairs, weight), ...): hashable, as a
  frozen config is; or ValueError in one line naming the entry."""
  if not isinstance(mixture, Sequence) or isinstance(mixture, str):
    raise ValueError(
      f"DataConfig.mixture must be a sequence of (data block, weight), got {mixture!r}"
    )
  out = []
  for i, entry in enumerate(mixture):
    where = f"DataConfig.mixture[{i}]"
    if isinstance(entry, Mapping) or not isinstance(entry, Sequence) or len(entry) != 2:
      raise ValueError(f"{where}: expected (data block, weight), got {entry!r}")
    fields, weight = entry
    fields = fields.to_dict() if hasattr(fields, "to_dict") else fields
    if not isinstance(fields, Mapping):
      raise ValueError(f"{where}: the data block must be a mapping of fields, got {fields!r}")
    unknown = sorted(set(fields) - set(SOURCE_FIELDS))
    if unknown:
      raise ValueError(
        f"{where}: {unknown} cannot differ between sources; a source sets {SOURCE_FIELDS}"
      )
    if isinstance(weight, bool) or not isinstance(weight, Real) or not weight > 0:
      raise ValueError(f"{where}: the weight must be a number > 0, got {weight!r}")
    pairs = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in fields.items()))
    out.append((pairs, float(weight)))
  if len(out) == 1:
    raise ValueError("DataConfig.mixture: one source is not a mixture; set its fields on data")
  names = [source_name(dict(fields)) for fields, _ in out]
  if len(set(names)) < len(names):
    raise ValueError(f"DataConfig.mixture: two sources share a name: {names}; set 'name'")
  return tuple(out)


def source_name(fields: Mapping[str, Any]) -> str:
  """A source's name: its `name`, else its path's last part without extensions."""
  if fields.get("name"):
    return str(fields["name"])
  return str(fields.get("path", "data")).rstrip("/").rsplit("/", 1)[-1].split(".")[0]


_BIBLE = "data/bible_kjv_rv1909_en_es.tsv.gz"
# The verses as a labelled table: the English text and its testament (OT / NT).
_TESTAMENTS = {
  "source": "labelled",
  "text_column": "en",
  "label_column": "testament",
  "label_names": ("OT", "NT"),
}


def _bible(**fields: Any) -> DataConfig:
  """A preset on the English-Spanish Bible, with an 8000-piece sentencepiece vocabulary."""
  return DataConfig(path=_BIBLE, tokenizer="sentencepiece", vocab_size=8000, **fields)


PRESETS: dict[str, DataConfig] = {
  # nanoGPT's character-level shakespeare: the last 10% of the characters for validation.
  "shakespeare_char": DataConfig(validation_fraction=0.1, test_fraction=0.0),
  "shakespeare_spm": DataConfig(tokenizer="sentencepiece", vocab_size=2048),
  "shakespeare_mlm": DataConfig(kind="mlm", tokenizer="sentencepiece", vocab_size=2048),
  "bible_en_es": _bible(kind="seq2seq", source="pairs", source_column="en", target_column="es"),
  "bible_es_en": _bible(kind="seq2seq", source="pairs", source_column="es", target_column="en"),
  "bible_testament": _bible(kind="classification", **_TESTAMENTS),
  "bible_mlm": _bible(kind="mlm", **_TESTAMENTS),
  "fashion_mnist": DataConfig(
    kind="image",
    source="idx",
    path="data/fashion-mnist",
    tokenizer="none",
    eval_split="test",
    label_names=FASHION_MNIST_LABELS,
    image_mean=(0.2860,),
    image_std=(0.3530,),
    validation_fraction=0.0,
    test_fraction=0.0,
  ),
}

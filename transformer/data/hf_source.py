"""`DataConfig.source='hf'`: Hugging Face datasets by name, and Parquet / JSONL / Arrow files.

`open_hf(cfg, paired, images, labelled, conversations, preference)` returns the fields of the
`sources.Splits` every task reads (docs/DATA.md):

- **Where** (`data.path`): a local or `gs://` folder, its splits named by its files as on
  the Hub (`train-*.parquet`, `validation/...`, `test.jsonl`; a folder with unnamed files
  is one 'train' split); a file or a glob of `.parquet`, `.jsonl` / `.json` or `.arrow`
  files (one 'train' split); anything else is a Hub name (`data.hf_config` its
  configuration), read from the `datasets` cache (`HF_HOME`, `HF_DATASETS_OFFLINE`).
  `data.data_dir` is the `datasets` cache folder (None: its default).
- **Reading**: `datasets` converts the files once into its Arrow cache and memory-maps
  them; a split is a random-access source of records (`Records`) that grain reads a record
  at a time, so a dataset is never loaded whole.
- **Splits**: `data.train_split` / `data.eval_split` as the data names them (the `datasets`
  slice syntax, 'train[:90%]', included). Data with a 'train' split only is cut like a
  local text: validation and test are its last `validation_fraction` and `test_fraction`
  of records, train the records before them.
- **Columns**: `text_column`, or `source_column` / `target_column` for pairs, must hold
  text (a nested field by its dotted name: 'translation.de'), or for a chat task
  (`conversations`) `text_column` a list of {role, content} messages; a preference task
  (`preference`) reads TRL's columns `prompt`, `chosen` and `rejected`, each text or a
  conversation; `label_column` class labels, integers or strings (strings become ids in
  the order of `data.label_names`, or sorted); `image_column` images. A missing column or
  one of another type is one error line naming the field and the data.
- **Bad records**: a record with a null in a column the task reads (or a label outside
  `label_names`) is never trained on. Such records are counted over the whole split up
  front (Arrow's null counts; no record is read), skipped with a warning, and reported in
  `DataInfo.stats`; above `data.max_bad_fraction` of a split the run stops. An image that
  does not decode stops the run when it is read, naming its split and row.
- **Token streams** (`data.windows`): tokenized once per (data fingerprint, tokenizer) and
  kept as `.npy` in `data.token_cache` (default `WORKDIR/token_cache`), memory-mapped by
  every later run (`token_stream`).
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np
from etils import epath

from transformer.data import features, files
from transformer.data.config import DataConfig, fail
from transformer.data.tokenizers import Tokenizer

FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".arrow": "arrow"}
TEXT_TYPES = ("string", "large_string")
PREFERENCE_COLUMNS = ("prompt", "chosen", "rejected")  # TRL's names
_SAFE = re.compile(r"[^\w.+-]")  # characters kept from a data path in a cache folder name


class Records(Sequence):
  """Rows `indices` of a memory-mapped `datasets.Dataset` as the records tasks read:
  {key: value} per (key, column) of `columns`, text as `str`, class labels as ids
  (`label_ids` maps string labels), images as uint8 arrays."""

  def __init__(
    self,
    ds: Any,
    columns: dict[str, str],
    indices: np.ndarray | None = None,
    label_ids: dict[str, int] | None = None,
    name: str = "",
  ):
    self.ds = ds.select_columns(sorted(set(columns.values())))
    self.columns, self.indices, self.label_ids, self.name = columns, indices, label_ids, name
    picked = b"" if indices is None else hashlib.sha256(indices.tobytes()).digest()
    self.fingerprint = hashlib.sha256(ds._fingerprint.encode() + picked).hexdigest()[:16]

  def __len__(self) -> int:
    return len(self.ds) if self.indices is None else len(self.indices)

  def __getitem__(self, i: int) -> dict[str, Any]:
    return self.__getitems__([i])[0]

  def __getitems__(self, positions: Sequence[int]) -> list[dict[str, Any]]:
    rows = [int(i) for i in positions] if self.indices is None else self.indices[positions]
    rows = [int(r) for r in rows]
    try:
      return [self._record(row) for row in self.ds.__getitems__(rows)]
    except IndexError:  # past the end: how a Sequence's iteration stops
      raise
    except Exception:  # a record that does not decode (an image): find it and name it
      for row in rows:
        try:
          self._record(self.ds[row])
        except Exception as e:
          raise ValueError(f"{self.name} [row {row}]: does not decode: {files.one_line(e)}") from e
      raise

  def _record(self, row: dict[str, Any]) -> dict[str, Any]:
    out = {key: row[column] for key, column in self.columns.items()}
    if self.label_ids is not None and "label" in out:
      out["label"] = self.label_ids[out["label"]]
    if "image" in out:
      out["image"] = _image_array(out["image"])
    return out


def _image_array(value: Any) -> np.ndarray:
  """A `datasets` Image (PIL), PNG / JPEG bytes, or {'bytes': ...} -> uint8 [H, W(, C)]."""
  if isinstance(value, dict):
    value = value.get("bytes")
  if isinstance(value, bytes):
    from PIL import Image

    value = Image.open(io.BytesIO(value))
  return np.asarray(value)


def open_hf(
  cfg: DataConfig,
  paired: bool,
  images: bool,
  labelled: bool,
  conversations: bool = False,
  preference: bool = False,
) -> dict[str, Any]:
  """The training and evaluation splits of `cfg` (module docstring) as `Records`, with the
  other fields of a `sources.Splits`."""
  name = cfg.path
  found = _load(cfg)
  train, held_out = _split(found, cfg, cfg.train_split), _split(found, cfg, cfg.eval_split)
  if images:
    columns = {"image": ("image_column", cfg.image_column)}
  elif preference:
    columns = {c: ("path", c) for c in PREFERENCE_COLUMNS}
  elif paired:
    columns = {
      cfg.source_column: ("source_column", cfg.source_column),
      cfg.target_column: ("target_column", cfg.target_column),
    }
  else:
    columns = {cfg.text_column: ("text_column", cfg.text_column)}
  if labelled:
    columns["label"] = ("label_column", cfg.label_column)
  if any("." in column and column not in train.features for _, column in columns.values()):
    train, held_out = train.flatten(), held_out.flatten()  # 'translation.de': a nested field
  for key, (field, column) in columns.items():
    if column not in train.features:
      if preference:
        rule = f"a preference dataset has columns {', '.join(PREFERENCE_COLUMNS)}; no {column!r}"
        fail("data.path", name, f"{rule}: columns {sorted(train.features)}")
      fail(f"data.{field}", column, f"no such column in {name}; columns: {sorted(train.features)}")
    kind = _kind(train.features[column])
    if preference:
      if kind not in TEXT_TYPES and not _is_conversation(train.features[column]):
        rule = f"column {column!r} holds {kind}, expected text or lists of {{role, content}}"
        fail("data.path", name, rule)
    elif conversations and key == cfg.text_column:
      if not _is_conversation(train.features[column]):
        rule = f"column of {name} holds {kind}, expected conversations: lists of {{role, content}}"
        fail(f"data.{field}", column, rule)
    elif key != "label" and key != "image" and kind not in TEXT_TYPES:
      fail(f"data.{field}", column, f"column of {name} holds {kind}, expected text (string)")
  label_names, label_ids = _labels(cfg, train, held_out, name) if labelled else ((), None)
  mapping = {key: column for key, (_, column) in columns.items()}
  splits, stats = [], {}
  for role, split, ds in (("train", cfg.train_split, train), ("eval", cfg.eval_split, held_out)):
    keep = _good_rows(cfg, ds, mapping, label_ids, f"{name} [{split}]")
    splits.append(Records(ds, mapping, keep, label_ids, f"{name} [{split}]"))
    stats[f"{role}_bad_records"] = len(ds) - len(splits[-1])
  text_keys = (cfg.source_column, cfg.target_column) if paired else (cfg.text_column,)
  text_keys = PREFERENCE_COLUMNS if preference else text_keys
  image_shape = None
  if images:
    first = splits[0][0]["image"]
    image_shape = first.shape if first.ndim == 3 else (*first.shape, 1)
  return dict(
    train=splits[0],
    eval=splits[1],
    key=f"hf-{_SAFE.sub('_', name)[-60:]}-{splits[0].fingerprint}",
    label_names=label_names,
    image_shape=tuple(image_shape) if image_shape else None,
    text_keys=() if images else text_keys,
    stats=stats,
  )


def _is_conversation(feature: Any) -> bool:
  """Whether a `datasets` feature is a list of {role, content} text messages."""
  inner = getattr(feature, "feature", None) if _kind(feature) in ("List", "LargeList") else None
  if not isinstance(inner, dict) or not {"role", "content"} <= set(inner):
    return False
  return all(_kind(inner[k]) in TEXT_TYPES for k in ("role", "content"))


def _kind(feature: Any) -> str:
  """A `datasets` feature's type in one word: 'string', 'int64', 'ClassLabel', 'Image'..."""
  return getattr(feature, "dtype", None) if type(feature).__name__ == "Value" else (
    type(feature).__name__
  )  # fmt: skip


def _where(cfg: DataConfig) -> tuple[str, dict[str, Any]]:
  """`load_dataset`'s path and keyword arguments for `cfg.path` (module docstring)."""
  import datasets

  path, kwargs = cfg.path, {"cache_dir": cfg.data_dir}
  where = epath.Path(path) if files.is_remote(path) else epath.Path(cfg.resolved_path())
  suffix = next((s for s in FORMATS if path.endswith(s)), None)
  if suffix is not None:
    if not files.is_remote(path) and not any(c in path for c in "*?[") and not where.exists():
      raise FileNotFoundError(f"data.path={path!r}: no such file")
    return FORMATS[suffix], {**kwargs, "data_files": {"train": str(where)}}
  if not (files.is_remote(path) or where.is_dir()):
    return path, {**kwargs, "name": cfg.hf_config or None}  # a Hub name
  if not where.is_dir():
    raise FileNotFoundError(f"data.path={path!r}: no such folder")
  try:  # the Hub's split names: train-*.parquet, validation/, test.jsonl, ...
    patterns = datasets.data_files.get_data_patterns(str(where))
    found = datasets.data_files.DataFilesDict.from_patterns(patterns, base_path=str(where))
  except datasets.data_files.EmptyDatasetError:
    found = {}
  split_files = {split: [str(f) for f in names] for split, names in found.items()}
  kinds = {FORMATS[s] for names in split_files.values() for f in names for s in FORMATS
           if f.endswith(s)}  # fmt: skip
  if len(kinds) != 1 or any(
    not f.endswith(tuple(FORMATS)) for n in split_files.values() for f in n
  ):
    raise ValueError(
      f"data.path={path!r}: expected .parquet, .jsonl / .json or .arrow files of one "
      f"format in the folder or its split folders, found {sorted(kinds) or 'none'}"
    )
  return kinds.pop(), {**kwargs, "data_files": split_files}


def _load(cfg: DataConfig) -> Any:
  """The data's splits as a `datasets.DatasetDict` (memory-mapped Arrow)."""
  import datasets
  import pyarrow

  datasets.disable_progress_bars()
  builder, kwargs = _where(cfg)
  try:
    return datasets.load_dataset(builder, **kwargs)
  except (pyarrow.ArrowInvalid, datasets.exceptions.DatasetGenerationError) as e:
    cause = e.__cause__ or e
    raise ValueError(
      f"data.path={cfg.path!r}: unreadable or truncated file: {str(cause).splitlines()[0]}"
    ) from e
  except (ConnectionError, datasets.exceptions.DatasetNotFoundError) as e:
    if builder != cfg.path and files.is_remote(cfg.path) and datasets.config.HF_HUB_OFFLINE:
      raise ConnectionError(
        f"data.path={cfg.path!r}: datasets reads no remote files while HF_DATASETS_OFFLINE "
        "or HF_HUB_OFFLINE is set; unset it (the files are fetched into its cache once)"
      ) from e
    if builder != cfg.path:
      raise
    config = f", {cfg.hf_config!r}" if cfg.hf_config else ""
    raise FileNotFoundError(
      f"data.path={cfg.path!r}: not in the datasets cache "
      f"({cfg.data_dir or 'the default, HF_HOME'}) and the Hub is unreachable or offline; "
      f'fetch it once where the Hub is reachable: python -c "import datasets; '
      f'datasets.load_dataset({cfg.path!r}{config}, cache_dir={cfg.data_dir!r})"'
    ) from e


def _split(found: Any, cfg: DataConfig, spec: str) -> Any:
  """Split `spec` of the loaded data; a lone 'train' split is cut into train, validation and
  test by the fractions, as local text is (a sliced spec, 'train[:10%]', reads it whole)."""
  base, sliced = spec.split("[")[0], "[" in spec
  valid, test = cfg.validation_fraction, cfg.test_fraction
  cuts = {"train": (0, 1 - valid - test), "validation": (1 - valid - test, 1 - test),
          "test": (1 - test, 1)}  # fmt: skip
  if sorted(found) == ["train"] and valid + test > 0 and base in cuts and not sliced:
    n, (lo, hi) = len(found["train"]), cuts[base]
    return found["train"].select(range(int(n * lo), int(n * hi)))
  if base not in found:
    raise ValueError(f"data.path={cfg.path!r}: no split {spec!r}; splits: {sorted(found)}")
  if not sliced:
    return found[base]
  import datasets

  ds = found[base]
  (absolute,) = datasets.ReadInstruction.from_spec(spec).to_absolute({base: len(ds)})
  return ds.select(range(absolute.from_, absolute.to))


def _labels(cfg: DataConfig, train: Any, held_out: Any, name: str):
  """(label_names, {string label: id} or None for integer labels)."""
  import pyarrow.compute as pc

  feature = train.features[cfg.label_column]
  kind = _kind(feature)
  if kind == "ClassLabel":
    return tuple(feature.names), None
  column = train.data.column(cfg.label_column)
  if kind in TEXT_TYPES:
    names = cfg.label_names or tuple(sorted(str(v) for v in pc.unique(column).to_pylist() if v))
    return tuple(names), {n: i for i, n in enumerate(names)}
  if kind is None or not kind.startswith(("int", "uint")):
    fail("data.label_column", cfg.label_column,
         f"column of {name} holds {kind}, expected class labels (integers or strings)")  # fmt: skip
  top = max(pc.max(ds.data.column(cfg.label_column)).as_py() or 0 for ds in (train, held_out))
  return tuple(cfg.label_names or (str(i) for i in range(top + 1))), None


def _good_rows(
  cfg: DataConfig, ds: Any, columns: dict[str, str], label_ids: dict | None, where: str
) -> np.ndarray | None:
  """The rows a task may read (None: all): no null in `columns`, a known label. Raises when
  the split is empty or more than `max_bad_fraction` of it is bad."""
  import pyarrow
  import pyarrow.compute as pc

  n = len(ds)
  bad = np.zeros(n, bool)
  if ds._indices is not None:  # a slice of the split: read the rows it selects
    table = ds.data.table.take(ds._indices.column(0))
  else:
    table = ds.data.table
  for key, column in columns.items():
    values = table.column(column)
    if values.null_count:
      bad |= pc.is_null(values).to_numpy(zero_copy_only=False)
    if key == "label" and label_ids is not None:
      known = pc.is_in(values, value_set=pyarrow.array(list(label_ids)))
      bad |= ~pc.fill_null(known, False).to_numpy(zero_copy_only=False)
    elif key == "label" and label_ids is None and _kind(ds.features[column]) != "ClassLabel":
      ok = pc.less(values, len(cfg.label_names)) if cfg.label_names else None
      if ok is not None:
        bad |= ~pc.fill_null(ok, False).to_numpy(zero_copy_only=False)
  count = int(bad.sum())
  if n - count == 0:
    raise ValueError(f"{where}: no records{f' ({count} bad of {n})' if count else ''}")
  if count > cfg.max_bad_fraction * n:
    raise ValueError(
      f"{where}: {count} of {n} records have a null in {sorted(set(columns.values()))} or "
      f"an unknown label, more than data.max_bad_fraction={cfg.max_bad_fraction}"
    )
  if not count:
    return None
  logging.warning("%s: %d of %d records skipped (a null or an unknown label)", where, count, n)
  return np.flatnonzero(~bad)


def tokenizer_digest(tok: Tokenizer) -> str:
  """A short digest of a tokenizer's saved file (same file, same token ids)."""
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "tokenizer")
    tok.save(path)
    return hashlib.sha256(epath.Path(path).read_bytes()).hexdigest()[:16]


def token_stream(
  records: Records, tok: Tokenizer, keys: Sequence[str], folder: str | os.PathLike
) -> tuple[np.ndarray, bool]:
  """The split's documents as one token stream: each record's text in `keys` (every
  record's first column, then every record's second, ...) tokenized on its own and ended
  with EOS. Read from `folder` (memory-mapped where local) if a run tokenized the same
  records with the same tokenizer before, else tokenized and kept there; (int32 [N],
  True if it came from the cache)."""
  tag = f"{records.fingerprint}-{tokenizer_digest(tok)}-{'|'.join(keys)}"
  path = epath.Path(folder) / f"{hashlib.sha256(tag.encode()).hexdigest()[:24]}.npy"
  if path.exists():
    if files.is_remote(path):
      return np.load(io.BytesIO(path.read_bytes()), allow_pickle=False), True
    return np.load(path, mmap_mode="r", allow_pickle=False), True
  eos = np.asarray([tok.eos_id], np.int32)
  parts = []
  for key in keys:
    for _, record in features.read_records(records, range(len(records))):
      parts += [tok.encode_array(features.text_of(record, key)).astype(np.int32), eos]
  tokens = np.concatenate(parts) if parts else np.zeros(0, np.int32)
  buffer = io.BytesIO()
  np.save(buffer, tokens)
  files.write_atomic(path, buffer.getvalue())
  return tokens, False

"""Standard TFDS datasets by name without TensorFlow: every workaround in one place.

Verified against tensorflow-datasets 4.9.10 with no TensorFlow (and no h5py) installed:

- `builder(name, data_dir)`: TFDS registers the builders of its legacy packages
  (`tensorflow_datasets.text`, `.translate`, ...) only when a name is first missed, by
  importing the packages in one loop inside one `try` (`core/registered.py`,
  `_import_legacy_builders`). The first package that fails to import ends the loop:
  `nearest_neighbors` and `d4rl` import h5py, so every package after them (`text` with
  `glue`, `translate` with `wmt14_translate`, ...) is never registered and
  `tfds.builder('wmt14_translate/de-en')` raises `DatasetNotFoundError`. We import the
  same packages one by one, skipping only those that fail, then look the name up again.
- `data_source(builder, split)`: under `tfds.testing.mock_data` the reader behind
  `ArrayRecordDataSource` is a `PickableDataSourceMock` whose `__getitems__` is a
  `functools.partial` stored on the instance, so it is called without `self` and raises
  `TypeError` (single `__getitem__` works). Bulk reads (`features.read_records`) prefer
  `__getitems__`, so a mocked source is handed out as a view with `__len__` and
  `__getitem__` only.
- An unprepared dataset makes `as_data_source` raise `NotImplementedError` about the
  TFRecord format (TFDS assumes TFRecord when no `dataset_info.json` exists); `not_ready`
  turns that into one line with the `tfds build` command and the data dir.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Sequence
from typing import Any
from unittest import mock

# tensorflow_datasets 4.9.10, core/registered.py `_import_legacy_builders`: the packages
# whose builders register on import.
_LEGACY_PACKAGES = (
  "audio",
  "graphs",
  "image",
  "image_classification",
  "object_detection",
  "nearest_neighbors",
  "question_answering",
  "d4rl",
  "ranking",
  "recommendation",
  "rl_unplugged",
  "rlds.datasets",
  "robotics",
  "robomimic",
  "structured",
  "summarization",
  "text",
  "text_simplification",
  "time_series",
  "translate",
  "video",
  "vision_language",
)


def _import_legacy_packages() -> None:
  for package in _LEGACY_PACKAGES:
    try:
      importlib.import_module(f"tensorflow_datasets.{package}")
    except ImportError:  # an optional dependency of that package (h5py, ...) is missing
      continue


def builder(name: str, data_dir: str | None) -> Any:
  """`tfds.builder(name, data_dir=...)`; a name TFDS does not know: one-line `ValueError`."""
  import tensorflow_datasets as tfds

  try:
    return tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    _import_legacy_packages()
  try:
    return tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError as e:
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise ValueError(
      f"DataConfig.path={name!r}: no TFDS dataset of that name ({first}); "
      f"names as in `tfds.list_builders()`, a config after '/' (e.g. 'wmt14_translate/de-en')"
    ) from None


@dataclasses.dataclass(frozen=True)
class _RecordByRecord:
  """A data source seen through `__len__` and `__getitem__` only (no bulk `__getitems__`)."""

  source: Sequence

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, index: int) -> Any:
    return self.source[index]


def data_source(tfds_builder: Any, split: str) -> Sequence:
  """The builder's random-access source of `split` (mocked sources without bulk reads)."""
  source = tfds_builder.as_data_source(split=split)
  if isinstance(getattr(source, "data_source", None), mock.NonCallableMock):
    return _RecordByRecord(source)  # tfds.testing.mock_data: see the module docstring
  return source


def data_dir_root(tfds_builder: Any) -> str:
  """The data dir the builder reads (`data_dir`, or TFDS's default), without name/version."""
  full = str(tfds_builder.data_dir)
  suffix = "/" + tfds_builder.info.full_name
  return full[: -len(suffix)] if full.endswith(suffix) else full


def build_command(tfds_builder: Any) -> str:
  """The `tfds build` command that prepares this dataset as array_record where it is read."""
  name = tfds_builder.info.full_name.rsplit("/", 1)[0]  # 'name' or 'name/config'
  return f"tfds build {name} --file_format=array_record --data_dir={data_dir_root(tfds_builder)}"


def not_ready(tfds_builder: Any, split: str, error: Exception) -> Exception:
  """The one-line error for a split that cannot be opened: not prepared, wrong file
  format, or no such split."""
  name, root = tfds_builder.info.full_name.rsplit("/", 1)[0], data_dir_root(tfds_builder)
  if not tfds_builder.is_prepared():
    manual = (
      f" (manual download: the archives go in {root}/downloads/manual first)"
      if getattr(tfds_builder, "MANUAL_DOWNLOAD_INSTRUCTIONS", None)
      else ""
    )
    return FileNotFoundError(
      f"TFDS dataset {name!r} is not prepared in {root}; prepare it once with: "
      f"{build_command(tfds_builder)}{manual} (needs TensorFlow; see docs/DATA.md)"
    )
  available = list(tfds_builder.info.splits)
  if split.split("[")[0] not in available:
    return ValueError(f"TFDS dataset {name!r}: no split {split!r}; prepared splits: {available}")
  info = tfds_builder.info
  stored = [info.file_format, *getattr(info, "alternative_file_formats", [])]
  formats = [str(f.value) for f in stored if f is not None] or ["tfrecord"]  # TFDS's default
  if "array_record" not in formats:
    return FileNotFoundError(
      f"TFDS dataset {name!r} in {root} is prepared as {formats[0]}, not array_record; "
      f"convert it with: tfds convert_format --dataset_dir={tfds_builder.data_dir} "
      f"--out_file_format=array_record (needs TensorFlow; see docs/DATA.md)"
    )
  first = str(error).splitlines()[0] if str(error) else ""
  return RuntimeError(f"TFDS dataset {name!r} [{split}]: {type(error).__name__}: {first}")

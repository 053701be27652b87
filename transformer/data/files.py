"""Local files: strict readers (text, delimited tables, IDX arrays) and atomic writes.

Every reader fails loudly with the file (and line, where there is one) in the message:
`FileNotFoundError` for a missing path, `ValueError` for content that cannot be read
as promised (undecodable bytes, a malformed row, an empty file, a corrupt IDX header).
Files ending in `.gz` are decompressed transparently.

`write_atomic(path, data)` is the one way the package replaces a file it writes whole
(configs, tokenizers, IDX arrays, a truncated metrics log): a killed process leaves the
old file or the new one, never a partial one. It takes local paths and object-storage
URLs (`gs://bucket/...`, through `etils.epath`); `is_remote` tells them apart.
`read_jsonl` reads the package's logs (metrics, run records); `one_line(e)` is how a storage
error is reported wherever the package reports one. `staging_folder` is a local folder for
what a process writes locally and uploads (the TensorBoard events of a remote workdir).
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
from etils import epath

TEXT_SUFFIXES = (".txt", ".txt.gz")

# Object storage (`gs://`, through etils.epath -> fsspec/gcsfs): a workdir is shared by
# several processes and hosts (a lease, a resumed run, eval.py), so no listing is answered
# from a cache that another writer has made stale. Defaults for filesystems made after this.
fsspec.config.conf.setdefault("gcs", {}).setdefault("use_listings_cache", False)

# IDX type codes (http://yann.lecun.com/exdb/mnist/, "THE IDX FILE FORMAT").
_IDX_DTYPES = {
  0x08: np.dtype(np.uint8),
  0x09: np.dtype(np.int8),
  0x0B: np.dtype(">i2"),
  0x0C: np.dtype(">i4"),
  0x0D: np.dtype(">f4"),
  0x0E: np.dtype(">f8"),
}


def existing(path: str | os.PathLike) -> Path:
  """Returns `path` as a `Path`, or raises `FileNotFoundError` naming it."""
  p = Path(path)
  if not p.exists():
    raise FileNotFoundError(f"{p}: no such file or directory")
  return p


def read_bytes(path: str | os.PathLike) -> bytes:
  """The (decompressed, for `.gz`) bytes of a file."""
  p = existing(path)
  if p.is_dir():
    raise ValueError(f"{p}: is a directory, expected a file")
  data = p.read_bytes()
  if p.name.endswith(".gz"):
    try:
      data = gzip.decompress(data)
    except (OSError, EOFError) as e:
      raise ValueError(f"{p}: not a valid gzip file ({e})") from e
  return data


def decode_utf8(data: bytes, path: str | os.PathLike) -> str:
  """Decodes UTF-8 strictly; on failure the error names the file, line and column."""
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = data.count(b"\n", 0, e.start) + 1
    column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
    bad = data[e.start : e.end]
    raise ValueError(
      f"{path}:{line}: invalid UTF-8 byte(s) {bad!r} at column {column} (byte offset {e.start})"
    ) from e


def read_text(path: str | os.PathLike) -> str:
  """The whole file as a `str` (strict UTF-8; newlines kept exactly as stored)."""
  return decode_utf8(read_bytes(path), path)


def text_files(path: str | os.PathLike) -> list[Path]:
  """A text file, or every `.txt` / `.txt.gz` file under a folder in sorted order."""
  p = existing(path)
  if p.is_file():
    return [p]
  files = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(TEXT_SUFFIXES))
  if not files:
    raise ValueError(f"{p}: folder holds no {' or '.join(TEXT_SUFFIXES)} files")
  return files


def read_table(
  path: str | os.PathLike, columns: Sequence[str], delimiter: str | None = None
) -> Iterator[tuple[int, dict[str, str]]]:
  """Yields `(line_number, {column: value})` for each data row of a TSV / CSV file.

  The first row is the header and must name every column in `columns`. The delimiter is
  a tab for `.tsv` / `.tsv.gz` (no quoting: fields hold no tabs or newlines) and a comma
  with standard CSV quoting otherwise, unless given. A row with the wrong number of
  fields raises `ValueError` naming the file and line.
  """
  text = read_text(path)
  name = Path(path).name.removesuffix(".gz")
  if delimiter is None:
    delimiter = "\t" if name.endswith(".tsv") else ","
  quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
  reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, quoting=quoting)
  try:
    header = next(reader)
  except StopIteration:
    raise ValueError(f"{path}: empty file, expected a header row") from None
  missing = [c for c in columns if c not in header]
  if missing:
    raise ValueError(f"{path}:1: header {header} lacks column(s) {missing}")
  where = [header.index(c) for c in columns]
  line = reader.line_num
  while True:
    try:
      row = next(reader)
    except StopIteration:
      return
    except csv.Error as e:  # e.g. a field over csv.field_size_limit() (131,072 characters)
      raise ValueError(f"{path}:{reader.line_num}: unreadable row: {e}") from None
    if not row:  # A blank line (typically a trailing one).
      line = reader.line_num
      continue
    if len(row) != len(header):
      raise ValueError(
        f"{path}:{line + 1}: expected {len(header)} fields ({delimiter!r}-separated), "
        f"got {len(row)}"
      )
    yield line + 1, {c: row[i] for c, i in zip(columns, where, strict=True)}
    line = reader.line_num


def read_idx(path: str | os.PathLike) -> np.ndarray:
  """An IDX file (the MNIST / Fashion-MNIST format) as a NumPy array of its shape."""
  data = read_bytes(path)
  if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
    raise ValueError(f"{path}: not an IDX file (bad magic number {data[:4]!r})")
  dtype, ndim = _IDX_DTYPES[data[2]], data[3]
  header = 4 + 4 * ndim
  if ndim == 0 or len(data) < header:
    raise ValueError(f"{path}: truncated IDX header")
  shape = tuple(int(d) for d in np.frombuffer(data, ">u4", count=ndim, offset=4))
  expected = header + int(np.prod(shape)) * dtype.itemsize
  if len(data) != expected:
    raise ValueError(
      f"{path}: IDX header says shape {shape} ({expected} bytes), file has {len(data)}"
    )
  return np.frombuffer(data, dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
  """Writes a uint8 array as an uncompressed IDX file (the inverse of `read_idx`), atomically."""
  array = np.asarray(array)
  if array.dtype != np.uint8 or not 1 <= array.ndim <= 255:
    raise ValueError(f"{path}: write_idx takes uint8 arrays, got {array.dtype} {array.shape}")
  header = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
  write_atomic(path, header + np.ascontiguousarray(array).tobytes())


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
  """The JSON objects of a .jsonl file, in order ([] if it does not exist; a line that is
  not a JSON object, such as one cut short by a kill, is skipped). Local or a URL."""
  path = epath.Path(path)
  return json_objects(path.read_text(encoding="utf-8").splitlines()) if path.exists() else []


def json_objects(lines: Sequence[str | bytes]) -> list[dict[str, Any]]:
  """The lines that are JSON objects, parsed, in order (others skipped: a line cut short by
  a kill, a stray value)."""
  records = []
  for line in lines:
    try:
      record = json.loads(line)
    except ValueError:
      continue
    if isinstance(record, dict):
      records.append(record)
  return records


def one_line(e: BaseException) -> str:
  """An error as one line: its type and its first non-empty message line (storage
  clients' errors run to pages of response bodies and retries)."""
  lines = [line.strip() for line in str(e).splitlines() if line.strip()]
  return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


class StorageError(RuntimeError):
  """A file or object of the run could not be written: the storage unreachable past its
  clients' retries, a full disk, access refused. Its message is one line."""


def is_remote(path: str | os.PathLike) -> bool:
  """True for an object-storage URL such as `gs://bucket/run` (read and written through
  `etils.epath`), False for a local path."""
  return "://" in os.fspath(path)


def staging_folder(remote: str, kind: str) -> str:
  """A new local folder for files that this process writes and uploads to `remote`:
  `{kind}-{hash of remote}-{pid}-{random}` in the temporary directory. The folders of the
  same `remote` and kind whose process has ended (killed: the uploader removes its own) are
  removed first; the caller must not need what a dead process left in its folder."""
  prefix = f"{kind}-{hashlib.sha256(remote.encode()).hexdigest()[:16]}-"
  temp = tempfile.gettempdir()
  for name in os.listdir(temp):
    pid = name[len(prefix) :].split("-")[0]
    if name.startswith(prefix) and pid.isdigit() and not _running(int(pid)):
      shutil.rmtree(os.path.join(temp, name), ignore_errors=True)
  return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")


def _running(pid: int) -> bool:
  try:
    os.kill(pid, 0)  # no signal: only whether the process exists
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process
    pass
  return True


def write_atomic(path: str | os.PathLike, data: str | bytes) -> Path | epath.Path:
  """Writes `data` (a `str` is encoded as UTF-8) to `path` through a temporary file in the
  same folder and a rename, creating the folder if needed; returns the path.

  A process killed at any moment leaves the previous file (or none) or the complete new
  one, never a partial one; concurrent writers each write their own temporary file. On
  object storage (`is_remote`) the object is uploaded whole: a store such as Cloud
  Storage makes an object visible only once its upload completes, so readers likewise see
  the old object or the new one.
  """
  if isinstance(data, str):
    data = data.encode("utf-8")
  if is_remote(path):
    remote = epath.Path(path)
    remote.write_bytes(data)
    return remote
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
  try:
    tmp.write_bytes(data)
    os.replace(tmp, path)
  except BaseException:
    tmp.unlink(missing_ok=True)
    raise
  return path


def fingerprint(paths: Sequence[Path], *extra: object, content: bool = True) -> str:
  """A short hash of the files (content, or name + size + mtime) and `extra` settings."""
  h = hashlib.sha256(repr(extra).encode())
  for p in paths:
    h.update(str(p.name).encode())
    if content:
      with open(p, "rb") as f:
        for block in iter(lambda f=f: f.read(1 << 20), b""):
          h.update(block)
    else:
      st = p.stat()
      h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
  return h.hexdigest()[:10]

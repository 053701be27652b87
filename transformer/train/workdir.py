"""The run directory: creation and a writability check (its lock: `train/guard/lock.py`).

A workdir is a local folder or an object-storage URL (`gs://bucket/run`, read and written
through `etils.epath`).
"""

from __future__ import annotations

import logging
import os
import tempfile
import uuid

from etils import epath

from transformer.data.files import is_remote, one_line


def absolute(workdir: str | os.PathLike) -> str:
  """`workdir` as an absolute local path, or the object-storage URL without a trailing '/'."""
  workdir = os.fspath(workdir)
  if is_remote(workdir):
    return workdir.rstrip("/")
  return os.path.abspath(os.path.expanduser(workdir))


def prepare_workdir(workdir: str) -> str:
  """Creates `workdir` if needed and checks it is writable; returns its absolute path (or
  its URL, for object storage)."""
  if not workdir:
    raise ValueError("--workdir is required (the folder for checkpoints and metrics)")
  if is_remote(workdir):
    return _prepare_remote(absolute(workdir))
  path = absolute(workdir)
  if os.path.exists(path) and not os.path.isdir(path):
    raise ValueError(f"workdir {path} exists and is not a directory")
  try:
    os.makedirs(path, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path, prefix=".write_test_"):
      pass
  except OSError as e:
    raise ValueError(f"workdir {path} is not writable: {e.strerror or e}") from None
  return path


def _prepare_remote(url: str) -> str:
  """Checks that an object-storage workdir can be written (a probe object is written and
  deleted); any storage error is a one-line ValueError naming the URL."""
  scheme, _, rest = url.partition("://")
  if not rest.split("/")[0]:
    raise ValueError(f"workdir {url} names no bucket (expected {scheme}://BUCKET/PATH)")
  path = epath.Path(url)
  probe = path / f".write_test_{uuid.uuid4().hex}"
  client_log = logging.getLogger("gcsfs")  # logs each retry's traceback; the error says it
  level = client_log.level
  client_log.setLevel(logging.CRITICAL)
  try:
    if path.exists() and not path.is_dir():
      raise ValueError(f"workdir {url} exists and is not a directory")
    probe.write_bytes(b"")
    probe.unlink(missing_ok=True)
  except ValueError:
    raise
  except FileNotFoundError as e:  # Cloud Storage: 404 on an upload = no such bucket
    raise ValueError(f"workdir {url} is not writable: no such bucket? ({one_line(e)})") from None
  except Exception as e:  # the storage clients raise many types (OSError, HTTP, auth, import)
    raise ValueError(f"workdir {url} is not writable: {one_line(e)}") from None
  finally:
    client_log.setLevel(level)
  return url

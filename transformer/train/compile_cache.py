"""The persistent compilation cache every run uses (`loop.compilation_cache_dir`).

JAX keys each entry by the program, the backend, the XLA flags and the jax / jaxlib
versions, so one folder serves every run, resume, sweep trial and `eval.py`, and an entry
written by another jaxlib or for another backend is never read. A program compiled once
(the train step, the evaluation step, the samplers) is loaded from the folder at the next
launch instead of compiled again; every program is kept, however fast it compiled (JAX's
default keeps only those over a second), unless the user sets
JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS.

A folder that cannot be written (read-only, a file in the way, no space) is one warning
line and the run goes on uncached; entries that fail to read (corrupt, truncated) are
compiled again and rewritten, with one warning line for all of them. `summary()` says how
many of the run's compilations the folder answered.
"""

from __future__ import annotations

import os
import uuid
import warnings

import jax
from etils import epath

MIN_TIME_VARIABLE = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
_REQUESTS = "/jax/compilation_cache/compile_requests_use_cache"
_HITS = "/jax/compilation_cache/cache_hits"
_ENTRY_ERRORS = ("Error reading persistent compilation cache entry", "Error writing persistent")
_counts = {_REQUESTS: 0, _HITS: 0}
_installed = False


def folder(setting: str) -> str | None:
  """The folder of `setting`: 'auto' is the user's JAX_COMPILATION_CACHE_DIR, else
  $XDG_CACHE_HOME/transformer/jax, default ~/.cache/transformer/jax; '' is none; anything
  else is the folder (or gs:// URL) itself."""
  if setting != "auto":
    return setting or None
  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return os.environ["JAX_COMPILATION_CACHE_DIR"]
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(root, "transformer", "jax")


def unusable(path: str) -> str | None:
  """Why the cache cannot live at `path` (None when it can): the folder is made if missing
  and a probe file written, read back and removed."""
  try:
    root = epath.Path(path)
    root.mkdir(parents=True, exist_ok=True)
    probe = root / f".probe-{os.getpid()}-{uuid.uuid4().hex}"
    probe.write_bytes(b"probe")
    readable = probe.read_bytes() == b"probe"
    probe.unlink()
  except Exception as e:  # any storage error: the run goes on without the cache
    return f"{type(e).__name__}: {e}".splitlines()[0]
  return None if readable else "a file written there did not read back"


def use(setting: str) -> str | None:
  """Points JAX's persistent cache at `folder(setting)` when it is usable; returns the
  folder, or None when off or unusable (after one warning line)."""
  path = folder(setting)
  if not path:
    return None
  why = unusable(path)
  if why:
    print(f"warning: compilation cache {path} is not usable ({why}); compiling without it")
    return None
  jax.config.update("jax_compilation_cache_dir", path)
  if MIN_TIME_VARIABLE not in os.environ:  # keep every program, not only the slow ones
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  _install()
  return path


def _install() -> None:
  """Counts the cache's answers and folds its per-entry errors into one warning line."""
  global _installed
  if _installed:
    return
  _installed = True

  def count(event: str, **_) -> None:
    if event in _counts:
      _counts[event] += 1

  jax.monitoring.register_event_listener(count)
  show = warnings.showwarning
  said = []

  def show_once(message, category, filename, lineno, file=None, line=None):
    if not str(message).startswith(_ENTRY_ERRORS):
      return show(message, category, filename, lineno, file, line)
    if not said:  # one line for all of them
      said.append(message)
      first = str(message).splitlines()[0]
      print(f"warning: compilation cache: {first} (compiled again; further ones not shown)")

  warnings.showwarning = show_once


def summary(path: str) -> str:
  """'compilation cache PATH: H of R programs loaded, C compiled' (this process, so far)."""
  hits, requests = _counts[_HITS], _counts[_REQUESTS]
  return (
    f"compilation cache {path}: {hits} of {requests} programs loaded, {requests - hits} compiled"
  )

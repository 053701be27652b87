"""Checkpoint integrity: CRC32 checksums of the state, verification, and corrupt steps.

A checkpoint's `checksums` item is `{'crc32': {path: [crc, dtype, shape]}}` for every
state array this host holds, taken from the host copy before writing. On restore the
arrays read back are checked against it: tensorstore reads a byte flipped inside a
compressed chunk without any error, so only the checksum sees it. A step that cannot be
read (or whose checksums differ) raises `Corrupt`; the manager then either reports it
(an explicit step) or moves it to `<directory>/corrupt/<step>` with a
`CorruptCheckpointWarning` (`move_aside`) and tries the next newest.
"""

from __future__ import annotations

import json
import logging
import warnings
import zlib
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from transformer.train.checkpoints.serialisation import MAX_LISTED, leaf_label, leaf_names

CORRUPT_DIR = "corrupt"


class CorruptCheckpointWarning(UserWarning):
  """A checkpoint failed to read and was moved aside."""


class Corrupt(Exception):
  """The checkpoint at a step cannot be read, whatever the target."""


def host_arrays(state: Any) -> dict[str, np.ndarray | None]:
  """Path -> host copy of every leaf (None for an array sharded over several hosts)."""
  flat = {}
  for keypath, leaf in jax.tree_util.tree_leaves_with_path(state):
    if isinstance(leaf, jax.Array):
      if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)
      if not leaf.is_fully_addressable:
        leaf = leaf.addressable_data(0) if leaf.is_fully_replicated else None
    flat[leaf_label(leaf_names(keypath))] = leaf
  fetched = jax.device_get([v for v in flat.values() if v is not None])
  it = iter(fetched)
  return {k: None if v is None else np.asarray(next(it)) for k, v in flat.items()}


def crc32(array: np.ndarray) -> int:
  """CRC32 of the array's bytes in C order."""
  return zlib.crc32(np.ascontiguousarray(array).reshape(-1).view(np.uint8))


def checksums(state: Any) -> dict[str, Any]:
  """{'crc32': {path: [crc, dtype, shape]}} of every state leaf held by this host."""
  sums = {
    path: [crc32(a), str(a.dtype), list(a.shape)]
    for path, a in host_arrays(state).items()
    if a is not None
  }
  return {"crc32": sums}


def verify(saved: Any, restored_state: Any) -> None:
  """Raises Corrupt naming the arrays whose CRC32 differs from the one saved with them."""
  if not isinstance(saved, dict) or not isinstance(saved.get("crc32"), dict):
    raise Corrupt("item 'checksums' is malformed")
  bad = []
  for path, array in host_arrays(restored_state).items():
    entry = saved["crc32"].get(path)
    if entry is None or array is None:
      continue
    crc, dtype, shape = entry
    if str(array.dtype) != dtype or list(array.shape) != list(shape):
      continue  # restored with a cast (check_dtypes=False): cannot compare bytes
    if crc32(array) != crc:
      bad.append(f"{path} (saved crc32 {crc:#010x}, read {crc32(array):#010x})")
  if bad:
    shown = ", ".join(bad[:MAX_LISTED]) + (" ..." if len(bad) > MAX_LISTED else "")
    raise Corrupt(f"checksum mismatch in {len(bad)} array(s): {shown}")


def check_json_items(step_dir: epath.Path, names: Any) -> None:
  """Raises Corrupt when a JSON item of the checkpoint in `step_dir` cannot be parsed."""
  for name in names:
    try:
      json.loads((step_dir / name / "metadata").read_text())  # JsonCheckpointHandler's file
    except Exception as e:
      raise Corrupt(f"item {name!r} unreadable: {type(e).__name__}: {e}") from e


def move_aside(directory: epath.Path, step: int, reason: str, barrier: str) -> None:
  """Moves `directory/<step>` to `directory/corrupt/<step>` (never deleted; `.1`, `.2`, ...
  when taken), on process 0 with every process waiting at `barrier`, and warns with a
  `CorruptCheckpointWarning` attributed to the caller's caller."""
  source = directory / str(step)
  destination = directory / CORRUPT_DIR / str(step)
  suffix = 0
  while destination.exists():
    suffix += 1
    destination = directory / CORRUPT_DIR / f"{step}.{suffix}"
  message = f"checkpoint step {step} in {directory} is corrupt ({reason});"
  message += f" moved to {destination}, falling back to an older checkpoint"
  if jax.process_index() == 0:
    destination.parent.mkdir(parents=True, exist_ok=True)
    source.rename(destination)
  if jax.process_count() > 1:
    ocp.multihost.sync_global_processes(barrier)
  logging.warning(message)
  warnings.warn(message, CorruptCheckpointWarning, stacklevel=3)

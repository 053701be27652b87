"""Checkpoint integrity: CRC32 checksums of the state, verification, and corrupt steps.

A checkpoint's `checksums` item holds the CRC32 of every piece of the state, taken from
host copies before writing:

  {'crc32':  {path: [crc, dtype, shape]},                  whole arrays
   'shards': {path: {'dtype': d, 'shape': s,               arrays split over devices:
                     'parts': [[[[start, stop], ...], crc], ...]}}}   one entry per slice

Every process computes the sums of the shards it holds (one copy of each: replica 0), the
processes exchange them and process 0 writes the union. On restore every process checks
each saved piece that lies inside a shard it holds (so a different mesh is checked where
the slices allow), and the processes agree on the verdict (`agree`): tensorstore reads a
byte flipped inside a compressed chunk without any error, so only the checksum sees it,
and it may be in the part of an array that only one process reads. A step that cannot be
read (or whose checksums differ) raises `Corrupt` on every process; the manager then either
reports it (an explicit step) or moves it to `<directory>/corrupt/<step>` with a
`CorruptCheckpointWarning` (`move_aside`) and tries the next newest. Checkpoints written
before the shard entries hold `crc32` only and are verified as whole arrays.
"""

from __future__ import annotations

import json
import logging
import warnings
import zlib
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from transformer.train.checkpoints.serialisation import MAX_LISTED, leaf_label, leaf_names

CORRUPT_DIR = "corrupt"

Index = tuple[tuple[int, int], ...]  # [start, stop) per dimension


class CorruptCheckpointWarning(UserWarning):
  """A checkpoint failed to read and was moved aside."""


class Corrupt(Exception):
  """The checkpoint at a step cannot be read, whatever the target."""


def crc32(array: np.ndarray) -> int:
  """CRC32 of the array's bytes in C order."""
  return zlib.crc32(np.ascontiguousarray(array).reshape(-1).view(np.uint8))


def _index(index: Sequence[slice], shape: Sequence[int]) -> Index:
  return tuple((s.indices(n)[0], s.indices(n)[1]) for s, n in zip(index, shape, strict=True))


def _pieces(leaf: Any, saving: bool) -> tuple[str, tuple[int, ...], list[tuple[Index, Any]]]:
  """(dtype, global shape, [(index, data)]) of the parts of `leaf` this process holds.

  Saving: one copy of each part over all processes (replica 0; numpy leaves on process 0).
  Verifying: every distinct part this process holds. `data` is still on the device.
  """
  if isinstance(leaf, jax.Array):
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      leaf = jax.random.key_data(leaf)
    shape = tuple(leaf.shape)
    parts: dict[Index, Any] = {}
    for shard in leaf.addressable_shards:
      if saving and shard.replica_id != 0:
        continue
      parts.setdefault(_index(shard.index, shape), shard.data)
    return str(leaf.dtype), shape, list(parts.items())
  array = np.asarray(leaf)
  whole = tuple((0, n) for n in array.shape)
  held = not saving or jax.process_index() == 0
  return str(array.dtype), tuple(array.shape), [(whole, array)] if held else []


def _local_pieces(state: Any, saving: bool) -> dict[str, tuple[str, tuple[int, ...], list]]:
  """Path -> (dtype, shape, [(index, host array)]), with one device-to-host copy of all."""
  flat = {
    leaf_label(leaf_names(keypath)): _pieces(leaf, saving)
    for keypath, leaf in jax.tree_util.tree_leaves_with_path(state)
  }
  fetched = iter(jax.device_get([data for _, _, parts in flat.values() for _, data in parts]))
  return {
    path: (dtype, shape, [(index, np.asarray(next(fetched))) for index, _ in parts])
    for path, (dtype, shape, parts) in flat.items()
  }


def allgather_json(value: Any) -> list[Any]:
  """`value` (JSON-serialisable) of every process, in process order (a collective)."""
  if jax.process_count() == 1:
    return [value]
  from jax.experimental import multihost_utils

  data = np.frombuffer(json.dumps(value).encode(), np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(np.int32(len(data)))).reshape(-1)
  padded = np.zeros(int(sizes.max()), np.uint8)
  padded[: len(data)] = data
  rows = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
  return [json.loads(row[:n].tobytes().decode()) for row, n in zip(rows, sizes, strict=True)]


def checksums(state: Any) -> dict[str, Any]:
  """The `checksums` item of `state` (see the module docstring); a collective on several
  processes, which all return the same dict."""
  local: dict[str, Any] = {"crc32": {}, "shards": {}}
  for path, (dtype, shape, parts) in _local_pieces(state, saving=True).items():
    for index, array in parts:
      if all(start == 0 and stop == n for (start, stop), n in zip(index, shape, strict=True)):
        local["crc32"][path] = [crc32(array), dtype, list(shape)]
      else:
        entry = local["shards"].setdefault(
          path, {"dtype": dtype, "shape": list(shape), "parts": []}
        )
        entry["parts"].append([[list(i) for i in index], crc32(array)])
  merged: dict[str, Any] = {"crc32": {}, "shards": {}}
  for sums in allgather_json(local):
    merged["crc32"].update(sums["crc32"])
    for path, entry in sums["shards"].items():
      merged["shards"].setdefault(path, {**entry, "parts": []})["parts"].extend(entry["parts"])
  for entry in merged["shards"].values():
    entry["parts"].sort()
  return merged


def _saved_pieces(saved: Any) -> dict[str, tuple[str, list[int], list[tuple[Index, int]]]]:
  """Path -> (dtype, shape, [(index, crc)]) of a `checksums` item; Corrupt if malformed."""
  try:
    pieces = {
      path: (dtype, list(shape), [(tuple((0, n) for n in shape), int(crc))])
      for path, (crc, dtype, shape) in saved["crc32"].items()
    }
    for path, entry in saved.get("shards", {}).items():
      parts = [
        (tuple((int(a), int(b)) for a, b in index), int(crc)) for index, crc in entry["parts"]
      ]
      pieces[path] = (entry["dtype"], list(entry["shape"]), parts)
  except (KeyError, TypeError, ValueError, AttributeError) as e:
    raise Corrupt(f"item 'checksums' is malformed ({type(e).__name__}: {e})") from e
  return pieces


def _inside(part: Index, shard: Index) -> bool:
  return all(s0 <= p0 and p1 <= s1 for (p0, p1), (s0, s1) in zip(part, shard, strict=True))


def _label(path: str, index: Index, shape: Sequence[int]) -> str:
  if all(a == 0 and b == n for (a, b), n in zip(index, shape, strict=True)):
    return path
  return f"{path}[{','.join(f'{a}:{b}' for a, b in index)}]"


def mismatches(saved: Any, restored_state: Any) -> list[str]:
  """The saved pieces that differ from what this process restored, e.g.
  `params/x[0:16,0:32] (saved crc32 0x..., read 0x...)`; process-local.

  A piece is checked where it lies inside a shard this process holds; arrays restored with
  a cast (`check_dtypes=False`) or another shape cannot be compared and are not.
  """
  if not isinstance(saved, dict) or not isinstance(saved.get("crc32"), dict):
    raise Corrupt("item 'checksums' is malformed")
  expected = _saved_pieces(saved)
  bad = []
  for path, (dtype, shape, held) in _local_pieces(restored_state, saving=False).items():
    if path not in expected or expected[path][:2] != (dtype, list(shape)):
      continue
    for part, crc in expected[path][2]:
      for index, array in held:
        if _inside(part, index):
          local = tuple(
            slice(p0 - s0, p1 - s0) for (p0, p1), (s0, _) in zip(part, index, strict=True)
          )
          read = crc32(array[local])
          if read != crc:
            bad.append(f"{_label(path, part, shape)} (saved crc32 {crc:#010x}, read {read:#010x})")
          break
  return bad


def agree(problem: str | None) -> None:
  """Raises Corrupt on every process when any process found a `problem` (a collective on
  several processes): one process may hold the only damaged part."""
  problems = allgather_json(problem)
  found = [(i, p) for i, p in enumerate(problems) if p]
  if not found:
    return
  if len(problems) == 1:
    raise Corrupt(found[0][1])
  raise Corrupt("; ".join(f"on process {i}: {p}" for i, p in found))


def describe_mismatches(bad: list[str]) -> str | None:
  """One line naming the mismatched pieces, or None when there are none."""
  if not bad:
    return None
  shown = ", ".join(bad[:MAX_LISTED]) + (" ..." if len(bad) > MAX_LISTED else "")
  return f"checksum mismatch in {len(bad)} array(s): {shown}"


def verify(saved: Any, restored_state: Any) -> None:
  """Raises Corrupt (on every process) naming the pieces whose CRC32 differs from the one
  saved with them."""
  try:
    problem = describe_mismatches(mismatches(saved, restored_state))
  except Corrupt as e:
    problem = str(e)
  agree(problem)


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

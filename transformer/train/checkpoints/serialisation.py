"""What a checkpoint holds, as names and JSON: leaf names, the target check, the config.

leaf_names / leaf_label  a pytree key path as orbax names the leaf ('a/b/c')
compare                  the checkpoint's tree against a restore target: one `ValueError`
                         listing every missing, unexpected, reshaped, retyped or
                         unshardable path
without_absent           the target without the optional top-level fields a checkpoint
                         lacks (set to None)
restorable               what orbax restores for a target whose None fields a checkpoint
                         written before those fields existed does not name at all
config_to_json           a ConfigDict / dataclass / mapping as a JSON-ready dict
write_config             that dict as `workdir/config.json`, atomically
write_small_arrays_whole orbax's array handler set to split a replicated array across its
                         replicas only when each slice is at least REPLICA_SLICE_BYTES
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint._src.metadata import array_metadata_store

from transformer.data.files import write_atomic
from transformer.nn import tree

MAX_LISTED = 20  # paths named per category in an error message
# Orbax writes a replicated array in slices, one per replica, each cut by its own small
# program (a compilation per new shape, a dispatch per slice and device). That pays for
# large arrays on many chips; for small ones the cutting costs more than the write. The values
# written are the same either way; only the chunking differs (one zarr chunk per slice).
REPLICA_SLICE_BYTES = 1 << 20


def write_small_arrays_whole() -> None:
  """Registers orbax's `jax.Array` handler with REPLICA_SLICE_BYTES as its minimum slice
  (orbax's handlers are per process; idempotent). The store of per-array metadata is the
  one orbax's default handler has (it records PRNG key types, among others)."""
  handler = ocp.type_handlers.ArrayHandler(
    min_slice_bytes_for_replica_parallel=REPLICA_SLICE_BYTES,
    array_metadata_store=array_metadata_store.Store(),
  )
  ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)


def leaf_names(keypath: Sequence[Any]) -> tuple[str, ...]:
  """A JAX key path as orbax names the leaf in its metadata (ValueError for a key that has
  no dict key, attribute name or index)."""
  return tree.path_names(keypath, strict=True)


def leaf_label(names: Sequence[str]) -> str:
  """A leaf in messages and in the checksums item: 'a/b/c', '<root>' for a lone leaf.

  Saved checksums are keyed by this label, so it must not change.
  """
  return "/".join(names) if names else "<root>"


def json_roundtrip(name: str, value: Any) -> Any:
  """`value` through JSON and back; a ValueError naming `name` if JSON cannot hold it."""
  try:
    return json.loads(json.dumps(value))
  except (TypeError, ValueError) as e:
    raise ValueError(f"{name} must be JSON-serialisable: {e}") from e


def compare(metadata_tree: Any, target: Any, check_dtypes: bool) -> None:
  """Raises ValueError listing every difference between checkpoint and target trees."""
  saved = ocp.tree.to_flat_dict(metadata_tree)
  wanted = {leaf_names(p): leaf for p, leaf in jax.tree_util.tree_leaves_with_path(target)}
  problems = {
    "missing from the checkpoint": [leaf_label(p) for p in wanted if p not in saved],
    "in the checkpoint but not in the target": [leaf_label(p) for p in saved if p not in wanted],
    "shape differs": [],
    "dtype differs": [],
    "sharding cannot hold the shape": [],
  }
  for path in sorted(set(saved) & set(wanted)):
    meta, leaf = saved[path], wanted[path]
    if isinstance(leaf, (int, float)):
      continue
    stored = jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):  # stored as its key data
      stored = jax.eval_shape(jax.random.key_data, stored)
    shape, dtype = tuple(stored.shape), np.dtype(stored.dtype)
    saved_shape = tuple(getattr(meta, "shape", ()) or ())
    if saved_shape != shape:
      problems["shape differs"].append(f"{leaf_label(path)}: saved {saved_shape}, target {shape}")
    saved_dtype = getattr(meta, "dtype", None)
    if check_dtypes and saved_dtype is not None and np.dtype(saved_dtype) != dtype:
      problems["dtype differs"].append(
        f"{leaf_label(path)}: saved {np.dtype(saved_dtype)}, target {dtype}"
      )
    sharding = getattr(leaf, "sharding", None)
    if sharding is not None and saved_shape == shape:
      try:
        sharding.shard_shape(tuple(leaf.shape))
      except Exception as e:
        problems["sharding cannot hold the shape"].append(f"{leaf_label(path)}: {e}")
  lines = []
  for category, paths in problems.items():
    if paths:
      shown = "\n    ".join(paths[:MAX_LISTED])
      more = f"\n    ... and {len(paths) - MAX_LISTED} more" if len(paths) > MAX_LISTED else ""
      lines.append(f"  {category} ({len(paths)}):\n    {shown}{more}")
  if lines:
    raise ValueError("checkpoint does not match the restore target:\n" + "\n".join(lines))


def without_absent(metadata_tree: Any, target: Any, optional: Sequence[str]) -> Any:
  """`target` with each field named in `optional` set to None where the checkpoint holds
  none of its leaves (`target`: a dataclass, e.g. the train state, or a mapping)."""
  if not optional:
    return target
  saved = {path[0] for path in ocp.tree.to_flat_dict(metadata_tree) if path}
  for name in optional:
    if name in saved:
      continue
    if dataclasses.is_dataclass(target) and not isinstance(target, type):
      target = dataclasses.replace(target, **{name: None})
    elif isinstance(target, Mapping) and name in target:
      target = {**target, name: None}
  return target


def restorable(metadata_tree: Any, target: Any) -> tuple[Any, Callable[[Any], Any]]:
  """(the item to restore, a function of the restored item giving the target's structure).

  Orbax matches the tree structure exactly, None fields included; a checkpoint written
  before a dataclass state gained a field (e.g. `ema_params`) does not name it. Such
  fields, None in the target, are left out of the item and stay None.
  """
  if not (dataclasses.is_dataclass(target) and isinstance(metadata_tree, Mapping)):
    return target, lambda restored: restored
  fields = [f.name for f in dataclasses.fields(target)]
  unnamed = [n for n in fields if n not in metadata_tree and getattr(target, n) is None]
  if not unnamed:
    return target, lambda restored: restored
  item = {n: getattr(target, n) for n in fields if n not in unnamed}
  return item, lambda restored: dataclasses.replace(target, **restored)


def config_to_json(config: Any) -> dict[str, Any]:
  """A config (ConfigDict, dataclass, mapping) as a JSON-ready dict.

  Raises ValueError naming the key path of a value JSON cannot hold.
  """

  def convert(value: Any, path: str) -> Any:
    if hasattr(value, "to_dict") and callable(value.to_dict):
      value = value.to_dict()
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
      value = dataclasses.asdict(value)
    if isinstance(value, Mapping):
      return {str(k): convert(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
      return [convert(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, np.generic):
      value = value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
      return value
    raise ValueError(f"config value at {path or '<root>'} is not JSON-serialisable: {value!r}")

  result = convert(config, "")
  if not isinstance(result, dict):
    raise ValueError(f"config must be a mapping, ConfigDict or dataclass; got {type(config)}")
  return result


def write_config(
  config: Any, workdir: str | epath.PathLike, filename: str = "config.json"
) -> epath.Path:
  """Writes `config_to_json(config)` to `workdir/filename` (process 0 only, atomically);
  returns the path."""
  path = epath.Path(workdir) / filename
  text = json.dumps(config_to_json(config), indent=2, sort_keys=True)
  if jax.process_index() == 0:
    write_atomic(path, text + "\n")
  return path


def with_default_shardings(target: Any) -> Any:
  """A restore target whose leaves without a sharding get this process's first device (on
  one process; several processes need every sharding given)."""

  def fill(leaf: Any) -> Any:
    if isinstance(leaf, (int, float)) or getattr(leaf, "sharding", None) is not None:
      return leaf
    if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
      raise ValueError(f"target leaves must be ShapeDtypeStructs, arrays or numbers; got {leaf!r}")
    if jax.process_count() > 1:
      raise ValueError("on several processes every target leaf needs a sharding")
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=device)

  return jax.tree.map(fill, target)

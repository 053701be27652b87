"""Checkpoints: a thin wrapper over orbax `CheckpointManager` with our safety rules.

One checkpoint is the directory `<directory>/<step>/` holding four orbax items:
  state      the train-state pytree (params, opt_state, step, rng, ...): `StandardSave`
             (tensorstore/OCDBT arrays + JSON metadata; never pickle)
  checksums  JSON: CRC32, dtype and shape of every array of `state`, taken from the host
             copy before writing (absent in older checkpoints, which are not verified)
  data       the data-iterator state, a JSON dict (absent when not given)
  config     the run config as JSON (absent when not given)

Rules on top of orbax:
  * keep the newest `max_to_keep` steps plus the best `keep_best` by the eval metric
    `best_metric` (mode min or max); a checkpoint saved without metrics is kept only
    while it is among the newest;
  * saves are asynchronous (device arrays are copied to host before `save` returns, so
    the state may be donated right after); `wait_until_finished()` blocks on the write;
  * a step that exists, or is not after the latest, is never written (`save` -> False);
  * restore goes into an abstract target (`jax.ShapeDtypeStruct`s with shardings), so a
    checkpoint restores onto any device count or mesh; the checkpoint's tree is compared
    with the target from its metadata first, and a mismatch is a `ValueError` naming the
    paths;
  * a corrupt or truncated newest checkpoint (unreadable files, or arrays whose CRC32
    differs from the saved one: tensorstore reads a flipped byte inside a compressed
    chunk silently) is moved to `<directory>/corrupt/<step>` (never deleted) with a
    `CorruptCheckpointWarning` naming what was wrong, and the next newest is tried;
  * nothing is unpickled: orbax reads JSON and tensorstore arrays, and files planted
    beside them (e.g. a `.pkl` or `.npy`) are never opened.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import warnings
import zlib
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import checkpoint_managers

STATE, DATA, CONFIG, CHECKSUMS = "state", "data", "config", "checksums"
CORRUPT_DIR = "corrupt"
_MAX_LISTED = 20  # paths named per category in a mismatch error


class CorruptCheckpointWarning(UserWarning):
  """A checkpoint failed to read and was moved aside."""


class _Corrupt(Exception):
  """Internal: the checkpoint at a step cannot be read, whatever the target."""


@dataclasses.dataclass(frozen=True)
class Restored:
  """What `CheckpointManager.restore` returns."""

  step: int  # the checkpoint's step
  state: Any  # the train state, structured like the target
  data_state: dict[str, Any] | None  # the data-iterator state, if it was saved
  config: dict[str, Any] | None  # the config, if it was saved


class CheckpointManager:
  """Saves and restores train state + data-iterator state + config under `directory`.

  Args:
    directory: the checkpoint root (e.g. `workdir/checkpoints`); created if missing.
    max_to_keep: newest checkpoints kept (None: keep all).
    best_metric: metric name ranking checkpoints (e.g. "eval_loss"); None: no best.
    best_mode: "min" or "max": which value of `best_metric` is best.
    keep_best: best checkpoints kept in addition to the newest ones.
    async_save: write in a background thread (`wait_until_finished` to block).
    checksums: save the CRC32 of every state array and verify it on restore (costs one
      extra device-to-host copy of the state per save).
  """

  def __init__(
    self,
    directory: str | epath.PathLike,
    *,
    max_to_keep: int | None = 3,
    best_metric: str | None = None,
    best_mode: str = "min",
    keep_best: int = 1,
    async_save: bool = True,
    checksums: bool = True,
  ):
    if max_to_keep is not None and (not _is_int(max_to_keep) or max_to_keep < 1):
      raise ValueError(f"max_to_keep must be an int >= 1 or None; got {max_to_keep!r}")
    if best_metric is not None and (not isinstance(best_metric, str) or not best_metric):
      raise ValueError(f"best_metric must be a non-empty str or None; got {best_metric!r}")
    if best_mode not in ("min", "max"):
      raise ValueError(f"best_mode must be 'min' or 'max'; got {best_mode!r}")
    if not _is_int(keep_best) or keep_best < 0:
      raise ValueError(f"keep_best must be an int >= 0; got {keep_best!r}")
    if not isinstance(async_save, bool):
      raise ValueError(f"async_save must be a bool; got {async_save!r}")
    self._directory = epath.Path(directory)
    self._checksums = bool(checksums)
    self._best_metric, self._best_mode = best_metric, best_mode
    policies: list[Any] = [checkpoint_managers.LatestN(n=max_to_keep)]
    best_fn = None
    if best_metric is not None:
      worst = math.inf if best_mode == "min" else -math.inf

      def best_fn(metrics: Mapping[str, float]) -> float:  # NaN or absent ranks worst
        value = metrics.get(best_metric, math.nan)
        return worst if math.isnan(value) else value

      policies.append(
        checkpoint_managers.BestN(
          get_metric_fn=best_fn,
          reverse=best_mode == "min",
          n=keep_best,
          keep_checkpoints_without_metrics=False,
        )
      )
    options = ocp.CheckpointManagerOptions(
      preservation_policy=checkpoint_managers.AnyPreservationPolicy(policies),
      best_fn=best_fn,  # only for best_step(); retention is the policy above
      best_mode=best_mode,
      enable_async_checkpointing=async_save,
    )
    self._manager = ocp.CheckpointManager(
      self._directory,
      options=options,
      item_names=(STATE, CHECKSUMS, DATA, CONFIG),
      item_handlers={
        STATE: ocp.StandardCheckpointHandler(),
        CHECKSUMS: ocp.JsonCheckpointHandler(),
        DATA: ocp.JsonCheckpointHandler(),
        CONFIG: ocp.JsonCheckpointHandler(),
      },
    )
    self._barriers = 0

  @property
  def directory(self) -> epath.Path:
    return self._directory

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def best_step(self) -> int | None:
    """The best step by `best_metric` among those with metrics (else the latest)."""
    return self._manager.best_step()

  def wait_until_finished(self) -> None:
    """Blocks until pending asynchronous saves (and old-step cleanup) are done."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()

  def __enter__(self) -> CheckpointManager:
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()

  def save(
    self,
    step: int,
    state: Any,
    *,
    data_state: Mapping[str, Any] | None = None,
    config: Any = None,
    metrics: Mapping[str, float] | None = None,
  ) -> bool:
    """Starts writing a checkpoint for `step`; returns False (and logs) if none is written.

    Args:
      step: the train step (>= 0); must be after `latest_step()` and not on disk.
      state: pytree of arrays / numpy arrays / Python scalars.
      data_state: JSON-serialisable dict from the data pipeline, or None.
      config: the run config (see `config_to_json`), or None.
      metrics: scalars for ranking (must include `best_metric` when that is set).
    """
    if not _is_int(step) or step < 0:
      raise ValueError(f"step must be an int >= 0; got {step!r}")
    _check_state_leaves(state)
    items = {STATE: ocp.args.StandardSave(state)}
    if self._checksums:
      items[CHECKSUMS] = ocp.args.JsonSave(_checksums(state))
    if data_state is not None:
      items[DATA] = ocp.args.JsonSave(_json_roundtrip("data_state", data_state))
    if config is not None:
      items[CONFIG] = ocp.args.JsonSave(config_to_json(config))
    metrics = _check_metrics(metrics, self._best_metric)
    latest = self.latest_step()
    if step in self.all_steps() or (self._directory / str(step)).exists():
      logging.warning(
        "checkpoint for step %d already exists in %s; not saved", step, self.directory
      )
      return False
    if latest is not None and step < latest:
      logging.warning("step %d is before the latest checkpoint %d; not saved", step, latest)
      return False
    return self._manager.save(step, args=ocp.args.Composite(**items), metrics=metrics, force=True)

  def check_compatible(self, target: Any, step: int, *, check_dtypes: bool = True) -> None:
    """Raises ValueError naming every path where the checkpoint at `step` and `target`
    differ (missing, unexpected, shape, dtype) or where a target sharding cannot hold its
    shape. Reads metadata only."""
    _compare(self._state_metadata(step), target, check_dtypes)

  def restore(
    self, target: Any, step: int | None = None, *, check_dtypes: bool = True
  ) -> Restored | None:
    """Restores `step` (None: the newest valid checkpoint) into the layout of `target`.

    Args:
      target: pytree like the saved state whose leaves are `jax.ShapeDtypeStruct`s (or
        arrays) carrying the shardings to restore onto; a leaf without a sharding goes to
        the first local device (single-process only). Python scalar leaves stay scalars.
      step: the step to restore; None picks the newest, moving corrupt ones aside.
      check_dtypes: also require dtypes to match (False: cast to the target's dtype).

    Returns:
      `Restored`, or None when `step` is None and there is no valid checkpoint.

    Raises:
      ValueError: the checkpoint's tree does not match `target` (naming the paths), or
        `step` is not a saved step, or the checkpoint at the given `step` is corrupt.
    """
    target = _with_default_shardings(target)
    if step is not None:
      if not _is_int(step) or step not in self.all_steps():
        raise ValueError(f"step must be one of the saved steps {self.all_steps()}; got {step!r}")
      try:
        return self._restore_step(step, target, check_dtypes)
      except _Corrupt as e:
        raise ValueError(f"checkpoint at step {step} in {self.directory} is corrupt: {e}") from e
    for candidate in sorted(self.all_steps(), reverse=True):
      try:
        return self._restore_step(candidate, target, check_dtypes)
      except _Corrupt as e:
        self._move_aside(candidate, str(e))
    return None

  # -- internals -------------------------------------------------------------------

  def _state_metadata(self, step: int) -> Any:
    try:
      metadata = self._manager.item_metadata(step)[STATE]
      tree = metadata.tree if metadata is not None else None
    except Exception as e:  # any read failure means unreadable
      raise _Corrupt(f"cannot read the state metadata: {type(e).__name__}: {e}") from e
    if tree is None:
      raise _Corrupt("the state item or its metadata is missing")
    return tree

  def _restore_step(self, step: int, target: Any, check_dtypes: bool) -> Restored:
    _compare(self._state_metadata(step), target, check_dtypes)
    step_dir = self._directory / str(step)
    items = {STATE: ocp.args.StandardRestore(target)}
    for name in (CHECKSUMS, DATA, CONFIG):
      if (step_dir / name).exists():
        items[name] = ocp.args.JsonRestore()
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(**items))
    except Exception as error:
      self._diagnose(step, items)  # raises _Corrupt when the files are at fault
      raise error
    if restored.get(CHECKSUMS) is not None:
      _verify(restored[CHECKSUMS], restored[STATE])
    return Restored(step, restored[STATE], restored.get(DATA), restored.get(CONFIG))

  def restore_numpy(self, step: int) -> Any:
    """The saved state of `step` as host numpy arrays, structured as saved (no target).

    For reading another run's weights (fine-tuning) without rebuilding its optimizer.
    """
    to_numpy = lambda _: ocp.RestoreArgs(restore_type=np.ndarray)
    restore_args = jax.tree.map(to_numpy, self._state_metadata(step))
    reader = ocp.PyTreeCheckpointer()
    try:
      return reader.restore(
        self._directory / str(step) / STATE, args=ocp.args.PyTreeRestore(restore_args=restore_args)
      )
    finally:
      reader.close()

  def _diagnose(self, step: int, items: Mapping[str, Any]) -> None:
    """Reads every item of `step` onto the host, independent of any target."""
    step_dir = self._directory / str(step)
    for name in items:
      if name == STATE:
        continue
      try:
        json.loads((step_dir / name / "metadata").read_text())  # JsonCheckpointHandler's file
      except Exception as e:
        raise _Corrupt(f"item {name!r} unreadable: {type(e).__name__}: {e}") from e
    try:
      self.restore_numpy(step)
    except Exception as e:
      raise _Corrupt(f"state arrays unreadable: {type(e).__name__}: {e}") from e

  def _move_aside(self, step: int, reason: str) -> None:
    source = self._directory / str(step)
    destination = self._directory / CORRUPT_DIR / str(step)
    suffix = 0
    while destination.exists():
      suffix += 1
      destination = self._directory / CORRUPT_DIR / f"{step}.{suffix}"
    message = f"checkpoint step {step} in {self.directory} is corrupt ({reason});"
    message += f" moved to {destination}, falling back to an older checkpoint"
    if jax.process_index() == 0:
      destination.parent.mkdir(parents=True, exist_ok=True)
      source.rename(destination)
    if jax.process_count() > 1:
      self._barriers += 1
      ocp.multihost.sync_global_processes(f"transformer_ckpt_move_aside_{step}_{self._barriers}")
    logging.warning(message)
    warnings.warn(message, CorruptCheckpointWarning, stacklevel=3)
    self._manager.reload()


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
  """Writes `config_to_json(config)` to `workdir/filename` (process 0 only); returns the path."""
  path = epath.Path(workdir) / filename
  text = json.dumps(config_to_json(config), indent=2, sort_keys=True)
  if jax.process_index() == 0:  # via a temporary file: a kill leaves the old file or the new
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{filename}.tmp-{os.getpid()}"
    tmp.write_text(text + "\n")
    tmp.replace(path)
  return path


def _host_arrays(state: Any) -> dict[str, np.ndarray | None]:
  """Path -> host copy of every leaf (None for an array sharded over several hosts)."""
  flat = {}
  for keypath, leaf in jax.tree_util.tree_leaves_with_path(state):
    if isinstance(leaf, jax.Array):
      if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)
      if not leaf.is_fully_addressable:
        leaf = leaf.addressable_data(0) if leaf.is_fully_replicated else None
    flat[_path_str(_key_tuple(keypath))] = leaf
  fetched = jax.device_get([v for v in flat.values() if v is not None])
  it = iter(fetched)
  return {k: None if v is None else np.asarray(next(it)) for k, v in flat.items()}


def _crc32(array: np.ndarray) -> int:
  return zlib.crc32(np.ascontiguousarray(array).reshape(-1).view(np.uint8))


def _checksums(state: Any) -> dict[str, Any]:
  """{'crc32': {path: [crc, dtype, shape]}} of every state leaf held by this host."""
  sums = {
    path: [_crc32(a), str(a.dtype), list(a.shape)]
    for path, a in _host_arrays(state).items()
    if a is not None
  }
  return {"crc32": sums}


def _verify(saved: Any, restored_state: Any) -> None:
  """Raises _Corrupt naming the arrays whose CRC32 differs from the one saved with them."""
  if not isinstance(saved, dict) or not isinstance(saved.get("crc32"), dict):
    raise _Corrupt("item 'checksums' is malformed")
  bad = []
  for path, array in _host_arrays(restored_state).items():
    entry = saved["crc32"].get(path)
    if entry is None or array is None:
      continue
    crc, dtype, shape = entry
    if str(array.dtype) != dtype or list(array.shape) != list(shape):
      continue  # restored with a cast (check_dtypes=False): cannot compare bytes
    if _crc32(array) != crc:
      bad.append(f"{path} (saved crc32 {crc:#010x}, read {_crc32(array):#010x})")
  if bad:
    shown = ", ".join(bad[:_MAX_LISTED]) + (" ..." if len(bad) > _MAX_LISTED else "")
    raise _Corrupt(f"checksum mismatch in {len(bad)} array(s): {shown}")


def _is_int(x: Any) -> bool:
  return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _path_str(path: tuple[Any, ...]) -> str:
  return "/".join(path) if path else "<root>"


def _key_tuple(keypath: tuple[Any, ...]) -> tuple[str, ...]:
  """A jax key path as orbax names it in metadata."""
  names = []
  for key in keypath:
    for attr in ("key", "name", "idx"):
      if hasattr(key, attr):
        names.append(str(getattr(key, attr)))
        break
    else:
      raise ValueError(f"unsupported pytree key {key!r}")
  return tuple(names)


def _check_state_leaves(state: Any) -> None:
  leaves = jax.tree_util.tree_leaves_with_path(state)
  if not leaves:
    raise ValueError("state must be a non-empty pytree of arrays")
  for path, leaf in leaves:
    if not isinstance(leaf, (jax.Array, np.ndarray, np.generic, int, float)):
      raise ValueError(
        f"state leaf {jax.tree_util.keystr(path)} must be an array or number; got {type(leaf)}"
      )


def _json_roundtrip(name: str, value: Any) -> Any:
  try:
    return json.loads(json.dumps(value))
  except (TypeError, ValueError) as e:
    raise ValueError(f"{name} must be JSON-serialisable: {e}") from e


def _check_metrics(metrics: Mapping[str, float] | None, best_metric: str | None) -> Any:
  if metrics is None:
    return None
  if not isinstance(metrics, Mapping):
    raise ValueError(f"metrics must be a mapping of name -> number; got {type(metrics)}")
  if best_metric is not None and best_metric not in metrics:
    raise ValueError(f"metrics must include best_metric {best_metric!r}; got {sorted(metrics)}")
  try:
    return {str(k): float(v) for k, v in metrics.items()}
  except (TypeError, ValueError) as e:
    raise ValueError(f"metrics values must be numbers: {e}") from e


def _with_default_shardings(target: Any) -> Any:
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


def _compare(metadata_tree: Any, target: Any, check_dtypes: bool) -> None:
  """Raises ValueError listing every difference between checkpoint and target trees."""
  saved = ocp.tree.to_flat_dict(metadata_tree)
  wanted = {_key_tuple(p): leaf for p, leaf in jax.tree_util.tree_leaves_with_path(target)}
  problems = {
    "missing from the checkpoint": [_path_str(p) for p in wanted if p not in saved],
    "in the checkpoint but not in the target": [_path_str(p) for p in saved if p not in wanted],
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
      problems["shape differs"].append(f"{_path_str(path)}: saved {saved_shape}, target {shape}")
    saved_dtype = getattr(meta, "dtype", None)
    if check_dtypes and saved_dtype is not None and np.dtype(saved_dtype) != dtype:
      problems["dtype differs"].append(
        f"{_path_str(path)}: saved {np.dtype(saved_dtype)}, target {dtype}"
      )
    sharding = getattr(leaf, "sharding", None)
    if sharding is not None and saved_shape == shape:
      try:
        sharding.shard_shape(tuple(leaf.shape))
      except Exception as e:
        problems["sharding cannot hold the shape"].append(f"{_path_str(path)}: {e}")
  lines = []
  for category, paths in problems.items():
    if paths:
      shown = "\n    ".join(paths[:_MAX_LISTED])
      more = f"\n    ... and {len(paths) - _MAX_LISTED} more" if len(paths) > _MAX_LISTED else ""
      lines.append(f"  {category} ({len(paths)}):\n    {shown}{more}")
  if lines:
    raise ValueError("checkpoint does not match the restore target:\n" + "\n".join(lines))

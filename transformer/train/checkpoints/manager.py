"""`CheckpointManager`: orbax's `CheckpointManager` with our retention, save and restore rules.

See the package docstring for the rules; integrity checks live in `integrity`, tree and
config serialisation in `serialisation`, what a checkpoint folder holds and how its
failures read in `storage`, the data-iterator states in `data_state`.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from grain import checkpoint as grain_checkpoint
from orbax.checkpoint import checkpoint_managers

from transformer.train.checkpoints import integrity, serialisation, storage
from transformer.train.checkpoints.data_state import (
  LEGACY_DATA_FILE,
  DataState,
  Restored,
  data_problem,
  data_processes,
)

STATE, DATA, CONFIG, CHECKSUMS = "state", "data", "config", "checksums"


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
    serialisation.write_small_arrays_whole()
    self._manager = ocp.CheckpointManager(
      self._directory,
      options=options,
      item_names=(STATE, CHECKSUMS, DATA, CONFIG),
      item_handlers={
        STATE: ocp.StandardCheckpointHandler(),
        CHECKSUMS: ocp.JsonCheckpointHandler(),
        DATA: grain_checkpoint.CheckpointHandler(),  # one file per process
        CONFIG: ocp.JsonCheckpointHandler(),
      },
    )
    self._barriers = 0
    self._writing: int | None = None  # the step of the asynchronous write in flight
    self._last_write: int | None = None  # the step of the last write started
    self._failed = False  # a write failed (reported once)
    self.committed = self._manager.latest_step()  # the newest step seen committed
    storage.quiet_orbax_tracebacks()
    self._swept = False  # partial writes of earlier runs removed (at the first save)

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
    """Blocks until pending asynchronous saves (and old-step cleanup) are done.

    Raises:
      storage.CheckpointWriteError: the write in flight failed (one line: the step, the storage
        error, the latest complete checkpoint); its partial folder is removed.
    """
    try:
      self._manager.wait_until_finished()
    except Exception as error:
      if not self._failed:  # else: the failure already reported, seen again
        self._write_failed(self._writing, error)
    if self._writing is not None:
      self.committed = self._writing
    self._writing = None

  def close(self) -> None:
    """Waits for the write in flight and closes; `storage.CheckpointWriteError` as in `wait`."""
    failed = None
    try:
      self.wait_until_finished()
    except storage.CheckpointWriteError as e:
      failed = e
    try:
      self._manager.close()  # its metadata writes may fail too: the same step
    except Exception as error:
      if failed is None and not self._failed:
        self._write_failed(self._last_write, error)
    if failed is not None:
      raise failed

  def __enter__(self) -> CheckpointManager:
    return self

  def __exit__(self, kind: Any, *exc: Any) -> None:
    try:
      self.close()
    except storage.CheckpointWriteError as e:
      if kind is None:
        raise
      logging.error("%s", e)  # another error is on its way: do not replace it

  def _write_failed(self, step: int | None, error: BaseException) -> NoReturn:
    """Raises `CheckpointWriteError` for the failed write of `step` (`storage.write_failed`)."""
    self._writing, self._failed = None, True
    raise storage.write_failed(self._directory, step, error, self.committed) from error

  def _sweep_partial_writes(self) -> None:
    """Removes the partial writes of earlier runs (killed, or stopped by a failed write);
    at the first save of a run, which holds the workdir's lock, so no write is in flight."""
    self._swept = True
    if jax.process_index() == 0:
      for path in storage.partial_writes(self._directory):
        logging.warning("removing the partial checkpoint write %s (never committed)", path)
        path.rmtree(missing_ok=True)
    if jax.process_count() > 1:
      ocp.multihost.sync_global_processes("transformer_ckpt_sweep_partial_writes")

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
      data_state: this process's JSON-serialisable dict from the data pipeline, or None;
        every process writes its own (`data/process_<i>-of-<n>.json`).
      config: the run config (see `config_to_json`), or None.
      metrics: scalars for ranking (must include `best_metric` when that is set).
    """
    if not _is_int(step) or step < 0:
      raise ValueError(f"step must be an int >= 0; got {step!r}")
    _check_state_leaves(state)
    items = {STATE: ocp.args.StandardSave(state)}
    if self._checksums:
      items[CHECKSUMS] = ocp.args.JsonSave(integrity.checksums(state))
    if data_state is not None:
      position = serialisation.json_roundtrip("data_state", data_state)
      items[DATA] = grain_checkpoint.CheckpointSave(DataState(position))
    if config is not None:
      items[CONFIG] = ocp.args.JsonSave(serialisation.config_to_json(config))
    metrics = _check_metrics(metrics, self._best_metric)
    self.wait_until_finished()  # a failed previous write stops here, naming its step
    if not self._swept:
      self._sweep_partial_writes()
    latest = self.latest_step()
    if step in self.all_steps() or (self._directory / str(step)).exists():
      logging.warning(
        "checkpoint for step %d already exists in %s; not saved", step, self.directory
      )
      return False
    if latest is not None and step < latest:
      logging.warning("step %d is before the latest checkpoint %d; not saved", step, latest)
      return False
    try:
      started = self._manager.save(
        step, args=ocp.args.Composite(**items), metrics=metrics, force=True
      )
    except Exception as error:
      self._write_failed(step, error)
    if started:
      self._writing = self._last_write = step
    return started

  def check_compatible(self, target: Any, step: int, *, check_dtypes: bool = True) -> None:
    """Raises ValueError naming every path where the checkpoint at `step` and `target`
    differ (missing, unexpected, shape, dtype) or where a target sharding cannot hold its
    shape. Reads metadata only."""
    serialisation.compare(self._state_metadata(step), target, check_dtypes)

  def restore(
    self,
    target: Any,
    step: int | None = None,
    *,
    check_dtypes: bool = True,
    optional: Sequence[str] = (),
  ) -> Restored | None:
    """Restores `step` (None: the newest valid checkpoint) into the layout of `target`.

    Args:
      target: pytree like the saved state whose leaves are `jax.ShapeDtypeStruct`s (or
        arrays) carrying the shardings to restore onto; a leaf without a sharding goes to
        the first local device (single-process only). Python scalar leaves stay scalars.
      step: the step to restore; None picks the newest, moving corrupt ones aside.
      check_dtypes: also require dtypes to match (False: cast to the target's dtype).
      optional: top-level fields of `target` (a dataclass or mapping) that a checkpoint
        may lack: one holding none of a field's leaves restores it as None (a run that
        turned on the parameter EMA resumes a checkpoint written without one).

    Returns:
      `Restored`, or None when `step` is None and there is no valid checkpoint. Its data
      state is this process's; `Restored.resumable_data_state()` refuses one written by
      another number of processes.

    Raises:
      ValueError: the checkpoint's tree does not match `target` (naming the paths), or
        `step` is not a saved step, or the checkpoint at the given `step` is corrupt.
    """
    target = serialisation.with_default_shardings(target)
    if step is not None:
      if not _is_int(step) or step not in self.all_steps():
        raise ValueError(f"step must be one of the saved steps {self.all_steps()}; got {step!r}")
      try:
        return self._restore_step(step, target, check_dtypes, optional)
      except integrity.Corrupt as e:
        raise ValueError(f"checkpoint at step {step} in {self.directory} is corrupt: {e}") from e
    for candidate in sorted(self.all_steps(), reverse=True):
      try:
        return self._restore_step(candidate, target, check_dtypes, optional)
      except integrity.Corrupt as e:
        self._barriers += 1
        barrier = f"transformer_ckpt_move_aside_{candidate}_{self._barriers}"
        integrity.move_aside(self._directory, candidate, str(e), barrier)
        self._manager.reload()
    return None

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

  # -- internals -------------------------------------------------------------------

  def _state_metadata(self, step: int) -> Any:
    try:
      metadata = self._manager.item_metadata(step)[STATE]
      tree = metadata.tree if metadata is not None else None
    except Exception as e:  # any read failure means unreadable
      raise integrity.Corrupt(f"cannot read the state metadata: {type(e).__name__}: {e}") from e
    if tree is None:
      raise integrity.Corrupt("the state item or its metadata is missing")
    return tree

  def _restore_step(
    self, step: int, target: Any, check_dtypes: bool, optional: Sequence[str] = ()
  ) -> Restored:
    metadata = self._state_metadata(step)
    target = serialisation.without_absent(metadata, target, optional)
    serialisation.compare(metadata, target, check_dtypes)
    item, rebuild = serialisation.restorable(metadata, target)
    step_dir = self._directory / str(step)
    legacy = (step_dir / DATA / LEGACY_DATA_FILE).exists()
    processes = None if legacy else data_processes(step_dir / DATA)
    read_data = processes == jax.process_count()  # other counts: see `resumable_data_state`
    integrity.agree(data_problem(step_dir / DATA, legacy, read_data))
    items = {STATE: ocp.args.StandardRestore(item)}
    for name in (CHECKSUMS, CONFIG):
      if (step_dir / name).exists():
        items[name] = ocp.args.JsonRestore()
    if read_data:
      items[DATA] = grain_checkpoint.CheckpointRestore(DataState())
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(**items))
    except Exception as error:
      self._diagnose(step, items)  # raises Corrupt when the files are at fault
      raise error
    state = rebuild(restored[STATE])
    if restored.get(CHECKSUMS) is not None:
      integrity.verify(restored[CHECKSUMS], state)
    if legacy:
      data_state = json.loads((step_dir / DATA / LEGACY_DATA_FILE).read_text())
    else:
      data_state = restored[DATA].state if read_data else None
    return Restored(
      step,
      state,
      data_state,
      restored.get(CONFIG),
      data_processes=processes,
      directory=str(self._directory),
    )

  def _diagnose(self, step: int, items: Mapping[str, Any]) -> None:
    """Reads every item of `step` onto the host, independent of any target."""
    json_items = [n for n in items if n not in (STATE, DATA)]
    integrity.check_json_items(self._directory / str(step), json_items)
    try:
      self.restore_numpy(step)
    except Exception as e:
      raise integrity.Corrupt(f"state arrays unreadable: {type(e).__name__}: {e}") from e


def _is_int(x: Any) -> bool:
  return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _check_state_leaves(state: Any) -> None:
  leaves = jax.tree_util.tree_leaves_with_path(state)
  if not leaves:
    raise ValueError("state must be a non-empty pytree of arrays")
  for path, leaf in leaves:
    if not isinstance(leaf, (jax.Array, np.ndarray, np.generic, int, float)):
      raise ValueError(
        f"state leaf {jax.tree_util.keystr(path)} must be an array or number; got {type(leaf)}"
      )


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

"""Checkpoints: a thin wrapper over orbax `CheckpointManager` with our safety rules.

One checkpoint is the directory `<directory>/<step>/` holding four orbax items:
  state      the train-state pytree (params, opt_state, step, rng, ...): `StandardSave`
             (tensorstore/OCDBT arrays + JSON metadata; never pickle)
  checksums  JSON: CRC32, dtype and shape of every array of `state` (of every shard of an
             array split over devices), taken from host copies before writing; each
             process sums the shards it holds, process 0 writes the union, and on restore
             each process checks the shards it holds (absent in older checkpoints, which
             are not verified)
  data       the data-iterator state of every process, one JSON file each
             (`process_<i>-of-<n>.json`, grain's orbax handler); a resume needs the same
             process count (`Restored.resumable_data_state`). Older checkpoints hold one
             JSON item (`data/metadata`), still restored (on one process)
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
    beside them (e.g. a `.pkl` or `.npy`) are never opened;
  * a step exists once its write committed (`committed_steps`: orbax's temporary folder
    renamed on a local disk, `commit_success.txt` written last on object storage); the
    first save of a run removes the partial writes of earlier ones (`partial_writes`);
  * a write that fails (disk full, storage unreachable past its retries) raises
    `CheckpointWriteError` at the next save, wait or close: one line naming the step, the
    error and the latest complete checkpoint, which is kept; its partial folder is removed.

Modules:
  manager        `CheckpointManager` (save / restore / best / fallback)
  storage        committed steps, partial writes, `CheckpointWriteError`, one-line orbax logs
  data_state     the data-iterator states (per process, or one legacy JSON) and `Restored`
  integrity      CRC32 checksums, their verification, moving a corrupt step aside
  serialisation  tree paths, the target comparison and its message, config as JSON
"""

from transformer.train.checkpoints.data_state import Restored
from transformer.train.checkpoints.integrity import CORRUPT_DIR, CorruptCheckpointWarning
from transformer.train.checkpoints.manager import CheckpointManager
from transformer.train.checkpoints.serialisation import config_to_json, write_config
from transformer.train.checkpoints.storage import (
  CheckpointWriteError,
  committed_steps,
  describe_latest,
  partial_writes,
)

__all__ = [
  "CORRUPT_DIR",
  "CheckpointManager",
  "CheckpointWriteError",
  "CorruptCheckpointWarning",
  "Restored",
  "committed_steps",
  "describe_latest",
  "config_to_json",
  "partial_writes",
  "write_config",
]

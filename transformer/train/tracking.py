"""Weights & Biases tracking (`config.wandb`), a tracker of `MetricWriter`.

  config.wandb.mode = 'offline'   # or 'online'; 'disabled' (the default) imports nothing
  config.wandb.project, .entity, .name ('' = the workdir's name), .tags

The run logs every metric the loop writes (`{split}/{name}` at the update number), the
config (as W&B's run config), and texts such as the final sample (a table). Only process
0 logs. Needs the `wandb` package: `pip install '.[wandb]'`.

Resuming: the W&B run id is saved as `workdir/wandb_run_id` the first time, and every
later start of the same workdir calls `wandb.init(id=<that id>, resume='allow')`, so a
resumed training run continues the same W&B run. Files go to `workdir/wandb/` (`dir=`):
an offline run is synced later with `wandb sync workdir/wandb/offline-run-*`.

Online with no network (or no API key): `wandb.init` fails within `INIT_TIMEOUT_SECONDS`;
the run warns in one line and logs offline instead. It never stops training.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import string
import tempfile
from collections.abc import Mapping
from typing import Any

from etils import epath

from transformer.data.files import is_remote, write_atomic
from transformer.train.experiment import WandbConfig

RUN_ID_FILE = "wandb_run_id"
INIT_TIMEOUT_SECONDS = 20.0  # online: how long wandb.init may try to reach the server


def check_available(cfg: WandbConfig) -> None:
  """A one-line error, before anything is built, when W&B is asked for but not installed."""
  if cfg.mode == "disabled":
    return
  try:
    import wandb  # noqa: F401
  except ImportError:
    raise ValueError(
      f"config.wandb.mode={cfg.mode!r} needs the wandb package: pip install '.[wandb]' "
      "(or set config.wandb.mode='disabled')"
    ) from None


def run_id(workdir: str, create: bool = True) -> str | None:
  """The W&B run id saved in `workdir` (a new one saved there first when `create`)."""
  path = epath.Path(workdir) / RUN_ID_FILE
  if path.exists():
    saved = path.read_text(encoding="utf-8").strip()
    if saved:
      return saved
  if not create:
    return None
  alphabet = string.ascii_lowercase + string.digits  # the characters of W&B's own ids
  new = "".join(secrets.choice(alphabet) for _ in range(8))
  write_atomic(os.fspath(path), new + "\n")
  return new


class WandbTracker:
  """Mirrors a `MetricWriter`'s writes into one W&B run."""

  def __init__(self, run: Any, mode: str):
    self.run, self.mode = run, mode
    self.id = run.id

  @classmethod
  def start(
    cls, cfg: WandbConfig, workdir: str, config: Mapping[str, Any], is_primary: bool
  ) -> WandbTracker | None:
    """The tracker of `workdir`'s W&B run, or None (disabled, or not process 0)."""
    if cfg.mode == "disabled" or not is_primary:
      return None
    import wandb

    directory = workdir
    if is_remote(workdir):  # W&B writes local files: a local folder, synced by the user
      directory = tempfile.mkdtemp(prefix="wandb-")
      print(f"wandb: {workdir} is not a local folder; W&B files go to {directory}")
    else:
      os.makedirs(directory, exist_ok=True)
    kwargs = dict(
      project=cfg.project,
      entity=cfg.entity or None,
      name=cfg.name or os.path.basename(os.path.normpath(workdir)) or None,
      tags=list(cfg.tags) or None,
      id=run_id(workdir),
      resume="allow",
      dir=directory,
      config=_plain(config),
    )
    settings = dict(init_timeout=INIT_TIMEOUT_SECONDS, silent=True, console="off")
    mode = cfg.mode
    try:
      run = wandb.init(mode=mode, settings=wandb.Settings(**settings), **kwargs)
    except Exception as e:  # wandb.errors.CommError, UsageError (no API key), timeouts
      if mode != "online":
        raise
      reason = " ".join(str(e).split())[:200]
      with contextlib.suppress(Exception):
        wandb.teardown()  # the failed attempt holds the run id in W&B's service
      print(f"warning: wandb online init failed ({reason}); logging offline to {directory}/wandb")
      mode = "offline"
      run = wandb.init(mode=mode, settings=wandb.Settings(**settings), **kwargs)
    print(f"wandb: run {run.id} ({mode}) in {directory}/wandb")
    return cls(run, mode)

  def log(self, step: int, values: Mapping[str, float], split: str) -> None:
    self.run.log({f"{split}/{k}": v for k, v in values.items()}, step=step)

  def hparams(self, config: Mapping[str, Any]) -> None:
    self.run.config.update(_plain(config), allow_val_change=True)

  def text(self, step: int, tag: str, text: str) -> None:
    import wandb

    self.run.log({tag: wandb.Table(columns=["text"], data=[[text]])}, step=step)
    self.run.summary[f"{tag}_text"] = text

  def close(self, failed: bool = False) -> None:
    try:
      self.run.finish(exit_code=1 if failed else 0)
    except Exception as e:  # never let tracking hide the run's own outcome
      logging.warning("wandb: finishing run %s failed: %s", self.id, e)


def _plain(config: Mapping[str, Any]) -> dict[str, Any]:
  """A ConfigDict (or mapping) as plain nested dicts with lists for tuples."""
  if hasattr(config, "to_dict"):
    config = config.to_dict()
  out = {}
  for k, v in config.items():
    if hasattr(v, "to_dict") or isinstance(v, Mapping):
      out[k] = _plain(v)
    elif isinstance(v, tuple):
      out[k] = list(v)
    else:
      out[k] = v
  return out

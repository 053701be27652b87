"""`transformer-train` (`python -m transformer.train_main`): train.py as an installed command.

  transformer-train --config configs/NAME.py[:arg] --workdir DIR [--config.a.b=v ...]

The same flags and behaviour as `python train.py`; a `--config` path that is not a file
here names a shipped config (`configs/...` of the checkout, or of `pip install .`). Every
invocation that gets as far as building the run appends its record (command, wall and CPU
time, CPU ISA, load, versions, steps, final metrics) to WORKDIR/runs.jsonl at the end,
whether it completed, was preempted or stopped with an error (`train/guard/run_record.py`).
"""

from __future__ import annotations

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from transformer import cli
from transformer.data.config import resolve_shipped
from transformer.train.guard.run_record import RunRecord
from transformer.train.guard.startup import maybe_initialize
from transformer.train.loop import Hooks, train_and_evaluate

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "experiment config file", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (checkpoints, metrics)")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str], hooks: Hooks | None = None) -> None:
  """Trains `--config` in `--workdir` (resuming from its latest checkpoint) and appends the
  invocation's record to `--workdir`/runs.jsonl."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  record = RunRecord(sys.argv, _WORKDIR.value)  # the load average at start
  if not flags.FLAGS["verbosity"].present:  # library INFO logs (orbax) only with -v 0
    logging.set_verbosity(logging.WARNING)
  cli.apply_process_settings()  # before JAX starts: CPU allocator and XLA flags
  maybe_initialize(_CONFIG.value, _WORKDIR.value)  # several processes: same config, peer watch
  hooks = record.hooks(hooks or Hooks())
  cli.run_reporting_errors(_train_recorded, _CONFIG.value, _WORKDIR.value, hooks, record)


def _train_recorded(config, workdir: str, hooks: Hooks, record: RunRecord) -> None:
  """`train_and_evaluate`, then the run record; on an error the record is written before
  the error propagates (so the error stays the last line `run_reporting_errors` prints)."""
  try:
    metrics = train_and_evaluate(config, workdir, hooks)
  except BaseException as e:
    record.finish(error=e)
    raise
  record.finish(metrics=metrics)


def _find_config(value: str) -> str:
  """'configs/NAME.py[:arg]' with the file found by `resolve_shipped` if it is not here."""
  path, sep, arg = value.partition(":")
  found = resolve_shipped(path) if path else None
  return f"{found}{sep}{arg}" if found is not None and found.is_file() else value


def shipped_config_argv(argv: list[str]) -> list[str]:
  """`argv` with the value of `--config` (`--config=V` or `--config V`) found by `_find_config`."""
  out = list(argv)
  for i, arg in enumerate(out):
    name, eq, value = arg.partition("=")
    if name in ("--config", "-config"):
      if eq:
        out[i] = f"{name}={_find_config(value)}"
      elif i + 1 < len(out):
        out[i + 1] = _find_config(out[i + 1])
      break
    if arg == "--":
      break
  return out


def parse_flags(argv: list[str]) -> list[str]:
  """`cli.parse_flags` after `shipped_config_argv`."""
  argv = shipped_config_argv(argv)
  sys.argv = argv  # config_flags reads the --config.a.b overrides from sys.argv
  return cli.parse_flags(argv)


def run() -> None:
  """The console entry point."""
  app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  run()

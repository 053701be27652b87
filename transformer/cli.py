"""Shared pieces of the command-line entry points: one-line errors, flag parsing (a
`--config` that names a shipped config is found), the CPU process settings and the
garbage collector's freeze of the imports' objects.

It sits below the training layer (tests/test_layout.py) so that the training loop's own
command (`train/loop.py` `main`) can use it, as `eval_main.py` does.
"""

from __future__ import annotations

import contextlib
import gc
import sys

from absl import flags, logging

from transformer import process_settings
from transformer.data.config import resolve_shipped

_TRACEBACK = flags.DEFINE_bool("traceback", False, "show the full traceback of an error")
_CPU_TUNING = flags.DEFINE_enum(
  "cpu_tuning", "auto", process_settings.MODES,
  "CPU process settings (allocator, XLA vector width; docs/PERFORMANCE.md): auto = when JAX"
  " runs on the CPU",
)  # fmt: skip

# Errors that describe bad input or a stopped run: one clear line, no traceback.
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, PermissionError, RuntimeError)


def apply_process_settings() -> None:
  """`process_settings.apply(--cpu_tuning)`, then `gc.freeze()`; a command calls it once its
  modules are imported, before JAX computes anything.

  The freeze moves the objects alive now (nearly all made by the imports) out of reach of
  Python's cyclic garbage collector, which runs many times while JAX traces the steps and
  once more at exit and would walk them all each time (docs/PERFORMANCE.md). They are
  freed as before when their last reference goes; only a reference cycle among them would
  stay, and the imports leave very few.
  """
  applied = process_settings.apply(_CPU_TUNING.value)
  gc.freeze()
  if applied:
    logging.info("CPU process settings: %s", ", ".join(applied))


@contextlib.contextmanager
def errors_in_one_line():
  """Within it, a user error prints one line to stderr and exits with status 1."""
  try:
    yield
  except USER_ERRORS as e:
    if _TRACEBACK.value:
      raise
    logging.flush()
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)


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
  """absl flag parsing whose errors (bad --config.x overrides included) are one line; a
  `--config` path that is not a file here names a shipped config (`configs/...` of the
  checkout, or of `pip install .`)."""
  argv = shipped_config_argv(argv)
  sys.argv = argv  # config_flags reads the --config.a.b overrides from sys.argv
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    print(f"error: {e}", file=sys.stderr)
  except (AttributeError, KeyError) as e:  # ml_collections: an override of no field
    name = str(e).strip("'\"")
    bad = " ".join(a for a in argv[1:] if name in a) or argv[1:]
    print(f"error: no such config field {name!r} in {bad}", file=sys.stderr)
  except (TypeError, ValueError) as e:  # ml_collections: a value of the wrong type
    print(f"error: invalid config override: {e}", file=sys.stderr)
  sys.exit(1)

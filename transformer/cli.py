"""Shared pieces of the command-line entry points."""

from __future__ import annotations

import sys

from absl import flags, logging

from transformer import process_settings

_TRACEBACK = flags.DEFINE_bool("traceback", False, "show the full traceback of an error")
_CPU_TUNING = flags.DEFINE_enum(
  "cpu_tuning", "auto", process_settings.MODES,
  "CPU process settings (allocator, XLA vector width; docs/PERFORMANCE.md): auto = when JAX"
  " runs on the CPU",
)  # fmt: skip

# Errors that describe bad input or a stopped run: one clear line, no traceback.
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, PermissionError, RuntimeError)


def apply_process_settings() -> None:
  """`process_settings.apply(--cpu_tuning)`; call before JAX computes anything."""
  applied = process_settings.apply(_CPU_TUNING.value)
  if applied:
    logging.info("CPU process settings: %s", ", ".join(applied))


def run_reporting_errors(fn, *args) -> None:
  """Calls fn(*args); a user error prints one line to stderr and exits with status 1."""
  try:
    fn(*args)
  except USER_ERRORS as e:
    if _TRACEBACK.value:
      raise
    logging.flush()
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing whose errors (bad --config.x overrides included) are one line."""
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

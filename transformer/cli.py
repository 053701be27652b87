"""Shared pieces of the command-line entry points."""

from __future__ import annotations

import sys

from absl import flags, logging

_TRACEBACK = flags.DEFINE_bool("traceback", False, "show the full traceback of an error")

# Errors that describe bad input or a stopped run: one clear line, no traceback.
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, PermissionError, RuntimeError)


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

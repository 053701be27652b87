"""The coordinator's loss seen from the other processes: when process 0 dies, its
coordination service goes with it and JAX's client on every other process calls abort()
("Terminating process because the JAX distributed service detected fatal errors"). A
SIGABRT handler installed through ctypes (abort() never returns to Python, so a Python
handler would never run) checks that the coordinator's port no longer answers and lets the
peer watch write its one line first, with the lost-peer status.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
from typing import Any

_SIGNAL_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_int)
_LIBC = ctypes.CDLL(None)
_LIBC.signal.restype = ctypes.c_void_p
_LIBC.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
_WATCH: Any = None  # the peer watch (`peers.Group`) the handler reports through


def _coordinator_answers(address: str) -> bool:
  host, _, port = address.rpartition(":")
  try:
    socket.create_connection((host.strip("[]"), int(port)), timeout=2.0).close()
  except (OSError, ValueError):
    return False
  return True


@_SIGNAL_HANDLER
def _on_abort(signum: int) -> None:
  group = _WATCH
  if group is not None:
    if group.announced:  # this process was ending anyway: the coordinator ended first
      sys.stdout.flush()
      os._exit(group.exit_status)
    if not _coordinator_answers(group.coordinator):
      group.report_lost([0])
  _LIBC.signal(signal.SIGABRT, signal.SIG_DFL)  # any other abort: as before


def arm(group: Any) -> None:
  """Reports an abort of JAX's client through `group` (`.announced`, `.exit_status`,
  `.coordinator`, `.report_lost`) while armed."""
  global _WATCH
  _WATCH = group
  _LIBC.signal(signal.SIGABRT, ctypes.cast(_on_abort, ctypes.c_void_p))


def disarm() -> None:
  _LIBC.signal(signal.SIGABRT, signal.SIG_DFL)

"""Multi-host start-up: `jax.distributed.initialize()` when the environment asks for it.

- TRANSFORMER_COORDINATOR (host:port of process 0), TRANSFORMER_NUM_PROCESSES and
  TRANSFORMER_PROCESS_ID: an explicit run (any cluster, and the CPU tests);
- TRANSFORMER_DISTRIBUTED=1: JAX's own cluster detection (Cloud TPU pod slices through the
  VM metadata, Slurm through the job step's SLURM_* variables).

Every process then prints one line to stderr (`distributed: process I of N, coordinator
HOST:PORT, D local device(s)`). Explicit variables that are missing, not integers or out
of range, and TRANSFORMER_DISTRIBUTED=1 where JAX detects no cluster, end the run in one
`error:` line (status 1) instead of a traceback. CPU collectives use gloo.
docs/SCALING.md (section "Many hosts") shows the commands; tests/test_scaling_commands.py
runs them.
"""

from __future__ import annotations

import os
import sys

import jax

_EXPLICIT = ("TRANSFORMER_COORDINATOR", "TRANSFORMER_NUM_PROCESSES", "TRANSFORMER_PROCESS_ID")


def _fail(message: str) -> None:
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(1)


def _explicit_arguments(coordinator: str) -> dict:
  missing = [name for name in _EXPLICIT[1:] if not os.environ.get(name)]
  if missing:
    verb = "are" if len(missing) > 1 else "is"
    _fail(f"TRANSFORMER_COORDINATOR={coordinator} is set but {' and '.join(missing)} {verb} not")
  try:
    count, index = (int(os.environ[name]) for name in _EXPLICIT[1:])
  except ValueError:
    values = ", ".join(f"{name}={os.environ[name]!r}" for name in _EXPLICIT[1:])
    _fail(f"TRANSFORMER_NUM_PROCESSES and TRANSFORMER_PROCESS_ID must be integers: {values}")
  if not 0 <= index < count:
    _fail(
      f"TRANSFORMER_PROCESS_ID={index} is not in 0 .. {count - 1} "
      f"(TRANSFORMER_NUM_PROCESSES={count})"
    )
  return {"coordinator_address": coordinator, "num_processes": count, "process_id": index}


def maybe_initialize() -> None:
  """Initialises jax.distributed if the environment describes a multi-process run."""
  coordinator = os.environ.get("TRANSFORMER_COORDINATOR")
  auto = os.environ.get("TRANSFORMER_DISTRIBUTED") == "1"
  if not (coordinator or auto):
    return
  # Collectives between CPU processes (tests, CPU clusters) go through gloo.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if coordinator:
    jax.distributed.initialize(**_explicit_arguments(coordinator))
  else:
    try:
      jax.distributed.initialize()  # Cloud TPU / Slurm auto-detection
    except ValueError as e:  # nothing detected: no coordinator, process count or index
      _fail(
        f"TRANSFORMER_DISTRIBUTED=1 but JAX detected no cluster (a Cloud TPU pod slice or a "
        f"Slurm job step) to take the processes from ({e}); elsewhere set "
        f"{', '.join(_EXPLICIT)} on every process"
      )
  from jax._src import distributed as jax_distributed  # the address JAX detected

  address = getattr(jax_distributed.global_state, "coordinator_address", None) or coordinator
  print(
    f"distributed: process {jax.process_index()} of {jax.process_count()}, coordinator "
    f"{address}, {jax.local_device_count()} local device(s)",
    file=sys.stderr,
    flush=True,
  )

"""Multi-host start-up: `maybe_initialize(config, workdir)` runs
`jax.distributed.initialize()` when the environment asks for it:

- TRANSFORMER_COORDINATOR (host:port of process 0), TRANSFORMER_NUM_PROCESSES and
  TRANSFORMER_PROCESS_ID: an explicit run (any cluster, and the CPU tests);
- TRANSFORMER_DISTRIBUTED=1: JAX's own cluster detection (Cloud TPU pod slices through the
  VM metadata, Slurm through the job step's SLURM_* variables).

Every process then prints one line to stderr (`distributed: process I of N, coordinator
HOST:PORT, D local device(s), peers timeout Ts`). Explicit variables that are missing, not
integers or out of range, and TRANSFORMER_DISTRIBUTED=1 where JAX detects no cluster, end
the run in one `error:` line (status 1) instead of a traceback. CPU collectives use gloo.
docs/SCALING.md (section "Many hosts") shows the commands; tests/test_scaling_commands.py
runs them.

Then, before anything is built, every process checks that all have the same config
(`same_config.py`: one line naming the differing fields, status 1) and starts the watch
over the peers (`peers.py`: a lost or stalled process ends every survivor in one line).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import jax

from transformer.data.files import one_line
from transformer.train.guard import peers, same_config
from transformer.train.guard.config import DEFAULT_STALL_S, DEFAULT_TIMEOUT_S

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


def seconds_of(config: Any, name: str, default: int, minimum: int = 1) -> int:
  """`config.<name>` (an int >= `minimum`; `default` when absent), read before the config
  is validated: the processes start before anything else."""
  value = None if config is None else config.get(name)
  value = default if value is None else value
  if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
    _fail(f"config.{name}={value!r}: must be an int >= {minimum} (seconds)")
  return value


def maybe_initialize(config: Any = None, workdir: str | None = None) -> None:
  """Initialises jax.distributed if the environment describes a multi-process run, checks
  that every process has the same `config` and `workdir`, and starts the watch over the
  peers (module docstring)."""
  coordinator = os.environ.get("TRANSFORMER_COORDINATOR")
  auto = os.environ.get("TRANSFORMER_DISTRIBUTED") == "1"
  if not (coordinator or auto):
    return
  timeout = seconds_of(config, "distributed_timeout_s", DEFAULT_TIMEOUT_S)
  stall = seconds_of(config, "stall_timeout_s", DEFAULT_STALL_S, minimum=0)
  # Collectives between CPU processes (tests, CPU clusters) go through gloo.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  # The service reports a lost process instead of aborting the survivors (our watch does).
  jax.config.update("jax_enable_recoverability", True)
  timeouts = {"heartbeat_timeout_seconds": timeout, "shutdown_timeout_seconds": timeout}
  if coordinator:
    arguments = _explicit_arguments(coordinator)
    try:
      jax.distributed.initialize(**arguments, **timeouts)
    except Exception as e:  # the coordinator never answered, or a peer never came
      _fail(f"could not start the {arguments['num_processes']} processes through the "
            f"coordinator {coordinator}: {one_line(e)}")  # fmt: skip
  else:
    try:
      jax.distributed.initialize(**timeouts)  # Cloud TPU / Slurm auto-detection
    except ValueError as e:  # nothing detected: no coordinator, process count or index
      _fail(
        f"TRANSFORMER_DISTRIBUTED=1 but JAX detected no cluster (a Cloud TPU pod slice or a "
        f"Slurm job step) to take the processes from ({e}); elsewhere set "
        f"{', '.join(_EXPLICIT)} on every process"
      )
  from jax._src import distributed as jax_distributed  # the client and detected address

  state = jax_distributed.global_state
  address = getattr(state, "coordinator_address", None) or coordinator
  print(
    f"distributed: process {jax.process_index()} of {jax.process_count()}, coordinator "
    f"{address}, {jax.local_device_count()} local device(s), peers timeout {timeout}s",
    file=sys.stderr,
    flush=True,
  )
  group = peers.join(state.client, address, timeout, stall, workdir)
  if config is not None:  # the same config on every process, before anything is built
    problem = same_config.disagreement(
      group.client, group.me, group.count, group.timeout, f"{peers.KEYS}/config", config, workdir
    )
    if problem:
      _fail(problem)
  group.start_watch()

"""Multi-host start-up: `jax.distributed.initialize()` when the environment asks for it.

On Cloud TPU pods initialisation is automatic. On GPU clusters and in CPU tests set
TRANSFORMER_COORDINATOR (host:port), TRANSFORMER_NUM_PROCESSES and TRANSFORMER_PROCESS_ID
(Slurm's variables are also detected by JAX itself when TRANSFORMER_DISTRIBUTED=1).
"""

from __future__ import annotations

import os

import jax


def maybe_initialize() -> None:
  """Initialises jax.distributed if the environment describes a multi-process run."""
  coordinator = os.environ.get("TRANSFORMER_COORDINATOR")
  if coordinator or os.environ.get("TRANSFORMER_DISTRIBUTED") == "1":
    # Collectives between CPU processes (tests, CPU clusters) go through gloo.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if coordinator:
    jax.distributed.initialize(
      coordinator_address=coordinator,
      num_processes=int(os.environ["TRANSFORMER_NUM_PROCESSES"]),
      process_id=int(os.environ["TRANSFORMER_PROCESS_ID"]),
    )
  elif os.environ.get("TRANSFORMER_DISTRIBUTED") == "1":
    jax.distributed.initialize()  # Cloud TPU / Slurm auto-detection

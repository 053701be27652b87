"""Running the steps on many devices: `jax.jit` over a mesh, or `jax.pmap`.

`StepRunner` hides the difference from the loop. With 'jit' the train state is one
global array tree (replicated over the mesh's 'data' axis) and every batch is one global
array sharded along its first dimension; XLA inserts the gradient all-reduce. With
'pmap' the state is replicated per local device and the batch split into
[devices, B / devices, ...]; the step psums over the axis name 'batch'.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from transformer.training.train_step import StepConfig, TrainState, eval_step, train_step

DATA_AXIS = "data"
PMAP_AXIS = "batch"


def make_mesh(devices: list | None = None) -> Mesh:
  """A 1-D mesh over all devices with the axis 'data'."""
  devices = jax.devices() if devices is None else devices
  return Mesh(np.asarray(devices), (DATA_AXIS,))


class StepRunner:
  """Compiles and runs train / eval steps with the chosen parallelism."""

  def __init__(self, cfg: StepConfig, parallelism: str, mesh: Mesh | None = None):
    if parallelism not in ("jit", "pmap"):
      raise ValueError(f"parallelism must be jit or pmap, got {parallelism!r}")
    self.parallelism = parallelism
    self.mesh = make_mesh() if mesh is None else mesh
    self.num_devices = self.mesh.devices.size if parallelism == "jit" else jax.local_device_count()
    if parallelism == "jit":
      self.batch_sharding = NamedSharding(self.mesh, PartitionSpec(DATA_AXIS))
      self.replicated = NamedSharding(self.mesh, PartitionSpec())
      self._train = jax.jit(
        functools.partial(train_step, cfg=cfg),
        in_shardings=(self.replicated, self.batch_sharding),
        out_shardings=(self.replicated, self.replicated),
        donate_argnums=0,
      )
      self._eval = jax.jit(
        functools.partial(eval_step, cfg=cfg),
        in_shardings=(self.replicated, self.batch_sharding),
        out_shardings=self.replicated,
      )
    else:
      pcfg = dataclasses.replace(cfg, axis_name=PMAP_AXIS)
      self._train = jax.pmap(
        functools.partial(train_step, cfg=pcfg), axis_name=PMAP_AXIS, donate_argnums=0
      )
      self._eval = jax.pmap(functools.partial(eval_step, cfg=pcfg), axis_name=PMAP_AXIS)

  def check_batch_size(self, batch_size: int, name: str = "batch_size") -> None:
    per_process = jax.local_device_count() if self.parallelism == "pmap" else self.num_devices
    if batch_size % per_process:
      raise ValueError(f"config.{name}={batch_size}: must be divisible by {per_process} devices")

  # State placement ------------------------------------------------------------------

  def place_state(self, state: TrainState) -> TrainState:
    """Host or single-device state -> the layout the compiled step expects."""
    if self.parallelism == "jit":
      return jax.device_put(state, self.replicated)
    devices = jax.local_devices()
    stacked = NamedSharding(Mesh(np.asarray(devices), (PMAP_AXIS,)), PartitionSpec(PMAP_AXIS))

    def replicate(x):
      x = jax.device_get(x)
      return jax.device_put(np.broadcast_to(x[None], (len(devices), *np.shape(x))), stacked)

    return jax.tree.map(replicate, state)

  def host_state(self, state: TrainState) -> TrainState:
    """The state as one global tree (for checkpoints and evaluation)."""
    if self.parallelism == "jit":
      return state
    return jax.tree.map(lambda x: x[0], state)

  def state_target(self, abstract: TrainState) -> Any:
    """Abstract state with the shardings a checkpoint should be restored into."""
    sharding = (
      self.replicated
      if self.parallelism == "jit"
      else jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    )
    return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), abstract
    )

  # Batches --------------------------------------------------------------------------

  def place_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """This process's rows -> a global sharded batch (jit) or [devices, ...] (pmap)."""
    if self.parallelism == "jit":
      return {
        k: jax.make_array_from_process_local_data(self.batch_sharding, np.asarray(v))
        for k, v in batch.items()
      }
    n = jax.local_device_count()
    return {k: np.asarray(v).reshape(n, v.shape[0] // n, *v.shape[1:]) for k, v in batch.items()}

  # Steps ----------------------------------------------------------------------------

  def train(self, state: TrainState, batch: dict[str, np.ndarray]) -> tuple[TrainState, dict]:
    state, metrics = self._train(state, self.place_batch(batch))
    if self.parallelism == "pmap":
      metrics = jax.tree.map(lambda x: x[0], metrics)
    return state, metrics

  def eval(self, state: TrainState, batch: dict[str, np.ndarray]) -> dict:
    params = state.params
    sums = self._eval(params, self.place_batch(batch))
    if self.parallelism == "pmap":
      sums = jax.tree.map(lambda x: x[0], sums)
    return sums

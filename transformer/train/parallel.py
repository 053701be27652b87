"""Running the steps on many devices: `jax.jit` over a mesh, or `jax.pmap`.

`StepRunner` hides the difference from the loop. It compiles the update it is given (the
loop's own, `(state, batch, *, cfg) -> (state, metrics)`) and imports none: a copied
`train/loop.py` with another update runs that update.

'jit': one global program over a ('data', 'fsdp', 'tensor') mesh (`transformer.nn.partitioning`).
  Parameters and optimizer state are laid out by the logical-axis rules (replicated for
  pure data parallelism, sharded for FSDP and tensor parallelism); every batch is one
  global array split along its first dimension over data x fsdp. XLA inserts the
  collectives (gradient all-reduce, weight all-gathers, reduce-scatters).
'pmap': data parallelism only; the state is replicated per local device and the batch
  split into [devices, B / devices, ...]; the step psums over the axis name 'batch'.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from transformer.nn import partitioning
from transformer.train.step import StepConfig, TrainState, eval_step

PMAP_AXIS = "batch"

Update = Callable[..., tuple[TrainState, dict]]  # (state, batch, *, cfg) -> (state, metrics)


def make_mesh(devices: list | None = None, shape: Mapping[str, int] | None = None) -> Mesh:
  """A ('data', 'fsdp', 'tensor') mesh; by default all devices on 'data'."""
  return partitioning.make_mesh(shape or {"data": -1}, devices)


class StepRunner:
  """Compiles and runs `update` and the evaluation step with the chosen parallelism."""

  def __init__(
    self,
    cfg: StepConfig,
    parallelism: str,
    mesh: Mesh | None = None,
    rules: Mapping[str, Any] | None = None,
    *,
    update: Update,
  ):
    if parallelism not in ("jit", "pmap"):
      raise ValueError(f"parallelism must be jit or pmap, got {parallelism!r}")
    self.parallelism, self.rules, self.update = parallelism, rules, update
    self.mesh = make_mesh() if mesh is None else mesh
    if parallelism == "jit":  # the steps pin activations to this mesh as they trace
      self.cfg = dataclasses.replace(cfg, layout=(self.mesh, rules))
      self.num_devices = self.mesh.devices.size
      self.batch_sharding = partitioning.batch_sharding(self.mesh, rules)
      self.replicated = NamedSharding(self.mesh, PartitionSpec())
      self.train_step = self._eval = None  # compiled once the state's layout is known
      self.state_sharding = None
    else:
      if self.mesh.devices.size != jax.device_count() or self.mesh.shape["data"] != self.mesh.size:
        raise ValueError("parallelism='pmap' is data parallelism on all devices: use mesh data=-1")
      self.cfg = dataclasses.replace(cfg, axis_name=PMAP_AXIS)
      self.num_devices = jax.local_device_count()
      self.train_step = jax.pmap(
        functools.partial(update, cfg=self.cfg), axis_name=PMAP_AXIS, donate_argnums=0
      )
      self._eval = jax.pmap(functools.partial(eval_step, cfg=self.cfg), axis_name=PMAP_AXIS)

  def check_batch_size(self, batch_size: int, name: str = "batch_size") -> None:
    """`batch_size` is this process's rows; they must split evenly over its devices."""
    if self.parallelism == "pmap":
      per_process = jax.local_device_count()
    else:
      spec = self.batch_sharding.spec[0]
      names = (spec,) if isinstance(spec, str) else tuple(spec or ())
      splits = int(np.prod([self.mesh.shape[n] for n in names])) if names else 1
      per_process = max(splits // jax.process_count(), 1)
    if batch_size % per_process:
      raise ValueError(f"config.{name}={batch_size}: must be divisible by {per_process} devices")

  # State layout -----------------------------------------------------------------------

  def _layout(self, state: TrainState) -> None:
    """Shardings of the state (from its parameters) and the steps compiled for them:
    `self.train_step` is `jax.jit` of the update taking the state and a global batch with
    these shardings, donating the state."""
    if self.parallelism != "jit" or self.state_sharding is not None:
      return
    abstract = jax.eval_shape(lambda: state)
    self.state_sharding = partitioning.state_shardings(
      abstract, abstract.params, self.mesh, self.rules
    )
    self.param_sharding = self.state_sharding.params
    self.train_step = jax.jit(
      functools.partial(self.update, cfg=self.cfg),
      in_shardings=(self.state_sharding, self.batch_sharding),
      out_shardings=(self.state_sharding, self.replicated),
      donate_argnums=0,
    )
    self._eval = jax.jit(
      functools.partial(eval_step, cfg=self.cfg),
      in_shardings=(self.param_sharding, self.batch_sharding),
      out_shardings=self.replicated,
    )

  def place_state(self, state: TrainState) -> TrainState:
    """Host or single-device state -> the layout the compiled step expects."""
    if self.parallelism == "jit":
      self._layout(state)
      return jax.device_put(state, self.state_sharding)
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
    if self.parallelism == "jit":
      self._layout(abstract)
      shardings = self.state_sharding
    else:
      one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
      shardings = jax.tree.map(lambda _: one, abstract)
    return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings
    )

  # Batches ----------------------------------------------------------------------------

  def place_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """This process's rows -> a global sharded batch (jit) or [devices, ...] (pmap)."""
    self.cfg.task.check_batch(batch)
    if self.parallelism == "jit":
      return {
        k: jax.make_array_from_process_local_data(self.batch_sharding, np.asarray(v))
        for k, v in batch.items()
      }
    n = jax.local_device_count()
    return {k: np.asarray(v).reshape(n, v.shape[0] // n, *v.shape[1:]) for k, v in batch.items()}

  # Steps ------------------------------------------------------------------------------

  def unreplicate(self, metrics: dict) -> dict:
    """A step's metrics as one value each (pmap returns one per local device, all equal)."""
    if self.parallelism == "pmap":
      return jax.tree.map(lambda x: x[0], metrics)
    return metrics

  def train(self, state: TrainState, batch: dict[str, np.ndarray]) -> tuple[TrainState, dict]:
    """The update on a host batch of this process's rows (what the loop spells out)."""
    if self.train_step is None:
      raise RuntimeError("place_state(state) first: it fixes the state's layout")
    state, metrics = self.train_step(state, self.place_batch(batch))
    return state, self.unreplicate(metrics)

  def lower_train(self, state: TrainState, batch: dict[str, np.ndarray]) -> Any:
    """The train step lowered for a placed `state` and a host batch of this process's rows,
    once the update is checked to return a state like `state`. Compiling it compiles what
    `train_step` then runs (same shapes: no second compilation)."""
    if self.train_step is None:
      raise RuntimeError("place_state(state) first: it fixes the state's layout")
    placed = self.place_batch(batch)
    self.check_update(state, placed)
    return self.train_step.lower(state, placed)

  def check_update(self, state: TrainState, placed: dict) -> None:
    """Refuses, in one line naming the leaf, an update whose state out differs from the
    state in (structure, shape or dtype): the compiled loop feeds one to the next."""
    if self.parallelism == "jit":
      out = jax.eval_shape(functools.partial(self.update, cfg=self.cfg), state, placed)
    else:
      out = jax.eval_shape(self.train_step, state, placed)
    name = getattr(self.update, "__qualname__", repr(self.update))
    if not (isinstance(out, tuple) and len(out) == 2):
      raise TypeError(f"update {name}: must return (state, metrics), got {type(out).__name__}")
    got = dict(jax.tree_util.tree_flatten_with_path(out[0])[0])
    want = dict(jax.tree_util.tree_flatten_with_path(state)[0])
    for path in [*want, *got]:
      a, b = want.get(path), got.get(path)
      if a is None or b is None or (a.shape, a.dtype) != (b.shape, b.dtype):
        leaf, describe = jax.tree_util.keystr(path), lambda x: f"{x.dtype}{list(x.shape)}"
        raise ValueError(
          f"update {name}: returns the state's leaf {leaf} as "
          f"{describe(b) if b is not None else 'nothing'}; it received "
          f"{describe(a) if a is not None else 'no such leaf'}"
        )

  def lower_eval(self, params: Any, batch: dict[str, np.ndarray]) -> Any:
    """The evaluation step lowered for `params` (placed, or abstract with their shardings)
    and a host evaluation batch; compiling it compiles what `eval` then runs (jit)."""
    if self._eval is None:
      raise RuntimeError("place_state(state) first: it fixes the state's layout")
    return self._eval.lower(params, self.place_batch(batch))

  def eval(self, state: TrainState, batch: dict[str, np.ndarray]) -> dict:
    if self._eval is None:
      self._layout(state)
    return self.unreplicate(self._eval(state.params, self.place_batch(batch)))

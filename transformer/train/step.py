"""The train state and the pure train and eval steps.

An update `(state, batch, *, cfg) -> (state, metrics)` is a pure function of two halves,
`gradients` then `apply_gradients` (`train_step` is the plain one; the loop defines the
one it runs), compiled once by `train/parallel.py` with `jax.jit` (mesh shardings; the
global batch is one array) or `jax.pmap` (`axis_name`: gradients and sums are psum-ed).
The objective is the task's (`Task.objective`: its `loss` plus a mixture-of-experts
model's auxiliary losses): a loss sum, a normalizer (what the task averages over: tokens,
pairs, sequences, images) and metric sums. The step differentiates the loss sum of every
micro-batch, sums all three over micro-batches and devices, and divides by the global
normalizer, so jit, pmap, one device and gradient accumulation all optimise the same
number. It logs the loss and each metric sum over the normalizer, the normalizer itself,
and the norms and learning rate.
An update whose global normalizer is 0 (nothing to average over) is not applied; it is
counted in `empty_count`.

With `StepConfig.ema_decay` = d > 0 the state also carries `ema_params`, an exponential
moving average of the parameters updated after every applied update:
  ema <- d_t * ema + (1 - d_t) * params_new,   d_t = d, or with `ema_warmup`
  d_t = min(d, (1 + t) / (10 + t)), t = the updates applied before this one (0, 1, ...),
the warmup of TensorFlow's `ExponentialMovingAverage(num_updates=t)`. It starts equal to
the initial parameters; a skipped (NaN/Inf or empty) update leaves it unchanged with the rest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax import lax

from transformer.nn import partitioning
from transformer.tasks import Task
from transformer.tasks.base import Batch


@flax.struct.dataclass
class TrainState:
  """Everything a checkpoint needs to continue: the update count, weights, optimizer, rng.

  The dropout key of update `step` is `fold_in(rng, step)`, so a resumed run draws the
  same dropout masks as an uninterrupted one.
  """

  step: jax.Array  # int32 scalar: updates applied so far
  params: Any
  opt_state: Any
  rng: jax.Array  # uint32 [2]: base key of the dropout randomness
  nonfinite_count: jax.Array  # int32 scalar: updates not applied because of NaN/Inf
  first_nonfinite_step: jax.Array  # int32 scalar: step number of the first such update, or -1
  ema_params: Any = None  # EMA of params (StepConfig.ema_decay > 0), else None (no leaves)
  frozen: Any = None  # variables the task reads and nothing trains (`Task.frozen`), or None
  # int32 scalar: updates not applied because their global normalizer was 0 (nothing to
  # average over); None only in a state restored from a checkpoint written before it
  empty_count: Any = None


@dataclasses.dataclass(frozen=True)
class StepConfig:
  """The static (hashable) parts of a step: the model and the loss settings."""

  model: nn.Module
  tx: optax.GradientTransformation
  task: Task  # how a batch feeds the model (transformer/tasks)
  grad_accum_steps: int = 1
  axis_name: str | None = None  # set for pmap
  schedule: Any = None  # count -> learning rate, for logging
  ema_decay: float = 0.0  # decay of the parameter EMA (0 = none; the state then has none)
  ema_warmup: bool = False  # decay min(ema_decay, (1 + t) / (10 + t)) at update count t
  layout: tuple[Any, Any] | None = None  # (mesh, rules) activations are pinned to (jit)


def create_train_state(
  params: Any,
  tx: optax.GradientTransformation,
  rng: jax.Array,
  ema: bool = False,
  frozen: Any = None,
) -> TrainState:
  """The state before the first update; `ema`: also an EMA of the parameters (a copy);
  `frozen`: the task's untrained variables (no optimizer state)."""
  return TrainState(
    step=jnp.zeros((), jnp.int32),
    params=params,
    opt_state=jax.jit(tx.init)(params),  # one compilation, not one per zeros shape
    rng=jax.random.key_data(rng) if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) else rng,
    nonfinite_count=jnp.zeros((), jnp.int32),
    first_nonfinite_step=jnp.full((), -1, jnp.int32),
    ema_params=copy_params(params) if ema else None,
    frozen=frozen,
    empty_count=jnp.zeros((), jnp.int32),
  )


def copy_params(params: Any) -> Any:
  """New buffers with the values of `params` (an EMA must not alias the donated params)."""
  return jax.tree.map(lambda x: jnp.array(x, copy=True), params)


def ema_decay_at(step: jax.Array, decay: float, warmup: bool) -> jax.Array:
  """The EMA decay of the update applied at state step `step` (float32 scalar)."""
  d = jnp.float32(decay)
  if not warmup:
    return d
  t = jnp.asarray(step, jnp.float32)
  return jnp.minimum(d, (1.0 + t) / (10.0 + t))


def _update_ema(cfg: StepConfig, state: TrainState, params: Any) -> Any:
  if cfg.ema_decay == 0.0:
    return state.ema_params
  if state.ema_params is None:
    raise ValueError(
      "StepConfig.ema_decay > 0 but the train state has no ema_params; build it with "
      "create_train_state(..., ema=True)"
    )
  d = ema_decay_at(state.step, cfg.ema_decay, cfg.ema_warmup)
  return jax.tree.map(lambda e, p: d * e + (1.0 - d) * p, state.ema_params, params)


def _objective(cfg: StepConfig, params, frozen, batch: Batch, rng, deterministic: bool) -> dict:
  """The task's sums of one (micro-)batch: {'loss', 'normalizer', its metric sums}.
  `frozen`: the task's untrained variables (training steps only; evaluation scores the
  model alone)."""
  rngs = {"dropout": rng} if rng is not None else {}
  variables = {"params": params} if frozen is None else {"params": params, "frozen": frozen}
  # On a mesh, the model pins its activations to it by their logical axes as it traces.
  layout = partitioning.activation_layout(*cfg.layout) if cfg.layout else contextlib.nullcontext()
  with layout:
    loss_sum, normalizer, metrics = cfg.task.objective(
      cfg.model, variables, batch, deterministic, rngs
    )
  return {"loss": loss_sum, "normalizer": normalizer, **metrics}


def _means(sums: dict, denom: Any, exp: Any) -> dict:
  """The logged means of global sums: the loss and each metric sum over `denom` (the
  normalizer), and `perplexity` = exp of the `nll` mean where the task returns one."""
  means = {k: v / denom for k, v in sums.items() if k != "normalizer"}
  if "nll" in means:
    means["perplexity"] = exp(means["nll"])
  return means


def _global_norm(tree) -> jax.Array:
  return optax.tree.norm(tree)


def _inputs_finite(batch: Batch, axis_name: str | None) -> jax.Array:
  """bool scalar: no NaN/Inf in any floating-point array of the (global) batch."""
  checks = [
    jnp.isfinite(x).all() for x in jax.tree.leaves(batch) if jnp.issubdtype(x.dtype, jnp.floating)
  ]
  ok = jnp.all(jnp.stack(checks)) if checks else jnp.bool_(True)
  if axis_name is not None:  # pmap: every device must take the same decision
    ok = lax.pmin(ok.astype(jnp.int32), axis_name) > 0
  return ok


def _denominator(normalizer: jax.Array) -> jax.Array:
  """The global normalizer, or 1 where it is 0 (an empty update: never applied)."""
  return jnp.where(normalizer > 0, normalizer, 1.0)


def gradients(state: TrainState, batch: Batch, cfg: StepConfig) -> tuple[Any, dict]:
  """(the mean gradient of the loss over the global batch, the objective's global sums):
  every micro-batch's gradient of its loss sum, summed over micro-batches and devices and
  divided by the global normalizer (by 1 where it is 0)."""
  rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
  if cfg.axis_name is not None:  # each device draws its own dropout masks
    rng = jax.random.fold_in(rng, lax.axis_index(cfg.axis_name))

  def loss_fn(params, b, r):
    sums = _objective(cfg, params, state.frozen, b, r, False)
    return sums["loss"], sums

  grad_fn = jax.grad(loss_fn, has_aux=True)
  if cfg.grad_accum_steps == 1:
    grads, sums = grad_fn(state.params, batch, rng)
  else:
    k = cfg.grad_accum_steps
    micro = jax.tree.map(lambda x: x.reshape(k, x.shape[0] // k, *x.shape[1:]), batch)

    def accumulate(carry, inputs):
      i, mb = inputs
      g, s = grad_fn(state.params, mb, jax.random.fold_in(rng, i))
      return jax.tree.map(jnp.add, carry, (g, s)), None

    zeros = jax.tree.map(
      jnp.zeros_like,
      jax.eval_shape(grad_fn, state.params, jax.tree.map(lambda x: x[0], micro), rng),
    )
    (grads, sums), _ = lax.scan(accumulate, zeros, (jnp.arange(k), micro))

  if cfg.axis_name is not None:
    grads, sums = lax.psum((grads, sums), cfg.axis_name)
  denom = _denominator(sums["normalizer"])
  return jax.tree.map(lambda g: g / denom, grads), sums


def apply_gradients(
  state: TrainState, grads: Any, sums: dict, batch: Batch, cfg: StepConfig
) -> tuple[TrainState, dict]:
  """The optimizer's update from `grads` (the mean gradient), applied unless it or the
  batch holds a NaN/Inf or the global normalizer `sums['normalizer']` is 0; the EMA, the
  counters and the logged metrics (`batch` is read for its finiteness only)."""
  denom = _denominator(sums["normalizer"])
  updates, opt_state = cfg.tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)

  grad_norm = _global_norm(grads)
  update_norm = _global_norm(updates)
  loss = sums["loss"] / denom
  inputs_finite = _inputs_finite(batch, cfg.axis_name)
  finite = inputs_finite & jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.isfinite(update_norm)
  metrics = {
    **_means(sums, denom, jnp.exp),  # loss, the task's metrics
    "normalizer": sums["normalizer"],
    "grad_norm": grad_norm,
    "param_norm": _global_norm(state.params),
    "update_norm": update_norm,
    "learning_rate": cfg.schedule(state.step) if cfg.schedule is not None else jnp.nan,
    "nonfinite_inputs": (~inputs_finite).astype(jnp.float32),  # 1: a NaN/Inf in the batch
  }
  new_state = state.replace(
    step=state.step + 1,
    params=params,
    opt_state=opt_state,
    ema_params=_update_ema(cfg, state, params),
  )
  # A NaN/Inf update is never applied: the old weights and optimizer state are kept and the
  # event is recorded. The loop stops on it, or with skip_nonfinite moves on and counts it.
  # Nor is an empty one (global normalizer 0: nothing to average over); it is counted apart.
  empty = finite & ~(sums["normalizer"] > 0)
  apply = finite & ~empty
  new_state = jax.tree.map(lambda new, old: jnp.where(apply, new, old), new_state, state)
  if state.empty_count is not None:
    new_state = new_state.replace(empty_count=state.empty_count + empty.astype(jnp.int32))
  bad = (~finite).astype(jnp.int32)
  first = jnp.where(
    (state.first_nonfinite_step < 0) & ~finite, state.step + 1, state.first_nonfinite_step
  )
  new_state = new_state.replace(
    step=state.step + 1, nonfinite_count=state.nonfinite_count + bad, first_nonfinite_step=first
  )
  return new_state, metrics


def train_step(state: TrainState, batch: Batch, *, cfg: StepConfig) -> tuple[TrainState, dict]:
  """One optimizer update on the (global) batch; returns the new state and metrics. The
  loop (`train/loop.py`) spells out its own copy of these two lines, the update a fork
  changes; this one serves the benchmarks and tests that build a `StepRunner` directly."""
  grads, sums = gradients(state, batch, cfg)
  return apply_gradients(state, grads, sums, batch, cfg)


def eval_step(params: Any, batch: Batch, *, cfg: StepConfig) -> dict[str, jax.Array]:
  """The task's sums of one evaluation batch ({'loss', 'normalizer', its metric sums};
  weights 0 on padded rows/tokens), scored with `deterministic=True`."""
  sums = _objective(cfg, params, None, batch, None, True)
  if cfg.axis_name is not None:
    sums = lax.psum(sums, cfg.axis_name)
  return sums


def summarize_eval(sums: dict[str, float]) -> dict[str, float]:
  """Means from the evaluation sums summed over batches (floats), and the normalizer."""
  n = sums["normalizer"]
  means = _means(sums, n if n > 0 else 1.0, lambda x: math.exp(min(x, 700.0)))
  return {**means, "normalizer": sums["normalizer"]}

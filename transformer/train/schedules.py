"""Learning-rate schedules: optax-compatible functions of the optimizer step count.

Step convention (all schedules): optax calls a schedule with the *count* of updates
already applied, `c = 0, 1, 2, ...`. The papers define their formulas on step numbers
starting at 1, so every schedule here evaluates its formula at `step = c + 1`:

  lr(count c) = formula(step = c + 1)

The update that takes the train state from step `c` to `c + 1` therefore uses
`formula(c + 1)`: the first update uses `formula(1)` (never 0, unlike optax's own
`warmup_*` schedules evaluated at count 0), and linear warmup reaches the peak exactly at
update number `warmup_steps`.

Kinds (`create_schedule(kind, ...)`):
  noam           scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
                 (Vaswani et al. 2017, eq. 3; peak at step = warmup)
  cosine         linear warmup 0 -> learning_rate over warmup_steps, then cosine decay to
                 learning_rate * final_fraction at step = total_steps, constant after
  rsqrt          linear warmup, then learning_rate * sqrt(warmup / step): the inverse
                 square root 1/sqrt(max(step, warmup)) normalised so its peak is learning_rate
  constant       learning_rate, after an optional linear warmup
  wsd            warmup-stable-decay (Hu et al. 2024, MiniCPM; Hagele et al. 2024): linear
                 warmup over warmup_steps, learning_rate until the last
                 D = round(decay_fraction * total_steps) steps, then a decay of shape
                 `decay_shape` to learning_rate * final_fraction at step = total_steps,
                 constant after. With progress p = (step - (total_steps - D)) / D in [0, 1]:
                   lr = final + (learning_rate - final) * shape(p)
                 shape: linear 1 - p | cosine (1 + cos(pi p)) / 2 | 1-sqrt 1 - sqrt(p)
                 (the "1-sqrt" cooldown of Hagele et al. 2024, Sec. 3)

All schedules return a float32 scalar `jax.Array` and trace under `jax.jit`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

Schedule = Callable[[Any], jax.Array]  # optimizer count (int or int array) -> lr, float32 []

KINDS = ("noam", "cosine", "rsqrt", "constant", "wsd")

# Fields a schedule config block may carry; each kind uses a subset (see `_REQUIRED`).
FIELDS = (
  "learning_rate",
  "warmup_steps",
  "total_steps",
  "d_model",
  "scale",
  "final_fraction",
  "decay_fraction",
  "decay_shape",
)
_REQUIRED = {
  "noam": ("d_model", "warmup_steps"),
  "cosine": ("learning_rate", "total_steps"),
  "rsqrt": ("learning_rate", "warmup_steps"),
  "constant": ("learning_rate",),
  "wsd": ("learning_rate", "total_steps"),
}

# wsd decay shapes: progress p in [0, 1] -> the fraction of (peak - final) still applied.
DECAY_SHAPES: dict[str, Callable[[jax.Array], jax.Array]] = {
  "linear": lambda p: 1.0 - p,
  "cosine": lambda p: 0.5 * (1.0 + jnp.cos(jnp.pi * p)),
  "1-sqrt": lambda p: 1.0 - jnp.sqrt(p),
}


def _step(count: Any) -> jax.Array:
  """Optax count (0-based) -> formula step number (1-based), float32 []."""
  return jnp.asarray(count, jnp.float32) + 1.0


def _warmup_factor(step: jax.Array, warmup_steps: int) -> jax.Array:
  """min(1, step / warmup): linear warmup from 0 (step 0) to 1 (step = warmup)."""
  if warmup_steps == 0:
    return jnp.ones_like(step)
  return jnp.minimum(1.0, step / warmup_steps)


def noam(d_model: int, warmup_steps: int, scale: float = 1.0) -> Schedule:
  """Vaswani et al. 2017 eq. 3: `scale * D**-0.5 * min(step**-0.5, step * warmup**-1.5)`.

  Args:
    d_model: model width D.
    warmup_steps: step of the peak learning rate `scale * (D * warmup)**-0.5`.
    scale: multiplier (1.0 in the paper).
  """
  _check_int("d_model", d_model, minimum=1)
  _check_int("warmup_steps", warmup_steps, minimum=1)
  _check_positive("scale", scale)

  def schedule(count: Any) -> jax.Array:
    step = _step(count)
    return scale * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)

  return schedule


def warmup_cosine(
  learning_rate: float, total_steps: int, warmup_steps: int = 0, final_fraction: float = 0.0
) -> Schedule:
  """Linear warmup to `learning_rate`, cosine decay to `learning_rate * final_fraction`.

  Args:
    learning_rate: peak learning rate, reached at step = warmup_steps.
    total_steps: step at which the decay ends (includes the warmup); constant after.
    warmup_steps: linear-warmup length in steps (0: start at the peak).
    final_fraction: final learning rate as a fraction of the peak, in [0, 1].
  """
  _check_positive("learning_rate", learning_rate)
  _check_int("warmup_steps", warmup_steps, minimum=0)
  _check_int("total_steps", total_steps, minimum=1)
  if total_steps <= warmup_steps:
    raise ValueError(
      f"total_steps must be > warmup_steps for a cosine schedule; got total_steps={total_steps},"
      f" warmup_steps={warmup_steps}"
    )
  _check_fraction("final_fraction", final_fraction)
  inner = optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=learning_rate,
    warmup_steps=warmup_steps,
    decay_steps=total_steps,
    end_value=learning_rate * final_fraction,
  )
  return lambda count: jnp.asarray(inner(_step(count)), jnp.float32)


def warmup_rsqrt(learning_rate: float, warmup_steps: int) -> Schedule:
  """Linear warmup to `learning_rate`, then `learning_rate * sqrt(warmup / step)`.

  Args:
    learning_rate: peak learning rate, reached at step = warmup_steps.
    warmup_steps: end of the warmup and start of the inverse-square-root decay (>= 1).
  """
  _check_positive("learning_rate", learning_rate)
  _check_int("warmup_steps", warmup_steps, minimum=1)

  def schedule(count: Any) -> jax.Array:
    step = _step(count)
    decay = jnp.sqrt(warmup_steps / jnp.maximum(step, warmup_steps))
    return learning_rate * _warmup_factor(step, warmup_steps) * decay

  return schedule


def constant(learning_rate: float, warmup_steps: int = 0) -> Schedule:
  """`learning_rate`, after a linear warmup of `warmup_steps` steps (0: none)."""
  _check_positive("learning_rate", learning_rate)
  _check_int("warmup_steps", warmup_steps, minimum=0)

  def schedule(count: Any) -> jax.Array:
    return learning_rate * _warmup_factor(_step(count), warmup_steps)

  return schedule


def wsd(
  learning_rate: float,
  total_steps: int,
  warmup_steps: int = 0,
  decay_fraction: float = 0.1,
  decay_shape: str = "linear",
  final_fraction: float = 0.0,
) -> Schedule:
  """Warmup-stable-decay: linear warmup, constant `learning_rate`, then a final decay.

  Args:
    learning_rate: peak (and stable-phase) learning rate, reached at step = warmup_steps.
    total_steps: step at which the decay ends (includes warmup and decay); constant after.
    warmup_steps: linear-warmup length in steps (0: start at the peak).
    decay_fraction: share of `total_steps` in the decay, in (0, 1]; the decay lasts
      D = round(decay_fraction * total_steps) >= 1 steps, after the warmup.
    decay_shape: one of `DECAY_SHAPES` (linear, cosine, 1-sqrt).
    final_fraction: learning rate at step = total_steps as a fraction of the peak, in [0, 1].
  """
  _check_positive("learning_rate", learning_rate)
  _check_int("warmup_steps", warmup_steps, minimum=0)
  _check_int("total_steps", total_steps, minimum=1)
  _check_fraction("final_fraction", final_fraction)
  if (
    isinstance(decay_fraction, bool)
    or not isinstance(decay_fraction, (int, float))
    or not (0.0 < decay_fraction <= 1.0)
  ):
    raise ValueError(f"decay_fraction must be a number in (0, 1]; got {decay_fraction!r}")
  if decay_shape not in DECAY_SHAPES:
    raise ValueError(f"decay_shape must be one of {list(DECAY_SHAPES)}; got {decay_shape!r}")
  decay_steps = round(decay_fraction * total_steps)
  if decay_steps < 1:
    raise ValueError(
      f"decay_fraction={decay_fraction} gives round({decay_fraction} * total_steps="
      f"{total_steps}) = 0 decay steps; expected >= 1"
    )
  if warmup_steps + decay_steps > total_steps:
    raise ValueError(
      f"warmup_steps + decay steps must be <= total_steps for a wsd schedule; got "
      f"warmup_steps={warmup_steps} + {decay_steps} (decay_fraction={decay_fraction}) > "
      f"total_steps={total_steps}"
    )
  decay_start = total_steps - decay_steps
  final = learning_rate * final_fraction
  shape = DECAY_SHAPES[decay_shape]

  def schedule(count: Any) -> jax.Array:
    step = _step(count)
    progress = jnp.clip((step - decay_start) / decay_steps, 0.0, 1.0)
    return _warmup_factor(step, warmup_steps) * (final + (learning_rate - final) * shape(progress))

  return schedule


def create_schedule(kind: str, **fields: Any) -> Schedule:
  """Builds the schedule `kind` from the fields of a config block.

  Usage: `create_schedule(**config.schedule)` with a block such as
  `{"kind": "noam", "d_model": 512, "warmup_steps": 4000, "scale": 1.0}`.

  Args:
    kind: one of `KINDS`.
    **fields: any of `FIELDS`; a field the kind does not use is ignored (so one block
      can carry every field), a required one that is missing or None is an error.
      learning_rate (peak), warmup_steps, total_steps, d_model, scale (noam multiplier,
      default 1.0), final_fraction (cosine / wsd end as a fraction of the peak, default
      0.0), decay_fraction (wsd decay share of total_steps, default 0.1), decay_shape
      (wsd: linear | cosine | 1-sqrt, default linear).

  Raises:
    ValueError: naming the field, for an unknown kind or field, a missing required
      field, or a value out of range.
  """
  unknown = sorted(set(fields) - set(FIELDS))
  if unknown:
    raise ValueError(f"unknown schedule field(s) {unknown}; expected a subset of {list(FIELDS)}")
  if kind not in KINDS:
    raise ValueError(f"kind must be one of {list(KINDS)}; got {kind!r}")
  present = {k: v for k, v in fields.items() if v is not None}
  missing = [f for f in _REQUIRED[kind] if f not in present]
  if missing:
    raise ValueError(f"schedule kind {kind!r} requires field(s) {missing}")
  return _BUILDERS[kind](present, present.get("warmup_steps", 0))


# kind -> (fields present, warmup steps) -> schedule
_BUILDERS: dict[str, Callable[[dict[str, Any], int], Schedule]] = {
  "noam": lambda f, warmup: noam(f["d_model"], warmup, f.get("scale", 1.0)),
  "cosine": lambda f, warmup: warmup_cosine(
    f["learning_rate"], f["total_steps"], warmup, f.get("final_fraction", 0.0)
  ),
  "rsqrt": lambda f, warmup: warmup_rsqrt(f["learning_rate"], warmup),
  "constant": lambda f, warmup: constant(f["learning_rate"], warmup),
  "wsd": lambda f, warmup: wsd(
    f["learning_rate"],
    f["total_steps"],
    warmup,
    f.get("decay_fraction", 0.1),
    f.get("decay_shape", "linear"),
    f.get("final_fraction", 0.0),
  ),
}


def _check_int(name: str, value: Any, *, minimum: int) -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}")


def _check_positive(name: str, value: Any) -> None:
  if (
    isinstance(value, bool)
    or not isinstance(value, (int, float))
    or not math.isfinite(value)
    or value <= 0
  ):
    raise ValueError(f"{name} must be a finite number > 0; got {value!r}")


def _check_fraction(name: str, value: Any) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
    raise ValueError(f"{name} must be a number in [0, 1]; got {value!r}")

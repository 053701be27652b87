"""Token-level losses and accuracy, summed over weighted positions, in float32.

Shapes: B batch, T positions (absent for per-example classification), V classes.
`logits` are [B, T, V] or [B, V]; `targets` and `weights` have `logits.shape[:-1]`.
Positions with weight 0 (padding) contribute exactly 0, whatever their target or logits
(they are selected away, not multiplied, so an out-of-range padding target or a non-finite
padded logit cannot leak a NaN). Functions return sums, so callers can add them across
micro-batches and devices before dividing by the weight sum.

Label smoothing follows PyTorch `F.cross_entropy(label_smoothing=eps)`: the target
distribution is q = (1 - eps) * one_hot(target) + eps / V over all V classes, i.e.
q[target] = 1 - eps + eps / V and q[other] = eps / V. The cross-entropy H(q, p) is
computed without materialising q:

  H(q, p) = -(1 - eps) * log p[target] - eps * mean_v log p[v]
          = logsumexp(z) - (1 - eps) * z[target] - eps * mean_v z[v]

Its minimum over p, reached at p = q, is the entropy of q, the "normalizing offset"
(`smoothing_offset`); `loss / weight - offset` is 0 for a perfect model.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax


def smoothing_offset(label_smoothing: float, vocab_size: int) -> float:
  """Entropy (nats) of the smoothed target distribution: the per-token loss floor.

  offset = -[(1 - eps + eps/V) * log(1 - eps + eps/V) + (V - 1) * (eps/V) * log(eps/V)],
  with 0 * log 0 = 0 (so eps = 0 gives 0).
  """
  _check_smoothing(label_smoothing)
  if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
    raise ValueError(f"vocab_size must be an int >= 1; got {vocab_size!r}")
  eps, v = float(label_smoothing), vocab_size
  confidence, low = 1.0 - eps + eps / v, eps / v
  offset = -confidence * math.log(confidence)
  if low > 0:
    offset -= (v - 1) * low * math.log(low)
  return offset


def cross_entropy_with_label_smoothing(
  logits: jax.Array,
  targets: jax.Array,
  weights: jax.Array | None = None,
  label_smoothing: float = 0.0,
  z_loss: float = 0.0,
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
  """Summed label-smoothed cross-entropy (+ optional z-loss) over weighted positions.

  Args:
    logits: [B, T, V] or [B, V], any float dtype (computed in float32).
    targets: int class ids, `logits.shape[:-1]`, in [0, V) where weight > 0.
    weights: 0/1 mask or float weights, `logits.shape[:-1]` (None: all ones).
    label_smoothing: eps in [0, 1); PyTorch semantics (see module docstring).
    z_loss: coefficient of the z-loss `z_loss * logsumexp(logits)**2` per position
      (PaLM, Chowdhery et al. 2022), >= 0.

  Returns:
    (loss_sum, weight_sum, extra), float32 scalars in nats:
      loss_sum: sum_w [H(q, p) + z_loss * logsumexp**2], what to differentiate.
      weight_sum: sum of weights.
      extra: {
        "nll_sum": sum_w -log p[target] (unsmoothed; exp(nll_sum / weight_sum) is the
          perplexity),
        "z_loss_sum": the z-loss part of loss_sum,
        "normalizing_offset": `smoothing_offset(eps, V)`, a per-position constant:
          (loss_sum - z_loss_sum) / weight_sum - offset is 0 for a perfect model.
      }
  """
  _check_logits_targets(logits, targets, "cross_entropy_with_label_smoothing")
  weights = _weights_or_ones(weights, targets, "cross_entropy_with_label_smoothing")
  _check_smoothing(label_smoothing)
  if not (isinstance(z_loss, (int, float)) and math.isfinite(z_loss) and z_loss >= 0):
    raise ValueError(f"z_loss must be a finite number >= 0; got {z_loss!r}")
  vocab = logits.shape[-1]
  eps = float(label_smoothing)

  z = logits.astype(jnp.float32)  # [..., V]
  log_z = jax.nn.logsumexp(z, axis=-1)  # [...]
  target_logit = jnp.take_along_axis(z, targets[..., None].astype(jnp.int32), -1, mode="clip")
  target_logit = target_logit[..., 0]  # [...]
  nll = log_z - target_logit  # [...]
  smoothed = nll
  if eps > 0:
    smoothed = log_z - (1.0 - eps) * target_logit - eps * jnp.mean(z, axis=-1)  # [...]
  z_term = z_loss * jnp.square(log_z)  # [...]

  keep = weights > 0
  w = weights.astype(jnp.float32)

  def weighted_sum(x: jax.Array) -> jax.Array:
    return jnp.sum(jnp.where(keep, x * w, 0.0))

  extra = {
    "nll_sum": weighted_sum(nll),
    "z_loss_sum": weighted_sum(z_term) if z_loss else jnp.zeros((), jnp.float32),
    "normalizing_offset": jnp.asarray(smoothing_offset(eps, vocab), jnp.float32),
  }
  loss_sum = weighted_sum(smoothed + z_term) if z_loss else weighted_sum(smoothed)
  return loss_sum, jnp.sum(jnp.where(keep, w, 0.0)), extra


def cross_entropy(
  logits: jax.Array,
  targets: jax.Array,
  weights: jax.Array | None = None,
  label_smoothing: float = 0.0,
  z_loss: float = 0.0,
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
  """The loss of a cross-entropy task, as `Task.loss` returns it: (loss_sum, weight_sum,
  metric sums), float32 scalars. loss_sum and weight_sum are those of
  `cross_entropy_with_label_smoothing`; the metrics are `accuracy` (the weight of the
  positions whose argmax is the target), `nll` (unsmoothed; its mean's exp is the
  perplexity) and `normalized_loss` (loss_sum - offset * weight_sum: 0 for a model that
  matches the smoothed targets, without a z-loss)."""
  loss_sum, weight_sum, extra = cross_entropy_with_label_smoothing(
    logits, targets, weights, label_smoothing, z_loss
  )
  correct, _ = accuracy_sum(logits, targets, weights)
  metrics = {
    "accuracy": correct,
    "nll": extra["nll_sum"],
    "normalized_loss": loss_sum - extra["normalizing_offset"] * weight_sum,
  }
  return loss_sum, weight_sum, metrics


def accuracy_sum(
  logits: jax.Array, targets: jax.Array, weights: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
  """Weighted count of positions whose argmax equals the target.

  Args:
    logits: [B, T, V] or [B, V].
    targets: int, `logits.shape[:-1]`.
    weights: 0/1 mask or float weights, `logits.shape[:-1]` (None: all ones).

  Returns:
    (correct_sum, weight_sum), float32 scalars; accuracy = correct_sum / weight_sum.
    Ties go to the lowest class id (`argmax`).
  """
  _check_logits_targets(logits, targets, "accuracy_sum")
  weights = _weights_or_ones(weights, targets, "accuracy_sum")
  # argmax(logits) == target without argmax (a variadic reduce, slow on CPU): the target
  # attains the maximum and no lower class id does; NaN counts as the maximum, as in argmax.
  top = jnp.max(logits, axis=-1, keepdims=True)  # [..., 1]
  is_top = (logits == top) | jnp.isnan(logits)  # [..., V]
  target = targets[..., None].astype(jnp.int32)
  target_logit = jnp.take_along_axis(logits, target, -1, mode="clip")  # [..., 1]
  target_is_top = ((target_logit == top) | jnp.isnan(target_logit))[..., 0]  # [...]
  ids = lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
  lower_is_top = jnp.any(is_top & (ids < target), axis=-1)  # [...]
  correct = target_is_top & ~lower_is_top  # [...]
  keep = weights > 0
  w = weights.astype(jnp.float32)
  return jnp.sum(jnp.where(keep & correct, w, 0.0)), jnp.sum(jnp.where(keep, w, 0.0))


def _check_logits_targets(logits: jax.Array, targets: jax.Array, fn: str) -> None:
  if not hasattr(logits, "ndim") or logits.ndim not in (2, 3):
    raise ValueError(
      f"{fn}: logits must be [B, T, V] or [B, V]; got shape {getattr(logits, 'shape', None)}"
    )
  if not jnp.issubdtype(logits.dtype, jnp.floating):
    raise ValueError(f"{fn}: logits must be floating; got dtype {logits.dtype}")
  if not hasattr(targets, "shape") or tuple(targets.shape) != tuple(logits.shape[:-1]):
    raise ValueError(
      f"{fn}: targets must have shape logits.shape[:-1] = {tuple(logits.shape[:-1])};"
      f" got {getattr(targets, 'shape', None)}"
    )
  if not jnp.issubdtype(targets.dtype, jnp.integer):
    raise ValueError(f"{fn}: targets must be integer class ids; got dtype {targets.dtype}")


def _weights_or_ones(weights: jax.Array | None, targets: jax.Array, fn: str) -> jax.Array:
  if weights is None:
    return jnp.ones(targets.shape, jnp.float32)
  if not hasattr(weights, "shape") or tuple(weights.shape) != tuple(targets.shape):
    raise ValueError(
      f"{fn}: weights must have the targets' shape {tuple(targets.shape)};"
      f" got {getattr(weights, 'shape', None)}"
    )
  return weights


def _check_smoothing(label_smoothing: float) -> None:
  if (
    isinstance(label_smoothing, bool)
    or not isinstance(label_smoothing, (int, float))
    or not 0.0 <= label_smoothing < 1.0
  ):
    raise ValueError(f"label_smoothing must be a number in [0, 1); got {label_smoothing!r}")

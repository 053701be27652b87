"""Losses against a float64 NumPy reference and PyTorch's own cross-entropy."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from transformer.tasks import losses


def _random_batch(seed=0, b=3, t=7, v=11, scale=3.0):
  rng = np.random.default_rng(seed)
  logits = (scale * rng.standard_normal((b, t, v))).astype(np.float32)
  targets = rng.integers(0, v, size=(b, t)).astype(np.int32)
  weights = (rng.random((b, t)) > 0.3).astype(np.float32)
  return logits, targets, weights


def _numpy_reference(logits, targets, weights, eps, z_loss=0.0):
  """Float64, explicit smoothed target distribution q: sum_w -sum_v q_v log p_v."""
  z = logits.astype(np.float64)
  v = z.shape[-1]
  log_z = np.log(np.sum(np.exp(z - z.max(-1, keepdims=True)), -1)) + z.max(-1)
  log_p = z - log_z[..., None]
  q = np.full(z.shape, eps / v)
  np.put_along_axis(q, targets[..., None], 1 - eps + eps / v, axis=-1)
  per_token = -np.sum(q * log_p, -1) + z_loss * log_z**2
  nll = -np.take_along_axis(log_p, targets[..., None], -1)[..., 0]
  return np.sum(per_token * weights), np.sum(weights), np.sum(nll * weights)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.4])
def test_matches_float64_numpy_reference(eps):
  logits, targets, weights = _random_batch()
  loss, wsum, extra = losses.cross_entropy_with_label_smoothing(
    jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights), label_smoothing=eps
  )
  ref_loss, ref_w, ref_nll = _numpy_reference(logits, targets, weights, eps)
  np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-5)
  np.testing.assert_allclose(float(extra["nll_sum"]), ref_nll, rtol=1e-5)
  assert float(wsum) == ref_w
  assert float(extra["z_loss_sum"]) == 0.0


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.25])
def test_matches_pytorch_cross_entropy_with_ignored_padding(eps):
  logits, targets, weights = _random_batch(seed=1, b=4, t=9, v=13)
  loss, wsum, _ = losses.cross_entropy_with_label_smoothing(
    jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights), label_smoothing=eps
  )
  torch_targets = torch.from_numpy(np.where(weights > 0, targets, -100).astype(np.int64))
  want = F.cross_entropy(
    torch.from_numpy(logits).double().reshape(-1, logits.shape[-1]),
    torch_targets.reshape(-1),
    ignore_index=-100,
    label_smoothing=eps,
    reduction="sum",
  )
  np.testing.assert_allclose(float(loss), want.item(), rtol=1e-5)
  assert float(wsum) == weights.sum()


def test_two_dimensional_logits_for_classification():
  logits, targets, _ = _random_batch(seed=2)
  logits2, targets2 = logits[:, 0], targets[:, 0]  # [B, V], [B]
  loss, wsum, _ = losses.cross_entropy_with_label_smoothing(
    jnp.asarray(logits2), jnp.asarray(targets2), label_smoothing=0.1
  )
  want = F.cross_entropy(
    torch.from_numpy(logits2).double(),
    torch.from_numpy(targets2).long(),
    label_smoothing=0.1,
    reduction="sum",
  )
  np.testing.assert_allclose(float(loss), want.item(), rtol=1e-5)
  assert float(wsum) == logits2.shape[0]


def test_padding_contributes_nothing_even_with_garbage_targets_and_logits():
  logits, targets, weights = _random_batch(seed=3)
  base, base_w, base_extra = losses.cross_entropy_with_label_smoothing(
    jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights), 0.1, z_loss=1e-3
  )
  pad = weights == 0
  assert pad.any()
  garbage_logits = np.where(pad[..., None], np.inf, logits).astype(np.float32)
  garbage_targets = np.where(pad, 10_000, targets).astype(np.int32)
  loss, wsum, extra = losses.cross_entropy_with_label_smoothing(
    jnp.asarray(garbage_logits), jnp.asarray(garbage_targets), jnp.asarray(weights), 0.1, 1e-3
  )
  assert np.isfinite(float(loss))
  assert float(loss) == float(base) and float(wsum) == float(base_w)
  assert float(extra["nll_sum"]) == float(base_extra["nll_sum"])


def test_float_weights_scale_each_position():
  logits, targets, _ = _random_batch(seed=4)
  weights = np.random.default_rng(4).random(targets.shape).astype(np.float32)
  loss, wsum, _ = losses.cross_entropy_with_label_smoothing(
    jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights), 0.2
  )
  ref_loss, ref_w, _ = _numpy_reference(logits, targets, weights, 0.2)
  np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-5)
  np.testing.assert_allclose(float(wsum), ref_w, rtol=1e-6)


def test_z_loss_adds_squared_log_partition():
  logits, targets, weights = _random_batch(seed=5)
  loss, _, extra = losses.cross_entropy_with_label_smoothing(
    jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights), 0.1, z_loss=1e-2
  )
  ref_loss, _, _ = _numpy_reference(logits, targets, weights, 0.1, z_loss=1e-2)
  ref_plain, _, _ = _numpy_reference(logits, targets, weights, 0.1)
  np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-5)
  np.testing.assert_allclose(float(extra["z_loss_sum"]), ref_loss - ref_plain, rtol=1e-4)


@pytest.mark.parametrize(("eps", "vocab"), [(0.1, 32), (0.3, 5), (0.0, 7), (0.1, 2)])
def test_exact_smoothed_distribution_scores_the_normalizing_offset(eps, vocab):
  targets = np.arange(6) % vocab
  q = np.full((6, vocab), eps / vocab)
  q[np.arange(6), targets] = 1 - eps + eps / vocab
  with np.errstate(divide="ignore"):  # eps = 0: log 0 = -inf off the target
    logits = jnp.asarray(np.log(q), jnp.float32)  # log-probs of the smoothed target
  loss, wsum, extra = losses.cross_entropy_with_label_smoothing(
    logits, jnp.asarray(targets, jnp.int32), label_smoothing=eps
  )
  offset = float(extra["normalizing_offset"])
  assert offset == pytest.approx(losses.smoothing_offset(eps, vocab), rel=1e-6)
  assert float(loss) / float(wsum) - offset == pytest.approx(0.0, abs=1e-5)
  # Any other prediction scores above the floor (Gibbs' inequality).
  worse = jnp.asarray(np.log(0.8 * q + 0.2 / vocab), jnp.float32)
  worse_loss, _, _ = losses.cross_entropy_with_label_smoothing(
    worse, jnp.asarray(targets, jnp.int32), label_smoothing=eps
  )
  assert float(worse_loss) / 6 > offset + 1e-4


def test_offset_closed_form():
  eps, v = 0.1, 4
  hi, lo = 1 - eps + eps / v, eps / v
  assert losses.smoothing_offset(eps, v) == pytest.approx(
    -(hi * math.log(hi) + (v - 1) * lo * math.log(lo))
  )
  assert losses.smoothing_offset(0.0, 1000) == 0.0


def test_bfloat16_logits_are_computed_in_float32():
  logits, targets, weights = _random_batch(seed=6, v=50, scale=8.0)
  bf16 = jnp.asarray(logits, jnp.bfloat16)
  loss, wsum, extra = losses.cross_entropy_with_label_smoothing(
    bf16, jnp.asarray(targets), jnp.asarray(weights), 0.1
  )
  assert loss.dtype == jnp.float32 and wsum.dtype == jnp.float32
  upcast = np.asarray(bf16.astype(jnp.float32))  # exactly the bf16 values, in float64 below
  ref_loss, _, ref_nll = _numpy_reference(upcast, targets, weights, 0.1)
  np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-5)
  np.testing.assert_allclose(float(extra["nll_sum"]), ref_nll, rtol=1e-5)


def test_jit_and_gradient_match_softmax_minus_smoothed_target():
  logits, targets, weights = _random_batch(seed=7)
  eps, v = 0.1, logits.shape[-1]

  def mean_loss(z):
    loss, wsum, _ = losses.cross_entropy_with_label_smoothing(
      z, jnp.asarray(targets), jnp.asarray(weights), eps
    )
    return loss / wsum

  grad = jax.jit(jax.grad(mean_loss))(jnp.asarray(logits))
  p = np.asarray(jax.nn.softmax(jnp.asarray(logits, jnp.float32)), np.float64)
  q = np.full(p.shape, eps / v)
  np.put_along_axis(q, targets[..., None], 1 - eps + eps / v, axis=-1)
  want = (p - q) * weights[..., None] / weights.sum()
  np.testing.assert_allclose(np.asarray(grad), want, atol=1e-6)


def test_accuracy_sum_counts_weighted_argmax_hits():
  logits = jnp.asarray(
    [[[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [1.0, 1.0, 5.0], [0.0, 0.0, 1.0]]], jnp.float32
  )  # argmax per position: 0, 1, 2, 2
  targets = jnp.asarray([[0, 2, 2, 1]], jnp.int32)
  weights = jnp.asarray([[1.0, 1.0, 0.0, 1.0]])
  correct, wsum = losses.accuracy_sum(logits, targets, weights)
  assert float(correct) == 1.0 and float(wsum) == 3.0
  correct, wsum = losses.accuracy_sum(logits, targets)
  assert float(correct) == 2.0 and float(wsum) == 4.0


@pytest.mark.parametrize(
  ("kwargs", "field"),
  [
    ({"logits": np.zeros((2, 3, 4, 5), np.float32)}, "logits"),
    ({"logits": np.zeros((2, 3, 5), np.int32)}, "logits"),
    ({"targets": np.zeros((2, 4), np.int32)}, "targets"),
    ({"targets": np.zeros((2, 3), np.float32)}, "targets"),
    ({"weights": np.ones((2, 4), np.float32)}, "weights"),
    ({"label_smoothing": 1.0}, "label_smoothing"),
    ({"label_smoothing": -0.1}, "label_smoothing"),
    ({"z_loss": -1.0}, "z_loss"),
  ],
)
def test_bad_arguments_raise_value_error_naming_the_field(kwargs, field):
  args = {
    "logits": np.zeros((2, 3, 5), np.float32),
    "targets": np.zeros((2, 3), np.int32),
    "weights": np.ones((2, 3), np.float32),
  }
  args.update(kwargs)
  args = {k: jnp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in args.items()}
  with pytest.raises(ValueError, match=field):
    losses.cross_entropy_with_label_smoothing(**args)
  if set(kwargs) <= {"logits", "targets", "weights"}:
    with pytest.raises(ValueError, match=field):
      losses.accuracy_sum(args["logits"], args["targets"], args["weights"])


def test_accuracy_sum_equals_argmax_with_ties_and_nans():
  rng = np.random.default_rng(3)
  logits = rng.integers(-2, 3, size=(4, 9, 6)).astype(np.float32)  # many ties
  logits[0, 1, 3] = logits[2, 5, 0] = logits[2, 5, 4] = np.nan  # argmax picks the first NaN
  targets = rng.integers(0, 6, size=(4, 9)).astype(np.int32)
  targets[0, 1], targets[2, 5] = 3, 4
  argmax = np.asarray(jnp.argmax(jnp.asarray(logits), axis=-1))
  targets[1] = argmax[1]  # some hits on tied maxima
  weights = (rng.random((4, 9)) > 0.2).astype(np.float32)
  correct, _ = losses.accuracy_sum(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights))
  assert float(correct) == float(((argmax == targets) * weights).sum())

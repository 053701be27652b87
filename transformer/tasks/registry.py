"""How each batch format feeds its model: logits, targets and weights of one batch.

Letters: B batch, T length, S source length, V vocabulary, C classes.
Batch formats are those of `transformer.data` (see docs/DATA.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

Batch = Mapping[str, jax.Array]


def _lm(model, variables, batch, deterministic, rngs):
  logits = model.apply(
    variables,
    batch["inputs"],
    positions=batch["positions"],
    segment_ids=batch["segment_ids"],
    deterministic=deterministic,
    rngs=rngs,
  )  # [B, T, V]
  return logits, batch["targets"], batch["weights"]


def _mlm(model, variables, batch, deterministic, rngs, max_predictions=None):
  """All T positions, or the scored ones (weight > 0, in order) padded to `max_predictions`
  per row; rows with more scored positions than that are refused on the host
  (`check_mlm_batch`)."""
  targets, weights, predict = batch["targets"], batch["weights"], None
  if max_predictions is not None:
    scored_first = jnp.argsort(weights <= 0, axis=-1, stable=True)  # [B, T]
    predict = scored_first[:, :max_predictions]  # [B, P]; weight 0 where a row has fewer
    targets = jnp.take_along_axis(targets, predict, axis=-1)
    weights = jnp.take_along_axis(weights, predict, axis=-1)
  logits = model.apply(
    variables,
    batch["inputs"],
    segment_ids=batch["segment_ids"],
    positions=batch["positions"],
    deterministic=deterministic,
    rngs=rngs,
    predict_positions=predict,
  )  # [B, T or P, V]
  return logits, targets, weights


def check_mlm_batch(batch: Mapping[str, np.ndarray], max_predictions: int | None) -> None:
  """Host-side guard for `_mlm`: no row scores more than `max_predictions` positions."""
  if max_predictions is None:
    return
  most = int(np.max(np.sum(np.asarray(batch["weights"]) > 0, axis=-1), initial=0))
  if most > max_predictions:
    raise ValueError(
      f"an MLM batch row scores {most} positions, more than the {max_predictions} the train "
      "step predicts per row (data.mask_rate x seq_len); the batch does not come from "
      "transformer.data's MLM masking"
    )


def _labels_and_weights(batch: Batch) -> tuple[jax.Array, jax.Array]:
  """[B] labels and weights of whole-example tasks: evaluation pads rows with label -1."""
  label = batch["label"]
  return jnp.maximum(label, 0), (label >= 0).astype(jnp.float32)


def _classification(model, variables, batch, deterministic, rngs):
  logits = model.apply(
    variables,
    batch["inputs"],
    segment_ids=batch["segment_ids"],
    positions=batch["positions"],
    deterministic=deterministic,
    rngs=rngs,
  )  # [B, C]
  return logits, *_labels_and_weights(batch)


def _seq2seq(model, variables, batch, deterministic, rngs):
  logits = model.apply(
    variables,
    batch["inputs"],
    batch["targets"],
    inputs_segment_ids=batch["inputs_segment_ids"],
    targets_segment_ids=batch["targets_segment_ids"],
    inputs_positions=batch["inputs_positions"],
    targets_positions=batch["targets_positions"],
    deterministic=deterministic,
    rngs=rngs,
  )  # [B, T, V]
  return logits, batch["targets"], batch["weights"]


def _image(model, variables, batch, deterministic, rngs):
  logits = model.apply(variables, batch["image"], deterministic=deterministic, rngs=rngs)  # [B, C]
  return logits, *_labels_and_weights(batch)


Forward = Callable[[nn.Module, dict, Batch, bool, dict], tuple[jax.Array, jax.Array, jax.Array]]

# Data kind -> forward(model, variables, batch, deterministic, rngs) -> (logits, targets, weights)
FORWARD: dict[str, Forward] = {
  "lm": _lm,
  "mlm": _mlm,
  "classification": _classification,
  "seq2seq": _seq2seq,
  "image": _image,
}

# Data kind -> how many tokens (or examples) one batch row contributes: used for tokens/s.
TOKEN_KEY: dict[str, str] = {
  "lm": "segment_ids",
  "mlm": "segment_ids",
  "classification": "segment_ids",
  "seq2seq": "targets_segment_ids",
  "image": "label",
}


def init_inputs(kind: str, batch: Batch) -> tuple[tuple, dict]:
  """Positional and keyword arguments for `model.init` on a batch of this kind."""
  if kind == "lm":
    return (batch["inputs"],), {
      "positions": batch["positions"],
      "segment_ids": batch["segment_ids"],
    }
  if kind in ("mlm", "classification"):
    return (batch["inputs"],), {
      "segment_ids": batch["segment_ids"],
      "positions": batch["positions"],
    }
  if kind == "seq2seq":
    return (batch["inputs"], batch["targets"]), {
      "inputs_segment_ids": batch["inputs_segment_ids"],
      "targets_segment_ids": batch["targets_segment_ids"],
    }
  return (batch["image"],), {}

"""What the whole-example tasks (text and image classification) share: labels, and the
confusion-matrix evaluator as their default."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from transformer.tasks.base import Batch, Task


def labels_and_weights(batch: Batch) -> tuple[jax.Array, jax.Array]:
  """[B] labels and weights of whole-example tasks: evaluation pads rows with label -1."""
  label = batch["label"]
  return jnp.maximum(label, 0), (label >= 0).astype(jnp.float32)


class Classifying(Task):
  """Mixin for tasks with one label per example; their default evaluator is the confusion
  matrix."""

  evaluators = ("confusion",)

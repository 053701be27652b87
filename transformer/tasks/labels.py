"""What the whole-example tasks (text and image classification) share: labels, confusion."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp

from transformer.tasks import evals
from transformer.tasks.base import Batch, EvalOptions, Run, Task


def labels_and_weights(batch: Batch) -> tuple[jax.Array, jax.Array]:
  """[B] labels and weights of whole-example tasks: evaluation pads rows with label -1."""
  label = batch["label"]
  return jnp.maximum(label, 0), (label >= 0).astype(jnp.float32)


class Classifying(Task):
  """Mixin for tasks with one label per example: a confusion matrix in `eval.py`."""

  def evaluate(self, run: Run, options: EvalOptions) -> dict:
    del options
    counts = evals.confusion_matrix(
      run.model, run.params, self.apply, run.eval_factory(), run.eval_batches
    )
    names = list(run.info.label_names) or [str(i) for i in range(len(counts))]
    png = os.path.join(run.workdir, f"confusion_step_{run.step}.png")
    table = evals.write_confusion(counts, names, png) if jax.process_index() == 0 else ""
    return {"confusion_matrix": counts.tolist(), "confusion_table": table}

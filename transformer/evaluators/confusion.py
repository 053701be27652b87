"""Confusion matrices of classifiers (text and images), from `eval.py`: the counts, a
Markdown table and a PNG heatmap in the workdir (`confusion_step_<STEP>.png`)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer.evaluators.base import Evaluator, NoOptions
from transformer.tasks.base import Run, Task


@dataclasses.dataclass(frozen=True)
class Confusion(Evaluator):
  """counts[true, predicted] over the evaluation batches, with the split's label names."""

  name = "confusion"
  forward: Callable | None = None  # the task's forward pass (`Task.apply`)

  @classmethod
  def unsupported(cls, task: Task) -> str | None:
    return None if task.data_spec().labelled else "needs one class label per example (a classifier)"

  @classmethod
  def for_training(cls, task: Task, options: NoOptions, seed: int) -> Confusion:
    del options, seed  # eval.py only: neither periodic nor at the end
    return cls(forward=task.apply)

  @classmethod
  def for_eval(cls, task: Task, options: NoOptions) -> Confusion:
    del options
    return cls(forward=task.apply)

  def run(self, run: Run) -> dict[str, Any]:
    counts = confusion_matrix(
      run.model, run.params, self.forward, run.eval_factory(), run.eval_batches
    )
    names = list(run.info.label_names) or [str(i) for i in range(len(counts))]
    png = os.path.join(run.workdir, f"confusion_step_{run.step}.png")
    table = write_confusion(counts, names, png) if jax.process_index() == 0 else ""
    return {"confusion_matrix": counts.tolist(), "confusion_table": table}


def confusion_matrix(
  model: nn.Module, params: Any, forward, eval_iter: Iterable[dict], max_batches: int = 0
) -> np.ndarray:
  """counts[true, predicted] over the evaluation batches (padded rows, label -1, excluded).

  `forward(model, variables, batch) -> (logits [B, C], ...)` is the task's forward pass
  (`Task.apply`).
  """
  predict = jax.jit(lambda p, b: jnp.argmax(forward(model, {"params": p}, b)[0], axis=-1))
  n = model.config.num_classes
  counts = np.zeros((n, n), np.int64)
  for i, batch in enumerate(eval_iter):
    if max_batches and i >= max_batches:
      break
    pred = np.asarray(predict(params, batch))
    label = batch["label"]
    valid = label >= 0
    np.add.at(counts, (label[valid], pred[valid]), 1)
  return counts


def write_confusion(counts: np.ndarray, names: list[str], path_png: str) -> str:
  """Writes the confusion matrix as a PNG heatmap; returns it as a Markdown table."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  n = len(names)
  fig, ax = plt.subplots(figsize=(1.0 + 0.6 * n, 1.0 + 0.6 * n), dpi=100)
  ax.imshow(counts, cmap="Blues")
  ax.set_xticks(range(n), names, rotation=90)
  ax.set_yticks(range(n), names)
  ax.set_xlabel("predicted")
  ax.set_ylabel("true")
  for t in range(n):
    for p in range(n):
      ax.text(p, t, str(counts[t, p]), ha="center", va="center", fontsize=7)
  fig.tight_layout()
  fig.savefig(path_png)
  plt.close(fig)
  header = "| true \\ predicted | " + " | ".join(names) + " |"
  lines = [header, "|" + "---|" * (n + 1)]
  lines += [f"| {names[t]} | " + " | ".join(str(c) for c in counts[t]) + " |" for t in range(n)]
  return "\n".join(lines)

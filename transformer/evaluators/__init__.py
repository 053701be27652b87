"""Evaluators: what a run measures beyond the loss, one module per kind, chosen by the config.

  sample     evaluators/sample.py     a text sample at the end of training; eval.py --prompt
  bleu       evaluators/bleu.py       corpus BLEU every `bleu_every` updates and from eval.py
  confusion  evaluators/confusion.py  a confusion matrix (table and PNG) from eval.py
  harness    evaluators/harness.py    lm-evaluation-harness tasks every `harness_every`
                                      updates (python -m transformer.lm_eval: of a workdir)

The config's `evaluators` names those a run uses; () = its task's own (`Task.evaluators`:
lm and distill 'sample', seq2seq 'bleu', classification and image 'confusion'). `check`
refuses, when the config is validated, an unknown name or one the task cannot run, in one
line naming the field. `for_training` builds them for the training loop's `Evaluate`
action (`train/actions.py`: the periodic ones and those at the end), `for_eval` for
`eval.py` (`eval/evaluate.py`). The protocol is `base.Evaluator`: settings as fields,
`run(run) -> metrics`.

A new evaluator is one module with an `Evaluator` subclass plus one entry in `EVALUATORS`.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformer.data.config import fail
from transformer.evaluators.base import EvalOptions, Evaluator, TrainingOptions
from transformer.evaluators.bleu import Bleu
from transformer.evaluators.confusion import Confusion
from transformer.evaluators.harness import Harness
from transformer.evaluators.sample import Sample
from transformer.tasks.base import Task

EVALUATORS: dict[str, type[Evaluator]] = {
  cls.name: cls for cls in (Sample, Bleu, Confusion, Harness)
}


def names(configured: Sequence[str], task: Task) -> tuple[str, ...]:
  """The evaluators a run uses: those its config names, else its task's own."""
  return tuple(configured) or task.evaluators


def check(configured: Sequence[str], task: Task, options: TrainingOptions | None = None) -> None:
  """Raises `ValueError` in one line naming `config.evaluators` for an unknown or repeated
  name, or an evaluator `task` cannot run; with `options`, naming the field of a setting
  one of the run's evaluators cannot honour (`Evaluator.check_options`)."""
  for name in configured:
    if name not in EVALUATORS:
      known = ", ".join(EVALUATORS)
      fail("evaluators", tuple(configured), f"unknown evaluator {name!r}; known: {known}")
    why = EVALUATORS[name].unsupported(task)
    if why:
      rule = f"{name!r} cannot run on data.kind {task.name!r}: {why}"
      fail("evaluators", tuple(configured), rule)
  if len(set(configured)) < len(configured):
    fail("evaluators", tuple(configured), "names an evaluator twice")
  if options is not None:
    for name in names(configured, task):
      EVALUATORS[name].check_options(options)


def for_training(
  configured: Sequence[str], task: Task, options: TrainingOptions
) -> tuple[Evaluator, ...]:
  """The run's evaluators as training configures them."""
  return tuple(EVALUATORS[n].for_training(task, options) for n in names(configured, task))


def for_eval(configured: Sequence[str], task: Task, options: EvalOptions) -> tuple[Evaluator, ...]:
  """The run's evaluators as `eval.py`'s options configure them; `--prompt` is refused
  where none of them samples text."""
  chosen = names(configured, task)
  if options.prompts and Sample.name not in chosen:
    raise ValueError(f"--prompt is for language models; this run trains {task.name!r}")
  return tuple(EVALUATORS[n].for_eval(task, options) for n in chosen)


__all__ = [
  "EVALUATORS",
  "EvalOptions",
  "Evaluator",
  "TrainingOptions",
  "check",
  "for_eval",
  "for_training",
  "names",
]

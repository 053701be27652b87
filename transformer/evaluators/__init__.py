"""Evaluators: what a run measures beyond the loss, one module per kind, chosen by the config.

  sample     evaluators/sample.py     a text sample at the end of training; eval.py --prompt
  bleu       evaluators/bleu.py       corpus BLEU every `evaluate.bleu.every` updates and
                                      from eval.py
  confusion  evaluators/confusion.py  a confusion matrix (table and PNG) from eval.py
  exact_match evaluators/exact_match.py greedy answers to held-out conversations (sft)
  harness    evaluators/harness.py    lm-evaluation-harness tasks every
                                      `evaluate.harness.every` updates (python -m
                                      transformer.lm_eval: of a workdir)

The config's `evaluators` names those a run uses; () = its task's own (`Task.evaluators`:
lm and distill 'sample', seq2seq 'bleu', classification and image 'confusion', sft
'exact_match'). Each declares its settings once, as its `Options` dataclass: a run sets
them as `config.evaluate.NAME.FIELD`, `eval.py` from its flags. `check` refuses, when the
config is validated, an unknown name or one the task cannot run, in one line naming the
field.
`for_training` builds them for the training loop's `Evaluate` action (`train/actions.py`:
the periodic ones and those at the end), `for_eval` for `eval.py` (`eval/evaluate.py`).
The protocol is `base.Evaluator`: settings as fields, `run(run) -> metrics`.

A new evaluator is one module with an `Evaluator` subclass (and its `Options`, if it has
any) plus one entry in `EVALUATORS`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from transformer.data.config import fail
from transformer.evaluators.base import Evaluator, NoOptions
from transformer.evaluators.bleu import Bleu
from transformer.evaluators.confusion import Confusion
from transformer.evaluators.exact_match import ExactMatch
from transformer.evaluators.harness import Harness
from transformer.evaluators.sample import Sample
from transformer.tasks.base import Task

EVALUATORS: dict[str, type[Evaluator]] = {
  cls.name: cls for cls in (Sample, Bleu, Confusion, Harness, ExactMatch)
}


def names(configured: Sequence[str], task: Task) -> tuple[str, ...]:
  """The evaluators a run uses: those its config names, else its task's own."""
  return tuple(configured) or task.evaluators


def options(name: str, given: Mapping[str, Any]) -> Any:
  """Evaluator `name`'s options: those `given` for it, else its `Options` at their defaults."""
  return given.get(name) or EVALUATORS[name].Options()


def check(configured: Sequence[str], task: Task, given: Mapping[str, Any] | None = None) -> None:
  """Raises `ValueError` in one line naming `config.evaluators` for an unknown or repeated
  name, or an evaluator `task` cannot run; with `given` (evaluator name -> its options),
  naming the field of a setting one of the run's evaluators cannot honour in training
  (`Evaluator.check_options`)."""
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
  if given is not None:
    for name in names(configured, task):
      EVALUATORS[name].check_options(options(name, given))


def for_training(
  configured: Sequence[str], task: Task, given: Mapping[str, Any], seed: int
) -> tuple[Evaluator, ...]:
  """The run's evaluators as training configures them (`given`: name -> options)."""
  chosen = names(configured, task)
  return tuple(EVALUATORS[n].for_training(task, options(n, given), seed) for n in chosen)


def for_eval(
  configured: Sequence[str], task: Task, given: Mapping[str, Any]
) -> tuple[Evaluator, ...]:
  """The run's evaluators as `eval.py`'s options configure them (`given`: name -> options);
  prompts are refused where none of them samples text."""
  chosen = names(configured, task)
  if options(Sample.name, given).prompts and Sample.name not in chosen:
    raise ValueError(f"--prompt is for language models; this run trains {task.name!r}")
  return tuple(EVALUATORS[n].for_eval(task, options(n, given)) for n in chosen)


__all__ = [
  "EVALUATORS",
  "Evaluator",
  "NoOptions",
  "check",
  "for_eval",
  "for_training",
  "names",
  "options",
]

"""The `harness` evaluator: lm-evaluation-harness tasks on a language model in training.

Settings (`config.evaluate.harness.FIELD`, `HarnessOptions`): `tasks` (names: our shipped
tasks, the harness's own, e.g. 'hellaswag'), `every` (updates between runs, and after the
last; 0 = once at the end), `limit` (documents per task; 0 = all), `num_fewshot`
(examples in each prompt). The scores are logged as scalars
(`lm_eval/TASK/METRIC`, to TensorBoard, metrics.jsonl and W&B as every evaluator's) and the
harness's results written to WORKDIR/lm_eval_step_N.json. The adapter is
`evaluators/harness_lm.py`, imported when a harness runs (it needs `lm-eval`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from transformer.data.config import fail
from transformer.data.files import write_atomic
from transformer.evaluators.base import Evaluator, at_least
from transformer.tasks.base import Run, Task


def adapter():
  """evaluators/harness_lm.py, or one line naming the missing package."""
  try:
    from transformer.evaluators import harness_lm
  except ImportError as e:
    raise ImportError(
      f"the lm-evaluation-harness needs lm-eval: pip install '.[harness]' ({e})"
    ) from e
  return harness_lm


@dataclasses.dataclass(frozen=True)
class HarnessOptions:
  """config.evaluate.harness.FIELD."""

  tasks: tuple[str, ...] = ()  # lm-eval task names
  every: int = 0  # updates between runs (and after the last); 0 = once at the end
  limit: int = 0  # documents per task (0 = all)
  num_fewshot: int = 0  # examples in each prompt

  def __post_init__(self):
    at_least("harness", self, 0, "every", "limit", "num_fewshot")


@dataclasses.dataclass(frozen=True)
class Harness(Evaluator):
  """lm-eval tasks on the model in training: every `every` updates (0: at the end) of
  `tasks`, `limit` documents each (0 = all); the scores are logged as
  scalars (`lm_eval/TASK/METRIC`) and the results written to WORKDIR/lm_eval_step_N.json."""

  name = "harness"
  Options = HarnessOptions
  tasks: tuple[str, ...] = ()
  limit: int = 0
  num_fewshot: int = 0

  @classmethod
  def unsupported(cls, task: Task) -> str | None:
    return None if task.prompts else "needs a task whose model continues text (a language model)"

  @classmethod
  def for_training(cls, task: Task, options: HarnessOptions, seed: int) -> Harness:
    del task, seed
    return cls(every=options.every, at_end=not options.every, tasks=options.tasks,
               limit=options.limit, num_fewshot=options.num_fewshot)  # fmt: skip

  @classmethod
  def for_eval(cls, task: Task, options: HarnessOptions) -> Harness:
    del task, options
    return cls()  # eval.py runs none: `python -m transformer.lm_eval` does

  @classmethod
  def check_options(cls, options: HarnessOptions) -> None:
    if not options.tasks:
      fail("evaluate.harness.tasks", (), "names no task; the 'harness' evaluator needs one or more")
    try:
      adapter().task_configs(options.tasks)
    except ValueError as e:
      fail("evaluate.harness.tasks", options.tasks, str(e))

  def run(self, run: Run) -> dict[str, Any]:
    if not self.tasks:
      return {}
    harness = adapter()
    lm = harness.HarnessLM(run.model, run.params, run.info.tokenizer)
    results = harness.evaluate_tasks(lm, self.tasks, self.limit, self.num_fewshot or None)
    path = f"{run.workdir}/lm_eval_step_{run.step}.json"
    write_atomic(path, json.dumps(results, indent=1, sort_keys=True).encode())
    print(f"lm-eval results: {path}")
    return harness.scalars(results)

"""The `harness` evaluator: lm-evaluation-harness tasks on a language model in training.

Settings (top-level config fields): `harness_tasks` (names: our shipped tasks, the
harness's own, e.g. 'hellaswag'), `harness_every` (updates between runs, and after the
last; 0 = once at the end), `harness_limit` (documents per task; 0 = all),
`harness_fewshot` (examples in each prompt). The scores are logged as scalars
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
from transformer.evaluators.base import EvalOptions, Evaluator, TrainingOptions
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
class Harness(Evaluator):
  """lm-eval tasks on the model in training: every `harness_every` updates (0: at the end)
  of `harness_tasks`, `harness_limit` documents each (0 = all); the scores are logged as
  scalars (`lm_eval/TASK/METRIC`) and the results written to WORKDIR/lm_eval_step_N.json."""

  name = "harness"
  tasks: tuple[str, ...] = ()
  limit: int = 0
  num_fewshot: int = 0

  @classmethod
  def unsupported(cls, task: Task) -> str | None:
    return None if task.prompts else "needs a task whose model continues text (a language model)"

  @classmethod
  def for_training(cls, task: Task, options: TrainingOptions) -> Harness:
    del task
    every = options.harness_every
    return cls(every=every, at_end=not every, tasks=tuple(options.harness_tasks),
               limit=options.harness_limit, num_fewshot=options.harness_fewshot)  # fmt: skip

  @classmethod
  def for_eval(cls, task: Task, options: EvalOptions) -> Harness:
    del task, options
    return cls()  # eval.py runs none: `python -m transformer.lm_eval` does

  @classmethod
  def check_options(cls, options: TrainingOptions) -> None:
    if not options.harness_tasks:
      fail("harness_tasks", (), "names no task; the 'harness' evaluator needs one or more")
    try:
      adapter().task_configs(options.harness_tasks)
    except ValueError as e:
      fail("harness_tasks", tuple(options.harness_tasks), str(e))

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

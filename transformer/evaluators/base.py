"""The evaluator protocol: settings declared once, as the evaluator's `Options`.

An evaluator measures what the loss does not (samples, BLEU, a confusion matrix):
`run(run) -> metrics` on a `tasks.Run` (model, parameters, data info, evaluation batches,
step), in the manner of big_vision's `evaluators/*.py` `run(train_state)`. Its settings
say when it runs: every `every` updates during training (and after the last), once at the
end of training (`at_end`), and from `eval.py` (always, with the options given there).

Its options are one frozen dataclass, `Options`, declared in its module: a run sets them
as `config.evaluate.NAME.FIELD` (validated with the config, a bad value named in one line),
`eval.py` from its flags. `for_training` and `for_eval` build the evaluator from them.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

import numpy as np

from transformer.data.config import fail
from transformer.data.tokenizers import EOS_ID, PAD_ID
from transformer.nn.config import ModelConfig
from transformer.tasks.base import Run, Task


@dataclasses.dataclass(frozen=True)
class NoOptions:
  """The options of an evaluator that has none."""


def at_least(evaluator: str, options: Any, minimum: int | float, *names: str) -> None:
  """One line naming `config.evaluate.EVALUATOR.FIELD` for the first of `names` below
  `minimum` (a helper for the `__post_init__` of an evaluator's `Options`)."""
  for name in names:
    if not getattr(options, name) >= minimum:  # NaN too
      fail(f"evaluate.{evaluator}.{name}", getattr(options, name), f"must be >= {minimum}")


@dataclasses.dataclass(frozen=True)
class Evaluator(abc.ABC):
  """One kind of evaluation. Subclasses are frozen dataclasses whose fields are their
  settings, built from their `Options` by `for_training` (a run's `config.evaluate.NAME`)
  or `for_eval` (`eval.py`'s flags) for a task that `unsupported` accepts."""

  name: ClassVar[str] = ""
  Options: ClassVar[type] = NoOptions  # its settings: config.evaluate.NAME.FIELD
  every: int = 0  # training: updates between runs (and after the last); 0 = not periodic
  at_end: bool = False  # training: once after the last update, on the primary process

  @classmethod
  @abc.abstractmethod
  def unsupported(cls, task: Task) -> str | None:
    """Why `task` cannot run this evaluator (the rule of a one-line refusal), or None."""

  @classmethod
  @abc.abstractmethod
  def for_training(cls, task: Task, options: Any, seed: int) -> Evaluator:
    """The evaluator as a training run configures it (`options`: its `Options`; `seed`:
    the run's, for what it draws)."""

  @classmethod
  @abc.abstractmethod
  def for_eval(cls, task: Task, options: Any) -> Evaluator:
    """The evaluator as `eval.py`'s options (its `Options`) configure it."""

  @classmethod
  def check_options(cls, options: Any) -> None:  # noqa: B027 (a hook)
    """Refuses settings a training run cannot honour, when the config is validated (one
    line naming `config.evaluate.NAME.FIELD`; default: none)."""
    del options

  def check(self, model: ModelConfig, tokenizer: Any) -> None:  # noqa: B027 (a hook)
    """Refuses settings it cannot honour, before any evaluation work (default: none)."""

  def due(self, done: int, total: int) -> bool:
    """Whether a periodic evaluation at update `done` of `total` includes this evaluator."""
    return bool(self.every) and (done % self.every == 0 or done == total)

  def compile_ahead(self, run: Run) -> None:  # noqa: B027 (a hook)
    """Compiles, without running them, the programs `run(run)` will run (training calls it
    in a background thread after the first update; `run.params` are abstract, with the
    shardings the real ones will have). Default: nothing, they compile when first run."""

  @abc.abstractmethod
  def run(self, run: Run) -> dict[str, Any]:
    """Its metrics on `run`: numbers are logged as scalars, strings (at the end) as text."""


def strip_ids(ids: np.ndarray, eos_id: int = EOS_ID, pad_id: int | None = PAD_ID) -> list[int]:
  """Token ids up to the first `eos_id`, without `pad_id` (None: keep every id)."""
  ids = [int(i) for i in ids]
  if eos_id in ids:
    ids = ids[: ids.index(eos_id)]
  return [i for i in ids if i != pad_id]

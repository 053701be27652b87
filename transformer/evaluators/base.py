"""The evaluator protocol, and the options training and `eval.py` configure evaluators with.

An evaluator measures what the loss does not (samples, BLEU, a confusion matrix):
`run(run) -> metrics` on a `tasks.Run` (model, parameters, data info, evaluation batches,
step), in the manner of big_vision's `evaluators/*.py` `run(train_state)`. Its settings
say when it runs: every `every` updates during training (and after the last), once at the
end of training (`at_end`), and from `eval.py` (always, with the options given there).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

import numpy as np

from transformer.data.tokenizers import EOS_ID, PAD_ID
from transformer.nn.config import ModelConfig
from transformer.tasks.base import Run, Task


@dataclasses.dataclass(frozen=True)
class TrainingOptions:
  """What a training run asks of its evaluators (top-level config fields of the same name)."""

  bleu_every: int = 0  # bleu: steps between BLEU evaluations (and at the end); 0 = never
  bleu_beam_size: int = 1  # bleu: beam size of that decoding (1 = greedy)
  sample_prompt: str = ""  # sample: text whose continuation is printed at the end
  sample_tokens: int = 200  # sample: tokens sampled at the end (0 = no sample)
  sample_temperature: float = 0.8  # sample: sampling temperature of the final sample
  harness_tasks: tuple[str, ...] = ()  # harness: lm-eval task names
  harness_every: int = 0  # harness: steps between runs (and at the end); 0 = at the end only
  harness_limit: int = 0  # harness: documents per task (0 = all)
  harness_fewshot: int = 0  # harness: examples in each prompt
  seed: int = 0  # seeds the sampling


@dataclasses.dataclass(frozen=True)
class EvalOptions:
  """What `eval.py` asks of a run beyond the loss metrics."""

  prompts: tuple[str, ...] = ()  # sample: texts to continue
  num_samples: int = 1  # sample: samples per prompt
  max_new_tokens: int = 200  # sample: tokens to sample
  past_context: str = "cap"  # sample: cap (new tokens fit the context) | slide (a moving window)
  temperature: float = 1.0  # sample: sampling temperature
  top_k: int = 0  # sample: keep the k most likely tokens (0 = all)
  top_p: float = 1.0  # sample: nucleus mass (1 = all)
  bleu_method: str = "beam"  # bleu: translation decoding, beam | greedy
  beam_size: int = 4  # bleu: translation beam size
  chat: bool = False  # sample: each prompt as a user message in the tokenizer's chat template


@dataclasses.dataclass(frozen=True)
class Evaluator(abc.ABC):
  """One kind of evaluation. Subclasses are frozen dataclasses whose fields are their
  settings, built by `for_training` (from the run's config) or `for_eval` (from `eval.py`'s
  options) for a task that `unsupported` accepts."""

  name: ClassVar[str] = ""
  every: int = 0  # training: updates between runs (and after the last); 0 = not periodic
  at_end: bool = False  # training: once after the last update, on the primary process

  @classmethod
  @abc.abstractmethod
  def unsupported(cls, task: Task) -> str | None:
    """Why `task` cannot run this evaluator (the rule of a one-line refusal), or None."""

  @classmethod
  @abc.abstractmethod
  def for_training(cls, task: Task, options: TrainingOptions) -> Evaluator:
    """The evaluator as a training run configures it."""

  @classmethod
  @abc.abstractmethod
  def for_eval(cls, task: Task, options: EvalOptions) -> Evaluator:
    """The evaluator as `eval.py`'s options configure it."""

  @classmethod
  def check_options(cls, options: TrainingOptions) -> None:  # noqa: B027 (a hook)
    """Refuses training settings it cannot run, when the config is validated (one line
    naming the field; default: none)."""
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

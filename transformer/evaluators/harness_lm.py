"""The lm-evaluation-harness (`lm_eval`) on our decoder language models: the adapter.

`HarnessLM(model, params, tokenizer)` is lm_eval's `LM` interface on a `DecoderLM`:

- `loglikelihood`: for each (context, continuation), the summed log-probability of the
  continuation's tokens, each given the context and the tokens before it, and whether
  greedy decoding picks every one of them. Rows of `max_len` tokens, right-padded (the
  attention is causal, so padding after a row's tokens changes none of their scores),
  `batch_size` rows a call, compiled once.
- `loglikelihood_rolling`: a text's summed log-probability over our evaluation's windows:
  the stream [BOS] + tokens cut into non-overlapping windows of `max_len`, each predicting
  its tokens from its own start, as `train.actions.evaluate` scores a token stream.
- `generate_until`: a continuation through `decode.generate` (greedy, or sampled with the
  request's `do_sample` / `temperature`, seeded), cut at the first stop string.

Text is encoded as a prompt is (`tokenizer.encode`, no BOS); an empty context is [BOS].
A context longer than the window keeps its end.

`evaluate_tasks(lm, tasks, ...)` runs `lm_eval.simple_evaluate` on `HarnessLM` with our
shipped tasks (`TASKS`: `shakespeare_continuation`, multiple-choice continuation of held-out
Shakespeare, data/shakespeare_continuation/) found by name, the harness's own by theirs
(indexed only when one is asked for) and YAML files under `include_path`.
`python -m transformer.lm_eval` evaluates a workdir (transformer/lm_eval.py); the
`harness` evaluator (evaluators/harness.py) runs the same during training. This module
imports `lm_eval` (`pip install '.[harness]'`); nothing imports it until a harness runs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import lm_eval
import numpy as np
from lm_eval.api.model import LM
from lm_eval.tasks import TaskManager

from transformer import decode
from transformer.data.config import resolve_shipped
from transformer.decode.sampling import Sampling
from transformer.evaluators.base import strip_ids

CONTINUATION = "data/shakespeare_continuation"


def _continuation_task() -> dict[str, Any]:
  """`shakespeare_continuation`: which of four 16-character spans follows 40 characters of
  held-out Shakespeare (scripts/make_continuation.py); acc: the true span's
  log-likelihood is the highest (the spans are of one length, so acc_norm says the same)."""
  folder = resolve_shipped(CONTINUATION)
  files = {split: str(folder / f"{split}.jsonl") for split in ("validation", "test")}
  return {
    "task": "shakespeare_continuation",
    "dataset_path": "json",
    "dataset_kwargs": {"data_files": files},
    "validation_split": "validation",
    "test_split": "test",
    "fewshot_split": "validation",
    "output_type": "multiple_choice",
    "doc_to_text": "{{context}}",
    "doc_to_choice": "{{choices}}",
    "doc_to_target": "{{label}}",
    "target_delimiter": "",
    "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
  }


TASKS = {"shakespeare_continuation": _continuation_task}  # shipped tasks, by name


class HarnessLM(LM):
  """lm_eval's `LM` on a `DecoderLM`, its parameters and tokenizer (module docstring)."""

  def __init__(self, model: Any, params: Any, tokenizer: Any, batch_size: int = 8, seed: int = 0):
    super().__init__()
    self.model, self.params, self.tokenizer = model, params, tokenizer
    self.window, self.batch_size, self.seed = model.config.max_len, batch_size, seed
    self._scores = jax.jit(self._token_scores)

  def _token_scores(self, params, inputs, targets):
    """[B, T] inputs and targets -> (log p(target) [B, T], target is the argmax [B, T])."""
    logits = self.model.apply({"params": params}, inputs, deterministic=True)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return picked, jnp.argmax(logits, axis=-1) == targets

  def _encode(self, text: str) -> list[int]:
    return [int(i) for i in self.tokenizer.encode(text)]

  def score(self, rows: Sequence[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
    """(context ids, continuation ids) -> (summed log-probability, greedy) per row."""
    t, out = self.window, []
    for start in range(0, len(rows), self.batch_size):
      chunk = rows[start : start + self.batch_size]
      inputs = np.zeros((self.batch_size, t), np.int32)
      targets = np.zeros((self.batch_size, t), np.int32)
      spans = []
      for r, (context, continuation) in enumerate(chunk):
        full = (list(context) or [self.tokenizer.bos_id]) + list(continuation)
        full = full[-(t + 1) :]  # a long context keeps its end
        n = min(len(continuation), len(full) - 1)
        inputs[r, : len(full) - 1], targets[r, : len(full) - 1] = full[:-1], full[1:]
        spans.append((len(full) - 1 - n, len(full) - 1))
      logp, hit = (np.asarray(a) for a in self._scores(self.params, inputs, targets))
      for r, (lo, hi) in enumerate(spans):
        out.append((float(logp[r, lo:hi].sum()), bool(hit[r, lo:hi].all())))
    return out

  def loglikelihood(self, requests) -> list[tuple[float, bool]]:
    rows = [(self._encode(c), self._encode(x)) for c, x in (r.args for r in requests)]
    return self.score(rows)

  def rolling_rows(self, text: str) -> list[tuple[list[int], list[int]]]:
    """Our evaluation's windows over [BOS] + the text's tokens, as (context, continuation)
    rows: each window's first token, then the up to `max_len` tokens it predicts."""
    stream = [self.tokenizer.bos_id, *self._encode(text)]
    t = self.window
    return [(stream[s : s + 1], stream[s + 1 : s + t + 1]) for s in range(0, len(stream) - 1, t)]

  def loglikelihood_rolling(self, requests) -> list[float]:
    out = []
    for request in requests:
      (text,) = request.args[:1]
      out.append(sum(logp for logp, _ in self.score(self.rolling_rows(text))))
    return out

  def generate_until(self, requests) -> list[str]:
    out = []
    for request in requests:
      context, kwargs = request.args[0], dict(request.args[1] if len(request.args) > 1 else {})
      until = kwargs.get("until") or []
      until = [until] if isinstance(until, str) else list(until)
      new = max(1, min(int(kwargs.get("max_gen_toks", 256)), self.window - 1))
      prompt = (self._encode(context) or [self.tokenizer.bos_id])[-(self.window - new) :]
      temperature = float(kwargs.get("temperature", 0.0) or 0.0)
      sampled = bool(kwargs.get("do_sample")) and temperature > 0
      result = decode.generate(
        self.model,
        self.params,
        [prompt],
        max_new_tokens=new,
        method="sample" if sampled else "greedy",
        sampling=Sampling(jax.random.PRNGKey(self.seed), temperature) if sampled else None,
        eos_id=self.tokenizer.eos_id,
      )
      ids = strip_ids(np.asarray(result.tokens)[0], self.tokenizer.eos_id, pad_id=None)
      text = self.tokenizer.decode(ids)
      cuts = [text.index(stop) for stop in until if stop and stop in text]
      out.append(text[: min(cuts)] if cuts else text)
    return out


def task_configs(names: Sequence[str], include_path: Sequence[str] = ()) -> tuple[list, Any]:
  """(the tasks to pass to `simple_evaluate`, its `TaskManager`): shipped names as their
  configs; others looked up among the harness's tasks and `include_path`, indexed only
  then. An unknown name raises ValueError in one line."""
  others = [n for n in names if n not in TASKS]
  manager = TaskManager(include_path=list(include_path) or None, include_defaults=False)
  if any(n not in manager.all_tasks for n in others):  # the harness's own (seconds to index)
    manager = TaskManager(include_path=list(include_path) or None)
  unknown = [n for n in others if n not in manager.all_tasks]
  if unknown:
    raise ValueError(
      f"lm-eval tasks {unknown}: unknown; shipped: {sorted(TASKS)}, the harness's own "
      "(lm_eval --tasks list) or a YAML under --include_path"
    )
  return [TASKS[n]() if n in TASKS else n for n in names], manager


def evaluate_tasks(
  lm: HarnessLM,
  names: Sequence[str],
  limit: int | None = None,
  num_fewshot: int | None = None,
  include_path: Sequence[str] = (),
) -> dict[str, Any]:
  """`lm_eval.simple_evaluate` on `lm`: its results dict (JSON-serialisable parts)."""
  tasks, manager = task_configs(names, include_path)
  results = lm_eval.simple_evaluate(
    model=lm,
    tasks=tasks,
    limit=limit or None,
    num_fewshot=num_fewshot,
    task_manager=manager,
    bootstrap_iters=1000,  # standard errors (a mean's is closed-form)
    log_samples=False,
    random_seed=lm.seed,
    numpy_random_seed=lm.seed,
    torch_random_seed=lm.seed,
    fewshot_random_seed=lm.seed,
  )
  return json.loads(json.dumps(dict(results), default=str))


def scalars(results: dict[str, Any]) -> dict[str, float]:
  """'lm_eval/TASK/METRIC' -> value for every number of the results' per-task table."""
  out = {}
  for task, metrics in results.get("results", {}).items():
    for key, value in metrics.items():
      metric, scored = key.split(",")[0], "," in key  # 'acc,none': a metric and its filter
      if scored and type(value) in (int, float) and not metric.endswith("_stderr"):
        out[f"lm_eval/{task}/{metric}"] = float(value)
  return out

"""Exact match of a chat model's greedy answers to the held-out conversations' last replies.

Each evaluation conversation (`data.text_column` of the evaluation split; of a preference
split, each pair's prompt and chosen reply) is cut before its last assistant turn: the
turns before it, rendered with the run's template and the opening of the assistant's reply
(`tasks.sft.prompt_ids`), are continued greedily until the tokenizer's EOS (at most
`max_new_tokens` tokens, and what the longest prompt leaves of the context); the answer is
the decoded continuation, stripped of surrounding whitespace, and it matches when it
equals the stripped reply. Metric 'exact_match' (the fraction of the `examples` first
conversations that match), with five examples from `eval.py`. Settings:
`config.evaluate.exact_match.FIELD`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from transformer import decode
from transformer.data import features, pipeline, sources
from transformer.evaluators.base import Evaluator, at_least, strip_ids
from transformer.tasks import sft
from transformer.tasks.base import Run, Task

BATCH = 64  # prompts decoded at once (one compilation per batch of this size)


@dataclasses.dataclass(frozen=True)
class ExactMatchOptions:
  """config.evaluate.exact_match.FIELD."""

  every: int = 0  # training: updates between evaluations (and after the last); 0 = at the end
  examples: int = 0  # evaluation conversations scored (0 = all)
  max_new_tokens: int = 32  # the longest answer decoded

  def __post_init__(self):
    at_least("exact_match", self, 0, "every", "examples")
    at_least("exact_match", self, 1, "max_new_tokens")


@dataclasses.dataclass(frozen=True)
class ExactMatch(Evaluator):
  """Exact match (module docstring): every `every` updates (0: once at the end) in
  training, and from `eval.py`."""

  name = "exact_match"
  Options = ExactMatchOptions
  options: ExactMatchOptions = ExactMatchOptions()

  pairs: bool = False  # the evaluation split holds preference pairs

  @classmethod
  def unsupported(cls, task: Task) -> str | None:
    spec = task.data_spec()
    if spec.conversations or spec.preference:
      return None
    return "needs conversations to answer (the sft and preference tasks)"

  @classmethod
  def for_training(cls, task: Task, options: ExactMatchOptions, seed: int) -> ExactMatch:
    del seed
    pairs = task.data_spec().preference
    return cls(every=options.every, at_end=not options.every, options=options, pairs=pairs)

  @classmethod
  def for_eval(cls, task: Task, options: ExactMatchOptions) -> ExactMatch:
    return cls(options=options, pairs=task.data_spec().preference)

  def run(self, run: Run) -> dict[str, Any]:
    cfg, tok = run.info.config, run.info.tokenizer
    pairs = list(held_out(cfg, run.workdir, self.options.examples, self.pairs))
    answers = greedy_answers(run.model, run.params, tok, [p for p, _ in pairs],
                             self.options.max_new_tokens)  # fmt: skip
    matched = [a == r.strip() for a, (_, r) in zip(answers, pairs, strict=True)]
    score = sum(matched) / max(len(matched), 1)
    if jax.process_index() == 0:
      print(f"exact match @ step {run.step} | {score:.4f} of {len(matched)} held-out answers")
    result: dict[str, Any] = {"exact_match": score}
    if not self.every and not self.at_end:  # eval.py: a few examples to read
      result["examples"] = [
        {"prompt": p[-1]["content"], "hypothesis": a, "reference": r}
        for (p, r), a in list(zip(pairs, answers, strict=True))[:5]
      ]
    return result


def held_out(cfg: Any, workdir: str, limit: int = 0, pairs: bool = False) -> list[tuple[list, str]]:
  """(the turns before the last reply, that reply) of this host's first `limit` (0 = all)
  evaluation conversations, in evaluation order; of preference `pairs`, the prompt and the
  chosen reply."""
  split = sources.open_splits(cfg, workdir, conversations=not pairs, preference=pairs).eval
  shard = pipeline.records(split, pipeline.Loader())
  n = len(shard) if not limit else min(limit, len(shard))
  out = []
  for k in range(n):
    index, record = shard[k]
    try:
      conversation = chosen_conversation(record) if pairs else record[cfg.text_column]
      out.append(sft.split_reply(conversation))
    except ValueError as e:
      where = features.where(getattr(split, "name", cfg.path), index, record)
      raise ValueError(f"{where}: {e}") from None
  return out


def chosen_conversation(record: Any) -> list:
  """A preference record's prompt turns and its chosen reply, as one conversation."""
  prompt, chosen = record["prompt"], record["chosen"]
  if isinstance(prompt, str):
    raise ValueError("a text prompt, not a conversation: nothing to answer")
  return [
    *prompt,
    *([{"role": "assistant", "content": chosen}] if isinstance(chosen, str) else chosen),
  ]


def greedy_answers(
  model, params, tok, prompts: list[list], max_new_tokens: int, sampling: Any = None
) -> list[str]:
  """The greedy continuation of each conversation (sampled with `sampling`, a
  `decode.Sampling`), up to EOS, decoded and stripped."""
  rows = [sft.prompt_ids(tok, messages) for messages in prompts]
  length = max((len(r) for r in rows), default=1)
  new = min(max_new_tokens, model.config.max_len - length)
  if new < 1:
    raise ValueError(f"a {length}-token prompt leaves no room in max_len={model.config.max_len}")
  answers = []
  for start in range(0, len(rows), BATCH):
    chunk = rows[start : start + BATCH]
    chunk = chunk + [chunk[-1]] * (BATCH - len(chunk))  # one compiled shape
    draw = None  # greedy; else each chunk its own draws
    if sampling is not None:
      draw = sampling._replace(rng=jax.random.fold_in(sampling.rng, start))
    out = decode.generate(model, params, chunk, max_new_tokens=new, sampling=draw,
                          method="greedy" if draw is None else "sample", eos_id=tok.eos_id,
                          prompt_len=length)  # fmt: skip
    for ids in list(out.tokens)[: min(BATCH, len(rows) - start)]:
      answers.append(tok.decode(strip_ids(ids, tok.eos_id, pad_id=None)).strip())
  return answers

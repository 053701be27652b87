"""Corpus BLEU (sacrebleu) of translations: during training every `evaluate.bleu.every` updates,
and from `eval.py`.

The decoded evaluation sources are scored against the raw target text of the evaluation
split, not the detokenized target ids (`tasks.seq2seq.eval_references` reads the records
in the order the evaluation batches hold them), so no key is added to the batches and the
compiled steps see the same batch.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from transformer import decode
from transformer.data.progress import progress
from transformer.evaluators.base import Evaluator, at_least, strip_ids
from transformer.tasks.base import Run, Task
from transformer.tasks.seq2seq import eval_references


@dataclasses.dataclass(frozen=True)
class BleuOptions:
  """config.evaluate.bleu.FIELD (eval.py: --beam_size, --bleu_method)."""

  every: int = 0  # training: updates between BLEU evaluations (and after the last); 0 = never
  beam_size: int = 1  # beam size of the decoding (1 = greedy)

  def __post_init__(self):
    at_least("bleu", self, 0, "every")
    at_least("bleu", self, 1, "beam_size")


@dataclasses.dataclass(frozen=True)
class Bleu(Evaluator):
  """In training: the score (metric 'bleu') every `every` updates that evaluate and
  after the last, with one console line; from `eval.py`: the score, sacrebleu's signature,
  the decoding method and five examples."""

  name = "bleu"
  Options = BleuOptions
  method: str = "beam"  # beam | greedy
  beam_size: int = 4

  @classmethod
  def unsupported(cls, task: Task) -> str | None:
    if task.data_spec().paired:
      return None
    return "needs source / target text pairs (a translation task)"

  @classmethod
  def for_training(cls, task: Task, options: BleuOptions, seed: int) -> Bleu:
    del seed
    return dataclasses.replace(cls.for_eval(task, options), every=options.every)

  @classmethod
  def for_eval(cls, task: Task, options: BleuOptions) -> Bleu:
    del task
    method = "beam" if options.beam_size > 1 else "greedy"
    return cls(method=method, beam_size=options.beam_size)

  def run(self, run: Run) -> dict[str, Any]:
    result = corpus_bleu(
      run.model,
      run.params,
      run.info.tokenizer,
      run.eval_factory(),
      run.eval_batches,
      references=eval_references(run.info.config, run.workdir),
      method=self.method,
      beam_size=self.beam_size,
      total=run.info.eval_batches,
    )
    if self.every and jax.process_index() == 0:  # training's line, with what a reader compares
      print(
        f"BLEU @ step {run.step} | {result['bleu']:.2f} on {run.info.config.eval_split} "
        f"({result['bleu_method']}; sacrebleu {result['bleu_signature']})",
        flush=True,
      )
    return result


def corpus_bleu(
  model: nn.Module,
  params: Any,
  tokenizer: Any,
  eval_iter: Iterable[dict],
  max_batches: int = 0,
  *,
  references: Iterable[str],
  method: str = "beam",
  beam_size: int = 4,
  alpha: float = 0.6,
  total: int | None = None,
) -> dict[str, Any]:
  """Corpus BLEU (sacrebleu) of decoded evaluation sources against raw reference text.

  `references` are the target strings of the evaluation records as stored in the split
  (not the detokenized target ids, which lose what the tokenizer cannot round-trip and
  what the row truncated), one per non-padding row of `eval_iter`, in its order. Each is
  checked against its row: its token ids must begin with the row's target ids, so a
  reference list out of step with the batches is an error, not a silently wrong score.
  `total`: the batches `eval_iter` yields, for the progress lines of a long decoding.
  Returns the score, sacrebleu's signature, the decoding method and five examples.
  """
  tok = tokenizer
  refs_iter = iter(references)
  hyps, refs = [], []
  if max_batches:
    eval_iter = itertools.islice(eval_iter, max_batches)
    total = min(total, max_batches) if total else max_batches
  for batch in progress(eval_iter, total, f"BLEU ({method})", enabled=jax.process_index() == 0):
    keep = batch["inputs_segment_ids"].max(axis=1) > 0  # padded rows have no source
    if not keep.any():
      continue
    for row in batch["targets"][keep]:
      refs.append(_matching_reference(tok, refs_iter, strip_ids(row, tok.eos_id), len(refs)))
    inputs = batch["inputs"][keep]
    out = decode.translate(
      model,
      params,
      inputs,
      method=method,
      beam_size=beam_size,
      alpha=alpha,
      max_len=batch["targets"].shape[1],
      eos_id=tok.eos_id,
    )
    hyps += [tok.decode(strip_ids(row, tok.eos_id)) for row in np.asarray(out.tokens)]
  import sacrebleu  # imported here: a run without BLEU does not pay for it

  metric = sacrebleu.BLEU()
  result = metric.corpus_score(hyps, [refs])
  return {
    "bleu": float(result.score),
    "bleu_signature": str(metric.get_signature()),
    "bleu_method": f"{method}{beam_size if method == 'beam' else ''}",
    "examples": [
      {"hypothesis": h, "reference": r} for h, r in zip(hyps[:5], refs[:5], strict=True)
    ],
  }


def _matching_reference(
  tokenizer: Any, references: Iterator[str], target: list[int], k: int
) -> str:
  """The next reference, checked against the target ids of evaluation example `k`."""
  reference = next(references, None)
  if reference is None:
    raise ValueError(f"BLEU: evaluation example {k} has no reference (too few references)")
  ids = tokenizer.encode_array(reference).tolist()  # as the pipeline encodes targets
  if ids[: len(target)] != target:  # the row holds the reference's ids, maybe truncated
    raise ValueError(
      f"BLEU: reference {k} {reference[:60]!r} does not encode to the target ids of "
      f"evaluation example {k}: references and evaluation batches are out of step"
    )
  return reference

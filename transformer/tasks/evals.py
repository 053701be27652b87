"""Evaluations the tasks offer: text samples, corpus BLEU, confusion matrices.

Each task's `during_training` / `after_training` / `evaluate` calls these.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import sacrebleu

from transformer import decode
from transformer.data.progress import progress
from transformer.data.tokenizers import EOS_ID, PAD_ID
from transformer.decode.sampling import Sampling
from transformer.decode.sliding import generate_sliding

PAST_CONTEXT = ("cap", "slide")  # what LM sampling does with tokens beyond the context


def sample_texts(
  model: nn.Module,
  params: Any,
  tokenizer: Any,
  prompts: list[str],
  *,
  sampling: Sampling,
  num_samples: int = 1,
  max_new_tokens: int = 200,
  sliding: bool = False,
) -> list[dict[str, str]]:
  """`num_samples` continuations of each prompt (LMs) drawn with `sampling`. Raises
  ValueError for bad prompts.

  `sliding`: through a window of the model's last `max_len` tokens (`decode.sliding`), so
  prompt + new tokens may exceed the context; else cached decoding within the context.
  Each sample says which (`generation`: 'cached' or 'sliding window of W tokens').
  """
  max_len = model.config.max_len
  rows = check_prompts(tokenizer, prompts, max_new_tokens, None if sliding else max_len)
  rows = [r for r in rows for _ in range(num_samples)]
  texts = [p for p in prompts for _ in range(num_samples)]
  generate = generate_sliding if sliding else decode.generate
  out = generate(
    model,
    params,
    rows,
    max_new_tokens=max_new_tokens,
    method="sample",
    sampling=sampling,
    eos_id=tokenizer.eos_id,
  )
  how = f"sliding window of {max_len} tokens" if sliding else "cached"
  tokens = [_strip(t, tokenizer.eos_id, pad_id=None) for t in np.asarray(out.tokens)]
  return [
    {"prompt": p, "sample": tokenizer.decode(t), "generation": how}
    for p, t in zip(texts, tokens, strict=True)
  ]


def fit_to_context(
  tokenizer: Any, prompts: list[str], max_new_tokens: int, max_len: int, past_context: str
) -> tuple[int, str | None]:
  """(new tokens to sample, a one-line note or None) for `past_context`: 'cap' fits them
  into the model's context after the longest prompt (noting a cut), 'slide' keeps them
  all (a sliding window). ValueError for an unknown mode or a prompt that fills the
  context under 'cap'."""
  if past_context not in PAST_CONTEXT:
    raise ValueError(f"past_context={past_context!r}: expected one of {', '.join(PAST_CONTEXT)}")
  if past_context == "slide" or max_new_tokens < 1:
    return max_new_tokens, None
  longest = max((len(tokenizer.encode(p)) for p in prompts), default=0)
  room = max_len - longest
  if room < 1:
    raise ValueError(
      f"a {longest}-token prompt fills the model's context (max_len={max_len}): shorten it, "
      "or use --past_context=slide to generate through a sliding window"
    )
  if max_new_tokens <= room:
    return max_new_tokens, None
  return room, (
    f"note: {max_new_tokens} new tokens capped to {room}: the model's context is "
    f"max_len={max_len} tokens with a {longest}-token prompt "
    "(--past_context=slide generates past it through a sliding window)"
  )


def check_prompts(
  tokenizer: Any, prompts: list[str], max_new_tokens: int, max_len: int | None
) -> list:
  """Token ids of each prompt; ValueError for an empty prompt, characters the vocabulary
  lacks, or a length the model cannot hold (`max_len` None: no length limit)."""
  rows = []
  for prompt in prompts:
    if not prompt:
      raise ValueError("--prompt is empty: give at least one character to continue")
    unknown = tokenizer.unknown_chars(prompt) if hasattr(tokenizer, "unknown_chars") else {}
    if unknown:
      chars = "".join(sorted(unknown))
      raise ValueError(f"prompt {prompt!r} has characters outside the vocabulary: {chars!r}")
    rows.append(tokenizer.encode(prompt))
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens={max_new_tokens}: must be >= 1")
  longest = max(len(r) for r in rows)
  if max_len is not None and longest + max_new_tokens > max_len:
    raise ValueError(
      f"{max_new_tokens} new tokens after a {longest}-token prompt exceed the model's "
      f"max_len={max_len}; ask for at most {max_len - longest}"
    )
  return rows


def _strip(ids: np.ndarray, eos_id: int = EOS_ID, pad_id: int | None = PAD_ID) -> list[int]:
  """Token ids up to the first `eos_id`, without `pad_id` (None: keep every id)."""
  ids = [int(i) for i in ids]
  if eos_id in ids:
    ids = ids[: ids.index(eos_id)]
  return [i for i in ids if i != pad_id]


def bleu(
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
      refs.append(_matching_reference(tok, refs_iter, _strip(row, tok.eos_id), len(refs)))
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
    hyps += [tok.decode(_strip(row, tok.eos_id)) for row in np.asarray(out.tokens)]
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


def text_batch(tokenizer: Any, text: str, max_len: int) -> dict[str, np.ndarray]:
  """A one-row batch of `text` (every token-model key) for attention analysis."""
  tokens = np.asarray(tokenizer.encode(text), np.int32)[None, :max_len]  # [1, T]
  if tokens.shape[1] == 0:
    raise ValueError(f"text {text!r} encodes to no tokens")
  ones = np.ones_like(tokens)
  return {
    "inputs": tokens,
    "targets": tokens,
    "positions": np.arange(tokens.shape[1], dtype=np.int32)[None],
    "segment_ids": ones,
    "weights": ones.astype(np.float32),
    "label": np.zeros((1,), np.int32),
  }

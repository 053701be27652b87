"""BERT-style masked-LM corruption (Devlin et al. 2019, Section 3.1 and Appendix A.1).

Of the non-special tokens of a row (ids >= NUM_SPECIAL: never PAD, CLS, SEP, ...),
`round(mask_rate * n)` (at least one) are selected for prediction; each selected token
is replaced by MASK with probability 0.8, by a uniformly random ordinary token with
probability 0.1, and left unchanged otherwise. With whole-word masking, whole words
(a word-start token and the non-start tokens after it) are selected until the budget is
reached; words that would overshoot it are passed over, as in BERT's reference code.
All randomness comes from the `np.random.Generator` passed in: same seed, same masks.
"""

from __future__ import annotations

import numpy as np

from transformer.data.tokenizers import MASK_ID, NUM_SPECIAL


def _word_groups(candidates: np.ndarray, word_starts: np.ndarray) -> list[np.ndarray]:
  """Positions of candidate tokens grouped into words."""
  idx = np.flatnonzero(candidates)
  if idx.size == 0:
    return []
  # A new group at a word start, or where a run of candidates is interrupted.
  new = word_starts[idx] | np.concatenate([[True], np.diff(idx) > 1])
  return np.split(idx, np.flatnonzero(new)[1:])


def max_selected(mask_rate: float, length: int) -> int:
  """The most positions `mask_tokens` selects in a row of `length` tokens: the budget of a
  row whose tokens are all ordinary. The train step computes MLM logits at this many
  positions per row instead of all of them (BERT's `max_predictions_per_seq`)."""
  return max(1, round(mask_rate * length))


def mask_tokens(
  ids: np.ndarray,
  rng: np.random.Generator,
  vocab_size: int,
  *,
  mask_rate: float = 0.15,
  mask_token_rate: float = 0.8,
  random_token_rate: float = 0.1,
  word_starts: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """Corrupts one row for MLM.

  Args:
    ids: int [T] original tokens (PAD and other specials are never selected).
    rng: the source of randomness.
    vocab_size: random replacements are drawn from [NUM_SPECIAL, vocab_size).
    mask_rate: fraction of the row's ordinary tokens selected for prediction.
    mask_token_rate: of the selected, the fraction replaced by MASK.
    random_token_rate: of the selected, the fraction replaced by a random token.
    word_starts: bool [T] word-start flags; given, whole words are selected together.

  Returns:
    (inputs int32 [T] with the corruption applied, weights float32 [T]: 1.0 where selected).
  """
  ids = np.asarray(ids)
  candidates = ids >= NUM_SPECIAL  # [T]
  n = int(candidates.sum())
  selected = np.zeros(ids.shape, bool)
  if n:
    budget = max(1, round(mask_rate * n))
    if word_starts is None:
      selected[rng.choice(np.flatnonzero(candidates), size=budget, replace=False)] = True
    else:
      groups = _word_groups(candidates, np.asarray(word_starts, bool))
      count = 0
      for g in rng.permutation(len(groups)):
        if count >= budget:
          break
        if count + len(groups[g]) > budget:
          continue
        selected[groups[g]] = True
        count += len(groups[g])
  u = rng.random(ids.shape)  # [T] one draw per token decides its fate
  to_mask = selected & (u < mask_token_rate)
  to_random = selected & (u >= mask_token_rate) & (u < mask_token_rate + random_token_rate)
  inputs = np.where(to_mask, MASK_ID, ids)
  random_ids = rng.integers(NUM_SPECIAL, vocab_size, size=ids.shape)
  inputs = np.where(to_random, random_ids, inputs).astype(np.int32)
  return inputs, selected.astype(np.float32)

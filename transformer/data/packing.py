"""Packing variable-length token sequences into fixed-length rows, and padding.

A packed row holds several whole examples one after another:

  inputs       [a a a b b c 0 0]   (tokens; 0 = PAD)
  segment_ids  [1 1 1 2 2 3 0 0]   (1, 2, 3, ... per example in the row; 0 = padding)
  positions    [0 1 2 0 1 0 0 0]   (restart at 0 for each example)

Packing uses grain's first-fit packer (`grain.experimental.FirstFitPackIterDataset`):
several features (e.g. `inputs` and `targets` of a translation pair) are packed jointly,
so example k of a row has segment id k in every feature. An example is never split
across rows: one longer than the row raises, so callers truncate first with `fit_length`
(which counts what it cut). Packing efficiency is the fraction of non-pad tokens.
"""

from __future__ import annotations

from collections.abc import Mapping

import grain
import numpy as np

OVERLONG_POLICIES = ("truncate", "skip", "error")


def fit_length(ids: np.ndarray, max_len: int, policy: str, where: str = "") -> np.ndarray | None:
  """Returns `ids` cut to `max_len` ('truncate'), None ('skip'), or raises ('error').

  `where` (e.g. "data.tsv:17") names the example in the error message.
  """
  if len(ids) <= max_len:
    return ids
  if policy == "truncate":
    return ids[:max_len]
  if policy == "skip":
    return None
  if policy == "error":
    raise ValueError(
      f"{where or 'example'}: {len(ids)} tokens exceed the sequence length {max_len}"
    )
  raise ValueError(f"overlong policy must be one of {OVERLONG_POLICIES}, got {policy!r}")


def pad_example(
  example: Mapping[str, np.ndarray], lengths: Mapping[str, int]
) -> dict[str, np.ndarray]:
  """Pads each feature in `lengths` to its row length, one example per row.

  The unpacked counterpart of `pack`, with the same output keys: `<key>`,
  `<key>_segment_ids` (1 on tokens, 0 on padding) and `<key>_positions`, int32
  [lengths[key]]. Features not in `lengths` pass through unchanged.
  """
  out = {k: v for k, v in example.items() if k not in lengths}
  for key, length in lengths.items():
    ids = example[key]
    n = len(ids)
    if n > length:
      raise ValueError(f"{key}: example of {n} tokens does not fit a row of {length}")
    tokens, segment_ids, positions = (np.zeros(length, np.int32) for _ in range(3))
    tokens[:n] = ids
    segment_ids[:n] = 1
    positions[:n] = np.arange(n)
    out[key], out[f"{key}_segment_ids"], out[f"{key}_positions"] = tokens, segment_ids, positions
  return out


def pack(
  ds: grain.IterDataset,
  lengths: Mapping[str, int],
  num_packing_bins: int,
  seed: int = 0,
  shuffle_bins: bool = False,
) -> grain.IterDataset:
  """Packs 1-D int features of `ds` into rows of `lengths[key]` tokens (first fit).

  Each element must hold every key of `lengths` (other keys are dropped). Output keys:
  `<key>`, `<key>_segment_ids`, `<key>_positions`, all int32 [lengths[key]]. Up to
  `num_packing_bins` rows are filled at once (more bins: less padding); the iterator
  state is checkpointable like any grain iterator.
  """
  packed = grain.experimental.FirstFitPackIterDataset(
    ds,
    length_struct=dict(lengths),
    num_packing_bins=num_packing_bins,
    seed=seed,
    shuffle_bins=shuffle_bins,
  )
  return packed.map(_as_int32)


def _as_int32(row: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  return {k: np.asarray(v, np.int32) for k, v in row.items()}


def packing_efficiency(segment_ids: np.ndarray) -> float:
  """Fraction of non-padding tokens (segment id > 0) in a batch or row."""
  segment_ids = np.asarray(segment_ids)
  return float((segment_ids > 0).mean()) if segment_ids.size else 0.0

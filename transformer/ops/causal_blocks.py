"""Causal self-attention by query blocks that skip the keys every query of a block masks.

Letters: B batch, T query length = S key length, N query heads, K key/value heads,
H head dim, c queries per block.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

CAUSAL_BLOCK = 128  # smallest query block (docs/PERFORMANCE.md)


def causal_query_blocks(t: int, s: int, mask_info: Any) -> int:
  """How many query blocks causal self-attention splits into (1 = none).

  `mask_info` is a `transformer.nn.masks.MaskInfo` or None. Causal self-attention over
  T = S >= 256 positions, not decoding (q_offset 0), without a window or a bidirectional
  prefix: 2 to 4 equal blocks of at least `CAUSAL_BLOCK` queries.
  """
  if mask_info is None or not mask_info.causal or mask_info.window is not None:
    return 1
  if mask_info.q_prefix is not None:  # prefix queries see later keys
    return 1
  if t != s or t < 2 * CAUSAL_BLOCK:
    return 1
  # A traced offset (`nn.remat` traces the 0 of a full pass) counts as 0 here: with T == S
  # queries start at key 0, since a cache of S keys holds no earlier ones.
  if isinstance(mask_info.q_offset, int) and mask_info.q_offset != 0:
    return 1
  blocks = min(4, t // CAUSAL_BLOCK)
  while t % blocks:
    blocks -= 1
  return blocks


def no_query_blocks(t: int, s: int, mask_info: Any) -> int:
  """The plain path: one product over all keys, whatever the mask."""
  del t, s, mask_info
  return 1


def slice_broadcast(x: jax.Array | None, axis: int, start: int, size: int) -> jax.Array | None:
  """Slice a broadcastable [*, *, T, S] array along `axis` unless that axis has size 1."""
  if x is None or x.shape[axis] == 1:
    return x
  return lax.dynamic_slice_in_dim(x, start, size, axis=axis)


def causal_block_attention(
  attend: Callable[..., jax.Array],
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  mask: jax.Array,
  bias: jax.Array | None,
  dropout_rate: float,
  dropout_rng: jax.Array | None,
  blocks: int,
) -> jax.Array:
  """Causal self-attention by query blocks: q [B, T, N, H], k, v [B, S, K, H] -> [B, T, N, H].

  Block i (queries [ic, (i+1)c)) computes scores against keys [0, (i+1)c) only, skipping
  the keys every one of its queries has masked (with 2 / 4 blocks: 75% / 62.5% of the
  score and value products). `mask` already holds the causal mask, so each block is
  `attend(q, k, v, mask, bias, dropout_rate, dropout_rng)` on its slices, exactly. Dropout
  on block i draws from fold_in(dropout_rng, i). A query row that an extra `mask` hides
  from every key (causal self-attention alone never does) gets uniform weights over its
  block's keys [0, (i+1)c) rather than over all S.
  """
  c = q.shape[1] // blocks
  outs = []
  for i in range(blocks):
    start, keys = i * c, (i + 1) * c
    block_mask = slice_broadcast(slice_broadcast(mask, 2, start, c), 3, 0, keys)
    block_bias = slice_broadcast(slice_broadcast(bias, 2, start, c), 3, 0, keys)
    rng = None if dropout_rate == 0.0 else jax.random.fold_in(dropout_rng, i)
    q_i = q[:, start : start + c]  # [B, c, N, H]
    outs.append(attend(q_i, k[:, :keys], v[:, :keys], block_mask, block_bias, dropout_rate, rng))
  return jnp.concatenate(outs, axis=1)  # [B, T, N, H]

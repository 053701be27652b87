"""Attention masks: dense mask helpers and `MaskInfo`, the factored mask built per block;
`BlockBias`, a position bias built per block the same way.

Letters: B batch, T query length, S key length, N heads, H head dim. Masks are boolean,
True = may attend, broadcastable to [B, N, T, S].
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from jax import lax

# Masked logits get this value (not -inf, so fully masked rows stay finite: uniform weights).
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def padding_mask(tokens: jax.Array, pad_id: int = 0) -> jax.Array:
  """Keys that are not padding: tokens [B, S] -> bool [B, 1, 1, S]."""
  return (tokens != pad_id)[:, None, None, :]


def lengths_mask(lengths: jax.Array, max_len: int) -> jax.Array:
  """Keys before each row's length: lengths [B] -> bool [B, 1, 1, S]."""
  return (jnp.arange(max_len)[None, :] < lengths[:, None])[:, None, None, :]


def causal_mask(q_len: int, kv_len: int | None = None, offset: int | jax.Array = 0) -> jax.Array:
  """Query t (at key index offset + t) sees keys s <= offset + t: bool [1, 1, T, S]."""
  kv_len = q_len if kv_len is None else kv_len
  q_idx = offset + jnp.arange(q_len)[:, None]  # [T, 1]
  return (jnp.arange(kv_len)[None, :] <= q_idx)[None, None]


def sliding_window_mask(
  q_len: int, window: int, kv_len: int | None = None, offset: int = 0, causal: bool = True
) -> jax.Array:
  """Local attention: |t - s| < window (and s <= t if causal): bool [1, 1, T, S]."""
  kv_len = q_len if kv_len is None else kv_len
  delta = offset + jnp.arange(q_len)[:, None] - jnp.arange(kv_len)[None, :]  # [T, S]
  mask = (delta >= 0) & (delta < window) if causal else jnp.abs(delta) < window
  return mask[None, None]


def segment_mask(q_segment_ids: jax.Array, kv_segment_ids: jax.Array) -> jax.Array:
  """Packed sequences: attend within the same segment only: [B, T], [B, S] -> [B, 1, T, S]."""
  return (q_segment_ids[:, :, None] == kv_segment_ids[:, None, :])[:, None]


def prefix_lm_mask(prefix: jax.Array) -> jax.Array:
  """Prefix-LM: causal, plus every pair of prefix tokens: prefix [B, T] (1 = prefix)
  -> bool [B, 1, T, T]."""
  both = prefix.astype(bool)[:, :, None] & prefix.astype(bool)[:, None, :]  # [B, T, T]
  return causal_mask(prefix.shape[1]) | both[:, None]


def combine_masks(*masks: jax.Array | None) -> jax.Array | None:
  """Logical AND of the given masks (None entries ignored), broadcast together."""
  masks = [m for m in masks if m is not None]
  if not masks:
    return None
  return functools.reduce(jnp.logical_and, masks)


@flax.struct.dataclass
class MaskInfo:
  """Positions, segments and prefix of queries and keys; the mask is derived per block.

  q_positions [B, T] and kv_positions [B, S] are the positions seen by position encodings
  (they restart per packed segment). Causality and windows use key *indices*: query t
  sits at key index `q_offset + t` (q_offset = cache index while decoding). Segment id 0
  marks padding; queries only see keys with the same segment id.

  Prefix-LM: with causal=True and bool q_prefix [B, T] / kv_prefix [B, S] (True = in the
  prefix), key s is visible to query t iff same segment and (s <= t or both are in the
  prefix): bidirectional inside the prefix, causal after it. A window still bounds
  |t - s|.
  """

  q_positions: jax.Array
  kv_positions: jax.Array
  q_segment_ids: jax.Array | None = None
  kv_segment_ids: jax.Array | None = None
  q_offset: jax.Array | int = 0
  causal: bool = flax.struct.field(pytree_node=False, default=False)
  window: int | None = flax.struct.field(pytree_node=False, default=None)
  q_prefix: jax.Array | None = None
  kv_prefix: jax.Array | None = None

  @classmethod
  def create(
    cls,
    q_segment_ids: jax.Array,
    kv_segment_ids: jax.Array | None = None,
    q_positions: jax.Array | None = None,
    kv_positions: jax.Array | None = None,
    causal: bool = False,
    window: int | None = None,
    prefix: jax.Array | None = None,
  ) -> MaskInfo:
    """Self-attention (kv_* None) or cross-attention info with default positions 0..L-1.

    In self-attention the keys are the queries, so kv_positions defaults to q_positions.
    `prefix` [B, T] (1 = prefix token) makes causal self-attention a prefix-LM.
    """
    self_attention = kv_segment_ids is None
    if prefix is not None and not (self_attention and causal):
      raise ValueError("a prefix applies to causal self-attention only")
    kv_segment_ids = q_segment_ids if kv_segment_ids is None else kv_segment_ids
    if q_positions is None:
      q_positions = jnp.broadcast_to(jnp.arange(q_segment_ids.shape[1]), q_segment_ids.shape)
    if kv_positions is None and self_attention:
      kv_positions = q_positions
    elif kv_positions is None:
      kv_positions = jnp.broadcast_to(jnp.arange(kv_segment_ids.shape[1]), kv_segment_ids.shape)
    prefix = None if prefix is None else prefix.astype(bool)
    return cls(
      q_positions, kv_positions, q_segment_ids, kv_segment_ids, 0, causal, window, prefix, prefix
    )

  def block_mask(self, q_start=0, q_len=None, kv_start=0, kv_len=None) -> jax.Array | None:
    """Mask of queries [q_start, +q_len) x keys [kv_start, +kv_len): bool [B|1, 1, t, s].

    None when nothing is masked.
    """
    q_len = self.q_positions.shape[1] if q_len is None else q_len
    kv_len = self.kv_positions.shape[1] if kv_len is None else kv_len
    if not self.causal and self.window is None and self.q_segment_ids is None:
      return None  # Everything attends to everything.
    q_idx = self.q_offset + q_start + jnp.arange(q_len)  # [t]
    kv_idx = kv_start + jnp.arange(kv_len)  # [s]
    take = lambda x, start, n: None if x is None else lax.dynamic_slice_in_dim(x, start, n, axis=1)
    return self.mask_at(
      q_idx,
      kv_idx,
      take(self.q_segment_ids, q_start, q_len),
      take(self.kv_segment_ids, kv_start, kv_len),
      take(self.q_prefix, q_start, q_len),
      take(self.kv_prefix, kv_start, kv_len),
    )

  def mask_at(self, q_idx, kv_idx, q_seg=None, kv_seg=None, q_pre=None, kv_pre=None) -> jax.Array:
    """The mask of queries at key indices q_idx [t] over keys at kv_idx [s], with their
    segment ids [B, t] / [B, s] and prefix flags (None: none): bool [B|1, 1, t, s].

    The one rule behind `block_mask`; context parallelism (`nn/context.py`) calls it with
    the indices of the sequence pieces a device holds, which need not be contiguous.
    """
    delta = (q_idx[:, None] - kv_idx[None, :])[None, None]  # [1, 1, t, s]
    mask = jnp.ones(delta.shape, bool)
    if self.causal:
      mask = delta >= 0
      if q_pre is not None:
        mask = mask | (q_pre[:, :, None] & kv_pre[:, None, :])[:, None]  # [B, 1, t, s]
    if self.window is not None:
      mask = mask & (jnp.abs(delta) < self.window)
    if q_seg is not None:
      mask = mask & segment_mask(q_seg, kv_seg)
    return mask


@flax.struct.dataclass
class BlockBias:
  """An additive logit bias given by positions, so any (query block, key block) of it can
  be built on its own: the chunked attention builds it block by block (memory linear in
  length), the other implementations once over every position (`dense`). One definition
  serves both.

  fn(params, q, q_positions, kv_positions) -> float32 [B|1, N, t, s], with q [B, t, N, H]
  the block's queries (unscaled; read only by query-dependent terms, Shaw's) and positions
  [B, t], [B, s] (those of `MaskInfo`: restarted per packed segment, cache positions while
  decoding). `params` (a pytree: T5's table, Shaw's embeddings) is an argument, not a
  closure, so the bias passes through `jax.jit` and gradients reach it.
  """

  fn: Callable[[Any, jax.Array, jax.Array, jax.Array], jax.Array] = flax.struct.field(
    pytree_node=False
  )
  params: Any = None

  def __call__(self, q: jax.Array, q_positions: jax.Array, kv_positions: jax.Array) -> jax.Array:
    """The bias of queries q [B, t, N, H] at q_positions [B, t] over keys at [B, s]."""
    return self.fn(self.params, q, q_positions, kv_positions)

  def dense(self, q: jax.Array, info: MaskInfo | None) -> jax.Array:
    """The whole bias [B|1, N, T, S] at the positions of `info`."""
    if info is None:
      raise ValueError("a BlockBias needs mask_info: it is built at the MaskInfo positions")
    return self(q, info.q_positions, info.kv_positions)

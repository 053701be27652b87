"""Scaled dot-product attention, its masks, and multi-head attention with a KV cache.

Letters: B batch, T query length, S key length, N query heads, K key/value heads,
G = N // K query heads per key/value head, H head dim, D model dim.

Query head n uses key/value head n // G (heads of one group are contiguous, as in
PyTorch's `enable_gqa` and `repeat_interleave`). Masks are boolean, True = may attend,
broadcastable to [B, N, T, S]. Three implementations give the same numbers:

  'xla'      einsum + float32 softmax; the reference, supports everything.
  'jax'      `jax.nn.dot_product_attention` (cuDNN flash attention on GPU); falls back
             to 'xla' when attention dropout is active or weights are requested.
  'chunked'  online softmax over [chunk x chunk] blocks (Rabe & Staats 2021; the
             FlashAttention recurrence); memory grows linearly with length when the mask
             comes from a `MaskInfo` (no dense [T, S] mask or bias).
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
from jax import lax

from transformer.nn import positional
from transformer.nn.config import ModelConfig
from transformer.nn.layers import bernoulli, dense_dot_general
from transformer.nn.partitioning import constrain

# Masked logits get this value (not -inf, so fully masked rows stay finite: uniform weights).
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


# ----------------------------------------------------------------------------------------
# Masks.


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


def combine_masks(*masks: jax.Array | None) -> jax.Array | None:
  """Logical AND of the given masks (None entries ignored), broadcast together."""
  masks = [m for m in masks if m is not None]
  if not masks:
    return None
  return functools.reduce(jnp.logical_and, masks)


@flax.struct.dataclass
class MaskInfo:
  """Positions and segments of queries and keys; the mask is derived from them per block.

  q_positions [B, T] and kv_positions [B, S] are the positions seen by position encodings
  (they restart per packed segment). Causality and windows use key *indices*: query t
  sits at key index `q_offset + t` (q_offset = cache index while decoding). Segment id 0
  marks padding; queries only see keys with the same segment id.
  """

  q_positions: jax.Array
  kv_positions: jax.Array
  q_segment_ids: jax.Array | None = None
  kv_segment_ids: jax.Array | None = None
  q_offset: jax.Array | int = 0
  causal: bool = flax.struct.field(pytree_node=False, default=False)
  window: int | None = flax.struct.field(pytree_node=False, default=None)

  @classmethod
  def create(
    cls,
    q_segment_ids: jax.Array,
    kv_segment_ids: jax.Array | None = None,
    q_positions: jax.Array | None = None,
    kv_positions: jax.Array | None = None,
    causal: bool = False,
    window: int | None = None,
  ) -> MaskInfo:
    """Self-attention (kv_* None) or cross-attention info with default positions 0..L-1.

    In self-attention the keys are the queries, so kv_positions defaults to q_positions.
    """
    self_attention = kv_segment_ids is None
    kv_segment_ids = q_segment_ids if kv_segment_ids is None else kv_segment_ids
    if q_positions is None:
      q_positions = jnp.broadcast_to(jnp.arange(q_segment_ids.shape[1]), q_segment_ids.shape)
    if kv_positions is None and self_attention:
      kv_positions = q_positions
    elif kv_positions is None:
      kv_positions = jnp.broadcast_to(jnp.arange(kv_segment_ids.shape[1]), kv_segment_ids.shape)
    return cls(q_positions, kv_positions, q_segment_ids, kv_segment_ids, 0, causal, window)

  def block_mask(self, q_start=0, q_len=None, kv_start=0, kv_len=None) -> jax.Array | None:
    """Mask of queries [q_start, +q_len) x keys [kv_start, +kv_len): bool [B|1, 1, t, s].

    None when nothing is masked.
    """
    q_len = self.q_positions.shape[1] if q_len is None else q_len
    kv_len = self.kv_positions.shape[1] if kv_len is None else kv_len
    q_idx = self.q_offset + q_start + jnp.arange(q_len)  # [t]
    kv_idx = kv_start + jnp.arange(kv_len)  # [s]
    delta = (q_idx[:, None] - kv_idx[None, :])[None, None]  # [1, 1, t, s]
    if not self.causal and self.window is None and self.q_segment_ids is None:
      return None  # Everything attends to everything.
    mask = jnp.ones((1, 1, q_len, kv_len), bool)
    if self.causal:
      mask = delta >= 0
    if self.window is not None:
      mask = mask & ((delta < self.window) if self.causal else (jnp.abs(delta) < self.window))
    if self.q_segment_ids is not None:
      q_seg = lax.dynamic_slice_in_dim(self.q_segment_ids, q_start, q_len, axis=1)
      kv_seg = lax.dynamic_slice_in_dim(self.kv_segment_ids, kv_start, kv_len, axis=1)
      mask = mask & segment_mask(q_seg, kv_seg)
    return mask


# ----------------------------------------------------------------------------------------
# Scaled dot-product attention.


def dot_product_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  *,
  mask: jax.Array | None = None,
  mask_info: MaskInfo | None = None,
  bias: jax.Array | None = None,
  dropout_rate: float = 0.0,
  dropout_rng: jax.Array | None = None,
  deterministic: bool = True,
  impl: str = "xla",
  chunk_size: int = 512,
  return_weights: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
  """softmax(q k^T / sqrt(H) + bias, masked) v.

  Args:
    q: [B, T, N, H]; k, v: [B, S, K, H] with N % K == 0.
    mask: optional bool, broadcastable to [B, N, T, S], True = attend.
    mask_info: optional factored mask (AND-ed with `mask`); the chunked path builds it
      block by block.
    bias: optional float additive bias broadcastable to [B, N, T, S].
    dropout_rate, dropout_rng, deterministic: dropout on the attention weights.
    impl: 'xla' | 'jax' | 'chunked'.
    return_weights: also return the weights [B, N, T, S] (computed by 'xla').
  Returns:
    [B, T, N, H] in q's dtype (and the float32 weights if asked).
  """
  if q.shape[2] % k.shape[2]:
    raise ValueError(f"query heads {q.shape[2]} must be a multiple of kv heads {k.shape[2]}")
  use_dropout = dropout_rate > 0.0 and not deterministic
  if use_dropout and dropout_rng is None:
    raise ValueError("attention dropout needs a dropout_rng")
  if impl == "chunked" and not return_weights:
    return _chunked_attention(
      q,
      k,
      v,
      mask,
      mask_info,
      bias,
      dropout_rate if use_dropout else 0.0,
      dropout_rng,
      chunk_size,
    )
  if mask_info is not None:
    mask = combine_masks(mask, mask_info.block_mask())
  if impl == "jax" and not use_dropout and not return_weights:
    return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask).astype(q.dtype)
  if impl not in ("xla", "jax", "chunked"):
    raise ValueError(f"unknown attention impl {impl!r}; expected xla, jax or chunked")
  rate = dropout_rate if use_dropout else 0.0
  blocks = 1 if return_weights else causal_query_blocks(q.shape[1], k.shape[1], mask_info)
  if blocks > 1:
    return _causal_block_attention(q, k, v, mask, bias, rate, dropout_rng, blocks)
  return _xla_attention(q, k, v, mask, bias, rate, dropout_rng, return_weights)


CAUSAL_BLOCK = 128  # smallest query block of the causal 'xla' path (docs/PERFORMANCE.md)


def causal_query_blocks(t: int, s: int, mask_info: MaskInfo | None) -> int:
  """How many query blocks the 'xla' path splits causal self-attention into (1 = none).

  Causal self-attention over T = S >= 256 positions, not decoding (q_offset 0) and without
  a window: 2 to 4 equal blocks of at least `CAUSAL_BLOCK` queries.
  """
  if mask_info is None or not mask_info.causal or mask_info.window is not None:
    return 1
  if t != s or t < 2 * CAUSAL_BLOCK:
    return 1
  if not isinstance(mask_info.q_offset, int) or mask_info.q_offset != 0:
    return 1
  blocks = min(4, t // CAUSAL_BLOCK)
  while t % blocks:
    blocks -= 1
  return blocks


def _causal_block_attention(q, k, v, mask, bias, dropout_rate, dropout_rng, blocks):
  """Causal self-attention by query blocks: block i (queries [ic, (i+1)c)) computes scores
  against keys [0, (i+1)c) only, skipping the keys every one of its queries has masked
  (with 2 / 4 blocks: 75% / 62.5% of the score and value products). `mask` already
  holds the causal mask, so each block is the 'xla' path on its slices, exactly. Dropout
  on block i draws from fold_in(dropout_rng, i). A query row that an extra `mask` hides
  from every key (causal self-attention alone never does) gets uniform weights over its
  block's keys [0, (i+1)c) rather than over all S.
  """
  c = q.shape[1] // blocks
  outs = []
  for i in range(blocks):
    start, keys = i * c, (i + 1) * c
    block_mask = _slice_broadcast(_slice_broadcast(mask, 2, start, c), 3, 0, keys)
    block_bias = _slice_broadcast(_slice_broadcast(bias, 2, start, c), 3, 0, keys)
    rng = None if dropout_rate == 0.0 else jax.random.fold_in(dropout_rng, i)
    q_i = q[:, start : start + c]  # [B, c, N, H]
    outs.append(
      _xla_attention(
        q_i, k[:, :keys], v[:, :keys], block_mask, block_bias, dropout_rate, rng, False
      )
    )
  return jnp.concatenate(outs, axis=1)  # [B, T, N, H]


def _xla_attention(q, k, v, mask, bias, dropout_rate, dropout_rng, return_weights):
  b, t, n, h = q.shape
  s, kv = k.shape[1], k.shape[2]
  q = q * jnp.asarray(h**-0.5, q.dtype)
  if kv == n:  # MHA: plain 4-D contractions (cheaper layouts for XLA:CPU than G = 1)
    logits = jnp.einsum("BTNH,BSNH->BNTS", q, k, preferred_element_type=jnp.float32)
  else:
    q = q.reshape(b, t, kv, n // kv, h)  # [B, T, K, G, H]
    logits = jnp.einsum("BTKGH,BSKH->BKGTS", q, k, preferred_element_type=jnp.float32)
  logits = logits.reshape(b, n, t, s)  # [B, N, T, S]
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  if mask is not None:
    logits = jnp.where(mask, logits, MASK_VALUE)
  weights = jax.nn.softmax(logits, axis=-1)  # [B, N, T, S] float32
  probs = weights
  if dropout_rate > 0.0:
    keep = bernoulli(dropout_rng, 1.0 - dropout_rate, weights.shape)
    probs = jnp.where(keep, weights / (1.0 - dropout_rate), 0.0)
  probs = probs.astype(v.dtype)
  if kv == n:
    out = jnp.einsum("BNTS,BSNH->BTNH", probs, v)  # [B, T, N, H]
  else:
    probs = probs.reshape(b, kv, n // kv, t, s)  # [B, K, G, T, S]
    out = jnp.einsum("BKGTS,BSKH->BTKGH", probs, v).reshape(b, t, n, h)  # [B, T, N, H]
  return (out, weights) if return_weights else out


def _slice_broadcast(x, axis, start, size):
  """Slice a broadcastable [*, *, T, S] array along `axis` unless that axis has size 1."""
  if x is None or x.shape[axis] == 1:
    return x
  return lax.dynamic_slice_in_dim(x, start, size, axis=axis)


def _pad_axis(x, axis, new_len, value):
  if x is None or x.shape[axis] == 1 or x.shape[axis] == new_len:
    return x
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, new_len - x.shape[axis])
  return jnp.pad(x, pad, constant_values=value)


def _chunked_attention(q, k, v, mask, mask_info, bias, dropout_rate, dropout_rng, chunk):
  b, t, n, h = q.shape
  s, kv = k.shape[1], k.shape[2]
  g = n // kv
  qc, kc = min(chunk, t), min(chunk, s)
  nq, nk = math.ceil(t / qc), math.ceil(s / kc)
  tp, sp = nq * qc, nk * kc
  q = _pad_axis(q, 1, tp, 0) * jnp.asarray(h**-0.5, q.dtype)
  k, v = _pad_axis(k, 1, sp, 0), _pad_axis(v, 1, sp, 0)
  mask = _pad_axis(_pad_axis(mask, 2, tp, False), 3, sp, False)
  bias = _pad_axis(_pad_axis(bias, 2, tp, 0.0), 3, sp, 0.0)
  if mask_info is not None:
    mask_info = mask_info.replace(
      q_segment_ids=_pad_axis(mask_info.q_segment_ids, 1, tp, -1),
      kv_segment_ids=_pad_axis(mask_info.kv_segment_ids, 1, sp, -2),
    )
  q_blocks = q.reshape(b, nq, qc, kv, g, h).swapaxes(0, 1)  # [nq, B, qc, K, G, H]

  @jax.checkpoint
  def one_query_block(qi, q_blk):
    def step(carry, kj):
      out, row_max, denom = carry
      k_blk = lax.dynamic_slice_in_dim(k, kj * kc, kc, axis=1)  # [B, kc, K, H]
      v_blk = lax.dynamic_slice_in_dim(v, kj * kc, kc, axis=1)  # [B, kc, K, H]
      logits = jnp.einsum(
        "BTKGH,BSKH->BKGTS", q_blk, k_blk, preferred_element_type=jnp.float32
      ).reshape(b, n, qc, kc)  # [B, N, qc, kc]
      if bias is not None:
        logits = logits + _slice_broadcast(
          _slice_broadcast(bias, 2, qi * qc, qc), 3, kj * kc, kc
        ).astype(jnp.float32)
      block_mask = _slice_broadcast(_slice_broadcast(mask, 2, qi * qc, qc), 3, kj * kc, kc)
      if mask_info is not None:
        block_mask = combine_masks(block_mask, mask_info.block_mask(qi * qc, qc, kj * kc, kc))
      if block_mask is not None:
        logits = jnp.where(block_mask, logits, MASK_VALUE)
      # Keys past S (padding added here) get exactly zero weight.
      valid_key = (kj * kc + jnp.arange(kc)) < s  # [kc]
      logits = jnp.where(valid_key, logits, -jnp.inf)
      new_max = jnp.maximum(row_max, logits.max(axis=-1))  # [B, N, qc]
      p = jnp.exp(logits - new_max[..., None])  # [B, N, qc, kc]
      correction = jnp.exp(row_max - new_max)  # [B, N, qc]
      denom = denom * correction + p.sum(axis=-1)
      if dropout_rate > 0.0:
        rng = jax.random.fold_in(dropout_rng, qi * nk + kj)
        keep = bernoulli(rng, 1.0 - dropout_rate, p.shape)
        p = jnp.where(keep, p / (1.0 - dropout_rate), 0.0)
      pv = jnp.einsum(
        "BKGTS,BSKH->BKGTH",
        p.astype(v.dtype).reshape(b, kv, g, qc, kc),
        v_blk,
        preferred_element_type=jnp.float32,
      ).reshape(b, n, qc, h)  # [B, N, qc, H]
      out = out * correction[..., None] + pv
      return (out, new_max, denom), None

    init = (
      jnp.zeros((b, n, qc, h), jnp.float32),
      jnp.full((b, n, qc), -jnp.inf, jnp.float32),
      jnp.zeros((b, n, qc), jnp.float32),
    )
    (out, _, denom), _ = lax.scan(step, init, jnp.arange(nk))
    return out / denom[..., None]  # [B, N, qc, H]

  blocks = lax.map(lambda args: one_query_block(*args), (jnp.arange(nq), q_blocks))
  out = blocks.transpose(1, 0, 3, 2, 4).reshape(b, tp, n, h)[:, :t]  # [B, T, N, H]
  return out.astype(q.dtype)


# ----------------------------------------------------------------------------------------
# Multi-head attention.


class MultiHeadAttention(nn.Module):
  """Multi-head self- or cross-attention with N query heads and K key/value heads.

  K == N is MHA, K == 1 is MQA, anything between is GQA. Position encodings that act
  inside attention (RoPE, ALiBi, Shaw, T5 bias) use the positions in `info`. With
  `decode=True` keys and values are written to a 'cache' collection of length
  `config.max_len` at the cache index and queries attend over the cache.
  """

  config: ModelConfig
  is_cross: bool = False

  @nn.compact
  def __call__(
    self,
    x: jax.Array,
    kv_input: jax.Array | None,
    info: MaskInfo,
    rel_table: jax.Array | None = None,
    deterministic: bool = True,
    decode: bool = False,
    return_weights: bool = False,
  ):
    """x: [B, T, D] queries; kv_input: [B, S, D] (cross) or None (self). Returns [B, T, D]."""
    c = self.config
    dtype = jnp.dtype(c.dtype)
    n, kv, h = c.num_heads, c.kv_heads, c.head_dim

    def proj(heads, name):
      return nn.DenseGeneral(
        (heads, h),
        use_bias=c.use_bias,
        dtype=dtype,
        kernel_init=nn.initializers.xavier_uniform(),
        dot_general=dense_dot_general,
        name=name,
      )

    kv_input = x if kv_input is None else kv_input
    q = constrain(proj(n, "query")(x), ("batch", "length", "heads", "head_dim"))  # [B, T, N, H]
    k = constrain(proj(kv, "key")(kv_input), ("batch", "length", "kv_heads", "head_dim"))
    v = constrain(proj(kv, "value")(kv_input), ("batch", "length", "kv_heads", "head_dim"))

    if c.position == "rope" and not self.is_cross:
      q = positional.apply_rope(q, info.q_positions, c.rope_theta)
      k = positional.apply_rope(k, info.kv_positions, c.rope_theta)

    if decode and not self.is_cross:
      k, v, info = self._update_cache(k, v, info)

    bias = None
    if not self.is_cross:
      if c.position == "alibi":
        bias = positional.alibi_bias(info.q_positions, info.kv_positions, n)  # [B, N, T, S]
      elif c.position == "relative_t5":
        relative = info.kv_positions[:, None, :] - info.q_positions[:, :, None]  # [B, T, S]
        buckets = positional.t5_relative_bucket(
          relative, not info.causal, c.relative_num_buckets, c.relative_max_distance
        )
        bias = jnp.take(rel_table, buckets, axis=0).transpose(0, 3, 1, 2)  # [B, N, T, S]
      elif c.position == "relative_shaw":
        table = self.param(
          "rel_key_embedding", nn.initializers.normal(0.02), (2 * c.shaw_max_distance + 1, h)
        )
        scaled_q = q * jnp.asarray(h**-0.5, q.dtype)
        bias = positional.shaw_relative_logits(scaled_q, table, info.q_positions, info.kv_positions)

    dropout_rng = None
    if c.attention_dropout_rate > 0.0 and not deterministic:
      dropout_rng = self.make_rng("dropout")
    result = dot_product_attention(
      q,
      k,
      v,
      mask_info=info,
      bias=bias,
      dropout_rate=c.attention_dropout_rate,
      dropout_rng=dropout_rng,
      deterministic=deterministic,
      impl=c.attention_impl,
      chunk_size=c.attention_chunk_size,
      return_weights=return_weights,
    )
    out, weights = result if return_weights else (result, None)
    if return_weights:
      self.sow("intermediates", "attention_weights", weights)
    return nn.DenseGeneral(
      c.d_model,
      axis=(-2, -1),
      use_bias=c.use_bias,
      dtype=dtype,
      kernel_init=nn.initializers.xavier_uniform(),
      dot_general=dense_dot_general,
      name="out",
    )(out)  # [B, T, D]

  def _update_cache(self, k, v, info: MaskInfo):
    """Writes k, v [B, T, K, H] at the cache index; returns the whole cache and its info."""
    c = self.config
    b, t, kv, h = k.shape
    initialized = self.has_variable("cache", "cached_key")
    zeros = functools.partial(jnp.zeros, dtype=k.dtype)
    cached_key = self.variable("cache", "cached_key", zeros, (b, c.max_len, kv, h))
    cached_value = self.variable("cache", "cached_value", zeros, (b, c.max_len, kv, h))
    cached_pos = self.variable("cache", "cached_positions", jnp.zeros, (b, c.max_len), jnp.int32)
    cached_seg = self.variable("cache", "cached_segment_ids", jnp.zeros, (b, c.max_len), jnp.int32)
    index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
    if not initialized:  # Creating the cache (model.init): nothing to attend over yet.
      return k, v, info
    i = index.value
    cached_key.value = lax.dynamic_update_slice(cached_key.value, k, (0, i, 0, 0))
    cached_value.value = lax.dynamic_update_slice(cached_value.value, v, (0, i, 0, 0))
    cached_pos.value = lax.dynamic_update_slice(
      cached_pos.value, info.q_positions.astype(jnp.int32), (0, i)
    )
    q_seg = info.q_segment_ids
    if q_seg is None:
      q_seg = jnp.ones((b, t), jnp.int32)
    cached_seg.value = lax.dynamic_update_slice(cached_seg.value, q_seg.astype(jnp.int32), (0, i))
    index.value = i + t
    info = MaskInfo(
      q_positions=info.q_positions,
      kv_positions=cached_pos.value,
      q_segment_ids=q_seg.astype(jnp.int32),
      kv_segment_ids=cached_seg.value,
      q_offset=i,
      causal=True,
      window=info.window,
    )
    return cached_key.value, cached_value.value, info

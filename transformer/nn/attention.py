"""Multi-head attention with N query heads and K key/value heads, and its KV cache.

Letters: B batch, T query length, S key length, N query heads, K key/value heads,
H head dim, D model dim. Masks come from `masks.MaskInfo`; the scores from
`kernels.dot_product_attention`; position encodings that act inside attention (RoPE,
ALiBi, Shaw, T5 bias) through the `positions.Position` hooks.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from transformer.nn.config import ModelConfig
from transformer.nn.kernels import dot_product_attention
from transformer.nn.masks import MaskInfo
from transformer.nn.partitioning import constrain
from transformer.nn.positions import position_for
from transformer.ops import select


class MultiHeadAttention(nn.Module):
  """Multi-head self- or cross-attention with N query heads and K key/value heads.

  K == N is MHA, K == 1 is MQA, anything between is GQA. Position encodings act in
  self-attention only, at the positions in `info`. With `decode=True` keys and values are
  written to a 'cache' collection of length `config.max_len` at the cache index and
  queries attend over the cache.
  """

  config: ModelConfig
  is_cross: bool = False

  @nn.compact
  def __call__(
    self,
    x: jax.Array,
    kv_input: jax.Array | None,
    info: MaskInfo,
    position_table: jax.Array | None = None,
    deterministic: bool = True,
    decode: bool = False,
    return_weights: bool = False,
  ):
    """x: [B, T, D] queries; kv_input: [B, S, D] (cross) or None (self). Returns [B, T, D].

    position_table: the stack's shared position table (`Position.shared_table`), or None.
    """
    c = self.config
    dtype = jnp.dtype(c.dtype)
    n, kv, h = c.num_heads, c.kv_heads, c.head_dim
    dot_general = select(c.ops).dot_general

    def proj(heads, name):
      return nn.DenseGeneral(
        (heads, h),
        use_bias=c.qkv_biases,
        dtype=dtype,
        kernel_init=nn.initializers.xavier_uniform(),
        dot_general=dot_general,
        name=name,
      )

    kv_input = x if kv_input is None else kv_input
    q = constrain(proj(n, "query")(x), ("batch", "length", "heads", "head_dim"))  # [B, T, N, H]
    k = constrain(proj(kv, "key")(kv_input), ("batch", "length", "kv_heads", "head_dim"))
    v = constrain(proj(kv, "value")(kv_input), ("batch", "length", "kv_heads", "head_dim"))

    bias = None
    if not self.is_cross:
      position = position_for(c)
      q = position.rotate(q, info.q_positions)  # [B, T, N, H]
      k = position.rotate(k, info.kv_positions)  # [B, S, K, H]
      if decode:
        k, v, info = self._update_cache(k, v, info)
      bias = position.bias(self, q, info, position_table)  # [B, N, T, S] or None

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
      ops=c.ops,
      scale=c.attention_scale,
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
      dot_general=dot_general,
      name="out",
    )(out)  # [B, T, D]

  def _update_cache(self, k, v, info: MaskInfo):
    """Writes k, v [B, T, K, H] at the cache index; returns the whole cache and its info.

    A prefix (prefix-LM) must arrive whole in one call, as the prompt of a prefill: its
    keys past the call are not cached yet, and later calls' queries see earlier keys
    causally anyway.
    """
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
    kv_prefix = None
    if info.q_prefix is not None:
      kv_prefix = lax.dynamic_update_slice(
        jnp.zeros((b, c.max_len), bool), info.q_prefix, (0, i)
      )  # [B, max_len]
    info = MaskInfo(
      q_positions=info.q_positions,
      kv_positions=cached_pos.value,
      q_segment_ids=q_seg.astype(jnp.int32),
      kv_segment_ids=cached_seg.value,
      q_offset=i,
      causal=True,
      window=info.window,
      q_prefix=info.q_prefix,
      kv_prefix=kv_prefix,
    )
    return cached_key.value, cached_value.value, info

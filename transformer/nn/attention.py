"""Multi-head attention with N query heads and K key/value heads, and its KV cache.

Letters: B batch, T query length, S key length, N query heads, K key/value heads,
H head dim, D model dim. Masks come from `masks.MaskInfo`; the scores from
`kernels.dot_product_attention` (while decoding: `cache_attention.attend`, over the cache
in its layout); position encodings that act inside attention (RoPE, ALiBi, Shaw, T5 bias)
through the `positions.Position` hooks.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax

from transformer.nn import cache_attention
from transformer.nn.config import ModelConfig
from transformer.nn.kernel_rules import attention_options
from transformer.nn.kernels import dot_product_attention
from transformer.nn.layers import compute_dtype, make_dense_general, rms_norm
from transformer.nn.masks import MaskInfo
from transformer.nn.partitioning import constrain
from transformer.nn.positions import position_for


def _qk_norm(c: ModelConfig, name: str):
  """RMSNorm over the head dim H with a learned scale [H] shared by the heads (Qwen3,
  Gemma 3; ViT-22B uses LayerNorm there); with `qk_norm_over='projection'` over all N*H
  features of the projection, scale [N*H] (OLMo 2); with 'each_head' a LayerNorm without
  bias over H, each head its own scale [N, H] ('query_head_norm', 'key_head_norm';
  StableLM 2). [..., N, H] -> [..., N, H]."""
  if c.qk_norm_over == "each_head":
    return nn.LayerNorm(
      epsilon=c.norm_eps,
      dtype=compute_dtype(c),
      use_bias=False,
      use_fast_variance=False,
      reduction_axes=-1,
      feature_axes=(-2, -1),
      name=name.replace("_norm", "_head_norm"),
    )
  norm = rms_norm(c, name)
  if c.qk_norm_over == "head":
    return norm
  return lambda x: norm(x.reshape(*x.shape[:-2], -1)).reshape(x.shape)


def _normed(project: nn.Module, norm, inputs: jax.Array) -> jax.Array:
  return norm(project(inputs))  # [B, S, K, H]


class MultiHeadAttention(nn.Module):
  """Multi-head self- or cross-attention with N query heads and K key/value heads.

  K == N is MHA, K == 1 is MQA, anything between is GQA. Position encodings act in
  self-attention only, at the positions in `info`. With `decode=True` keys and values are
  written to a 'cache' collection at the cache index and queries attend over the whole
  cache (`cache_attention`: layout [B * K, S, H]; S = config.max_len as `model.init`
  creates it, or the length the decoding loops resize it to); no attention dropout.
  Cross-attention with `decode=True` projects `kv_input` once into the cache
  ('cross_key', 'cross_value') and, given kv_input=None, reads them from it; its queries
  may be r rows per cached source (beams), see `cache_attention.attend`.
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
    n, kv, h = c.num_heads, c.kv_heads, c.head_dim

    def proj(heads, name):  # xavier-uniform [D, heads, H] (+ LoRA where targeted)
      return make_dense_general(c, (heads, h), name, use_bias=c.qkv_biases)

    q = constrain(proj(n, "query")(x), ("batch", "length", "heads", "head_dim"))  # [B, T, N, H]
    key, value = proj(kv, "key"), proj(kv, "value")
    if c.qk_norm:  # QK-norm: each head's query and key RMS-normalised over H, before RoPE
      q = _qk_norm(c, "query_norm")(q)  # [B, T, N, H]
      key = functools.partial(_normed, key, _qk_norm(c, "key_norm"))  # [B, S, D] -> [B, S, K, H]
    kv_axes = ("batch", "length", "kv_heads", "head_dim")
    if self.is_cross and decode:  # projected once per source, then read from the cache
      k, v = self._source_cache(key, value, kv_input, kv_axes)  # [B * K, S, H] each
    else:
      kv_input = x if kv_input is None else kv_input
      k = constrain(key(kv_input), kv_axes)  # [B, S, K, H]
      v = constrain(value(kv_input), kv_axes)  # [B, S, K, H]

    bias = None
    if not self.is_cross:
      position = position_for(c)
      q = position.rotate(q, info.q_positions)  # [B, T, N, H]
      k = position.rotate(k, info.kv_positions)  # [B, S, K, H]
      if decode:
        new = {"cached_key": k, "cached_value": v}
        caches, info = cache_attention.update(self, new, info)  # [B * K, S, H] each
        k, v = caches["cached_key"], caches["cached_value"]
      bias = position.bias(self, info, position_table)  # a BlockBias (built per block) or None

    if decode and return_weights:
      raise ValueError("attention weights are not returned while decoding")
    dropout_rng = None
    if c.attention_dropout_rate > 0.0 and not deterministic and not decode:
      dropout_rng = self.make_rng("dropout")
    if decode:
      scale, cap = c.attention_scale, c.attention_softcap
      result = cache_attention.attend(q, k, v, info, kv, bias, scale, cap)  # [B, T, N, H]
    else:
      result = dot_product_attention(
        q,
        k,
        v,
        info,
        attention_options(c),  # built once per config, 'auto' resolved for this backend
        bias=bias,
        dropout_rng=dropout_rng,
        deterministic=deterministic,
        return_weights=return_weights,
      )
    out, weights = result if return_weights else (result, None)
    if return_weights:
      self.sow("intermediates", "attention_weights", weights)
    out_proj = make_dense_general(c, c.d_model, "out", use_bias=c.use_bias, axis=(-2, -1))
    return out_proj(out)  # [B, T, D]

  def _source_cache(self, key, value, kv_input, kv_axes):
    """Cross-attention keys and values while decoding, [B * K, S, H] each.

    kv_input [B, S, D] (the encoder output): projected by `key` / `value` and kept in the
    cache ('cross_key', 'cross_value'); None: read from the cache, projected before.
    """
    if kv_input is None:
      if not self.has_variable("cache", "cross_key"):
        raise ValueError("decoding cross-attention needs kv_input at the first call")
      return self.get_variable("cache", "cross_key"), self.get_variable("cache", "cross_value")
    k = cache_attention.to_cache_layout(constrain(key(kv_input), kv_axes))  # [B * K, S, H]
    v = cache_attention.to_cache_layout(constrain(value(kv_input), kv_axes))  # [B * K, S, H]
    cached = self.has_variable("cache", "cross_key")
    if cached and self.get_variable("cache", "cross_key").shape != k.shape:
      raise ValueError(
        f"the cache holds cross-attention keys {self.get_variable('cache', 'cross_key').shape},"
        f" kv_input gives {k.shape}: build the cache for this batch and source length"
      )
    self.put_variable("cache", "cross_key", k)
    self.put_variable("cache", "cross_value", v)
    return k, v

"""Multi-head latent attention (DeepSeek-V2, Liu et al. 2024; DeepSeek-V3, Kimi K2).

Letters: B batch, T query length, S key length, N heads, H the no-position part of a query
or key head (`head_dim`), R the rotated part (`mla_rope_dim`), V the value head dim
(`mla_v_dim`), C the key-value latent's rank (`mla_kv_rank`), Q the query's
(`mla_q_rank`), D model dim.

- Queries: x -> [Q] (`query_down`, then RMSNorm `query_down_norm`) -> [N, H + R]
  (`query_up`); without `mla_q_rank` one projection [D] -> [N, H + R] (`query`).
- Keys and values: x -> [C + R] (`kv_down`); its first C features RMS-normalised
  (`kv_down_norm`) are the latent c, the last R one rope key k_r shared by the heads.
  Head n's key is [c W_k[n], RoPE(k_r)] (`key_up` [C, N, H]), its value c W_v[n]
  (`value_up` [C, N, V]); the query's last R features rotate too.
- Out: [N, V] -> [D] (`out`).

Training computes the N keys and values and calls `kernels.dot_product_attention` (every
implementation; values padded to the query width where V < H + R, keys and queries where
it is wider). Decoding caches only [c, RoPE(k_r)] per token, C + R numbers a layer
(`cached_latent`, one shared "head" in `cache_attention`'s layout), and attends in the
latent: q_n W_k[n]^T against c, so that scores equal the expanded form's, and the heads'
outputs over c are mapped by W_v afterwards (the absorbed form of the DeepSeek-V2 paper).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.nn import cache_attention
from transformer.nn.config import ModelConfig
from transformer.nn.kernel_rules import attention_options
from transformer.nn.kernels import dot_product_attention
from transformer.nn.layers import compute_dtype, make_dense, make_dense_general, rms_norm
from transformer.nn.masks import MaskInfo
from transformer.nn.partitioning import constrain
from transformer.nn.positions.rope import apply_rope

UP_INIT = nn.initializers.variance_scaling(1.0, "fan_avg", "uniform", in_axis=0, out_axis=(1, 2))


class _UpKernel(nn.Module):
  """A latent's up-projection kernel [C, N, F] ('kernel'), in the compute dtype."""

  shape: tuple[int, int, int]
  dtype: str

  @nn.compact
  def __call__(self) -> jax.Array:
    return self.param("kernel", UP_INIT, self.shape).astype(self.dtype)


class LatentAttention(nn.Module):
  """Causal self-attention through a low-rank key-value latent; see the module docstring."""

  config: ModelConfig

  @nn.compact
  def __call__(
    self,
    x: jax.Array,
    kv_input: None,
    info: MaskInfo,
    position_table: jax.Array | None = None,
    deterministic: bool = True,
    decode: bool = False,
    return_weights: bool = False,
  ) -> jax.Array:
    """x: [B, T, D] -> [B, T, D] (`MultiHeadAttention`'s signature, self-attention only)."""
    c = self.config
    n, h, r, rank = c.num_heads, c.head_dim, c.mla_rope_dim, c.mla_kv_rank
    dtype = compute_dtype(c)
    if c.mla_q_rank:
      q = rms_norm(c, "query_down_norm")(make_dense(c, c.mla_q_rank, "query_down")(x))
      q = make_dense_general(c, (n, h + r), "query_up", use_bias=False)(q)
    else:
      q = make_dense_general(c, (n, h + r), "query", use_bias=False)(x)
    q = constrain(q, ("batch", "length", "heads", "head_dim"))  # [B, T, N, H + R]
    compressed = make_dense(c, rank + r, "kv_down")(x)  # [B, T, C + R]
    latent = rms_norm(c, "kv_down_norm")(compressed[..., :rank])  # [B, T, C]
    q_rope = apply_rope(q[..., h:], info.q_positions, c.rope_theta, c)  # [B, T, N, R]
    k_rope = apply_rope(compressed[..., None, rank:], info.kv_positions, c.rope_theta, c)
    key_up = _UpKernel((rank, n, h), dtype, name="key_up")()  # [C, N, H]
    value_up = _UpKernel((rank, n, c.mla_value_dim), dtype, name="value_up")()  # [C, N, V]
    scale = (h + r) ** -0.5 if c.attention_scale is None else c.attention_scale
    if decode:
      if return_weights:
        raise ValueError("attention weights are not returned while decoding")
      new = jnp.concatenate([latent, k_rope[:, :, 0]], axis=-1)[:, :, None]  # [B, T, 1, C + R]
      caches, info = cache_attention.update(self, {"cached_latent": new}, info)
      cache = caches["cached_latent"]  # [B, S, C + R]
      q_latent = jnp.einsum("BTNH,CNH->BTNC", q[..., :h], key_up)  # [B, T, N, C]
      q_cat = jnp.concatenate([q_latent, q_rope.astype(q_latent.dtype)], axis=-1)
      out = cache_attention.attend(
        q_cat, cache, cache[..., :rank], info, 1, None, scale, c.attention_softcap
      )  # [B, T, N, C]
      out = jnp.einsum("BTNC,CNV->BTNV", out, value_up)  # [B, T, N, V]
    else:
      k = jnp.einsum("BSC,CNH->BSNH", latent, key_up)  # [B, S, N, H]
      k = jnp.concatenate([k, jnp.broadcast_to(k_rope, (*k.shape[:3], r)).astype(k.dtype)], -1)
      q = jnp.concatenate([q[..., :h], q_rope.astype(q.dtype)], axis=-1)  # [B, T, N, H + R]
      v = jnp.einsum("BSC,CNV->BSNV", latent, value_up)  # [B, S, N, V]
      width = max(h + r, v.shape[-1])  # one head width for the kernels
      q, k, v = (_pad_heads(a, width) for a in (q, k, v))
      drops = c.attention_dropout_rate > 0.0 and not deterministic
      options = dataclasses.replace(attention_options(c), scale=scale)
      out = dot_product_attention(
        q, k, v, info, options, dropout_rng=self.make_rng("dropout") if drops else None,
        deterministic=deterministic, return_weights=return_weights,
      )  # fmt: skip
      if return_weights:
        out, weights = out
        self.sow("intermediates", "attention_weights", weights)
      out = out[..., : c.mla_value_dim]  # [B, T, N, V]
    out_proj = make_dense_general(c, c.d_model, "out", use_bias=c.use_bias, axis=(-2, -1))
    return out_proj(out)  # [B, T, D]


def _pad_heads(x: jax.Array, width: int) -> jax.Array:
  """[..., F] -> [..., width], zeros after (scores and outputs unchanged)."""
  extra = width - x.shape[-1]
  return x if not extra else jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)])

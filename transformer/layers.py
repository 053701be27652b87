"""Norms, the feed-forward block and token embeddings.

Letters: B batch, T length, D model dim, F feed-forward hidden dim, V vocabulary.
Parameters are float32; computation runs in `config.dtype` (norm statistics in float32).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.config import ModelConfig
from transformer.positional import AbsolutePositionEmbedding

DENSE_INIT = nn.initializers.xavier_uniform()


def compute_dtype(config: ModelConfig) -> jnp.dtype:
  return jnp.dtype(config.dtype)


def make_norm(config: ModelConfig, name: str | None = None) -> nn.Module:
  """LayerNorm (scale and bias) or RMSNorm (scale only), statistics in float32."""
  if config.norm == "layernorm":
    return nn.LayerNorm(
      epsilon=config.norm_eps, dtype=compute_dtype(config), use_fast_variance=False, name=name
    )
  return nn.RMSNorm(epsilon=config.norm_eps, dtype=compute_dtype(config), name=name)


def make_dense(config: ModelConfig, features: int, name: str) -> nn.Dense:
  return nn.Dense(
    features,
    use_bias=config.use_bias,
    dtype=compute_dtype(config),
    kernel_init=DENSE_INIT,
    name=name,
  )


ACTIVATIONS = {
  "relu": nn.relu,
  "gelu": lambda x: nn.gelu(x, approximate=False),
  "swiglu": nn.silu,  # gate activation of SwiGLU (Shazeer 2020)
  "geglu": lambda x: nn.gelu(x, approximate=False),  # gate activation of GeGLU
}


class FeedForward(nn.Module):
  """Position-wise feed-forward: wo(act(wi x)), or wo(act(wi_0 x) * wi_1 x) for GLU variants.

  Hidden-size convention: `config.d_ff` is the hidden width F actually used. A gated unit
  has three D x F matrices instead of two, so to match a 4*D two-matrix FFN's parameters
  set F = 2/3 * 4 * D (`config.gated_hidden_size`, the 2/3 rule of Shazeer 2020 / LLaMA).
  Dropout on the hidden activations uses `config.dropout_rate`.
  """

  config: ModelConfig

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
    c = self.config
    act = ACTIVATIONS[c.activation]
    if c.gated:
      h = act(make_dense(c, c.d_ff, "wi_0")(x)) * make_dense(c, c.d_ff, "wi_1")(x)  # [B, T, F]
    else:
      h = act(make_dense(c, c.d_ff, "wi")(x))  # [B, T, F]
    h = nn.Dropout(c.dropout_rate)(h, deterministic=deterministic)
    return make_dense(c, c.d_model, "wo")(h)  # [B, T, D]


def make_embed(config: ModelConfig, num_embeddings: int, name: str) -> nn.Embed:
  """Token embedding table [V, D], init normal(D**-0.5); `.attend(x)` gives x @ E^T logits."""
  return nn.Embed(
    num_embeddings,
    config.d_model,
    embedding_init=nn.initializers.normal(stddev=config.d_model**-0.5),
    dtype=compute_dtype(config),
    name=name,
  )


class Embedder(nn.Module):
  """Token embedding (* sqrt(D) if configured) + absolute positions, then dropout.

  `embed` is the token table, owned by the model so that inputs, targets and output
  logits can share it. tokens, positions: [B, T] ints -> [B, T, D].
  """

  config: ModelConfig
  embed: nn.Module
  dropout: bool = True  # False: the caller applies dropout after adding more embeddings

  @nn.compact
  def __call__(self, tokens: jax.Array, positions: jax.Array, deterministic: bool) -> jax.Array:
    c = self.config
    x = self.embed(tokens)  # [B, T, D]
    if c.scale_embeddings:
      x = x * jnp.asarray(c.d_model**0.5, x.dtype)
    if c.position in ("learned", "sinusoidal"):
      x = AbsolutePositionEmbedding(c.max_len, c.position, name="positions")(x, positions)
    if self.dropout:
      x = nn.Dropout(c.dropout_rate)(x, deterministic=deterministic)
    return x


def default_positions(tokens: jax.Array) -> jax.Array:
  """Positions 0..T-1 for every row: [B, T] -> int32 [B, T]."""
  return jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)

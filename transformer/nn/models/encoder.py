"""Encoder-only models (BERT): a bidirectional backbone, a masked-LM head, a classifier.

Letters: B batch, T length, D model dim, V vocabulary, C classes.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.nn.attention import MaskInfo
from transformer.nn.blocks import Stack
from transformer.nn.config import ModelConfig
from transformer.nn.layers import (
  Dropout,
  Embedder,
  compute_dtype,
  default_positions,
  make_embed,
  make_norm,
)


class TransformerEncoder(nn.Module):
  """Token (+ position, + token type) embeddings and bidirectional blocks -> [B, T, D].

  `embed` is the token embedding module, owned by the caller so heads can tie to it.
  `embed_norm` adds BERT's LayerNorm after the embedding sum (used with post-LN).
  """

  config: ModelConfig
  embed: nn.Module
  embed_norm: bool = False

  @nn.compact
  def __call__(
    self,
    tokens: jax.Array,
    segment_ids: jax.Array | None = None,
    positions: jax.Array | None = None,
    token_type_ids: jax.Array | None = None,
    deterministic: bool = True,
  ) -> jax.Array:
    """tokens [B, T]; segment_ids [B, T] (0 = padding; default tokens != 0)."""
    c = self.config
    positions = default_positions(tokens) if positions is None else positions
    segment_ids = (tokens != 0).astype(jnp.int32) if segment_ids is None else segment_ids
    x = Embedder(c, self.embed, dropout=False, name="embedder")(tokens, positions, deterministic)
    if c.type_vocab_size:
      types = jnp.zeros_like(tokens) if token_type_ids is None else token_type_ids
      x = x + make_embed(c, c.type_vocab_size, "token_type_embed")(types)
    if self.embed_norm:
      x = make_norm(c, "embed_norm")(x)
    x = Dropout(c.dropout_rate)(x, deterministic=deterministic)
    info = MaskInfo.create(segment_ids, q_positions=positions, window=c.sliding_window)
    return Stack(c, c.num_layers, name="layers")(x, info, deterministic=deterministic)


def _backbone(config: ModelConfig) -> tuple[nn.Module, nn.Module]:
  embed = make_embed(config, config.vocab_size, "token_embed")
  encoder = TransformerEncoder(
    config, embed, embed_norm=config.norm_position == "post", name="encoder"
  )
  return embed, encoder


class MaskedLM(nn.Module):
  """BERT masked-LM: backbone, transform (dense, GELU, norm), logits tied to the embedding."""

  config: ModelConfig

  @nn.compact
  def __call__(
    self,
    tokens,
    segment_ids=None,
    positions=None,
    token_type_ids=None,
    deterministic: bool = True,
    predict_positions=None,
  ) -> jax.Array:
    """tokens [B, T] -> float32 logits [B, T, V], or [B, P, V] at `predict_positions`.

    `predict_positions` (int [B, P], optional): the positions whose tokens are predicted,
    as BERT's `masked_lm_positions`; the head (transform and logits, most of an MLM's
    output FLOPs) then runs on those P positions only.
    """
    c = self.config
    embed, encoder = _backbone(c)
    x = encoder(tokens, segment_ids, positions, token_type_ids, deterministic)  # [B, T, D]
    if predict_positions is not None:
      x = jnp.take_along_axis(x, predict_positions[..., None], axis=1)  # [B, P, D]
    x = nn.Dense(c.d_model, dtype=compute_dtype(c), name="mlm_transform")(x)
    x = make_norm(c, "mlm_norm")(nn.gelu(x, approximate=False))
    if c.tie_embeddings:
      logits = embed.attend(x)  # [B, T, V]
    else:
      logits = nn.Dense(c.vocab_size, use_bias=False, dtype=compute_dtype(c), name="mlm_head")(x)
    bias = self.param("mlm_bias", nn.initializers.zeros, (c.vocab_size,))
    return logits.astype(jnp.float32) + bias


class SequenceClassifier(nn.Module):
  """Backbone, pooling ([CLS] token -> dense tanh, or masked mean), dropout, classifier."""

  config: ModelConfig

  @nn.compact
  def __call__(
    self, tokens, segment_ids=None, positions=None, token_type_ids=None, deterministic: bool = True
  ) -> jax.Array:
    """tokens [B, T] (with [CLS] first for cls pooling) -> float32 logits [B, C]."""
    c = self.config
    _, encoder = _backbone(c)
    x = encoder(tokens, segment_ids, positions, token_type_ids, deterministic)  # [B, T, D]
    if c.pooling == "cls":
      pooled = x[:, 0]  # [B, D]
    else:
      valid = (tokens != 0 if segment_ids is None else segment_ids > 0)[..., None]  # [B, T, 1]
      pooled = (x * valid).sum(1) / jnp.maximum(valid.sum(1), 1)  # [B, D]
    pooled = jnp.tanh(nn.Dense(c.d_model, dtype=compute_dtype(c), name="pooler")(pooled))
    pooled = Dropout(c.dropout_rate)(pooled, deterministic=deterministic)
    logits = nn.Dense(c.num_classes, dtype=compute_dtype(c), name="classifier")(pooled)
    return logits.astype(jnp.float32)  # [B, C]

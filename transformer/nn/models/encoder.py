"""Encoder-only models (BERT): a bidirectional backbone, a masked-LM head, a classifier.

Letters: B batch, T length, D model dim, V vocabulary, C classes.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.nn import counts
from transformer.nn.blocks import Stack
from transformer.nn.config import ModelConfig, fail
from transformer.nn.layers import (
  Embedder,
  default_positions,
  make_dense,
  make_dropout,
  make_embed,
  make_norm,
)
from transformer.nn.masks import MaskInfo

LECUN = nn.initializers.lecun_normal()  # the heads' init (flax's `nn.Dense` default)


class TransformerEncoder(nn.Module):
  """Token (+ position, + token type) embeddings and bidirectional blocks -> [B, T, D].

  `embed` is the token embedding module, owned by the caller so heads can tie to it.
  `embed_norm` adds a norm after the embedding sum (BERT's post-LN; ModernBERT's
  `ModelConfig.embed_norm`).
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
    x = make_dropout(c)(x, deterministic=deterministic)
    info = MaskInfo.create(segment_ids, q_positions=positions, window=c.sliding_window)
    return Stack(c, c.num_layers, name="layers")(x, info, deterministic=deterministic)


def _backbone(config: ModelConfig) -> tuple[nn.Module, nn.Module]:
  embed = make_embed(config, config.vocab_size, "token_embed")
  encoder = TransformerEncoder(
    config, embed, embed_norm=config.norm_position == "post" or config.embed_norm, name="encoder"
  )
  return embed, encoder


class MaskedLM(nn.Module):
  """BERT masked-LM: backbone, transform (dense, GELU, norm), logits tied to the embedding
  (+ an output bias; ModernBERT's head: `head_bias`, `mlm_output_bias`)."""

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
    x = make_dense(c, c.d_model, "mlm_transform", use_bias=c.head_bias, kernel_init=LECUN)(x)
    x = make_norm(c, "mlm_norm")(nn.gelu(x, approximate=False))
    if c.tie_embeddings:
      logits = embed.attend(x)  # [B, T, V]
    else:
      mlm_head = make_dense(c, c.vocab_size, "mlm_head", use_bias=False, kernel_init=LECUN)
      logits = mlm_head(x)  # [B, T, V]
    logits = logits.astype(jnp.float32)
    if not c.mlm_output_bias:
      return logits
    return logits + self.param("mlm_bias", nn.initializers.zeros, (c.vocab_size,))


class SequenceClassifier(nn.Module):
  """Backbone, pooling ([CLS] token or masked mean), the pooler (dense, then tanh, or GELU
  and a norm: `pooler_activation`), dropout, classifier."""

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
    pooled = make_dense(c, c.d_model, "pooler", use_bias=c.head_bias, kernel_init=LECUN)(pooled)
    if c.pooler_activation == "tanh":
      pooled = jnp.tanh(pooled)  # [B, D]
    else:  # gelu_norm (ModernBERT)
      pooled = make_norm(c, "pooler_norm")(nn.gelu(pooled, approximate=False))  # [B, D]
    pooled = make_dropout(c)(pooled, deterministic=deterministic)
    classifier = make_dense(c, c.num_classes, "classifier", use_bias=True, kernel_init=LECUN)
    return classifier(pooled).astype(jnp.float32)  # [B, C]


def build(c: ModelConfig) -> nn.Module:
  """MaskedLM when `num_classes == 0`, else SequenceClassifier."""
  return SequenceClassifier(c) if c.num_classes else MaskedLM(c)


def validate(c: ModelConfig) -> None:
  if c.scale_logits:
    fail("scale_logits", c.scale_logits, "the output rescaling is for decoder and seq2seq")
  if c.logits_softcap is not None:
    fail("logits_softcap", c.logits_softcap, "the logit soft cap is for decoder and seq2seq")
  if c.logits_multiplier != 1:
    fail("logits_multiplier", c.logits_multiplier, "is for decoder and seq2seq")
  if c.pooling == "cls_mean" and c.num_classes:
    fail("pooling", c.pooling, "cls_mean is a ViT head; the encoder classifier pools cls or mean")


def param_count(c: ModelConfig) -> int:
  d = c.d_model
  embed = c.vocab_size * d + counts.embedder_params(c) + c.type_vocab_size * d
  embed_norm = counts.norm_params(c) if c.norm_position == "post" or c.embed_norm else 0
  dense = d * d + (d if c.head_bias else 0)  # the MLM transform or the pooler
  if c.num_classes:  # SequenceClassifier: pooler (+ its norm) + classifier.
    head = dense + d * c.num_classes + c.num_classes
    head += counts.norm_params(c) if c.pooler_activation == "gelu_norm" else 0
  else:  # MaskedLM: transform, norm, output bias (+ untied output matrix).
    head = dense + counts.norm_params(c) + (c.vocab_size if c.mlm_output_bias else 0)
    head += 0 if c.tie_embeddings else d * c.vocab_size
  return embed + embed_norm + counts.stack_params(c, c.num_layers, cross=False) + head


def forward_flops(c: ModelConfig, seq_len: int, mlm_predictions: int | None = None) -> float:
  head = 2 * (c.d_model * c.d_model + c.d_model * c.vocab_size)  # MLM transform + logits
  if mlm_predictions is not None:
    head *= mlm_predictions / seq_len
  return counts.stack_flops(c, c.num_layers, seq_len) + head

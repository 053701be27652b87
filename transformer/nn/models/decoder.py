"""Decoder-only language model (GPT): causal blocks and a next-token head.

Letters: B batch, T length, D model dim, V vocabulary.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.nn import counts
from transformer.nn.blocks import Stack
from transformer.nn.config import ModelConfig, fail
from transformer.nn.kernels import soft_cap
from transformer.nn.layers import Embedder, default_positions, make_dense, make_embed
from transformer.nn.masks import MaskInfo


class DecoderLM(nn.Module):
  """GPT-style LM. Logits through the token embedding when `tie_embeddings`."""

  config: ModelConfig

  @nn.compact
  def __call__(
    self,
    tokens: jax.Array,
    positions: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    deterministic: bool = True,
    decode: bool = False,
    prefix_mask: jax.Array | None = None,
    last_logits: bool = False,
  ) -> jax.Array:
    """tokens: [B, T] ints -> float32 logits [B, T, V].

    positions: [B, T] (default 0..T-1; per-segment when packed; the absolute positions
    of the new tokens when decoding). segment_ids: [B, T] packed example ids (0 = pad).
    decode: write keys/values to the 'cache' collection and attend over it.
    prefix_mask: [B, T] (1 = prefix token) makes a prefix-LM: key s is visible to query t
    iff same segment and (s <= t or both are in the prefix). When decoding, the prefix
    comes whole in one call (the prefill).
    last_logits: the logits of the last position only, [B, 1, V] (what a prefill needs).
    """
    c = self.config
    positions = default_positions(tokens) if positions is None else positions
    embed = make_embed(c, c.vocab_size, "token_embed")
    x = Embedder(c, embed, name="embedder")(tokens, positions, deterministic)  # [B, T, D]
    info = MaskInfo.create(
      segment_ids if segment_ids is not None else jnp.ones_like(tokens, jnp.int32),
      q_positions=positions,
      causal=True,
      window=c.sliding_window,
      prefix=prefix_mask,
    )
    x = Stack(c, c.num_layers, name="decoder")(x, info, deterministic=deterministic, decode=decode)
    if last_logits:
      x = x[:, -1:]  # [B, 1, D]
    if c.scale_logits:
      x = x * jnp.asarray(c.d_model**-0.5, x.dtype)  # [B, T, D]
    if c.tie_embeddings:
      logits = embed.attend(x)  # [B, T, V]
    else:
      lm_head = make_dense(
        c, c.vocab_size, "lm_head", use_bias=False, kernel_init=nn.initializers.lecun_normal()
      )
      logits = lm_head(x)  # [B, T, V]
    logits = logits.astype(jnp.float32)  # [B, T, V]
    if c.logits_multiplier != 1:
      logits = logits * jnp.float32(c.logits_multiplier)
    return soft_cap(logits, c.logits_softcap)  # [B, T, V]


def build(c: ModelConfig) -> nn.Module:
  return DecoderLM(c)


def validate(c: ModelConfig) -> None:
  if c.type_vocab_size:
    fail("type_vocab_size", c.type_vocab_size, "segment embeddings are for the encoder family")


def param_count(c: ModelConfig) -> int:
  embed = c.vocab_size * c.d_model + counts.embedder_params(c)
  head = 0 if c.tie_embeddings else c.d_model * c.vocab_size
  return embed + counts.stack_params(c, c.num_layers, cross=False) + head


def forward_flops(c: ModelConfig, seq_len: int, mlm_predictions: int | None = None) -> float:
  del mlm_predictions
  body = counts.stack_flops(c, c.num_layers, seq_len, causal=True)  # prefix-LM counted causal
  return body + 2 * c.d_model * c.vocab_size

"""Decoder-only language model (GPT): causal blocks and a next-token head.

Letters: B batch, T length, D model dim, V vocabulary.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.nn.attention import MaskInfo
from transformer.nn.blocks import Stack
from transformer.nn.config import ModelConfig
from transformer.nn.layers import Embedder, compute_dtype, default_positions, make_embed


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
  ) -> jax.Array:
    """tokens: [B, T] ints -> float32 logits [B, T, V].

    positions: [B, T] (default 0..T-1; per-segment when packed; the absolute positions
    of the new tokens when decoding). segment_ids: [B, T] packed example ids (0 = pad).
    decode: write keys/values to the 'cache' collection and attend over it.
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
    )
    x = Stack(c, c.num_layers, name="decoder")(x, info, deterministic=deterministic, decode=decode)
    if c.tie_embeddings:
      logits = embed.attend(x)  # [B, T, V]
    else:
      logits = nn.Dense(c.vocab_size, use_bias=False, dtype=compute_dtype(c), name="lm_head")(x)
    return logits.astype(jnp.float32)

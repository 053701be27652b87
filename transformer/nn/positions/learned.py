"""Learned absolute positions added to the embeddings (BERT, GPT-2)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.nn.positions.base import Position


class LearnedPositionEmbedding(nn.Module):
  """Adds a trained table [max_len, D] (normal(0.02) init), looked up at explicit positions."""

  max_len: int

  @nn.compact
  def __call__(self, x: jax.Array, positions: jax.Array) -> jax.Array:
    """x: [B, T, D]; positions: [B, T] or [T] ints. Returns x + table[positions]."""
    table = self.param("embedding", nn.initializers.normal(0.02), (self.max_len, x.shape[-1]))
    pe = jnp.take(table, positions, axis=0)  # [B, T, D] or [T, D]
    return x + pe.astype(x.dtype)


class Learned(Position):
  """The embedder's submodule 'positions' holds the table ('positions/embedding')."""

  def embed(self, module: nn.Module, x: jax.Array, positions: jax.Array) -> jax.Array:
    del module  # the submodule below is created in the calling module's scope
    return LearnedPositionEmbedding(self.config.max_len, name="positions")(x, positions)

  def embedding_params(self) -> int:
    return self.config.max_len * self.config.d_model

"""Shaw et al. 2018 relative positions: learned key embeddings of the clipped distance."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.nn.config import fail
from transformer.nn.masks import BlockBias, MaskInfo
from transformer.nn.positions.base import Position


def shaw_relative_logits(
  q: jax.Array, table: jax.Array, q_positions: jax.Array, kv_positions: jax.Array
) -> jax.Array:
  """The key-side relative term q_t . a_{clip(s - t)} as an additive bias.

  q: [B, T, N, H] (already scaled like the content scores); table: [2k + 1, H];
  positions [B, T] and [B, S]. Returns float32 [B, N, T, S]. Only the key term is used:
  Shaw et al. (Table 3) found the value term unnecessary. Each q_t meets the 2k + 1
  embeddings once, then the scores are gathered by distance (no [B, T, S, H] gather).
  """
  k = (table.shape[0] - 1) // 2
  relative = jnp.clip(kv_positions[:, None, :] - q_positions[:, :, None], -k, k) + k  # [B, T, S]
  per_distance = jnp.einsum(
    "BTNH,RH->BNTR", q, table.astype(q.dtype), preferred_element_type=jnp.float32
  )  # [B, N, T, 2k + 1]
  return jnp.take_along_axis(
    per_distance, relative[:, None], axis=-1, mode="promise_in_bounds"
  )  # [B, N, T, S]


def _shaw_block(table, q, q_positions, kv_positions) -> jax.Array:
  scaled_q = q * jnp.asarray(q.shape[-1] ** -0.5, q.dtype)  # [B, t, N, H]
  return shaw_relative_logits(scaled_q, table, q_positions, kv_positions)


class RelativeShaw(Position):
  """Each self-attention layer owns 'rel_key_embedding' [2k + 1, H], k = shaw_max_distance."""

  def bias(self, module: nn.Module, info: MaskInfo, table: jax.Array | None) -> BlockBias:
    del info, table
    c = self.config
    keys = module.param(
      "rel_key_embedding", nn.initializers.normal(0.02), (2 * c.shaw_max_distance + 1, c.head_dim)
    )
    return BlockBias(_shaw_block, keys)

  def validate(self) -> None:
    c = self.config
    if c.shaw_max_distance < 1:
      fail("shaw_max_distance", c.shaw_max_distance, "must be >= 1")

  def attention_params(self) -> int:
    return (2 * self.config.shaw_max_distance + 1) * self.config.head_dim

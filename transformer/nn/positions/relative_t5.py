"""T5 relative position bias (Raffel et al. 2020): a learned scalar per head and bucket."""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.nn.config import fail
from transformer.nn.masks import BlockBias, MaskInfo
from transformer.nn.positions.base import Position


def t5_relative_bucket(
  relative_position: jax.Array, bidirectional: bool, num_buckets: int, max_distance: int
) -> jax.Array:
  """T5's log-spaced buckets of relative_position = key position - query position.

  Half the buckets (bidirectional: per direction) are exact small distances, the rest
  grow logarithmically up to max_distance; farther distances share the last bucket.
  """
  n = -relative_position
  bucket = jnp.zeros_like(n)
  if bidirectional:
    num_buckets //= 2
    bucket = bucket + (n < 0).astype(n.dtype) * num_buckets
    n = jnp.abs(n)
  else:
    n = jnp.maximum(n, 0)
  max_exact = num_buckets // 2
  is_small = n < max_exact
  log_ratio = jnp.log(jnp.maximum(n, 1).astype(jnp.float32) / max_exact) / math.log(
    max_distance / max_exact
  )
  large = max_exact + (log_ratio * (num_buckets - max_exact)).astype(n.dtype)
  large = jnp.minimum(large, num_buckets - 1)
  return bucket + jnp.where(is_small, n, large)


def t5_relative_bias(
  table: jax.Array,
  q_positions: jax.Array,
  kv_positions: jax.Array,
  bidirectional: bool,
  max_distance: int,
) -> jax.Array:
  """table [buckets, N] looked up by bucket: positions [B, T], [B, S] -> float32 [B, N, T, S]."""
  relative = kv_positions[:, None, :] - q_positions[:, :, None]  # [B, T, S]
  buckets = t5_relative_bucket(relative, bidirectional, table.shape[0], max_distance)
  bias = jnp.take(table, buckets, axis=0)  # [B, T, S, N]
  return bias.transpose(0, 3, 1, 2).astype(jnp.float32)  # [B, N, T, S]


def _t5_block(
  bidirectional: bool, max_distance: int, table, q, q_positions, kv_positions
) -> jax.Array:
  del q
  return t5_relative_bias(table, q_positions, kv_positions, bidirectional, max_distance)


class RelativeT5(Position):
  """One table 'rel_embedding' [buckets, N] per stack, shared by its layers (as in T5).

  Buckets are bidirectional in bidirectional attention, one-sided in causal attention.
  """

  def shared_table(self, module: nn.Module) -> jax.Array:
    c = self.config
    return module.param(
      "rel_embedding", nn.initializers.normal(0.02), (c.relative_num_buckets, c.num_heads)
    )

  def bias(self, module: nn.Module, info: MaskInfo, table: jax.Array | None) -> BlockBias:
    del module
    fn = functools.partial(_t5_block, not info.causal, self.config.relative_max_distance)
    return BlockBias(fn, table)

  def validate(self) -> None:
    # Buckets split per direction, then half exact: max_exact = buckets // 4 (encoder) or
    # buckets // 2 (decoder), and the log-spaced buckets need max_distance > max_exact.
    c = self.config
    if c.relative_num_buckets < 4:
      fail("relative_num_buckets", c.relative_num_buckets, "T5 needs at least 4 buckets")
    if c.relative_max_distance <= c.relative_num_buckets // 2:
      fail(
        "relative_max_distance",
        c.relative_max_distance,
        f"must exceed relative_num_buckets // 2 = {c.relative_num_buckets // 2}",
      )

  def stack_params(self) -> int:
    return self.config.relative_num_buckets * self.config.num_heads

"""ALiBi (Press et al. 2022): a per-head linear distance penalty on the attention logits."""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer.nn.masks import BlockBias, MaskInfo
from transformer.nn.positions.base import Position


def alibi_slopes(num_heads: int) -> np.ndarray:
  """Head slopes: the geometric sequence 2^(-8/n), 2^(-16/n), ...

  For a head count that is not a power of two, the slopes of the closest lower power of
  two are followed by every other slope of the next power of two (the paper's recipe).
  """

  def power_of_two(n: int) -> list[float]:
    start = 2.0 ** (-8.0 / n)
    return [start ** (i + 1) for i in range(n)]

  if math.log2(num_heads).is_integer():
    return np.asarray(power_of_two(num_heads), np.float32)
  closest = 2 ** math.floor(math.log2(num_heads))
  extra = power_of_two(2 * closest)[0::2][: num_heads - closest]
  return np.asarray(power_of_two(closest) + extra, np.float32)


def alibi_bias(q_positions: jax.Array, kv_positions: jax.Array, num_heads: int) -> jax.Array:
  """ALiBi additive bias -slope_n * |t - s|: q_positions [B, T], kv_positions [B, S].

  Returns float32 [B, N, T, S]. With a causal mask this equals the paper's -slope * (t - s).
  """
  slopes = jnp.asarray(alibi_slopes(num_heads))  # [N]
  distance = jnp.abs(q_positions[:, :, None] - kv_positions[:, None, :])  # [B, T, S]
  return -slopes[None, :, None, None] * distance[:, None].astype(jnp.float32)  # [B, N, T, S]


def _alibi_block(num_heads: int, params: None, q, q_positions, kv_positions) -> jax.Array:
  del params, q
  return alibi_bias(q_positions, kv_positions, num_heads)


class Alibi(Position):
  """Bias -slope_n * |t - s| on every self-attention layer; no parameters."""

  def bias(self, module: nn.Module, info: MaskInfo, table: jax.Array | None) -> BlockBias:
    del module, info, table
    return BlockBias(functools.partial(_alibi_block, self.config.num_heads))

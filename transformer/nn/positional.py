"""Position information: absolute tables, RoPE, ALiBi and relative position biases.

Letters: B batch, T query length, S key length, N heads, H head dim, D model dim.
All functions take explicit integer positions, so packed sequences (positions restart
per segment) and cached decoding (positions continue from the cache index) work.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


def sinusoidal_table(length: int, d_model: int, max_timescale: float = 10_000.0) -> np.ndarray:
  """Vaswani et al. 2017, 3.5: PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(...).

  Returns float32 [length, D] with sines at even and cosines at odd feature indices.
  """
  positions = np.arange(length, dtype=np.float64)[:, None]  # [L, 1]
  inv_freq = max_timescale ** (-np.arange(0, d_model, 2, dtype=np.float64) / d_model)  # [D/2]
  angles = positions * inv_freq[None, :]  # [L, D/2]
  table = np.zeros((length, d_model), dtype=np.float64)
  table[:, 0::2] = np.sin(angles)
  table[:, 1::2] = np.cos(angles)
  return table.astype(np.float32)


def sincos_2d_table(grid: int, d_model: int, max_timescale: float = 10_000.0) -> np.ndarray:
  """2-D sin-cos positions for a grid x grid of patches (MAE / big_vision `posemb_sincos_2d`).

  Features [0, D/2) encode the row (y), [D/2, D) the column (x), each as `sinusoidal_table`
  over D/2 features. Returns float32 [grid * grid, D] in row-major patch order.
  """
  if d_model % 4:
    raise ValueError(f"2-D sin-cos positions need d_model divisible by 4, got {d_model}")
  half = sinusoidal_table(grid, d_model // 2, max_timescale)  # [G, D/2]
  rows = np.repeat(half, grid, axis=0)  # [G*G, D/2]: y changes slowest
  cols = np.tile(half, (grid, 1))  # [G*G, D/2]
  return np.concatenate([rows, cols], axis=1)


class AbsolutePositionEmbedding(nn.Module):
  """Adds a learned or sinusoidal position table, looked up at explicit positions.

  Attributes:
    max_len: rows in the table.
    kind: 'learned' (trained, normal(0.02) init) or 'sinusoidal' (fixed).
  """

  max_len: int
  kind: str = "learned"

  @nn.compact
  def __call__(self, x: jax.Array, positions: jax.Array) -> jax.Array:
    """x: [B, T, D]; positions: [B, T] or [T] ints. Returns x + PE[positions]."""
    d = x.shape[-1]
    if self.kind == "learned":
      table = self.param("embedding", nn.initializers.normal(0.02), (self.max_len, d))
    else:
      table = jnp.asarray(sinusoidal_table(self.max_len, d))
    pe = jnp.take(table, positions, axis=0)  # [B, T, D] or [T, D]
    return x + pe.astype(x.dtype)


def rope_frequencies(head_dim: int, theta: float = 10_000.0) -> np.ndarray:
  """Inverse frequencies theta^(-2i/H) for i < H/2 (Su et al. 2021), float64 [H/2]."""
  return theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def apply_rope(x: jax.Array, positions: jax.Array, theta: float = 10_000.0) -> jax.Array:
  """Rotary position embedding, rotating feature pairs (x[i], x[i + H/2]) ("rotate half").

  x: [B, T, N, H]; positions: [B, T] ints. Scores q_t . k_s then depend on s - t only.
  """
  head_dim = x.shape[-1]
  inv_freq = jnp.asarray(rope_frequencies(head_dim, theta), jnp.float32)  # [H/2]
  angles = positions[..., None].astype(jnp.float32) * inv_freq  # [B, T, H/2]
  sin = jnp.sin(angles)[:, :, None, :]  # [B, T, 1, H/2]
  cos = jnp.cos(angles)[:, :, None, :]  # [B, T, 1, H/2]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)  # [B, T, N, H/2] each
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)  # [B, T, N, H]
  return rotated.astype(x.dtype)


def alibi_slopes(num_heads: int) -> np.ndarray:
  """Press et al. 2022 head slopes: the geometric sequence 2^(-8/n), 2^(-16/n), ...

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


class T5RelativeBias(nn.Module):
  """Learned per-head scalar bias by T5 relative-position bucket, shared by a layer stack.

  Returns float32 [B, N, T, S] for q_positions [B, T] and kv_positions [B, S].
  """

  num_heads: int
  num_buckets: int = 32
  max_distance: int = 128
  bidirectional: bool = True

  @nn.compact
  def __call__(self, q_positions: jax.Array, kv_positions: jax.Array) -> jax.Array:
    table = self.param(
      "rel_embedding", nn.initializers.normal(0.02), (self.num_buckets, self.num_heads)
    )
    relative = kv_positions[:, None, :] - q_positions[:, :, None]  # [B, T, S]
    buckets = t5_relative_bucket(
      relative, self.bidirectional, self.num_buckets, self.max_distance
    )  # [B, T, S]
    bias = jnp.take(table, buckets, axis=0)  # [B, T, S, N]
    return jnp.transpose(bias, (0, 3, 1, 2)).astype(jnp.float32)  # [B, N, T, S]


def shaw_relative_logits(
  q: jax.Array, table: jax.Array, q_positions: jax.Array, kv_positions: jax.Array
) -> jax.Array:
  """Shaw et al. 2018 key-side relative term q_t . a_{clip(s - t)} as an additive bias.

  q: [B, T, N, H] (already scaled like the content scores); table: [2k + 1, H];
  positions [B, T] and [B, S]. Returns float32 [B, N, T, S]. Only the key term is used:
  Shaw et al. (Table 3) found the value term unnecessary.
  """
  k = (table.shape[0] - 1) // 2
  relative = jnp.clip(kv_positions[:, None, :] - q_positions[:, :, None], -k, k) + k  # [B, T, S]
  rel = jnp.take(table, relative, axis=0)  # [B, T, S, H]
  return jnp.einsum("BTNH,BTSH->BNTS", q, rel.astype(q.dtype)).astype(jnp.float32)

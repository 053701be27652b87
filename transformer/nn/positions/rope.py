"""Rotary position embedding (Su et al. 2021): queries and keys rotated by position."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from transformer.nn.config import fail
from transformer.nn.positions.base import Position


def rope_frequencies(head_dim: int, theta: float = 10_000.0) -> np.ndarray:
  """Inverse frequencies theta^(-2i/H) for i < H/2, float64 [H/2]."""
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


class Rope(Position):
  """Rotates self-attention queries and keys with base wavelength `config.rope_theta`."""

  def rotate(self, x: jax.Array, positions: jax.Array) -> jax.Array:
    return apply_rope(x, positions, self.config.rope_theta)

  def validate(self) -> None:
    c = self.config
    if c.head_dim % 2:
      fail("position", c.position, f"rope needs an even head_dim, got {c.head_dim}")

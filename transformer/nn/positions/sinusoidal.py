"""Fixed sinusoidal positions added to the embeddings (Vaswani et al. 2017, 3.5)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer.nn.config import fail
from transformer.nn.positions.base import Position


def sinusoidal_table(
  length: int, d_model: int, max_timescale: float = 10_000.0, split: bool = False
) -> np.ndarray:
  """PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(p / 10000^(2i/D)).

  Returns float32 [length, D] with sines at even and cosines at odd feature indices; with
  `split`, PE[p, i] = sin(...) and PE[p, D/2 + i] = cos(...) instead (the same angles,
  sines in the first half: Marian, HF `MarianSinusoidalPositionalEmbedding`).
  """
  positions = np.arange(length, dtype=np.float64)[:, None]  # [L, 1]
  inv_freq = max_timescale ** (-np.arange(0, d_model, 2, dtype=np.float64) / d_model)  # [D/2]
  angles = positions * inv_freq[None, :]  # [L, D/2]
  if split:
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1).astype(np.float32)
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


class Sinusoidal(Position):
  """x + PE[positions] with PE = `sinusoidal_table(max_len, D)` in the config's
  `sinusoidal_layout`; no parameters."""

  def embed(self, module: nn.Module, x: jax.Array, positions: jax.Array) -> jax.Array:
    del module
    c = self.config
    split = c.sinusoidal_layout == "split"
    table = jnp.asarray(sinusoidal_table(c.max_len, x.shape[-1], split=split))  # [L, D]
    return x + jnp.take(table, positions, axis=0).astype(x.dtype)  # [B, T, D]

  def validate(self) -> None:
    c = self.config
    if c.d_model % 2:
      fail("position", c.position, f"sinusoidal needs an even d_model, got {c.d_model}")

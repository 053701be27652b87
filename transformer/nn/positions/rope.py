"""Rotary position embedding (Su et al. 2021): queries and keys rotated by position.

Frequencies for a context longer than pretraining's (`ModelConfig.rope_scaling`), as
Hugging Face's `modeling_rope_utils` computes them:
- linear (position interpolation, Chen et al. 2023): every frequency divided by the factor;
- llama3 (Llama 3.1+): wavelengths longer than L / low_freq_factor divided by the factor,
  those shorter than L / high_freq_factor kept, and those between interpolated smoothly,
  L being the pretraining context (`rope_original_max_len`);
- yarn (Peng et al. 2023, "YaRN"): dims that turn more than beta_fast times over L keep
  their frequency, those turning fewer than beta_slow times are divided by the factor, a
  linear ramp between; q and k are also multiplied by the attention factor
  (`rope_attention_factor`, default 0.1 ln(factor) + 1), so scores by its square.

Partial rotary (`rope_fraction` < 1, GPT-NeoX): only the first R = `rope_dim` features of
each head rotate, with the frequencies of an R-wide head, as Hugging Face does.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from transformer.nn.config import ModelConfig, fail
from transformer.nn.positions.base import Position


def rope_frequencies(
  head_dim: int, theta: float = 10_000.0, config: ModelConfig | None = None
) -> np.ndarray:
  """Inverse frequencies theta^(-2i/H) for i < H/2, float64 [H/2], scaled as
  `config.rope_scaling` says (none without a config)."""
  inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
  scaling = "none" if config is None else config.rope_scaling
  if scaling == "none":
    return inv_freq
  factor = config.rope_scaling_factor
  if scaling == "linear":
    return inv_freq / factor
  if scaling == "yarn":
    return _yarn(inv_freq, head_dim, theta, config)
  low, high = config.rope_low_freq_factor, config.rope_high_freq_factor
  context = config.rope_original_max_len
  wavelength = 2 * math.pi / inv_freq
  smooth = (context / wavelength - low) / (high - low)  # 0 at L / low, 1 at L / high
  between = (1 - smooth) * inv_freq / factor + smooth * inv_freq
  out = np.where(wavelength > context / low, inv_freq / factor, between)
  return np.where(wavelength < context / high, inv_freq, out)


def _yarn(inv_freq: np.ndarray, dim: int, theta: float, c: ModelConfig) -> np.ndarray:
  """YaRN's frequencies, as `transformers.modeling_rope_utils._compute_yarn_parameters`."""

  def correction_dim(rotations: float) -> float:  # the dim that turns `rotations` times in L
    return (
      dim * math.log(c.rope_original_max_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))
    )

  low, high = correction_dim(c.rope_beta_fast), correction_dim(c.rope_beta_slow)
  if c.rope_truncate:
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, dim - 1)
  high = high + 0.001 if low == high else high  # as HF: no zero-width ramp
  ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
  kept = 1 - ramp  # 1: the frequency as it is (extrapolated), 0: divided by the factor
  return inv_freq / c.rope_scaling_factor * (1 - kept) + inv_freq * kept


def rope_attention_factor(config: ModelConfig | None) -> float:
  """What yarn multiplies q and k by after rotating (1 otherwise)."""
  if config is None or config.rope_scaling != "yarn":
    return 1.0
  if config.rope_attention_factor is not None:
    return config.rope_attention_factor
  factor = config.rope_scaling_factor
  return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def apply_rope(
  x: jax.Array, positions: jax.Array, theta: float = 10_000.0, config: ModelConfig | None = None
) -> jax.Array:
  """Rotary position embedding, rotating feature pairs (x[i], x[i + H/2]) ("rotate half").

  x: [B, T, N, H]; positions: [B, T] ints. Scores q_t . k_s then depend on s - t only.
  `config` gives the frequencies' scaling (`rope_frequencies`).
  """
  head_dim = x.shape[-1]
  inv_freq = jnp.asarray(rope_frequencies(head_dim, theta, config), jnp.float32)  # [H/2]
  angles = positions[..., None].astype(jnp.float32) * inv_freq  # [B, T, H/2]
  sin = jnp.sin(angles)[:, :, None, :]  # [B, T, 1, H/2]
  cos = jnp.cos(angles)[:, :, None, :]  # [B, T, 1, H/2]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)  # [B, T, N, H/2] each
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)  # [B, T, N, H]
  factor = rope_attention_factor(config)
  return (rotated if factor == 1.0 else rotated * factor).astype(x.dtype)


class Rope(Position):
  """Rotates self-attention queries and keys with base wavelength `config.rope_theta`."""

  def rotate(self, x: jax.Array, positions: jax.Array) -> jax.Array:
    """x [B, T, N, H]: the first `config.rope_dim` features rotated, the rest as they are."""
    c = self.config
    r = c.rope_dim
    if r == x.shape[-1]:
      return apply_rope(x, positions, c.rope_theta, c)
    rotated = apply_rope(x[..., :r], positions, c.rope_theta, c)  # [B, T, N, R]
    return jnp.concatenate([rotated, x[..., r:]], axis=-1)  # [B, T, N, H]

  def validate(self) -> None:
    c = self.config
    if c.rope_fraction == 1.0 and c.head_dim % 2:
      fail("position", c.position, f"rope needs an even head_dim, got {c.head_dim}")
    if c.rope_dim % 2 or not c.rope_dim:
      fail(
        "rope_fraction",
        c.rope_fraction,
        f"rope needs an even, non-zero number of rotated features, got int({c.head_dim} * "
        f"{c.rope_fraction}) = {c.rope_dim}",
      )

"""Vision Transformer (Dosovitskiy et al. 2021): patches as tokens, [CLS] or mean pooling.

Letters: B batch, P patch side, G = image_size / P, D model dim, C classes.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.nn.attention import MaskInfo
from transformer.nn.blocks import Stack
from transformer.nn.config import ModelConfig
from transformer.nn.layers import Dropout, compute_dtype
from transformer.nn.positional import sincos_2d_table


class VisionTransformer(nn.Module):
  """Convolutional patch embedding, positions, bidirectional blocks, pooled classifier."""

  config: ModelConfig

  @nn.compact
  def __call__(self, images: jax.Array, deterministic: bool = True) -> jax.Array:
    """images: [B, H, W, C] with H = W = config.image_size -> float32 logits [B, classes]."""
    c = self.config
    expected = (c.image_size, c.image_size, c.num_channels)
    if images.ndim != 4 or tuple(images.shape[1:]) != expected:
      raise ValueError(
        f"ViT expects images [B, {', '.join(map(str, expected))}], got {images.shape}"
      )
    dtype = compute_dtype(c)
    x = nn.Conv(
      c.d_model,
      (c.patch_size, c.patch_size),
      strides=(c.patch_size, c.patch_size),
      padding="VALID",
      dtype=dtype,
      name="patch_embed",
    )(images.astype(dtype))  # [B, G, G, D]
    b = x.shape[0]
    x = x.reshape(b, -1, c.d_model)  # [B, G*G, D]
    if c.position == "sinusoidal":  # fixed 2-D sin-cos over the patch grid
      grid = c.image_size // c.patch_size
      x = x + jnp.asarray(sincos_2d_table(grid, c.d_model), dtype)[None]
    if c.pooling == "cls":
      cls = self.param("cls", nn.initializers.zeros, (1, 1, c.d_model))
      x = jnp.concatenate([jnp.broadcast_to(cls, (b, 1, c.d_model)).astype(dtype), x], axis=1)
    if c.position == "learned":
      pos = self.param("pos_embedding", nn.initializers.normal(0.02), (1, x.shape[1], c.d_model))
      x = x + pos.astype(dtype)  # [B, 1 + G*G, D]
    x = Dropout(c.dropout_rate)(x, deterministic=deterministic)
    info = MaskInfo.create(jnp.ones(x.shape[:2], jnp.int32)).replace(
      q_segment_ids=None, kv_segment_ids=None
    )
    x = Stack(c, c.num_layers, name="encoder")(x, info, deterministic=deterministic)
    pooled = x[:, 0] if c.pooling == "cls" else x.mean(axis=1)  # [B, D]
    head = nn.Dense(c.num_classes, dtype=dtype, kernel_init=nn.initializers.zeros, name="head")
    return head(pooled).astype(jnp.float32)  # [B, classes]

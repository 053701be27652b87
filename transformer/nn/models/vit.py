"""Vision Transformer (Dosovitskiy et al. 2021): patches as tokens, [CLS] or mean pooling.

Letters: B batch, P patch side, G = image_size / P, D model dim, C classes, E learned
tokens before the patches ([CLS], DeiT's distillation token; `prefix_tokens`).
`sliding_window` W: token t sees tokens s with |t - s| < W in the token order ([CLS],
then the patches row by row), a band over the flattened grid rather than a 2-D window.

Heads: `pooling` 'cls' reads [CLS], 'mean' the mean of all tokens, 'cls_mean' (DINOv2)
concat([CLS], mean of the patch tokens) [B, 2D]. `vit_distillation_token` (DeiT, Touvron
et al. 2021) puts a second learned token after [CLS] with its own head on it; the logits
are the mean of the two heads', as DeiT's inference does.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.nn import counts
from transformer.nn.blocks import Stack
from transformer.nn.config import ModelConfig, fail
from transformer.nn.layers import compute_dtype, make_dense, make_dropout
from transformer.nn.masks import MaskInfo
from transformer.nn.positions import sincos_2d_table

# ViT positions are its own: a 2-D sin-cos grid or a learned [1, tokens, D] table.
POSITIONS = ("learned", "sinusoidal", "none")


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
    prefix = prefix_tokens(c)  # E: [CLS] (and the distillation token) before the patches
    if prefix:
      names = ("cls", "distillation_token")[:prefix]
      tokens = [self.param(n, nn.initializers.zeros, (1, 1, c.d_model)) for n in names]
      tokens = jnp.broadcast_to(jnp.concatenate(tokens, axis=1), (b, prefix, c.d_model))
      x = jnp.concatenate([tokens.astype(dtype), x], axis=1)  # [B, E + G*G, D]
    if c.position == "learned":
      pos = self.param("pos_embedding", nn.initializers.normal(0.02), (1, x.shape[1], c.d_model))
      x = x + pos.astype(dtype)  # [B, E + G*G, D]
    x = make_dropout(c)(x, deterministic=deterministic)
    info = MaskInfo.create(jnp.ones(x.shape[:2], jnp.int32), window=c.sliding_window).replace(
      q_segment_ids=None, kv_segment_ids=None
    )  # no padding; a sliding window bounds |t - s| over the token order ([CLS] first)
    x = Stack(c, c.num_layers, name="encoder")(x, info, deterministic=deterministic)
    if c.pooling == "cls":
      pooled = x[:, 0]  # [B, D]
    elif c.pooling == "cls_mean":  # DINOv2: [CLS] beside the mean of the patch tokens
      pooled = jnp.concatenate([x[:, 0], x[:, prefix:].mean(axis=1)], axis=-1)  # [B, 2D]
    else:
      pooled = x.mean(axis=1)  # [B, D]

    def head(name: str, features: jax.Array) -> jax.Array:  # [B, D or 2D] -> [B, classes]
      dense = make_dense(c, c.num_classes, name, use_bias=True, kernel_init=nn.initializers.zeros)
      return dense(features).astype(jnp.float32)

    logits = head("head", pooled)  # [B, classes]
    if c.vit_distillation_token:  # DeiT: the mean of the [CLS] and distillation heads
      logits = (logits + head("distillation_head", x[:, 1])) / 2
    return logits  # [B, classes]


def prefix_tokens(c: ModelConfig) -> int:
  """Learned tokens before the patches: [CLS] (pooling 'cls' / 'cls_mean'), and DeiT's
  distillation token after it."""
  return (c.pooling != "mean") + c.vit_distillation_token


def build(c: ModelConfig) -> nn.Module:
  return VisionTransformer(c)


def validate(c: ModelConfig) -> None:
  for field in ("image_size", "patch_size", "num_channels"):
    value = getattr(c, field)
    if not isinstance(value, int) or value <= 0:
      fail(field, value, "must be a positive integer")
  if c.position == "sinusoidal" and c.d_model % 4:
    fail("position", c.position, f"2-D sin-cos needs d_model divisible by 4, got {c.d_model}")
  if c.image_size % c.patch_size:
    fail("image_size", c.image_size, f"must be divisible by patch_size={c.patch_size}")
  if c.num_classes <= 0:
    fail("num_classes", c.num_classes, "a ViT needs num_classes > 0")
  if c.scale_logits:
    fail("scale_logits", c.scale_logits, "the output rescaling is for decoder and seq2seq")
  if c.logits_softcap is not None:
    fail("logits_softcap", c.logits_softcap, "the logit soft cap is for decoder and seq2seq")
  if c.logits_multiplier != 1:
    fail("logits_multiplier", c.logits_multiplier, "is for decoder and seq2seq")
  if c.position not in POSITIONS:
    fail("position", c.position, "ViT supports learned, sinusoidal (2-D sin-cos) or none")
  if c.vit_distillation_token and c.pooling != "cls":
    fail("vit_distillation_token", True, f"needs pooling='cls' (DeiT), got {c.pooling!r}")
  tokens = c.num_patches + prefix_tokens(c)
  if tokens > c.max_len:
    fail("max_len", c.max_len, f"must be >= {tokens} image tokens")


def param_count(c: ModelConfig) -> int:
  d, prefix = c.d_model, prefix_tokens(c)
  tokens = c.num_patches + prefix
  patch = c.patch_size**2 * c.num_channels * d + d
  head_in = 2 * d if c.pooling == "cls_mean" else d
  return (
    patch
    + prefix * d
    + (tokens * d if c.position == "learned" else 0)
    + counts.stack_params(c, c.num_layers, cross=False)
    + (head_in + 1) * c.num_classes
    + ((d + 1) * c.num_classes if c.vit_distillation_token else 0)
  )


def forward_flops(c: ModelConfig, seq_len: int, mlm_predictions: int | None = None) -> float:
  del mlm_predictions
  patch = 2 * c.patch_size**2 * c.num_channels * c.d_model  # patch embedding per image token
  return counts.stack_flops(c, c.num_layers, seq_len) + patch

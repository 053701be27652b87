"""The Transformer block and the layer stack (optionally scanned and rematerialised).

Letters: B batch, T query length, S source length, D model dim.

One `Block` serves every family: an encoder block is self-attention + feed-forward with a
bidirectional `MaskInfo`; a decoder block is the same with a causal `MaskInfo`, plus
cross-attention over the encoder output in encoder-decoder models.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.nn.attention import MultiHeadAttention
from transformer.nn.config import ModelConfig
from transformer.nn.layers import FeedForward, make_dropout, make_norm
from transformer.nn.masks import MaskInfo
from transformer.nn.mla import LatentAttention
from transformer.nn.moe import AUX_COLLECTION, MoEFeedForward
from transformer.nn.partitioning import constrain
from transformer.nn.positions import position_for

REMAT_POLICIES = {
  "full": None,  # save nothing, recompute the whole block
  "dots": jax.checkpoint_policies.checkpoint_dots,
  "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def layer_scaled(config: ModelConfig, y: jax.Array, scale: jax.Array | None) -> jax.Array:
  """A residual branch y [B, T, D] times its layer scale [D] (CaiT, DINOv2; None = none)
  and `residual_multiplier` (Granite)."""
  y = y if scale is None else y * scale.astype(y.dtype)[None, None]  # [B, T, D]
  m = config.residual_multiplier
  return y if m == 1 else y * jnp.asarray(m, y.dtype)  # [B, T, D]


def residual(
  config: ModelConfig,
  x: jax.Array,
  sublayer,
  norm_name: str | None,
  deterministic: bool,
  scale: jax.Array | None = None,
):
  """Pre-LN: x + drop(f(norm(x))). Post-LN (Vaswani et al.): norm(x + drop(f(x))).
  Sandwich (Gemma 2 / 3): x + drop(norm2(f(norm1(x)))), norm2 named `norm_name`_post.
  Sublayer-post (OLMo 2): x + drop(norm(f(x))).
  `norm_name` None (pre-LN only): x + drop(f(x)), no norm (ModernBERT's layer 0 attention).
  `scale`: the branch's layer scale [D] (`layer_scale_init`), applied to f's output (after
  norm2 / norm) before dropout and the add; None = none."""

  def branch(y):  # [B, T, D]
    return make_dropout(config)(layer_scaled(config, y, scale), deterministic=deterministic)

  if config.norm_position == "pre":
    normed = x if norm_name is None else make_norm(config, norm_name)(x)
    return x + branch(sublayer(normed))
  if config.norm_position == "sandwich":
    y = make_norm(config, f"{norm_name}_post")(sublayer(make_norm(config, norm_name)(x)))
    return x + branch(y)
  if config.norm_position == "sublayer_post":
    return x + branch(make_norm(config, norm_name)(sublayer(x)))
  return make_norm(config, norm_name)(x + branch(sublayer(x)))


class Block(nn.Module):
  """Self-attention, optional cross-attention, feed-forward; each a residual sublayer.

  `moe`: the feed-forward is a mixture of experts (`moe.MoEFeedForward`, named 'moe').
  With `layer_scale_init` set, each branch is multiplied by a learned [D] vector before the
  add ('self_attention_scale', 'cross_attention_scale', 'ffn_scale'; CaiT, DINOv2).
  `attention_norm` False: pre-LN self-attention reads x itself (ModernBERT's layer 0).
  """

  config: ModelConfig
  cross_attention: bool = False
  moe: bool = False
  attention_norm: bool = True

  @nn.compact
  def __call__(
    self,
    x: jax.Array,
    info: MaskInfo,
    encoded: jax.Array | None = None,
    cross_info: MaskInfo | None = None,
    position_table: jax.Array | None = None,
    deterministic: bool = True,
    decode: bool = False,
  ) -> jax.Array:
    """x: [B, T, D]; encoded: [B, S, D] for cross-attention. Returns [B, T, D].

    position_table: the stack's shared position table (`Position.shared_table`), or None.
    """
    c = self.config

    def self_attention(h):
      kind = LatentAttention if c.mla_kv_rank else MultiHeadAttention
      attn = kind(c, name="self_attention")
      return attn(h, None, info, position_table, deterministic, decode)

    def layer_scale(name: str) -> jax.Array | None:  # [D] per residual branch, or None
      if c.layer_scale_init is None:
        return None
      return self.param(name, nn.initializers.constant(c.layer_scale_init), (c.d_model,))

    if c.parallel_residual:  # both sublayers read x: x + attn(norm1(x)) + ffn(norm2(x))
      drop = make_dropout(c)
      normed = make_norm(c, "self_attention_norm")(x)  # [B, T, D]
      attended = self_attention(normed)
      attended = drop(layer_scaled(c, attended, layer_scale("self_attention_scale")), deterministic)
      if not c.parallel_shared_norm:  # Cohere, StableLM: one norm for both
        normed = make_norm(c, "ffn_norm")(x)
      fed = self._feed_forward(info, deterministic)(normed)
      fed = drop(layer_scaled(c, fed, layer_scale("ffn_scale")), deterministic)
      return constrain(x + attended + fed, ("batch", "length", "embed"))  # [B, T, D]
    scale = layer_scale("self_attention_scale")
    norm_name = "self_attention_norm" if self.attention_norm else None
    x = residual(c, x, self_attention, norm_name, deterministic, scale)
    if self.cross_attention:

      def cross_attention(h):
        attn = MultiHeadAttention(c, is_cross=True, name="cross_attention")
        return attn(h, encoded, cross_info, None, deterministic, decode)

      scale = layer_scale("cross_attention_scale")
      x = residual(c, x, cross_attention, "cross_attention_norm", deterministic, scale)
    feed_forward = self._feed_forward(info, deterministic)
    x = residual(c, x, feed_forward, "ffn_norm", deterministic, layer_scale("ffn_scale"))
    return constrain(x, ("batch", "length", "embed"))  # [B, T, D]

  def _feed_forward(self, info: MaskInfo, deterministic: bool):
    """h [B, T, D] -> [B, T, D]: the dense feed-forward ('ffn') or the experts ('moe')."""
    c = self.config
    if self.moe:  # padding tokens (segment id 0) are routed nowhere
      valid = None if info.q_segment_ids is None else info.q_segment_ids > 0  # [B, T]
      moe = MoEFeedForward(c, name="moe")
      return lambda h: moe(h, valid, deterministic)
    ffn = FeedForward(c, name="ffn")
    return lambda h: ffn(h, deterministic)


class _ScanBlock(nn.Module):
  """Adapts `Block` to nn.scan's (carry, *args) -> (carry, output) signature."""

  config: ModelConfig
  block: type
  cross_attention: bool

  @nn.compact
  def __call__(self, x, *args):
    moe = self.config.moe_experts > 0  # scanned layers are alike: moe_every is 1
    return self.block(self.config, self.cross_attention, moe, name="block")(x, *args), None


class Stack(nn.Module):
  """`num_layers` blocks (unrolled or nn.scan; layer 0 without its attention norm if
  `first_layer_attention_norm` is False), the final norm for pre-LN, and the position table
  the layers share (T5's relative bias)."""

  config: ModelConfig
  num_layers: int
  cross_attention: bool = False

  @nn.compact
  def __call__(
    self,
    x: jax.Array,
    info: MaskInfo,
    encoded: jax.Array | None = None,
    cross_info: MaskInfo | None = None,
    deterministic: bool = True,
    decode: bool = False,
  ) -> jax.Array:
    """x: [B, T, D] -> [B, T, D]."""
    c = self.config
    position_table = position_for(c).shared_table(self)  # one per stack, or None
    block = Block
    if c.remat_policy != "none":
      # Argument 0 is the module; deterministic (6) and decode (7) are Python bools.
      block = nn.remat(block, policy=REMAT_POLICIES[c.remat_policy], static_argnums=(6, 7))
    args = (info, encoded, cross_info, position_table, deterministic, decode)
    if c.scan_layers:
      scanned = nn.scan(
        _ScanBlock,
        variable_axes={"params": 0, "cache": 0, "intermediates": 0, AUX_COLLECTION: 0},
        split_rngs={"params": True, "dropout": True},
        in_axes=(nn.broadcast,) * len(args),
        length=self.num_layers,
      )
      x, _ = scanned(c, block, self.cross_attention, name="layers")(x, *args)
    else:
      for i in range(self.num_layers):
        layer_args = args
        if c.is_global_layer(i) and info.window is not None:  # a global layer of a pattern
          layer_args = (info.replace(window=None), *args[1:])
        attention_norm = i > 0 or c.first_layer_attention_norm
        layer = block(
          c.layer_config(i),
          self.cross_attention,
          c.is_moe_layer(i),
          attention_norm,
          name=f"layer_{i}",
        )
        x = layer(x, *layer_args)
    if c.norm_position != "post":  # all but post-LN end in a final norm
      x = make_norm(c, "final_norm")(x)
    return x


def shift_right(
  targets: jax.Array, segment_ids: jax.Array | None = None, start_id: int = 0
) -> jax.Array:
  """Decoder inputs: targets shifted right by one, `start_id` first (PAD 0 as in T5;
  `ModelConfig.decoder_start_id`).

  With packed segment ids the first token of every segment also starts from `start_id`.
  targets: [B, T] -> [B, T].
  """
  shifted = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=start_id)[:, :-1]
  if segment_ids is not None:
    prev_seg = jnp.pad(segment_ids, ((0, 0), (1, 0)))[:, :-1]
    shifted = jnp.where(segment_ids == prev_seg, shifted, start_id)
  return shifted

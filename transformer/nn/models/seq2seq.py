"""Encoder-decoder Transformer (Vaswani et al. 2017; T5 with relative positions / RMSNorm).

Letters: B batch, S source length, T target length, D model dim, V vocabulary.
Source and target share one vocabulary and one embedding table; with `tie_embeddings`
the output logits also use it (Vaswani et al. 3.4). T5 (transformer/convert/t5.py):
relative_t5 positions, pre-RMSNorm, no biases, `attention_scale=1.0`, ReLU (v1.0) or
`geglu_tanh` (v1.1) feed-forward, `scale_logits` (v1.0) or an untied head (v1.1).
`sliding_window` W bounds both self-attentions (encoder |t - s| < W, decoder
0 <= t - s < W); cross-attention sees the whole source, since a window relates positions
of one sequence and source and target positions are not aligned.

BART and Marian (transformer/convert/bart.py, marian.py): post-LN, `embed_norm` (a norm
after each stack's token + position embeddings, BART), `final_logits_bias` (a learned
[V] bias added to the logits, zeros at initialisation) and `decoder_start_id` (the token
the decoder starts from, in training (`shift_right`) and decoding; BART's EOS).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.nn import counts
from transformer.nn.blocks import Stack, shift_right
from transformer.nn.config import ModelConfig, fail
from transformer.nn.kernels import soft_cap
from transformer.nn.layers import Embedder, default_positions, make_dense, make_embed
from transformer.nn.masks import MaskInfo


def _segments(tokens: jax.Array, segment_ids: jax.Array | None) -> jax.Array:
  return (tokens != 0).astype(jnp.int32) if segment_ids is None else segment_ids


class EncoderDecoder(nn.Module):
  """`__call__(inputs, targets)` for training; `encode` + `decode` for generation."""

  config: ModelConfig

  def setup(self):
    c = self.config
    self.embed = make_embed(c, c.vocab_size, "shared_embed")
    self.encoder_embedder = Embedder(c, self.embed, norm=c.embed_norm)
    self.decoder_embedder = Embedder(c, self.embed, norm=c.embed_norm)
    self.encoder = Stack(c, c.num_layers, name="encoder")
    self.decoder = Stack(c, c.decoder_layers, cross_attention=True, name="decoder")
    if not c.tie_embeddings:
      self.lm_head = make_dense(
        c, c.vocab_size, use_bias=False, kernel_init=nn.initializers.lecun_normal()
      )
    if c.final_logits_bias:
      self.logits_bias = self.param("final_logits_bias", nn.initializers.zeros, (c.vocab_size,))

  def encode(
    self,
    inputs: jax.Array,
    inputs_segment_ids: jax.Array | None = None,
    inputs_positions: jax.Array | None = None,
    deterministic: bool = True,
  ) -> jax.Array:
    """inputs [B, S] -> encoded [B, S, D]."""
    positions = default_positions(inputs) if inputs_positions is None else inputs_positions
    x = self.encoder_embedder(inputs, positions, deterministic)  # [B, S, D]
    info = MaskInfo.create(
      _segments(inputs, inputs_segment_ids),
      q_positions=positions,
      window=self.config.sliding_window,
    )  # bidirectional window: |t - s| < sliding_window
    return self.encoder(x, info, deterministic=deterministic)

  def decode(
    self,
    encoded: jax.Array | None,
    inputs_segment_ids: jax.Array,
    decoder_inputs: jax.Array,
    targets_segment_ids: jax.Array | None = None,
    targets_positions: jax.Array | None = None,
    deterministic: bool = True,
    decode: bool = False,
  ) -> jax.Array:
    """Decoder inputs [B, T] (already shifted) over encoded [B, S, D] -> logits [B, T, V].

    inputs_segment_ids: [B, S] source segments (0 = padding). When decoding with the
    cache, pass the new tokens and their absolute `targets_positions`; `encoded` is needed
    at the first call only: each layer projects its cross-attention keys and values from
    it once into the cache, and later calls pass None and read them there. Those calls
    may hold r rows per source (beams: rows b * r ... b * r + r - 1 decode source b,
    whose cached keys and segment ids [B, S] they share).
    """
    c = self.config
    positions = (
      default_positions(decoder_inputs) if targets_positions is None else targets_positions
    )
    if targets_segment_ids is None:
      targets_segment_ids = jnp.ones_like(decoder_inputs, jnp.int32)
    x = self.decoder_embedder(decoder_inputs, positions, deterministic)  # [B, T, D]
    self_info = MaskInfo.create(
      targets_segment_ids, q_positions=positions, causal=True, window=c.sliding_window
    )
    cross_info = MaskInfo.create(targets_segment_ids, inputs_segment_ids, q_positions=positions)
    x = self.decoder(x, self_info, encoded, cross_info, deterministic=deterministic, decode=decode)
    if c.scale_logits:  # T5 v1.0 (Mesh TensorFlow): rescale before the tied logits
      x = x * jnp.asarray(c.d_model**-0.5, x.dtype)  # [B, T, D]
    logits = self.embed.attend(x) if c.tie_embeddings else self.lm_head(x)  # [B, T, V]
    logits = logits.astype(jnp.float32)  # [B, T, V]
    if c.final_logits_bias:
      logits = logits + self.logits_bias[None, None, :]  # [B, T, V]
    if c.logits_multiplier != 1:
      logits = logits * jnp.float32(c.logits_multiplier)
    return soft_cap(logits, c.logits_softcap)  # [B, T, V]

  def __call__(
    self,
    inputs: jax.Array,
    targets: jax.Array,
    inputs_segment_ids: jax.Array | None = None,
    targets_segment_ids: jax.Array | None = None,
    inputs_positions: jax.Array | None = None,
    targets_positions: jax.Array | None = None,
    deterministic: bool = True,
  ) -> jax.Array:
    """Teacher forcing: inputs [B, S], targets [B, T] -> logits [B, T, V] predicting targets."""
    inputs_segment_ids = _segments(inputs, inputs_segment_ids)
    targets_segment_ids = _segments(targets, targets_segment_ids)
    encoded = self.encode(inputs, inputs_segment_ids, inputs_positions, deterministic)
    decoder_inputs = shift_right(targets, targets_segment_ids, self.config.decoder_start_id)
    return self.decode(
      encoded,
      inputs_segment_ids,
      decoder_inputs,
      targets_segment_ids,
      targets_positions,
      deterministic,
    )


def build(c: ModelConfig) -> nn.Module:
  return EncoderDecoder(c)


def validate(c: ModelConfig) -> None:
  if c.parallel_residual:  # three sublayers in the decoder: no parallel form defined here
    fail("parallel_residual", True, "is for blocks without cross-attention (not seq2seq)")


def param_count(c: ModelConfig) -> int:
  # Shared source/target embeddings (Vaswani et al. 3.4); untied adds output logits.
  embed = c.vocab_size * c.d_model + 2 * counts.embedder_params(c)  # encoder + decoder
  head = 0 if c.tie_embeddings else c.d_model * c.vocab_size
  head += c.vocab_size if c.final_logits_bias else 0
  embed += 2 * counts.norm_params(c) if c.embed_norm else 0  # encoder + decoder embed_norm
  return (
    embed
    + counts.stack_params(c, c.num_layers, cross=False)
    + counts.stack_params(c, c.decoder_layers, cross=True)
    + head
  )


def forward_flops(c: ModelConfig, seq_len: int, mlm_predictions: int | None = None) -> float:
  # Tokens are counted on the target side; source and target lengths are taken equal.
  del mlm_predictions
  body = counts.stack_flops(c, c.num_layers, seq_len)
  body += counts.stack_flops(c, c.decoder_layers, seq_len, cross=True, causal=True)
  return body + 2 * c.d_model * c.vocab_size

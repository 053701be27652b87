"""Norms, feed-forward, embeddings and the Transformer block against the float64 reference."""

import jax.numpy as jnp
import numpy as np
import pytest
import reference_numpy as ref

from transformer.nn import layers
from transformer.nn.blocks import Block, shift_right
from transformer.nn.masks import MaskInfo
from transformer.nn.sizes import gated_hidden_size

TOL = dict(rtol=1e-5, atol=1e-5)


def _x(shape=(2, 5, 32), seed=0, scale=2.0, shift=0.5):
  """Inputs with a non-zero mean and non-unit scale, so the norms have work to do."""
  rng = np.random.default_rng(seed)
  return (scale * rng.standard_normal(shape) + shift).astype(np.float32)


@pytest.mark.parametrize("norm, eps", [("layernorm", 1e-5), ("rmsnorm", 1e-6), ("layernorm", 0.5)])
def test_norms_match_reference(tiny_config, random_params, jit_apply, norm, eps):
  c = tiny_config(norm=norm, norm_eps=eps)
  module = layers.make_norm(c)
  x = _x()
  params = random_params(module, x)
  assert set(params) == ({"scale", "bias"} if norm == "layernorm" else {"scale"})
  expected = ref.norm(x.astype(np.float64), ref.to_numpy(params), c)
  np.testing.assert_allclose(jit_apply(module)(params, x), expected, **TOL)


@pytest.mark.parametrize(
  "activation, use_bias", [("relu", True), ("gelu", False), ("swiglu", True), ("geglu", False)]
)
def test_feed_forward_matches_reference(
  tiny_config, random_params, jit_apply, activation, use_bias
):
  c = tiny_config(activation=activation, use_bias=use_bias)
  module = layers.FeedForward(c)
  x = _x()
  params = random_params(module, x)
  names = {"wi_0", "wi_1", "wo"} if c.gated else {"wi", "wo"}
  assert set(params) == names
  assert all(("bias" in p) == use_bias for p in params.values())
  expected = ref.feed_forward(x.astype(np.float64), ref.to_numpy(params), activation)
  np.testing.assert_allclose(jit_apply(module)(params, x), expected, **TOL)


def test_gated_hidden_size_is_two_thirds_of_4d_rounded():
  assert gated_hidden_size(4096) == 11008  # LLaMA-7B
  assert gated_hidden_size(768, multiple_of=1) == 2048
  assert gated_hidden_size(100, multiple_of=64) == 320


def test_embedder_scales_tokens_and_adds_positions(tiny_config, random_params, jit_apply):
  c = tiny_config(position="sinusoidal", scale_embeddings=True)
  embed = layers.make_embed(c, c.vocab_size, "token_embed")
  module = layers.Embedder(c, embed)
  tokens = np.array([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]], np.int32)
  positions = np.array([[0, 1, 2, 3, 4], [2, 3, 0, 1, 2]], np.int32)
  params = random_params(module, tokens, positions, True)
  out = jit_apply(module)(params, tokens, positions, True)
  table = ref.to_numpy(params)["embed"]["embedding"]
  expected = table[tokens] * np.sqrt(c.d_model) + ref.sinusoidal(positions, c.d_model)
  np.testing.assert_allclose(out, expected, **TOL)
  np.testing.assert_array_equal(layers.default_positions(jnp.zeros((2, 3))), [[0, 1, 2]] * 2)


def test_shift_right_starts_every_segment_from_zero():
  targets = jnp.array([[5, 6, 7, 8, 9, 0]])
  segments = jnp.array([[1, 1, 2, 2, 2, 0]])
  np.testing.assert_array_equal(shift_right(targets), [[0, 5, 6, 7, 8, 9]])
  np.testing.assert_array_equal(shift_right(targets, segments), [[0, 5, 0, 7, 8, 0]])


# Each case covers several options at once; together: pre/post, with/without cross-attention,
# layernorm/rmsnorm, MHA/GQA, every FFN activation kind, bias on/off, a position kind.
# name: (overrides, cross-attention, causal self-attention)
BLOCK_CASES = {
  "pre-encoder-layernorm-gelu": (dict(norm_position="pre", activation="gelu"), False, False),
  "post-causal-rmsnorm-relu-gqa-alibi": (
    dict(norm_position="post", norm="rmsnorm", activation="relu", num_kv_heads=2, position="alibi"),
    False,
    True,
  ),
  "pre-cross-rmsnorm-swiglu-rope-nobias": (
    dict(norm_position="pre", norm="rmsnorm", activation="swiglu", position="rope", use_bias=False),
    True,
    True,
  ),
  "post-cross-layernorm-geglu-mqa": (
    dict(norm_position="post", activation="geglu", num_kv_heads=1),
    True,
    True,
  ),
}


@pytest.mark.parametrize("name", list(BLOCK_CASES))
def test_block_matches_reference(tiny_config, random_params, jit_apply, name):
  overrides, cross, causal = BLOCK_CASES[name]
  c = tiny_config(**overrides)
  b, t, s = 2, 6, 7
  x = _x((b, t, c.d_model), seed=1)
  encoded = _x((b, s, c.d_model), seed=2) if cross else None
  seg = np.array([[1, 1, 1, 1, 1, 0], [1] * 6], np.int32)
  src_seg = np.array([[1] * 7, [1, 1, 1, 1, 0, 0, 0]], np.int32)
  info = MaskInfo.create(jnp.asarray(seg), causal=causal)
  cross_info = MaskInfo.create(jnp.asarray(seg), jnp.asarray(src_seg)) if cross else None
  module = Block(c, cross_attention=cross)
  params = random_params(module, x, info, encoded, cross_info)
  out = jit_apply(module)(params, x, info, encoded, cross_info)
  idx, src_idx = np.arange(t), np.arange(s)
  mask = ref.reference_mask(idx, idx, causal, None, seg, seg)
  cross_mask = ref.reference_mask(idx, src_idx, False, None, seg, src_seg) if cross else None
  expected = ref.block(
    ref.to_numpy(params),
    x.astype(np.float64),
    c,
    mask,
    np.broadcast_to(idx, (b, t)),
    causal,
    None,
    None if encoded is None else encoded.astype(np.float64),
    cross_mask,
  )
  assert out.shape == x.shape
  np.testing.assert_allclose(out, expected, **TOL)

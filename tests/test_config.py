"""ModelConfig: validation (field, value and rule in the message) at construction and by
`models.check` (the registries' rules, which `build_model` applies), helpers, named sizes
and the FLOP formula."""

import dataclasses
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.nn.config import ModelConfig
from transformer.nn.models import build_model, check, flops_per_token, param_count
from transformer.nn.sizes import NAMED_SIZES, named

VIT = dict(family="vit", num_classes=10, image_size=32, patch_size=8, max_len=17)

# (overrides, field named in the message, a phrase of the rule)
BAD = [
  (dict(d_model=30, num_heads=4), "d_model", "divisible by num_heads=4"),
  (dict(num_heads=4, num_kv_heads=3), "num_kv_heads", "must divide num_heads=4"),
  (dict(num_heads=4, num_kv_heads=8), "num_kv_heads", "must divide num_heads=4"),
  (dict(num_kv_heads=0), "num_kv_heads", "positive integer or None"),
  (dict(position="absolute"), "position", "must be one of sinusoidal, learned, rope"),
  (dict(norm="batchnorm"), "norm", "must be one of layernorm, rmsnorm"),
  (dict(norm_position="middle"), "norm_position", "must be one of pre, post"),
  (
    dict(activation="tanh"),
    "activation",
    "must be one of relu, gelu, gelu_tanh, silu, swiglu, geglu, geglu_tanh",
  ),
  (dict(family="rnn"), "family", "must be one of"),
  (dict(attention_impl="flash"), "attention_impl", "must be one of xla, jax, chunked"),
  (dict(dtype="float64"), "dtype", "must be one of"),
  (dict(pooling="max"), "pooling", "must be one of cls, mean"),
  (dict(remat_policy="some"), "remat_policy", "must be one of"),
  (dict(ops="cuda"), "ops", "must be one of fast, plain"),
  (dict(d_model=-32), "d_model", "positive integer"),
  (dict(vocab_size=0), "vocab_size", "positive integer"),
  (dict(num_layers=0), "num_layers", "positive integer"),
  (dict(num_heads=0), "num_heads", "positive integer"),
  (dict(d_ff=-1), "d_ff", "positive integer"),
  (dict(max_len=0), "max_len", "positive integer"),
  (dict(d_model=32.0), "d_model", "positive integer"),
  (dict(num_decoder_layers=-1), "num_decoder_layers", "positive integer or None"),
  (dict(sliding_window=0), "sliding_window", "positive integer or None"),
  (dict(type_vocab_size=-1, family="encoder"), "type_vocab_size", ">= 0"),
  (dict(num_classes=-2), "num_classes", ">= 0"),
  (dict(dropout_rate=1.0), "dropout_rate", "in [0, 1)"),
  (dict(attention_dropout_rate=-0.1), "attention_dropout_rate", "in [0, 1)"),
  (dict(norm_eps=0.0), "norm_eps", "> 0"),
  (dict(position="rope", d_model=20, num_heads=4), "position", "even head_dim, got 5"),
  (dict(position="sinusoidal", d_model=33, num_heads=3), "position", "even d_model"),
  (dict(rope_theta=0.0), "rope_theta", "> 0"),
  (dict(position="rope", rope_scaling="ntk"), "rope_scaling", "one of ('none'"),
  (dict(norm_scale_plus_one=True), "norm_scale_plus_one", "needs norm='rmsnorm'"),
  (dict(rope_fraction=0.0), "rope_fraction", "must be in (0, 1]"),
  (
    dict(position="rope", rope_scaling="yarn", rope_beta_fast=1.0),
    "rope_beta_fast",
    "must be > rope_beta_slow=1.0 > 0",
  ),
  (dict(attention_softcap=0.0), "attention_softcap", "must be a number > 0, or None"),
  (dict(local_global_pattern="LX", sliding_window=4), "local_global_pattern", "L (local) and G"),
  (dict(position="rope", rope_pattern="RX"), "rope_pattern", "R (RoPE) and N (no position"),
  (dict(rope_pattern="RN"), "rope_pattern", "needs position='rope', got 'learned'"),
  (dict(position="rope", rope_pattern="RN", scan_layers=True), "rope_pattern", "uniform"),
  (dict(residual_multiplier=0.0), "residual_multiplier", "must be a number > 0"),
  (dict(parallel_shared_norm=True), "parallel_shared_norm", "needs parallel_residual=True"),
  (
    dict(family="encoder", logits_multiplier=0.5),
    "logits_multiplier",
    "is for decoder and seq2seq",
  ),
  (dict(local_global_pattern="LG"), "local_global_pattern", "need a sliding_window"),
  (
    dict(local_global_pattern="LG", sliding_window=4, scan_layers=True),
    "local_global_pattern",
    "uniform with scan_layers",
  ),
  (dict(rope_local_theta=10.0), "rope_local_theta", "needs position='rope' and L layers"),
  (dict(family="encoder", logits_softcap=30.0), "logits_softcap", "decoder and seq2seq"),
  (dict(position="rope", rope_fraction=0.3), "rope_fraction", "int(32 * 0.3) = 9"),
  (dict(parallel_residual=True, norm_position="post"), "parallel_residual", "norm_position='pre'"),
  (dict(family="seq2seq", parallel_residual=True), "parallel_residual", "not seq2seq"),
  (dict(norm="rmsnorm", norm_scale_plus_one=1), "norm_scale_plus_one", "True or False"),
  (dict(rope_scaling="linear", rope_scaling_factor=2.0), "rope_scaling", "position='rope'"),
  (
    dict(position="rope", rope_scaling="linear", rope_scaling_factor=0.0),
    "rope_scaling_factor",
    "> 0",
  ),
  (
    dict(position="rope", rope_scaling="llama3", rope_original_max_len=0),
    "rope_original_max_len",
    "int > 0",
  ),
  (
    dict(position="rope", rope_scaling="llama3", rope_high_freq_factor=1.0),
    "rope_high_freq_factor",
    "> rope_low_freq_factor=1.0 > 0",
  ),
  (dict(attention_chunk_size=0), "attention_chunk_size", "> 0"),
  (dict(position="relative_t5", relative_num_buckets=2), "relative_num_buckets", "at least 4"),
  (
    dict(position="relative_t5", relative_num_buckets=32, relative_max_distance=16),
    "relative_max_distance",
    "exceed relative_num_buckets // 2 = 16",
  ),
  (dict(position="relative_shaw", shaw_max_distance=0), "shaw_max_distance", ">= 1"),
  (dict(VIT, image_size=30), "image_size", "divisible by patch_size=8"),
  (dict(VIT, patch_size=0), "patch_size", "positive integer"),
  (dict(VIT, patch_size=-8), "patch_size", "positive integer"),
  (dict(VIT, num_channels=0), "num_channels", "positive integer"),
  (dict(VIT, num_classes=0), "num_classes", "num_classes > 0"),
  (dict(VIT, position="rope"), "position", "ViT supports learned, sinusoidal"),
  (dict(VIT, position="sinusoidal", d_model=18, num_heads=2), "position", "divisible by 4"),
  (dict(VIT, max_len=16), "max_len", "must be >= 17 image tokens"),
  (dict(type_vocab_size=2), "type_vocab_size", "for the encoder family"),
  (dict(final_logits_bias=True), "final_logits_bias", "is a seq2seq option"),
  (dict(family="seq2seq", decoder_start_id=256), "decoder_start_id", "[0, vocab_size=256)"),
  (dict(decoder_start_id=2), "decoder_start_id", "is a seq2seq option"),
  (dict(sinusoidal_layout="split"), "sinusoidal_layout", "needs position='sinusoidal'"),
  (dict(position="sinusoidal", sinusoidal_layout="halves"), "sinusoidal_layout", "interleaved"),
  (dict(norm="rmsnorm", norm_bias=False), "norm_bias", "needs norm='layernorm'"),
  (dict(norm_bias=1), "norm_bias", "must be True or False"),
  (
    dict(first_layer_attention_norm=False, norm_position="post"),
    "first_layer_attention_norm",
    "needs norm_position='pre'",
  ),
  (dict(first_layer_attention_norm=False, scan_layers=True), "first_layer_attention_norm", "scan"),
  (dict(embed_norm=True), "embed_norm", "option, got family='decoder'"),
  (dict(family="encoder", embed_norm=True, norm_position="post"), "embed_norm", "implied by"),
  (dict(head_bias=False), "head_bias", "is an encoder head option"),
  (dict(family="seq2seq", mlm_output_bias=False), "mlm_output_bias", "encoder head option"),
  (dict(family="encoder", pooler_activation="relu"), "pooler_activation", "tanh, gelu_norm"),
]


@pytest.mark.parametrize(
  "overrides, field, rule", BAD, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)]
)
def test_invalid_config_raises_naming_field_value_and_rule(overrides, field, rule):
  value = overrides[field] if field in overrides else {**VIT, **overrides}.get(field)
  with pytest.raises(ValueError) as error:
    check(ModelConfig(**overrides))
  message = str(error.value)
  assert message.startswith(f"ModelConfig.{field}={value!r}: "), message
  assert rule in message, message


@pytest.mark.parametrize(
  ("overrides", "field"), [(dict(family="rnn"), "family"), (dict(VIT, image_size=30), "image_size")]
)
def test_build_model_applies_the_registries_rules(overrides, field):
  config = ModelConfig(**overrides)  # field rules hold; the family's do not
  with pytest.raises(ValueError, match=re.escape(f"ModelConfig.{field}=")):
    build_model(config)


def test_replace_validates_too():
  c = ModelConfig()
  with pytest.raises(ValueError, match=re.escape("ModelConfig.d_model=128: must be divisible")):
    c.replace(num_heads=3)
  assert c.replace(d_model=64).d_model == 64 and c.d_model == 128  # frozen original


def test_config_is_frozen_and_round_trips_through_a_dict():
  c = ModelConfig(num_kv_heads=2, position="rope")
  with pytest.raises(dataclasses.FrozenInstanceError):
    c.d_model = 64
  assert ModelConfig(**c.to_dict()) == c
  assert hash(c) == hash(ModelConfig(**c.to_dict()))


def test_derived_sizes():
  c = ModelConfig(d_model=96, num_heads=6, num_kv_heads=2, num_layers=3, activation="swiglu")
  assert (c.head_dim, c.kv_heads, c.decoder_layers, c.gated) == (16, 2, 3, True)
  assert ModelConfig(num_heads=4).kv_heads == 4
  assert ModelConfig(num_decoder_layers=5).decoder_layers == 5
  assert ModelConfig(**VIT).num_patches == 16


def test_named_sizes_apply_overrides_and_reject_unknown_names():
  c = named("gpt2_small", dropout_rate=0.0)
  assert (c.d_model, c.num_layers, c.dropout_rate) == (768, 12, 0.0)
  with pytest.raises(ValueError, match="unknown model size 'gpt5'"):
    named("gpt5")
  for name in NAMED_SIZES:  # every named size is itself valid
    assert named(name).family in ("encoder", "decoder", "seq2seq", "vit")


def _matmul_flops_per_token(c: ModelConfig, seq_len: int) -> float:
  """Forward matmul FLOPs per token counted from the built model's weight shapes.

  2 FLOPs per weight of every projection a token passes through (attention, FFN, output
  logits = embedding table when tied), plus 4 * (T / 2) * N * H per layer for q.k and p.v:
  causal masking leaves half the score matrix (MaxText's convention).
  """
  model = build_model(c)
  tokens = jax.ShapeDtypeStruct((1, seq_len), jnp.int32)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), tokens))["params"]
  flat = jax.tree_util.tree_flatten_with_path(shapes)[0]
  weights = sum(
    math.prod(leaf.shape)
    for path, leaf in flat
    if jax.tree_util.keystr(path).endswith("['kernel']")
  )
  if c.tie_embeddings:
    weights += c.vocab_size * c.d_model
  return 2.0 * weights + 4.0 * (seq_len / 2) * c.num_heads * c.head_dim * c.num_layers


@pytest.mark.parametrize(
  "overrides",
  [dict(), dict(num_kv_heads=2, activation="swiglu", tie_embeddings=False)],
  ids=["gpt", "gqa-swiglu-untied"],
)
def test_flops_per_token_counts_every_matmul_of_a_decoder(overrides):
  c = ModelConfig(family="decoder", vocab_size=100, d_model=64, num_heads=4, d_ff=96, **overrides)
  expected = _matmul_flops_per_token(c, seq_len=50)
  assert flops_per_token(c, 50, training=False) == pytest.approx(expected, rel=1e-12)
  assert flops_per_token(c, 50) == pytest.approx(3 * expected, rel=1e-12)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [None, 1, 7, 40, 64, 100])
def test_attended_keys_are_the_masks_area_per_query(causal, window):
  """`counts.attended_keys` against the unmasked entries of the T x T mask built in NumPy,
  per query: equal, but for a causal mask's diagonal, counted half (T / 2 for a causal
  mask, T for a full one)."""
  from transformer.nn.counts import attended_keys

  t = 64
  offset = np.arange(t)[:, None] - np.arange(t)[None, :]  # query - key
  allowed = offset >= 0 if causal else np.ones((t, t), bool)
  if window is not None:
    allowed &= np.abs(offset) < window
  diagonal = 0.5 if causal else 0.0
  assert attended_keys(t, causal, window) == pytest.approx(allowed.sum() / t - diagonal)
  if window is None or window >= t:
    assert attended_keys(t, causal, window) == (t / 2 if causal else t)


def test_flops_count_each_layers_band_and_halve_causal_attention():
  """Scores and values per layer and token: 4 * keys * N * H, keys = T / 2 for a decoder,
  T for an encoder, a window's band (`attended_keys`) in each local layer of a pattern."""
  from transformer.nn.counts import attended_keys

  base = dict(vocab_size=100, d_model=64, num_heads=4, d_ff=96, num_layers=3, max_len=64)
  qh, t = 64, 64
  for family, causal in (("decoder", True), ("encoder", False)):
    plain = ModelConfig(family=family, position="rope", **base)
    windowed = plain.replace(sliding_window=8)
    pattern = windowed.replace(local_global_pattern="LLG")
    per_layer = 4 * qh * (attended_keys(t, causal, 8) - attended_keys(t, causal, None))
    flops = lambda c: flops_per_token(c, t, training=False)  # noqa: E731
    assert flops(windowed) - flops(plain) == pytest.approx(3 * per_layer)
    assert flops(pattern) - flops(plain) == pytest.approx(2 * per_layer)  # two L, one G
    assert per_layer < 0
  assert attended_keys(t, True, None) == t / 2 and attended_keys(t, False, None) == t


def test_mlm_head_flops_count_the_predicted_positions_only():
  c = ModelConfig(family="encoder", vocab_size=100, d_model=64, num_heads=4, d_ff=96)
  head = 2 * (64 * 64 + 64 * 100)  # transform + tied logits, per predicted position
  full = flops_per_token(c, 50, training=False)
  assert flops_per_token(c, 50, False, mlm_predictions=50) == pytest.approx(full, rel=1e-12)
  some = flops_per_token(c, 50, False, mlm_predictions=8)
  assert full - some == pytest.approx(head * (1 - 8 / 50), rel=1e-12)


def test_flops_are_about_six_times_the_parameters_for_gpt2():
  """The 6N rule (Kaplan et al. 2020) holds for GPT-2 small at short context."""
  c = named("gpt2_small")
  non_embedding = param_count(c) - c.vocab_size * c.d_model - c.max_len * c.d_model
  ratio = flops_per_token(c, 128) / (6 * (non_embedding + c.vocab_size * c.d_model))
  assert 0.95 < ratio < 1.1, ratio

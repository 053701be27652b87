"""Whole models: float64 reference, properties, scan/remat, cached decoding, bfloat16.

Every model is built at a tiny size (D=32, 2 layers, T <= 16) with random parameters and
compiled once per case; options are spread over a few cases instead of a full product.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference_numpy as ref
from conftest import decode_in_pieces, init_cache, make_decode_step

from transformer.nn.models import (
  DecoderLM,
  EncoderDecoder,
  MaskedLM,
  SequenceClassifier,
  VisionTransformer,
  build_model,
)

TOL = dict(rtol=1e-5, atol=1e-5)


def _tokens(shape, seed=0, vocab=40):
  return np.random.default_rng(seed).integers(1, vocab, shape).astype(np.int32)


# ----------------------------------------------------------------------------------------
# Float64 reference.

DECODER_CASES = {
  # GPT-2 style; dropout configured but off at evaluation.
  "learned-pre-tied": dict(position="learned", dropout_rate=0.1, attention_dropout_rate=0.1),
  # LLaMA-ish, packed rows, local attention, chunked implementation.
  "rope-post-rms-swiglu-gqa-window-chunked": dict(
    position="rope",
    norm_position="post",
    norm="rmsnorm",
    activation="swiglu",
    num_kv_heads=2,
    tie_embeddings=False,
    sliding_window=3,
    attention_impl="chunked",
  ),
  "t5-jax-scaled-mqa": dict(
    position="relative_t5",
    attention_impl="jax",
    scale_embeddings=True,
    num_kv_heads=1,
  ),
  # Gemma: RMSNorm by (1 + scale), embeddings * sqrt(D), tanh GeGLU, H = 2 D / N, MQA;
  # with QK-norm (1 + scale) too, as Gemma 3 has.
  "gemma-plus-one-norms": dict(
    position="rope",
    norm="rmsnorm",
    norm_scale_plus_one=True,
    scale_embeddings=True,
    activation="geglu_tanh",
    attention_head_dim=32,
    num_kv_heads=1,
    qk_norm=True,
    use_bias=False,
  ),
  # Gemma 2: norms before and after each sublayer, soft-capped scores and logits, local and
  # global layers alternating, a score scale other than H**-0.5.
  "gemma2-sandwich-softcaps-lg": dict(
    position="rope",
    norm="rmsnorm",
    norm_scale_plus_one=True,
    norm_position="sandwich",
    attention_softcap=1.0,
    logits_softcap=2.0,
    sliding_window=3,
    local_global_pattern="LG",
    attention_scale=0.3,
    attention_impl="chunked",
  ),
  # Gemma 3: QK-norm, two local layers per global one, the local layers' own RoPE base.
  "gemma3-llg-local-rope": dict(
    position="rope",
    norm="rmsnorm",
    norm_position="sandwich",
    qk_norm=True,
    sliding_window=2,
    local_global_pattern="LLG",
    rope_local_theta=100.0,
    num_layers=3,
  ),
  # OLMo 2: a norm on each sublayer's output (none before), QK-norm over whole projections.
  "olmo2-sublayer-post-qk-projection": dict(
    position="rope",
    norm="rmsnorm",
    norm_position="sublayer_post",
    qk_norm=True,
    qk_norm_over="projection",
    num_kv_heads=2,
    activation="swiglu",
  ),
  # GPT-2's scale_attn_by_inverse_layer_idx: layer i's scores also / (i + 1), 3 layers.
  "gpt2-inverse-layer-scale": dict(attention_scale_by_layer=True, num_layers=3),
  # StableLM 2 12B / Cohere: one LayerNorm for the parallel sublayers; per-head QK LayerNorms.
  "stablelm-shared-norm-each-head-qk": dict(
    position="rope",
    parallel_residual=True,
    parallel_shared_norm=True,
    qk_norm=True,
    qk_norm_over="each_head",
    rope_fraction=0.25,
    attention_head_dim=16,
    num_kv_heads=2,
  ),
  # Granite's multipliers (embeddings, residual branches, logits) and SmolLM3's NoPE layers.
  "granite-multipliers-smollm3-nope": dict(
    position="rope",
    norm="rmsnorm",
    activation="swiglu",
    embedding_multiplier=3.0,
    residual_multiplier=0.5,
    logits_multiplier=0.4,
    attention_scale=0.3,
    rope_pattern="RN",
    num_layers=4,
  ),
  # GPT-NeoX / Pythia: parallel attention and feed-forward, RoPE on a quarter of each head.
  "neox-parallel-partial-rope": dict(
    position="rope", parallel_residual=True, rope_fraction=0.25, attention_head_dim=16
  ),
}


@pytest.mark.parametrize("name", list(DECODER_CASES))
def test_decoder_lm_matches_reference(tiny_config, random_params, jit_apply, name):
  c = tiny_config(**DECODER_CASES[name])
  model = DecoderLM(c)
  tokens = _tokens((2, 11))
  # Row 0 packs three sequences (positions restart), row 1 is one sequence.
  seg = np.array([[1] * 4 + [2] * 5 + [3] * 2, [1] * 11], np.int32)
  positions = np.array([[0, 1, 2, 3, 0, 1, 2, 3, 4, 0, 1], list(range(11))], np.int32)
  params = random_params(model, tokens, positions, seg)
  logits = jit_apply(model)(params, tokens, positions, seg)
  assert logits.shape == (2, 11, c.vocab_size) and logits.dtype == jnp.float32
  expected = ref.decoder_lm(ref.to_numpy(params), tokens, c, seg, positions)
  np.testing.assert_allclose(logits, expected, **TOL)


MODERNBERT = dict(
  position="rope",
  activation="geglu",
  use_bias=False,
  norm_bias=False,
  embed_norm=True,
  first_layer_attention_norm=False,
  sliding_window=3,
  local_global_pattern="GLL",
  rope_local_theta=100.0,
  num_layers=3,
)
ENCODER_CASES = {
  # BERT: post-LN with embedding LayerNorm, token types, untied output.
  "bert-post-types-untied": dict(norm_position="post", type_vocab_size=2, tie_embeddings=False),
  "pre-sinusoidal-rms-swiglu-window": dict(
    position="sinusoidal", norm="rmsnorm", activation="swiglu", sliding_window=4
  ),
  "cls-relative_t5-gqa": dict(num_classes=3, position="relative_t5", num_kv_heads=2),
  "mean-shaw-post-types": dict(
    num_classes=3, pooling="mean", position="relative_shaw", norm_position="post", type_vocab_size=3
  ),
  # ModernBERT: bias-free LayerNorms and heads, an embedding norm under pre-LN, layer 0's
  # attention un-normed, GeGLU, a global layer then two local ones with their own RoPE base.
  "modernbert-mlm": dict(**MODERNBERT, head_bias=False, mlm_output_bias=False),
  "modernbert-mean-gelu-norm-pooler": dict(
    **MODERNBERT, num_classes=3, pooling="mean", pooler_activation="gelu_norm"
  ),
}


@pytest.mark.parametrize("name", list(ENCODER_CASES))
def test_encoder_models_match_reference(tiny_config, random_params, jit_apply, name):
  c = tiny_config("encoder", **ENCODER_CASES[name])
  model = build_model(c)
  assert isinstance(model, SequenceClassifier if c.num_classes else MaskedLM)
  tokens = _tokens((2, 9), seed=1)
  tokens[1, 6:] = 0  # padding
  types = np.random.default_rng(2).integers(0, max(c.type_vocab_size, 1), tokens.shape)
  types = types.astype(np.int32) if c.type_vocab_size else None
  params = random_params(model, tokens, None, None, types)
  out = jit_apply(model)(params, tokens, None, None, types)
  fn = ref.sequence_classifier if c.num_classes else ref.masked_lm
  expected = fn(ref.to_numpy(params), tokens, c, token_type_ids=types)
  assert out.shape == ((2, c.num_classes) if c.num_classes else (2, 9, c.vocab_size))
  np.testing.assert_allclose(out, expected, **TOL)


SEQ2SEQ_CASES = {
  # Vaswani et al.: sinusoidal, post-LN, ReLU, sqrt(D)-scaled shared embeddings.
  "vaswani": dict(
    position="sinusoidal", norm_position="post", activation="relu", scale_embeddings=True
  ),
  "learned-pre-rms-gqa-untied-1dec": dict(
    position="learned",
    norm="rmsnorm",
    num_kv_heads=2,
    tie_embeddings=False,
    num_decoder_layers=1,
    attention_impl="chunked",
  ),
  # Granite's multipliers in an encoder-decoder: embeddings, residual branches, logits.
  "multipliers": dict(embedding_multiplier=2.0, residual_multiplier=0.5, logits_multiplier=0.4),
}


@pytest.mark.parametrize("name", list(SEQ2SEQ_CASES))
def test_encoder_decoder_matches_reference(tiny_config, random_params, jit_apply, name):
  c = tiny_config("seq2seq", **SEQ2SEQ_CASES[name])
  model = EncoderDecoder(c)
  inputs, targets = _tokens((2, 9), seed=3), _tokens((2, 7), seed=4)
  inputs[0, 5:] = 0
  targets[1, 4:] = 0
  params = random_params(model, inputs, targets)
  logits = jit_apply(model)(params, inputs, targets)
  expected = ref.encoder_decoder(ref.to_numpy(params), inputs, targets, c)
  assert logits.shape == (2, 7, c.vocab_size)
  np.testing.assert_allclose(logits, expected, **TOL)


@pytest.mark.parametrize(
  "overrides",
  [
    dict(position="learned"),
    dict(position="sinusoidal", pooling="mean", norm_position="post", norm="rmsnorm"),
    # DeiT: a distillation token and its head; CaiT-style layer scale, post-LN too.
    dict(vit_distillation_token=True, layer_scale_init=0.1, norm_position="post"),
    # DINOv2: [CLS] + mean of the patches, layer scale, SwiGLU; a sandwich to scale after.
    dict(pooling="cls_mean", layer_scale_init=1.0, activation="swiglu", norm_position="sandwich"),
    # Layer scale on both branches of a parallel block, and after a sublayer-post norm.
    dict(pooling="cls_mean", layer_scale_init=0.5, parallel_residual=True),
    dict(vit_distillation_token=True, layer_scale_init=0.5, norm_position="sublayer_post"),
  ],
  ids=[
    "cls-learned",
    "mean-sincos-post",
    "deit-distilled-scaled-post",
    "dinov2-cls-mean-swiglu-sandwich",
    "parallel-scaled",
    "distilled-sublayer-post",
  ],
)
def test_vision_transformer_matches_reference(tiny_config, random_params, jit_apply, overrides):
  c = tiny_config("vit", **overrides)
  model = VisionTransformer(c)
  images = np.random.default_rng(5).standard_normal((2, 8, 8, 3)).astype(np.float32)
  params = random_params(model, images)
  logits = jit_apply(model)(params, images)
  expected = ref.vision_transformer(ref.to_numpy(params), images.astype(np.float64), c)
  assert logits.shape == (2, c.num_classes)
  np.testing.assert_allclose(logits, expected, **TOL)
  with pytest.raises(ValueError, match="ViT expects images"):
    jax.eval_shape(lambda: model.apply({"params": params}, images[:, :4]))


# ----------------------------------------------------------------------------------------
# Properties.


def test_decoder_is_causal(tiny_config, random_params, jit_apply):
  c = tiny_config(position="rope", attention_impl="chunked")
  model = DecoderLM(c)
  tokens = _tokens((2, 12), seed=6)
  params = random_params(model, tokens)
  apply = jit_apply(model)
  changed = tokens.copy()
  changed[:, 7:] = _tokens((2, 5), seed=7)
  before, after = apply(params, tokens), apply(params, changed)
  np.testing.assert_allclose(before[:, :7], after[:, :7], rtol=1e-6, atol=1e-6)
  assert not np.allclose(before[:, 7:], after[:, 7:], atol=1e-3)


def test_padding_changes_nothing_and_equals_the_unpadded_sequence(
  tiny_config, random_params, jit_apply
):
  c = tiny_config("encoder", position="learned", norm_position="post", type_vocab_size=2)
  model = MaskedLM(c)
  tokens = _tokens((2, 10), seed=8)
  seg = np.ones_like(tokens)
  seg[:, 6:] = 0  # explicit segment ids: the padded slots may hold any token
  params = random_params(model, tokens, seg)
  apply = jit_apply(model)
  out = apply(params, tokens, seg)
  garbage = tokens.copy()
  garbage[:, 6:] = _tokens((2, 4), seed=9)
  np.testing.assert_allclose(apply(params, garbage, seg)[:, :6], out[:, :6], rtol=1e-6, atol=1e-6)
  short = apply(params, tokens[:, :6], seg[:, :6])
  np.testing.assert_allclose(short, out[:, :6], **TOL)


def test_attention_without_positions_is_permutation_equivariant(
  tiny_config, random_params, jit_apply
):
  c = tiny_config("encoder", position="none", num_kv_heads=2)
  model = MaskedLM(c)
  tokens = _tokens((2, 9), seed=10)
  perm = np.random.default_rng(11).permutation(9)
  params = random_params(model, tokens)
  apply = jit_apply(model)
  np.testing.assert_allclose(apply(params, tokens[:, perm]), apply(params, tokens)[:, perm], **TOL)


# ----------------------------------------------------------------------------------------
# Scan and remat.


def _restack(unrolled_stack, num_layers):
  """Unrolled {'layer_i': tree} -> scanned {'layers': {'block': tree stacked on axis 0}}."""
  rest = {k: v for k, v in unrolled_stack.items() if not k.startswith("layer_")}
  layers = [unrolled_stack[f"layer_{i}"] for i in range(num_layers)]
  return {**rest, "layers": {"block": jax.tree.map(lambda *x: np.stack(x), *layers)}}


VARIANTS = [(True, "none"), (False, "full"), (True, "dots"), (False, "dots_no_batch")]


def test_scan_and_remat_preserve_outputs_and_gradients(tiny_config, random_params):
  """scan_layers (params restacked) and every remat policy: same logits, same gradients."""
  base_config = tiny_config(position="relative_t5", num_kv_heads=2)
  base = DecoderLM(base_config)
  tokens = _tokens((2, 8), seed=12)
  params = random_params(base, tokens)
  models, model_params = [base], [params]
  for scan, remat in VARIANTS:
    variant = DecoderLM(base_config.replace(scan_layers=scan, remat_policy=remat))
    p = dict(params, decoder=_restack(params["decoder"], 2)) if scan else params
    shapes = jax.eval_shape(lambda v=variant: v.init(jax.random.key(0), tokens))["params"]
    assert jax.tree.structure(shapes) == jax.tree.structure(p), (scan, remat)
    models.append(variant)
    model_params.append(p)

  def loss(model, p):
    logits = model.apply({"params": p}, tokens)
    return jnp.mean(jax.nn.log_softmax(logits)[..., 0]), logits

  @jax.jit
  def all_grads(model_params):
    return [
      jax.value_and_grad(loss, argnums=1, has_aux=True)(m, p)
      for m, p in zip(models, model_params, strict=True)
    ]

  ((_, logits), grads), *variants = all_grads(model_params)
  for ((_, v_logits), v_grads), (scan, remat) in zip(variants, VARIANTS, strict=True):
    np.testing.assert_allclose(v_logits, logits, rtol=1e-5, atol=1e-5, err_msg=f"{scan} {remat}")
    expected = dict(grads, decoder=_restack(grads["decoder"], 2)) if scan else grads
    jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), v_grads, expected
    )


# ----------------------------------------------------------------------------------------
# Prefill + cached decoding equals the full forward pass.


DECODE_CASES = {
  "rope-gqa": dict(position="rope", num_kv_heads=2),
  "alibi-mqa-window-chunked": dict(
    position="alibi", num_kv_heads=1, sliding_window=4, attention_impl="chunked"
  ),
  "learned-scan": dict(position="learned", scan_layers=True),
  "t5-post-rms-jax": dict(
    position="relative_t5", norm_position="post", norm="rmsnorm", attention_impl="jax"
  ),
  "shaw": dict(position="relative_shaw"),
}


@pytest.mark.parametrize("name", list(DECODE_CASES))
def test_decoder_prefill_then_cached_steps_equal_full_forward(tiny_config, random_params, name):
  c = tiny_config(**DECODE_CASES[name])
  model = DecoderLM(c)
  b, total, prefill = 2, 11, 4
  tokens = _tokens((b, total), seed=13)
  positions = np.broadcast_to(np.arange(total, dtype=np.int32), (b, total))
  params = random_params(model, tokens)
  cache = init_cache(model, np.zeros((b, c.max_len), np.int32))
  step = make_decode_step(model)

  @jax.jit
  def full(params):
    return model.apply({"params": params}, tokens)

  call = lambda cache, i, j: step(params, cache, tokens[:, i:j], positions[:, i:j])
  pieces, state = decode_in_pieces(call, cache, total, prefill)
  np.testing.assert_allclose(np.concatenate(pieces, axis=1), full(params), **TOL)
  flat = jax.tree_util.tree_flatten_with_path(state["cache"])[0]
  indices = [leaf for path, leaf in flat if "cache_index" in jax.tree_util.keystr(path)]
  assert indices and all(np.all(np.asarray(i) == total) for i in indices)


@pytest.mark.parametrize(
  "overrides",
  [
    dict(position="sinusoidal", norm_position="post", activation="relu", scale_embeddings=True),
    dict(position="relative_t5", num_kv_heads=2, norm="rmsnorm", activation="geglu"),
  ],
  ids=["vaswani", "t5-gqa"],
)
def test_encoder_decoder_cached_decoding_equals_full_forward(tiny_config, random_params, overrides):
  c = tiny_config("seq2seq", **overrides)
  model = EncoderDecoder(c)
  b, total, prefill = 2, 8, 3
  inputs, targets = _tokens((b, 9), seed=14), _tokens((b, total), seed=15)
  inputs[1, 6:] = 0  # source padding
  src_seg = (inputs != 0).astype(np.int32)
  params = random_params(model, inputs, targets)
  decoder_inputs = np.concatenate([np.zeros((b, 1), np.int32), targets[:, :-1]], axis=1)
  positions = np.broadcast_to(np.arange(total, dtype=np.int32), (b, total))
  encoded_shape = np.zeros((b, 9, c.d_model), np.float32)
  cache = init_cache(
    model, encoded_shape, src_seg, np.zeros((b, c.max_len), np.int32), method=EncoderDecoder.decode
  )
  step = make_decode_step(model, EncoderDecoder.decode)

  @jax.jit
  def full_and_encode(params):
    return (
      model.apply({"params": params}, inputs, targets),
      model.apply({"params": params}, inputs, src_seg, method=EncoderDecoder.encode),
    )

  expected, encoded = full_and_encode(params)

  def call(cache, i, j):  # the encoder output at every call
    tokens, at = decoder_inputs[:, i:j], positions[:, i:j]
    return step(params, cache, encoded, src_seg, tokens, targets_positions=at)

  pieces, _ = decode_in_pieces(call, cache, total, prefill)
  np.testing.assert_allclose(np.concatenate(pieces, axis=1), expected, **TOL)


# ----------------------------------------------------------------------------------------
# Mixed precision.


@pytest.mark.parametrize("family", ["decoder", "vit"])
def test_bfloat16_forward_stays_close_to_float32(tiny_config, random_params, family):
  c = tiny_config(family, position="rope" if family == "decoder" else "learned")
  if family == "decoder":
    inputs = _tokens((2, 12), seed=16)
  else:
    inputs = np.random.default_rng(17).standard_normal((2, 8, 8, 3)).astype(np.float32)
  fp32, bf16 = build_model(c), build_model(c.replace(dtype="bfloat16"))
  params = random_params(fp32, inputs)

  @jax.jit
  def run(params):
    return fp32.apply({"params": params}, inputs), bf16.apply({"params": params}, inputs)

  out32, out16 = run(params)
  assert out16.dtype == jnp.float32  # logits are returned in float32
  bf16_params = jax.eval_shape(lambda: bf16.init(jax.random.key(0), inputs))["params"]
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(bf16_params))
  diff = np.linalg.norm(np.asarray(out16) - np.asarray(out32)) / np.linalg.norm(out32)
  assert 0.0 < diff < 1e-2, diff


def test_build_model_picks_the_family(tiny_config):
  assert isinstance(build_model(tiny_config("decoder")), DecoderLM)
  assert isinstance(build_model(tiny_config("encoder")), MaskedLM)
  assert isinstance(build_model(tiny_config("encoder", num_classes=2)), SequenceClassifier)
  assert isinstance(build_model(tiny_config("seq2seq")), EncoderDecoder)
  assert isinstance(build_model(tiny_config("vit")), VisionTransformer)

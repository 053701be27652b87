"""QK-norm (`ModelConfig.qk_norm`): float64 reference, cached decoding, counts, sharding.

Each query and key head is RMS-normalised over H with a learned scale [H] (one for the
queries, one for the keys, shared by the heads) after the projections and before RoPE.
The reference is tests/reference_numpy.py (`multi_head_attention` with `config.qk_norm`).
Random parameters give the norm scales values near 1, not 1, so a missing or misplaced
norm changes the logits.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference_numpy as ref
from conftest import (
  decode_in_pieces,
  init_cache,
  make_decode_step,
  make_tiny_config,
  tiny_model,
)

from transformer.nn import partitioning
from transformer.nn.config import ModelConfig
from transformer.nn.models import DecoderLM, EncoderDecoder, param_count
from transformer.nn.tree import path_str

TOL = dict(rtol=1e-5, atol=1e-5)
# RoPE after the norm, GQA (key norm on K heads), untied head: the LLaMA / Qwen3 layout.
LM = dict(position="rope", num_kv_heads=2, norm="rmsnorm", tie_embeddings=False, qk_norm=True)
S2S = dict(position="relative_t5", norm="rmsnorm", tie_embeddings=False, qk_norm=True)


def _tokens(shape, seed):
  return np.random.default_rng(seed).integers(1, 40, shape).astype(np.int32)


@functools.cache
def _lm():
  return tiny_model("decoder", seed=5, **LM)


@functools.cache
def _s2s():
  return tiny_model("seq2seq", seed=6, **S2S)


def _check_cached(pieces: list, full: jax.Array) -> None:
  """Cached logits equal the full pass's, and so does their argmax (greedy decoding)."""
  cached = np.concatenate([np.asarray(x) for x in pieces], axis=1)  # [B, T, V]
  np.testing.assert_allclose(cached, full, **TOL)
  np.testing.assert_array_equal(cached.argmax(-1), np.asarray(full).argmax(-1))


def test_decoder_matches_reference_and_cached_decoding_equals_the_full_pass():
  """The full pass equals the float64 reference (and not the reference without the norm);
  prefill + cached steps equal the full pass, logits and argmax."""
  model, params = _lm()
  c = model.config
  attention = params["decoder"]["layer_0"]["self_attention"]
  assert attention["query_norm"]["scale"].shape == (c.head_dim,)
  assert attention["key_norm"]["scale"].shape == (c.head_dim,)
  b, total, prefill = 2, 10, 4
  tokens = _tokens((b, total), seed=3)
  positions = np.broadcast_to(np.arange(total, dtype=np.int32), (b, total))
  full = jax.jit(lambda: model.apply({"params": params}, tokens))()
  expected = ref.decoder_lm(ref.to_numpy(params), tokens, c)
  np.testing.assert_allclose(full, expected, **TOL)
  plain = ref.decoder_lm(ref.to_numpy(params), tokens, c.replace(qk_norm=False))
  assert np.abs(plain - expected).max() > 1e-2  # the norm is what makes the difference
  cache = init_cache(model, np.zeros((b, model.config.max_len), np.int32))
  step = make_decode_step(model)
  call = lambda cache, i, j: step(params, cache, tokens[:, i:j], positions[:, i:j])
  pieces, _ = decode_in_pieces(call, cache, total, prefill)
  _check_cached(pieces, full)


def test_encoder_decoder_matches_reference_and_its_cached_cross_keys_are_normed():
  """Teacher forcing equals the float64 reference (QK-norm in self- and cross-attention);
  decoding projects the encoder output (and norms its keys) once into the cache at the
  first call, later calls read the cache (encoded=None) and still equal teacher forcing."""
  model, params = _s2s()
  cross = params["decoder"]["layer_0"]["cross_attention"]
  assert set(cross) >= {"query_norm", "key_norm"}
  b, total, prefill = 2, 7, 3
  inputs, targets = _tokens((b, 9), seed=4), _tokens((b, total), seed=5)
  inputs[1, 6:] = 0  # source padding
  src_seg = (inputs != 0).astype(np.int32)
  shifted = np.concatenate([np.zeros((b, 1), np.int32), targets[:, :-1]], axis=1)
  positions = np.broadcast_to(np.arange(total, dtype=np.int32), (b, total))
  full, encoded = jax.jit(
    lambda: (
      model.apply({"params": params}, inputs, targets),
      model.apply({"params": params}, inputs, src_seg, method=EncoderDecoder.encode),
    )
  )()
  expected = ref.encoder_decoder(ref.to_numpy(params), inputs, targets, model.config)
  np.testing.assert_allclose(full, expected, **TOL)
  max_len = model.config.max_len
  cache = init_cache(
    model, encoded, src_seg, np.zeros((b, max_len), np.int32), method=EncoderDecoder.decode
  )
  step = make_decode_step(model, EncoderDecoder.decode)

  def call(cache, i, j):  # the encoder output at the first call only: later ones read the cache
    tokens, at = shifted[:, i:j], positions[:, i:j]
    return step(params, cache, encoded if i == 0 else None, src_seg, tokens, targets_positions=at)

  pieces, _ = decode_in_pieces(call, cache, total, prefill)
  _check_cached(pieces, full)


def _shapes(c: ModelConfig):
  model = DecoderLM(c) if c.family == "decoder" else EncoderDecoder(c)
  tokens = jax.ShapeDtypeStruct((1, 4), jnp.int32)
  args = (tokens, tokens) if c.family == "seq2seq" else (tokens,)
  return jax.eval_shape(lambda *a: model.init(jax.random.key(0), *a), *args)["params"]


@pytest.mark.parametrize("family, scan", [("decoder", True), ("seq2seq", False)])
def test_parameter_count_and_sharding_of_the_norm_scales(family, scan):
  c = make_tiny_config(family, **(LM if family == "decoder" else S2S), scan_layers=scan)
  layers = c.num_layers + (c.decoder_layers if family == "seq2seq" else 0)
  attentions = layers + (c.decoder_layers if family == "seq2seq" else 0)  # + cross-attention
  shapes = _shapes(c)
  real = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
  without = param_count(c.replace(qk_norm=False))
  assert param_count(c) == real == without + 2 * c.head_dim * attentions
  axes = {
    path_str(k): v
    for k, v in jax.tree_util.tree_leaves_with_path(
      partitioning.logical_axes(shapes), is_leaf=lambda x: isinstance(x, tuple)
    )
  }
  normed = {p: a for p, a in axes.items() if "query_norm" in p or "key_norm" in p}
  assert len(normed) == 2 * (1 if scan else attentions)
  assert set(normed.values()) == {("layers", "head_dim") if scan else ("head_dim",)}


@pytest.mark.parametrize("scan", [False, True])
def test_each_heads_own_scale_is_counted_and_sharded_over_heads(scan):
  """qk_norm_over='each_head' (StableLM 2): scales [N, H] and [K, H], split as the heads."""
  c = make_tiny_config("decoder", **LM, qk_norm_over="each_head", scan_layers=scan)
  shapes = _shapes(c)
  real = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
  head_scales = (c.num_heads + c.kv_heads) * c.head_dim * c.num_layers
  assert param_count(c) == real == param_count(c.replace(qk_norm=False)) + head_scales
  axes = {
    path_str(k): v
    for k, v in jax.tree_util.tree_leaves_with_path(
      partitioning.logical_axes(shapes), is_leaf=lambda x: isinstance(x, tuple)
    )
  }
  layers = ("layers",) if scan else ()
  normed = {p.split("/")[-2]: a for p, a in axes.items() if "_head_norm" in p}
  assert normed == {
    "query_head_norm": (*layers, "heads", "head_dim"),
    "key_head_norm": (*layers, "kv_heads", "head_dim"),
  }


def test_qk_norm_must_be_a_bool():
  with pytest.raises(ValueError, match=r"^ModelConfig.qk_norm='yes': must be True or False$"):
    ModelConfig(qk_norm="yes")

"""The encoder-decoder options of BART and Marian against the float64 reference.

`embed_norm` (a norm after each stack's embeddings), `final_logits_bias`, `decoder_start_id`,
`sinusoidal_layout='split'` and the ungated `silu` activation: the full forward pass equals
`reference_numpy.encoder_decoder`, cached decoding equals the full pass, greedy decoding
starts from `decoder_start_id`, and the analytic parameter count is the real one.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference_numpy as ref
from conftest import decode_in_pieces, init_cache, make_decode_step

from transformer.decode import translate
from transformer.nn.models import EncoderDecoder, param_count
from transformer.nn.positions.sinusoidal import sinusoidal_table

TOL = dict(rtol=1e-5, atol=1e-5)
CASES = {
  # BART: post-LN, learned positions, embedding norms, the logits bias, starts from EOS.
  "bart": dict(norm_position="post", embed_norm=True, final_logits_bias=True, decoder_start_id=2),
  # Marian: post-LN, split sinusoids, scaled embeddings, SiLU, untied here, start 0.
  "marian": dict(
    norm_position="post",
    position="sinusoidal",
    sinusoidal_layout="split",
    scale_embeddings=True,
    activation="silu",
    final_logits_bias=True,
    tie_embeddings=False,
  ),
  # Every option at once on a pre-LN model, and a start id that is no special id.
  "pre-all": dict(embed_norm=True, final_logits_bias=True, decoder_start_id=7, activation="silu"),
}


def _tokens(shape, seed):
  return np.random.default_rng(seed).integers(1, 40, shape).astype(np.int32)


def _model_and_params(tiny_config, random_params, name):
  c = tiny_config("seq2seq", **CASES[name])
  model = EncoderDecoder(c)
  inputs, targets = _tokens((2, 9), 3), _tokens((2, 7), 4)
  return c, model, random_params(model, inputs, targets)


@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference_and_counts_parameters(tiny_config, random_params, jit_apply, name):
  c, model, params = _model_and_params(tiny_config, random_params, name)
  inputs, targets = _tokens((2, 9), 5), _tokens((2, 7), 6)
  inputs[0, 5:] = 0
  targets[1, 4:] = 0
  logits = jit_apply(model)(params, inputs, targets)
  expected = ref.encoder_decoder(ref.to_numpy(params), inputs, targets, c)
  np.testing.assert_allclose(logits, expected, **TOL)
  assert param_count(c) == sum(x.size for x in jax.tree.leaves(params))
  # The new parameters exist and are random (non-zero), so one the model skipped would show.
  assert np.abs(params["final_logits_bias"]).min() > 0
  if c.embed_norm:
    assert "embed_norm" in params["encoder_embedder"] and "embed_norm" in params["decoder_embedder"]


@pytest.mark.parametrize("name", list(CASES))
def test_cached_decoding_equals_full_forward(tiny_config, random_params, name):
  c, model, params = _model_and_params(tiny_config, random_params, name)
  b, total, prefill = 2, 8, 3
  inputs, targets = _tokens((b, 9), 14), _tokens((b, total), 15)
  inputs[1, 6:] = 0
  src_seg = (inputs != 0).astype(np.int32)
  start = np.full((b, 1), c.decoder_start_id, np.int32)
  decoder_inputs = np.concatenate([start, targets[:, :-1]], axis=1)
  positions = np.broadcast_to(np.arange(total, dtype=np.int32), (b, total))
  encoded_shape = np.zeros((b, 9, c.d_model), np.float32)
  cache = init_cache(
    model, encoded_shape, src_seg, np.zeros((b, c.max_len), np.int32), method=EncoderDecoder.decode
  )
  step = make_decode_step(model, EncoderDecoder.decode)
  expected = model.apply({"params": params}, inputs, targets)
  encoded = model.apply({"params": params}, inputs, src_seg, method=EncoderDecoder.encode)

  def call(cache, i, j):
    tokens, at = decoder_inputs[:, i:j], positions[:, i:j]
    return step(params, cache, encoded, src_seg, tokens, targets_positions=at)

  pieces, _ = decode_in_pieces(call, cache, total, prefill)
  np.testing.assert_allclose(np.concatenate(pieces, axis=1), expected, **TOL)


def test_greedy_decoding_starts_from_decoder_start_id(tiny_config, random_params):
  """Greedy tokens fed back through the full pass reproduce themselves: the decoding
  loop started from `decoder_start_id` as `shift_right` does."""
  c, model, params = _model_and_params(tiny_config, random_params, "pre-all")
  inputs = _tokens((2, 9), 21)
  inputs[0, 6:] = 0
  out = np.asarray(translate(model, params, inputs, max_len=6, eos_id=None).tokens)  # [B, 6]
  logits = model.apply({"params": params}, jnp.asarray(inputs), jnp.asarray(out))
  np.testing.assert_array_equal(np.argmax(logits, -1), out)
  other = c.replace(decoder_start_id=0)
  logits0 = EncoderDecoder(other).apply({"params": params}, jnp.asarray(inputs), jnp.asarray(out))
  assert not np.allclose(logits0[:, 0], logits[:, 0])  # the start token matters


def test_split_sinusoids_are_the_interleaved_ones_regrouped():
  d = 16
  interleaved = sinusoidal_table(10, d)
  split = sinusoidal_table(10, d, split=True)
  np.testing.assert_array_equal(split[:, : d // 2], interleaved[:, 0::2])
  np.testing.assert_array_equal(split[:, d // 2 :], interleaved[:, 1::2])
  np.testing.assert_allclose(split, ref.sinusoidal(np.arange(10), d, split=True), atol=1e-6)

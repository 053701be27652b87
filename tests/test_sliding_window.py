"""`sliding_window` in every self-attention stack: the seq2seq encoder, BERT and ViT.

Bidirectional stacks see |t - s| < W (key indices); each model equals the float64 NumPy
reference with that banded mask and differs from the same model without the window. The
parameter count ignores the window; the FLOP count takes the window's band of keys in its
self-attention (`nn.counts.attended_keys`), cross-attention the whole source.
"""

import jax
import numpy as np
import pytest
import reference_numpy as ref

from transformer.nn import counts, models
from transformer.nn.models import EncoderDecoder, MaskedLM, VisionTransformer

TOL = dict(rtol=1e-5, atol=1e-5)
WINDOW = 3


def _tokens(shape, seed):
  return np.random.default_rng(seed).integers(1, 40, shape).astype(np.int32)


def _assert_counts_take_the_band(c):
  """Same parameters; per token, 3 (forward + backward) x 4 H N per self-attention layer
  times the keys the window removes from a bidirectional stack of length 64."""
  plain = c.replace(sliding_window=None)
  assert models.param_count(c) == models.param_count(plain)

  def removed(causal):
    full, band = (counts.attended_keys(64, causal, w) for w in (None, c.sliding_window))
    return full - band

  keys = c.num_layers * removed(False)  # the (encoder) stack, bidirectional
  if c.family == "seq2seq":  # the decoder's self-attention is causal; cross is unwindowed
    keys += c.decoder_layers * removed(True)
  want = 3 * 4 * c.num_heads * c.head_dim * keys
  assert models.flops_per_token(plain, 64) - models.flops_per_token(c, 64) == pytest.approx(want)


def _assert_window_changes(windowed, plain):
  windowed, plain = np.asarray(windowed), np.asarray(plain)
  assert not np.allclose(windowed, plain, atol=1e-3), np.abs(windowed - plain).max()


def test_seq2seq_encoder_honours_the_window_and_cross_attention_does_not(
  tiny_config, random_params
):
  """Source 9 and target 7 tokens, window 3: the encoder is banded, the decoder causal and
  banded, cross-attention sees every source token (the reference's unbanded cross mask)."""
  c = tiny_config("seq2seq", position="learned", sliding_window=WINDOW)
  model, plain = EncoderDecoder(c), EncoderDecoder(c.replace(sliding_window=None))
  inputs, targets = _tokens((2, 9), seed=0), _tokens((2, 7), seed=1)
  inputs[0, 7:] = 0  # source padding
  params = random_params(model, inputs, targets)

  @jax.jit
  def run(params):
    variables = {"params": params}
    return (
      model.apply(variables, inputs, targets),
      model.apply(variables, inputs, method=EncoderDecoder.encode),
      plain.apply(variables, inputs, method=EncoderDecoder.encode),
    )

  logits, encoded, encoded_plain = run(params)
  expected = ref.encoder_decoder(ref.to_numpy(params), inputs, targets, c)
  np.testing.assert_allclose(logits, expected, **TOL)
  _assert_window_changes(encoded, encoded_plain)
  _assert_counts_take_the_band(c)


def test_bert_encoder_honours_the_window_with_chunked_t5_bias(tiny_config, random_params):
  """Chunked attention (chunk 4) with a bidirectional T5 bias, window 3, padded rows."""
  c = tiny_config(
    "encoder",
    position="relative_t5",
    sliding_window=WINDOW,
    attention_impl="chunked",
    attention_chunk_size=4,
  )
  model, plain = MaskedLM(c), MaskedLM(c.replace(sliding_window=None))
  tokens = _tokens((2, 10), seed=2)
  tokens[1, 7:] = 0  # padding
  params = random_params(model, tokens)

  @jax.jit
  def run(params):
    return model.apply({"params": params}, tokens), plain.apply({"params": params}, tokens)

  logits, logits_plain = run(params)
  expected = ref.masked_lm(ref.to_numpy(params), tokens, c)
  real = tokens > 0
  np.testing.assert_allclose(np.asarray(logits)[real], expected[real], **TOL)
  _assert_window_changes(logits, logits_plain)
  _assert_counts_take_the_band(c)


def test_vision_transformer_honours_the_window(tiny_config, random_params):
  """[CLS] + 4 patches, window 2: a band over the token order."""
  c = tiny_config("vit", position="learned", sliding_window=2)
  model, plain = VisionTransformer(c), VisionTransformer(c.replace(sliding_window=None))
  images = np.random.default_rng(3).standard_normal((2, 8, 8, 3)).astype(np.float32)
  params = random_params(model, images)

  @jax.jit
  def run(params):
    return model.apply({"params": params}, images), plain.apply({"params": params}, images)

  logits, logits_plain = run(params)
  expected = ref.vision_transformer(ref.to_numpy(params), images.astype(np.float64), c)
  np.testing.assert_allclose(logits, expected, **TOL)
  _assert_window_changes(logits, logits_plain)
  _assert_counts_take_the_band(c)

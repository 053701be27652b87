"""Prefix-LM attention: bidirectional inside the prefix, causal after it, per packed segment.

Every implementation (xla, jax, chunked) is compared with a dense float64 mask built
element by element (`reference_numpy.prefix_lm_mask`); the decoder LM with it is checked
against the float64 reference model, by perturbation, and through the KV cache.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference_numpy as ref

from transformer.nn.kernel_rules import AttentionOptions
from transformer.nn.kernels import dot_product_attention
from transformer.nn.masks import MaskInfo, prefix_lm_mask
from transformer.nn.models import DecoderLM
from transformer.ops import causal_blocks

IMPLS = ("xla", "jax", "chunked")
TOL = dict(rtol=1e-5, atol=1e-5)

# Row 0 packs two examples (prefixes of 3 and 2 tokens) and a padding slot; row 1 is one
# example with a 4-token prefix.
SEGMENTS = np.array([[1, 1, 1, 1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 1, 1, 1, 1, 1]], np.int32)
PREFIX = np.array([[1, 1, 1, 0, 0, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0, 0, 0, 0]], np.int32)


def _qkv(b, t, n, k, h, seed=0):
  rng = np.random.default_rng(seed)
  shapes = ((b, t, n, h), (b, t, k, h), (b, t, k, h))
  return tuple(rng.standard_normal(s).astype(np.float32) for s in shapes)


def test_mask_info_prefix_equals_the_elementwise_reference():
  info = MaskInfo.create(jnp.asarray(SEGMENTS), causal=True, prefix=jnp.asarray(PREFIX))
  want = ref.prefix_lm_mask(PREFIX, SEGMENTS)
  np.testing.assert_array_equal(info.block_mask(), want)
  np.testing.assert_array_equal(
    prefix_lm_mask(jnp.asarray(PREFIX)), ref.prefix_lm_mask(PREFIX, np.ones_like(SEGMENTS))
  )
  for q_start, kv_start in ((0, 3), (3, 0), (6, 4)):  # blocks as the chunked path cuts them
    block = info.block_mask(q_start, 3, kv_start, 5)
    np.testing.assert_array_equal(block, want[:, :, q_start : q_start + 3, kv_start : kv_start + 5])
  with pytest.raises(ValueError, match="causal self-attention"):
    MaskInfo.create(jnp.asarray(SEGMENTS), prefix=jnp.asarray(PREFIX))


def test_every_impl_matches_the_float64_reference_with_a_prefix():
  """Packed rows, GQA, chunk 4 not dividing T = 9."""
  q, k, v = _qkv(2, 9, 4, 2, 8)
  info = MaskInfo.create(jnp.asarray(SEGMENTS), causal=True, prefix=jnp.asarray(PREFIX))

  @jax.jit
  def run(q, k, v):
    return {i: dot_product_attention(q, k, v, info, AttentionOptions(i, 4)) for i in IMPLS}

  outs = run(q, k, v)
  mask = ref.prefix_lm_mask(PREFIX, SEGMENTS)
  expected = ref.attention(*(x.astype(np.float64) for x in (q, k, v)), mask)
  valid = SEGMENTS > 0
  for impl in IMPLS:
    np.testing.assert_allclose(np.asarray(outs[impl])[valid], expected[valid], **TOL, err_msg=impl)


def test_long_prefix_rows_skip_the_causal_query_blocks_and_stay_exact():
  """T = 256 would use 2 causal query blocks; a prefix reaches past them, so none are used."""
  t = 256
  prefix = (np.arange(t) < 150)[None].astype(np.int32)  # prefix ends inside block 1
  info = MaskInfo.create(jnp.ones((1, t), jnp.int32), causal=True, prefix=jnp.asarray(prefix))
  assert causal_blocks.causal_query_blocks(t, t, info.replace(q_prefix=None, kv_prefix=None)) == 2
  assert causal_blocks.causal_query_blocks(t, t, info) == 1
  q, k, v = _qkv(1, t, 2, 2, 4, seed=1)
  out = jax.jit(lambda q, k, v: dot_product_attention(q, k, v, mask_info=info))(q, k, v)
  mask = ref.prefix_lm_mask(prefix, np.ones((1, t), np.int32))
  expected = ref.attention(*(x.astype(np.float64) for x in (q, k, v)), mask)
  np.testing.assert_allclose(out, expected, **TOL)


def test_an_all_false_prefix_is_plain_causal_attention_bit_for_bit():
  q, k, v = _qkv(2, 9, 4, 2, 8, seed=2)
  plain = MaskInfo.create(jnp.asarray(SEGMENTS), causal=True)
  empty = MaskInfo.create(jnp.asarray(SEGMENTS), causal=True, prefix=jnp.zeros((2, 9), bool))
  for impl in IMPLS:
    a = dot_product_attention(q, k, v, plain, AttentionOptions(impl, chunk_size=4))
    b = dot_product_attention(q, k, v, empty, AttentionOptions(impl, chunk_size=4))
    np.testing.assert_array_equal(a, b, err_msg=impl)


CASES = {
  "learned-xla": dict(),
  "rope-gqa-chunked": dict(position="rope", num_kv_heads=2, attention_impl="chunked"),
  "alibi-jax": dict(position="alibi", attention_impl="jax"),
  "t5-rms": dict(position="relative_t5", norm="rmsnorm"),
}


def _tokens(seed=0):
  return np.random.default_rng(seed).integers(1, 40, SEGMENTS.shape).astype(np.int32)


def _positions():
  starts = np.concatenate([[0], np.flatnonzero(np.diff(SEGMENTS[0])) + 1])
  row0 = np.concatenate([np.arange(e - s) for s, e in zip(starts, [*starts[1:], 9], strict=True)])
  return np.stack([row0, np.arange(9)]).astype(np.int32)


@pytest.mark.parametrize("name", list(CASES))
def test_prefix_lm_decoder_matches_reference(tiny_config, random_params, name):
  c = tiny_config(**CASES[name])
  model = DecoderLM(c)
  tokens, positions = _tokens(), _positions()
  params = random_params(model, tokens, positions, SEGMENTS)
  apply = jax.jit(
    lambda p, x, prefix: model.apply({"params": p}, x, positions, SEGMENTS, prefix_mask=prefix)
  )
  logits = apply(params, tokens, PREFIX)
  expected = ref.decoder_lm(ref.to_numpy(params), tokens, c, SEGMENTS, positions, PREFIX)
  valid = SEGMENTS > 0
  np.testing.assert_allclose(np.asarray(logits)[valid], expected[valid], **TOL)


def test_perturbing_prefix_and_suffix_tokens(tiny_config, random_params):
  """A prefix token reaches earlier prefix positions (and nothing in another segment); a
  suffix token reaches nothing before it."""
  c = tiny_config()
  model = DecoderLM(c)
  tokens, positions = _tokens(seed=3), _positions()
  params = random_params(model, tokens, positions, SEGMENTS)
  apply = jax.jit(
    lambda x: model.apply({"params": params}, x, positions, SEGMENTS, prefix_mask=PREFIX)
  )
  base = np.asarray(apply(tokens))

  def changed(row, index):
    other = tokens.copy()
    other[row, index] = other[row, index] % 39 + 1
    return np.abs(np.asarray(apply(other)) - base).max(axis=-1)[row]  # [T]

  delta = changed(0, 2)  # last prefix token of row 0's first example
  assert np.all(delta[:2] > 1e-6)  # earlier prefix positions see it
  np.testing.assert_array_equal(delta[5:], 0.0)  # the next example does not
  delta = changed(1, 3)  # last prefix token of row 1
  assert np.all(delta[:3] > 1e-6)
  delta = changed(1, 6)  # a suffix token: nothing before it changes
  np.testing.assert_array_equal(delta[:6], 0.0)
  assert np.all(delta[6:] > 1e-6)
  delta = changed(0, 3)  # first suffix token of row 0
  np.testing.assert_array_equal(delta[:3], 0.0)
  np.testing.assert_array_equal(delta[5:], 0.0)


def test_prefill_of_the_prefix_then_cached_steps_equal_the_full_forward(tiny_config, random_params):
  c = tiny_config(position="rope", num_kv_heads=2)
  model = DecoderLM(c)
  b, total, prompt = 2, 10, 4
  tokens = np.random.default_rng(4).integers(1, 40, (b, total)).astype(np.int32)
  positions = np.broadcast_to(np.arange(total, dtype=np.int32), (b, total))
  prefix = np.zeros((b, total), np.int32)
  prefix[0, :4], prefix[1, :2] = 1, 1  # row 1's prompt: 2 prefix tokens, then 2 causal ones
  params = random_params(model, tokens)
  cache = jax.jit(
    lambda: model.init(jax.random.key(0), np.zeros((b, c.max_len), np.int32), decode=True)["cache"]
  )()
  full = jax.jit(lambda p: model.apply({"params": p}, tokens, prefix_mask=prefix))(params)

  @jax.jit
  def step(cache, x, pos, prefix):
    variables = {"params": params, "cache": cache}
    return model.apply(variables, x, pos, decode=True, prefix_mask=prefix, mutable=["cache"])

  logits, state = step(cache, tokens[:, :prompt], positions[:, :prompt], prefix[:, :prompt])
  pieces = [logits]
  for i in range(prompt, total):
    logits, state = step(state["cache"], tokens[:, i : i + 1], positions[:, i : i + 1], None)
    pieces.append(logits)
  np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, **TOL)

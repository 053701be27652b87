"""The decoding cache: cross-attention keys and values once per source, a cache that grows
with what is filled, and decoding on it equal to full forward passes.

Tiny random float32 models. The references never use the cache: a DecoderLM token is
checked against a forward pass over exactly its prefix.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from conftest import tiny_model

from transformer import decode
from transformer.decode.cache import cache_lengths
from transformer.nn.attention import MultiHeadAttention

SOURCES = np.array([[5, 6, 7, 8, 9, 10], [10, 11, 12, 0, 0, 0]], np.int32)  # row 1 padded


@functools.cache
def _s2s():
  return tiny_model("seq2seq", seed=2, position="relative_t5", num_kv_heads=2, tie_embeddings=False)


@functools.cache
def _long_lm():
  return tiny_model(
    "decoder", seed=1, max_len=64, position="learned", num_kv_heads=2, tie_embeddings=False
  )


class _Calls:
  """Counts, while tracing, the key / value projections of self- and cross-attention
  (in `apply`; `init` runs only to find the cache's shapes)."""

  def __init__(self):
    self.counts = {"self": 0, "cross": 0}

  def __call__(self, next_fun, args, kwargs, context):
    module = context.module
    projection = module.name in ("key", "value") and context.method_name == "__call__"
    if projection and not module.is_initializing():
      parent = module.parent
      if isinstance(parent, MultiHeadAttention):
        self.counts["cross" if parent.is_cross else "self"] += 1
    return next_fun(*args, **kwargs)


def test_cross_attention_keys_and_values_are_projected_once_per_source():
  model, params = _s2s()
  layers = model.config.decoder_layers
  search = functools.partial(decode.seq2seq_beam_search, length=6, beam_size=3)
  calls = _Calls()
  with nn.intercept_methods(calls):
    jax.make_jaxpr(lambda p, x: search(model, p, x).tokens)(params, SOURCES)
  # The prefill projects key and value of every layer, once; the traced steps only
  # self-attention's.
  assert calls.counts["cross"] == 2 * layers, calls.counts
  assert calls.counts["self"] > 2 * layers, calls.counts

  # The step alone (what the loop runs per token) has no cross-attention projection,
  # and its cross-attention keys are one row per source while its queries are per beam.
  b, s = SOURCES.shape
  start = decode.cache.seq2seq_start(model, params, jnp.asarray(SOURCES), 8)
  axes = jax.tree_util.tree_flatten_with_path(start.axes, is_leaf=lambda x: x is None)[0]
  shared = [jax.tree_util.keystr(p) for p, ax in axes if ax is None and "cross" in str(p)]
  assert len(shared) == 2 * layers, shared  # cross_key, cross_value of every layer
  beams = 3
  cache = jax.tree.map(
    lambda ax, x: decode.beam.repeat_beams(x, ax, beams, b),
    start.axes,
    start.cache,
    is_leaf=lambda x: x is None,
  )
  tokens = jnp.ones((b * beams,), jnp.int32)
  calls = _Calls()
  with nn.intercept_methods(calls):
    logits, new_cache = jax.eval_shape(start.step, cache, tokens, tokens)
  assert calls.counts == {"self": 2 * layers, "cross": 0}
  assert logits.shape == (b * beams, model.config.vocab_size)
  cross_key = new_cache["decoder"]["layer_0"]["cross_attention"]["cross_key"]
  self_key = new_cache["decoder"]["layer_0"]["self_attention"]["cached_key"]
  kv = model.config.kv_heads  # cached keys: [rows * K, S, H]
  assert cross_key.shape[0] == b * kv and self_key.shape[0] == b * beams * kv


def test_beam_search_on_a_growing_cache_equals_one_cache():
  """The cache doubled 2 -> 4 -> 8 (the beams gathered across the growth) gives what one
  cache of 8 slots gives; the exhaustive tests of test_decoding.py run on one cache."""
  model, params = _s2s()
  assert cache_lengths(1, 8, 2) == [2, 4, 8] and cache_lengths(1, 8) == [8]
  search = functools.partial(decode.seq2seq_beam_search, model, params, SOURCES, beam_size=3)
  one, grown = search(length=8), search(length=8, initial_cache_len=2)
  np.testing.assert_array_equal(grown.beams, one.beams)
  np.testing.assert_allclose(grown.beam_scores, one.beam_scores, rtol=1e-6)
  assert len(set(np.asarray(one.beams).ravel().tolist())) > 3  # a non-degenerate search


@functools.partial(jax.jit, static_argnums=0)
def _lm_logprobs(model, params, tokens, segments):
  return jax.nn.log_softmax(model.apply({"params": params}, tokens, None, segments))


def _while_loops(jaxpr) -> list:
  """The while loops of a jaxpr, in order, looking inside calls (not inside the loops)."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "while":
      found.append(eqn)
      continue
    for value in eqn.params.values():
      inner = getattr(value, "jaxpr", value)
      if isinstance(inner, jax.extend.core.Jaxpr):
        found += _while_loops(inner)
  return found


def test_long_prompt_on_a_growing_cache_equals_full_forward_at_every_step():
  """Ragged prompts of 27 and 9 tokens, 30 new tokens: the cache holds 32 then 56 slots,
  never max_len = 64, and every token is the argmax of a forward pass over its prefix."""
  model, params = _long_lm()
  rng = np.random.default_rng(7)
  prompts = [rng.integers(4, 40, 27).tolist(), rng.integers(4, 40, 9).tolist()]
  new = 30
  tokens, lengths = decode.left_pad(prompts)
  sizes = cache_lengths(tokens.shape[1], new, 16)
  assert sizes == [32, 56]
  # Doubled while small, then a quarter more (at least GROWTH_STEP = 64 slots).
  assert cache_lengths(16, 256) == [128, 192, 256, 271]
  assert cache_lengths(16, 2032) == [128, 192, 256, 320, 448, 576, 768, 960, 1216, 1536, 1920, 2047]

  run = functools.partial(decode.lm_decode, model, length=new, initial_cache_len=16)
  jaxpr = jax.make_jaxpr(lambda p, t, n: run(p, t, n).tokens)(params, tokens, lengths)
  loops = _while_loops(jaxpr.jaxpr)
  rows, h = len(prompts) * model.config.kv_heads, model.config.head_dim
  cached = [
    {v.aval.shape[1] for v in e.invars if v.aval.ndim == 3 and v.aval.shape[::2] == (rows, h)}
    for e in loops
  ]  # the slots S of every [B * K, S, H] cache a loop carries
  assert cached == [{32}, {56}], cached

  out = run(params, tokens, lengths)
  generated = np.asarray(out.tokens)
  pairs = zip(prompts, generated, strict=True)
  prefixes = [p + g[:j].tolist() for p, g in pairs for j in range(new)]
  width = max(map(len, prefixes))
  full = np.zeros((len(prefixes), width), np.int32)
  segments = np.zeros_like(full)
  for i, row in enumerate(prefixes):
    full[i, : len(row)], segments[i, : len(row)] = row, 1
  logprobs = np.asarray(_lm_logprobs(model, params, full, segments))  # [2 * new, T, V]
  last = logprobs[np.arange(len(prefixes)), [len(row) - 1 for row in prefixes]]
  last = last.reshape(len(prompts), new, -1)  # [B, L, V]
  np.testing.assert_array_equal(generated, last.argmax(-1))
  chosen = np.take_along_axis(last, generated[..., None], -1)[..., 0]
  np.testing.assert_allclose(out.scores, chosen.sum(-1), rtol=1e-5, atol=1e-5)
  assert len(set(generated.ravel().tolist())) > 5


def test_argmax_matches_jnp_argmax_on_ties_and_nan():
  rng = np.random.default_rng(0)
  logits = rng.integers(0, 3, (64, 17)).astype(np.float32)  # many ties
  logits[3, [4, 9]] = np.nan
  logits[5, :] = -np.inf
  got = jax.jit(decode.sampling.argmax)(logits)
  np.testing.assert_array_equal(got, jnp.argmax(logits, -1))
  assert got[3] == 4 and got[5] == 0

"""The KV cache: its set-up, its growth, and how each model family prefills and steps.

Letters: B batch, P prompt length, S source length, D model dim, V vocabulary.

A DecoderLM batch is left-padded to a common length P. Pads get segment id 0 and real
tokens segment id 1, so the causal + segment mask (with the segment ids kept in the
cache) never lets a real token attend to a pad; positions restart at 0 at each row's
first real token. `lm_start` prefills the whole prompt in one batched call and keeps the
logits of its last column; the loop then feeds each new token at the row's explicit
position. Every row's last prompt token sits in column P - 1, so all rows share the cache
index, and the longest prompt bounds the batch: P + new tokens <= config.max_len.

`seq2seq_start` encodes the sources once and prefills the decoder with the start token
`config.decoder_start_id` at position 0 (PAD 0 by default, as `shift_right` does in
training; BART's EOS) together with the encoder output:
each layer projects its cross-attention keys and values once into the cache; the steps
pass no encoder output and read them there. They are [B * K, S, H] per layer, one per
source: beam search shares them between a source's beams instead of repeating them.

The cache grows: attention runs over every slot of the cache, so a step costs O(cache
length). The loops start with the first length of `cache_lengths` and grow it (with
`cache_attention.resize`) whenever it is full, up to what the decoding writes: doubled
while small, then by a quarter (at least `GROWTH_STEP` slots), since at a large batch the
step streams the whole cache from memory and every empty slot costs. Each length is one
compiled copy of the step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.data.tokenizers import PAD_ID
from transformer.nn import cache_attention
from transformer.nn.models import DecoderLM, EncoderDecoder

__all__ = ["INITIAL_CACHE_LEN", "Start", "Step", "cache_lengths", "init_cache", "lm_start"]
__all__ += ["seq2seq_start", "seq2seq_step"]

# The first cache length of the decoding loops (slots; grown as the cache fills).
INITIAL_CACHE_LEN = 128
# The cache grows by a quarter of its length, rounded up to a multiple of this, and at
# most doubles: 32 -> 64 -> 128 -> 192 -> 256 -> 320 -> 448 -> 576 -> 768 -> 960 ...
GROWTH_STEP = 64

# (cache, tokens [B], positions [B]) -> (logits [B, V], new cache)
Step = Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, Any]]


class Start(NamedTuple):
  """Where a decoding loop begins, after the prefill.

  step: feeds one token per row to the cached model. cache: the prefilled 'cache'
  collection. axes: per cache leaf, the batch axis along which beam search repeats and
  reorders it, or None for a leaf every beam of a row shares (the cache index, the
  cross-attention keys and values). logits: [B, V] float32, the prediction of the first
  new token. positions: [B] the position of the first new token. filled: the cache slots
  the prefill wrote (the same for every row; the i-th new token is fed into slot
  filled + i).
  """

  step: Step
  cache: Any
  axes: Any
  logits: jax.Array
  positions: jax.Array
  filled: int


def cache_lengths(filled: int, length: int, initial: int = INITIAL_CACHE_LEN) -> list[int]:
  """The cache lengths, in order, of decoding `length` tokens after a prefill of `filled`.

  The first is `initial` doubled until it holds the prefill and one more slot; each next
  one is `grown`; the last is cut to filled + length - 1, the slots the decoding writes
  (the last new token is never fed back).
  """
  total = filled + max(length - 1, 0)
  first = max(initial, 1)
  while first < min(filled + 1, total):
    first *= 2
  sizes = [min(first, total)]
  while sizes[-1] < total:
    sizes.append(min(grown(sizes[-1]), total))
  return sizes


def grown(size: int) -> int:
  """The next cache length after `size`: a quarter more, rounded up to a multiple of
  `GROWTH_STEP`, at most double. A step reads every slot of the cache, so smaller steps
  than doubling decode faster (docs/PERFORMANCE.md); each length compiles the step once
  more."""
  step = -(-size // (4 * GROWTH_STEP)) * GROWTH_STEP  # a quarter, rounded up
  return min(2 * size, size + max(step, GROWTH_STEP))


def resize(cache: Any, length: int) -> Any:
  """The cache with `length` self-attention slots (`cache_attention.resize`)."""
  return cache_attention.resize(cache, length)


@functools.lru_cache(maxsize=64)
def _cache_shapes(model: nn.Module, batch: int, source_length: int) -> Any:
  key, tokens = jax.random.key(0), jnp.zeros((batch, 1), jnp.int32)
  if isinstance(model, EncoderDecoder):
    d, dtype = model.config.d_model, jnp.dtype(model.config.dtype)
    encoded = jnp.zeros((batch, source_length, d), dtype)
    segments = jnp.ones((batch, source_length), jnp.int32)
    fn = lambda: model.init(key, encoded, segments, tokens, decode=True, method="decode")
  else:
    fn = lambda: model.init(key, tokens, decode=True)
  return jax.eval_shape(fn)["cache"]


def init_cache(
  model: DecoderLM | EncoderDecoder,
  batch: int,
  length: int | None = None,
  source_length: int = 1,
) -> Any:
  """The zeroed 'cache' collection of `model` for `batch` rows (nothing is compiled).

  length: self-attention slots (default config.max_len). source_length: the source
  length S of an EncoderDecoder (the cross-attention keys and values).
  """
  shapes = _cache_shapes(model, batch, source_length)
  if length is not None:
    shapes = resize(shapes, length)
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def _beam_axes(model: nn.Module, source_length: int) -> Any:
  """Per cache leaf, the batch axis (0, or 1 under nn.scan) or None (shared by beams)."""

  def axis(path, a, b):
    diff = [i for i, (m, n) in enumerate(zip(a.shape, b.shape, strict=True)) if m != n]
    return None if not diff or cache_attention.is_source_leaf(path) else diff[0]

  one, two = _cache_shapes(model, 1, source_length), _cache_shapes(model, 2, source_length)
  return jax.tree_util.tree_map_with_path(axis, one, two)


def lm_start(
  model: DecoderLM, params: Any, prompts: jax.Array, lengths: jax.Array, cache_length: int
) -> Start:
  """Prefills left-padded prompts [B, P] (real lengths [B]) into a cache of `cache_length`."""
  b, p = prompts.shape
  column = jnp.arange(p)[None, :]  # [1, P]
  first_real = (p - lengths)[:, None]  # [B, 1]
  positions = jnp.maximum(column - first_real, 0)  # [B, P]
  segments = (column >= first_real).astype(jnp.int32)  # [B, P]
  variables = {"params": params, "cache": init_cache(model, b, cache_length)}
  logits, variables = model.apply(
    variables, prompts, positions, segments, decode=True, last_logits=True, mutable=["cache"]
  )  # [B, 1, V]

  def step(cache, tokens, positions):
    variables = {"params": params, "cache": cache}
    logits, variables = model.apply(
      variables, tokens[:, None], positions[:, None], decode=True, mutable=["cache"]
    )  # [B, 1, V]
    return logits[:, 0], variables["cache"]  # [B, V]

  axes = _beam_axes(model, 1)
  return Start(step, variables["cache"], axes, logits[:, 0], lengths, p)


def seq2seq_step(
  model: EncoderDecoder, params: Any, segments: jax.Array, encoded: jax.Array | None = None
) -> Step:
  """The decoder step of sources with segment ids [B, S]. encoded: the encoder output
  [B, S, D], which the step projects into the cache's cross-attention keys and values
  (`seq2seq_start`'s prefill); None to read them from the cache."""

  def step(cache, tokens, positions):
    logits, variables = model.apply(
      {"params": params, "cache": cache},
      encoded,
      segments,
      tokens[:, None],
      None,
      positions[:, None],
      decode=True,
      method="decode",
      mutable=["cache"],
    )  # [B, 1, V]
    return logits[:, 0], variables["cache"]  # [B, V]

  return step


def seq2seq_start(
  model: EncoderDecoder, params: Any, inputs: jax.Array, cache_length: int
) -> Start:
  """Encodes inputs [B, S] (PAD = padding) and prefills the start token and the
  cross-attention keys and values into a cache of `cache_length` self-attention slots."""
  b, s = inputs.shape
  segments = (inputs != PAD_ID).astype(jnp.int32)  # [B, S]
  encoded = model.apply({"params": params}, inputs, segments, method="encode")  # [B, S, D]
  start = jnp.full((b,), model.config.decoder_start_id, jnp.int32)  # [B] T5: PAD
  cache = init_cache(model, b, cache_length, s)
  prefill = seq2seq_step(model, params, segments, encoded)
  logits, cache = prefill(cache, start, jnp.zeros((b,), jnp.int32))  # [B, V]
  axes = _beam_axes(model, s)
  step = seq2seq_step(model, params, segments)
  return Start(step, cache, axes, logits, jnp.ones((b,), jnp.int32), 1)

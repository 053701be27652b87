"""Beam search on the KV cache with a separate top-k set of finished hypotheses.

Letters: B batch, P prompt length, L generated length, S source length, V vocabulary,
k beam size.

`lm_beam_search` and `seq2seq_beam_search` are jitted (static: the model, L, k and the
initial cache length); alpha and eos_id are traced. They check nothing: `generate` and
`translate` validate their input and then call them. eos_id = -1 means none. Scores are
log-probabilities divided by the GNMT length penalty ((5 + length) / 6) ** alpha.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from transformer.decode.cache import (
  INITIAL_CACHE_LEN,
  Start,
  cache_lengths,
  lm_start,
  seq2seq_start,
)
from transformer.decode.loops import DecodeResult, grow_loop, token_lengths
from transformer.nn.models import DecoderLM, EncoderDecoder

__all__ = ["beam_loop", "gather_beams", "lm_beam_search", "repeat_beams", "seq2seq_beam_search"]


def repeat_beams(x: jax.Array, axis: int | None, k: int, b: int) -> jax.Array:
  """x's batch axis of B * m rows (m = K key/value heads for cached keys and values, else
  1) -> B * k * m rows: each row's m rows k times, beam by beam."""
  if axis is None:
    return x
  x = jnp.moveaxis(x, axis, 0)
  x = x.reshape((b, 1, -1) + x.shape[1:])  # [B, 1, m, ...]
  x = jnp.broadcast_to(x, (b, k) + x.shape[2:])  # [B, k, m, ...]
  return jnp.moveaxis(x.reshape((-1,) + x.shape[3:]), 0, axis)  # batch B * k * m


def gather_beams(x: jax.Array, axis: int | None, index: jax.Array) -> jax.Array:
  """Beams b * k + index[b, j] (each m rows, as in `repeat_beams`) of x's batch axis,
  for index [B, k]."""
  if axis is None:
    return x
  b, k = index.shape
  x = jnp.moveaxis(x, axis, 0)
  x = x.reshape((b, k, -1) + x.shape[1:])  # [B, k, m, ...]
  x = x[jnp.arange(b)[:, None], index]  # [B, k, m, ...]
  return jnp.moveaxis(x.reshape((-1,) + x.shape[3:]), 0, axis)  # batch B * k * m


def beam_loop(start: Start, length: int, beam: int, alpha, eos_id, sizes: list[int]):
  """Beam search (flax wmt / t5x style) over L = `length` tokens with k = `beam`.

  Each step extends the k live hypotheses by every token and keeps the best 2k
  candidates; those ending in EOS (all of them at the last step) compete for the
  finished set by length-normalised score, the rest for the k live slots. The loop stops
  when no live hypothesis can beat the worst finished one (valid for alpha >= 0).
  The cache leaves with a beam axis are repeated per beam and reordered with the
  hypotheses; the others (cross-attention keys and values) stay one per source.
  Returns a DecodeResult.
  """
  axes = start.axes
  b, k = start.logits.shape[0], beam
  leaf = lambda x: x is None
  cache = jax.tree.map(
    lambda ax, x: repeat_beams(x, ax, k, b), axes, start.cache, is_leaf=leaf
  )  # batch B -> B * k
  logits, positions = jnp.repeat(start.logits, k, axis=0), jnp.repeat(start.positions, k)
  penalty = lambda n: ((5.0 + n) / 6.0) ** alpha

  def can_improve(live_logprob, finished_scores):
    best_live = live_logprob[:, 0] / penalty(length)  # [B] best score a live one can reach
    return jnp.any(best_live > finished_scores[:, -1])

  def advance(i, logits, live_seqs, live_logprob, finished_seqs, finished_scores):
    """Token i of every hypothesis from logits [B * k, V]."""
    v = logits.shape[-1]
    logprobs = jax.nn.log_softmax(logits).reshape(b, k, v)  # [B, k, V]
    candidates = (live_logprob[:, :, None] + logprobs).reshape(b, k * v)  # [B, k * V]
    top_logprob, top = lax.top_k(candidates, min(2 * k, k * v))  # [B, 2k]
    source, new = top // v, (top % v).astype(jnp.int32)  # [B, 2k]
    seqs = jnp.take_along_axis(live_seqs, source[:, :, None], 1)  # [B, 2k, L]
    seqs = lax.dynamic_update_slice(seqs, new[:, :, None], (0, 0, i))  # [B, 2k, L]
    is_eos = new == eos_id  # [B, 2k]

    live_logprob, keep = lax.top_k(jnp.where(is_eos, -jnp.inf, top_logprob), k)  # [B, k]
    live_seqs = jnp.take_along_axis(seqs, keep[:, :, None], 1)  # [B, k, L]
    parents = jnp.take_along_axis(source, keep, 1)  # [B, k]
    tokens = jnp.take_along_axis(new, keep, 1).reshape(b * k)  # [B * k]

    ends = is_eos | (i == length - 1)  # [B, 2k]
    scores = jnp.where(ends, top_logprob / penalty(i + 1), -jnp.inf)  # [B, 2k]
    all_scores = jnp.concatenate([finished_scores, scores], 1)  # [B, 3k]
    finished_scores, keep = lax.top_k(all_scores, k)  # [B, k]
    all_seqs = jnp.concatenate([finished_seqs, seqs], 1)  # [B, 3k, L]
    finished_seqs = jnp.take_along_axis(all_seqs, keep[:, :, None], 1)  # [B, k, L]
    return (live_seqs, live_logprob, finished_seqs, finished_scores), parents, tokens

  def body(carry):
    i, cache, (tokens, *hypotheses) = carry
    logits, cache = start.step(cache, tokens, positions + i - 1)  # [B * k, V]
    hypotheses, parents, tokens = advance(i, logits, *hypotheses)
    cache = jax.tree.map(lambda ax, x: gather_beams(x, ax, parents), axes, cache, is_leaf=leaf)
    return i + 1, cache, (tokens, *hypotheses)

  empty = jnp.zeros((b, k, length), jnp.int32)  # [B, k, L]
  live_logprob = jnp.where(jnp.arange(k) == 0, 0.0, -jnp.inf) * jnp.ones((b, 1))  # [B, k]
  # Token 0 from the prefill's logits; the beams' caches are still equal: no gathering.
  hypotheses, _, tokens = advance(0, logits, empty, live_logprob, empty, jnp.full((b, k), -jnp.inf))
  cond = lambda carry: can_improve(carry[2][2], carry[2][4])
  _, _, (_, _, _, seqs, scores) = grow_loop(
    cond, body, (1, cache, (tokens, *hypotheses)), start, length, sizes
  )
  best = seqs[:, 0]  # [B, L]
  return DecodeResult(best, scores[:, 0], token_lengths(best, eos_id), seqs, scores)


_STATIC = ("model", "length", "beam_size", "initial_cache_len")


@functools.partial(jax.jit, static_argnames=_STATIC)
def lm_beam_search(
  model: DecoderLM,
  params: Any,
  prompts: jax.Array,
  lengths: jax.Array,
  *,
  length: int,
  beam_size: int,
  alpha: float | jax.Array = 0.6,
  eos_id: int | jax.Array = -1,
  initial_cache_len: int = INITIAL_CACHE_LEN,
) -> DecodeResult:
  """Beam search over L = `length` new tokens after left-padded prompts [B, P].

  lengths: [B] real prompt lengths (see `left_pad`).
  """
  sizes = cache_lengths(prompts.shape[1], length, initial_cache_len)
  start = lm_start(model, params, prompts, lengths, sizes[0])
  return beam_loop(start, length, beam_size, alpha, eos_id, sizes)


@functools.partial(jax.jit, static_argnames=_STATIC)
def seq2seq_beam_search(
  model: EncoderDecoder,
  params: Any,
  inputs: jax.Array,
  *,
  length: int,
  beam_size: int,
  alpha: float | jax.Array = 0.6,
  eos_id: int | jax.Array = -1,
  initial_cache_len: int = INITIAL_CACHE_LEN,
) -> DecodeResult:
  """Beam search over targets of L = `length` tokens for inputs [B, S] (PAD = pad).

  The cross-attention keys and values are computed once per source and shared by its
  beams (`cache.seq2seq_start`).
  """
  sizes = cache_lengths(1, length, initial_cache_len)
  start = seq2seq_start(model, params, inputs, sizes[0])
  return beam_loop(start, length, beam_size, alpha, eos_id, sizes)

"""Beam search on the KV cache with a separate top-k set of finished hypotheses.

Letters: B batch, P prompt length, L generated length, S source length, V vocabulary,
k beam size.

`lm_beam_search` and `seq2seq_beam_search` are jitted (static: the model, L and k);
alpha and eos_id are traced. They check nothing: `generate` and `translate` validate
their input and then call them. eos_id = -1 means none. Scores are log-probabilities
divided by the GNMT length penalty ((5 + length) / 6) ** alpha.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from transformer.decode.cache import Start, lm_start, seq2seq_start
from transformer.decode.loops import DecodeResult, token_lengths
from transformer.nn.models import DecoderLM, EncoderDecoder

__all__ = ["lm_beam_search", "seq2seq_beam_search"]


def _gather_beams(x: jax.Array, axis: int | None, index: jax.Array) -> jax.Array:
  """Rows b * k_old + index[b, j] of x's batch axis, for index [B, k_new]."""
  if axis is None:
    return x
  b, k_new = index.shape
  x = jnp.moveaxis(x, axis, 0)
  x = x.reshape((b, -1) + x.shape[1:])  # [B, k_old, ...]
  x = x[jnp.arange(b)[:, None], index]  # [B, k_new, ...]
  return jnp.moveaxis(x.reshape((b * k_new,) + x.shape[2:]), 0, axis)  # batch B * k_new


def _beam_loop(start: Start, length: int, beam: int, alpha, eos_id) -> DecodeResult:
  """Beam search (flax wmt / t5x style) over L = `length` tokens with k = `beam`.

  Each step extends the k live hypotheses by every token and keeps the best 2k
  candidates; those ending in EOS (all of them at the last step) compete for the
  finished set by length-normalised score, the rest for the k live slots. The loop stops
  when no live hypothesis can beat the worst finished one (valid for alpha >= 0).
  """
  step, axes = start.step, start.axes
  b, k = start.tokens.shape[0], beam
  leaf = lambda x: x is None
  state = jax.tree.map(
    lambda ax, x: x if ax is None else jnp.repeat(x, k, axis=ax), axes, start.state, is_leaf=leaf
  )  # batch B -> B * k
  tokens, positions = jnp.repeat(start.tokens, k), jnp.repeat(start.positions, k)  # [B * k]
  penalty = lambda n: ((5.0 + n) / 6.0) ** alpha

  def cond(carry):
    i, _, _, _, live_logprob, _, finished_scores = carry
    best_live = live_logprob[:, 0] / penalty(length)  # [B] best score a live one can reach
    return (i < length) & jnp.any(best_live > finished_scores[:, -1])

  def body(carry):
    i, tokens, state, live_seqs, live_logprob, finished_seqs, finished_scores = carry
    logits, state = step(state, tokens, positions + i)  # [B * k, V]
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
    state = jax.tree.map(lambda ax, x: _gather_beams(x, ax, parents), axes, state, is_leaf=leaf)
    tokens = jnp.take_along_axis(new, keep, 1).reshape(b * k)  # [B * k]

    ends = is_eos | (i == length - 1)  # [B, 2k]
    scores = jnp.where(ends, top_logprob / penalty(i + 1), -jnp.inf)  # [B, 2k]
    all_scores = jnp.concatenate([finished_scores, scores], 1)  # [B, 3k]
    finished_scores, keep = lax.top_k(all_scores, k)  # [B, k]
    all_seqs = jnp.concatenate([finished_seqs, seqs], 1)  # [B, 3k, L]
    finished_seqs = jnp.take_along_axis(all_seqs, keep[:, :, None], 1)  # [B, k, L]
    return i + 1, tokens, state, live_seqs, live_logprob, finished_seqs, finished_scores

  empty = jnp.zeros((b, k, length), jnp.int32)  # [B, k, L]
  live_logprob = jnp.where(jnp.arange(k) == 0, 0.0, -jnp.inf) * jnp.ones((b, 1))  # [B, k]
  init = (0, tokens, state, empty, live_logprob, empty, jnp.full((b, k), -jnp.inf))
  *_, seqs, scores = lax.while_loop(cond, body, init)
  best = seqs[:, 0]  # [B, L]
  return DecodeResult(best, scores[:, 0], token_lengths(best, eos_id), seqs, scores)


@functools.partial(jax.jit, static_argnames=("model", "length", "beam_size"))
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
) -> DecodeResult:
  """Beam search over L = `length` new tokens after left-padded prompts [B, P].

  lengths: [B] real prompt lengths (see `left_pad`).
  """
  start = lm_start(model, params, prompts, lengths)
  return _beam_loop(start, length, beam_size, alpha, eos_id)


@functools.partial(jax.jit, static_argnames=("model", "length", "beam_size"))
def seq2seq_beam_search(
  model: EncoderDecoder,
  params: Any,
  inputs: jax.Array,
  *,
  length: int,
  beam_size: int,
  alpha: float | jax.Array = 0.6,
  eos_id: int | jax.Array = -1,
) -> DecodeResult:
  """Beam search over targets of L = `length` tokens for inputs [B, S] (PAD = pad)."""
  start = seq2seq_start(model, params, inputs)
  return _beam_loop(start, length, beam_size, alpha, eos_id)

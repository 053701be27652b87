"""Greedy and sampled decoding: one `lax.while_loop` over the KV cache, one token a step.

Letters: B batch, P prompt length, L generated length, S source length, V vocabulary.

`lm_decode` and `seq2seq_decode` are jitted (static: the model and L; greedy and
sampling differ in the `sampling` pytree); temperature, top-k, top-p and eos_id are
traced, so changing them does not recompile. They check nothing: `generate` and
`translate` validate their input and then call them. eos_id = -1 means none.

Rows stop independently at `eos_id`: the EOS token is emitted, later slots are PAD and
the row's score stops changing (finished rows are still fed PAD to keep the batch in
lockstep); the loop exits once every row has finished.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from transformer.data.tokenizers import PAD_ID
from transformer.decode.cache import Start, lm_start, seq2seq_start
from transformer.decode.sampling import Sampling, Select, selector
from transformer.nn.models import DecoderLM, EncoderDecoder

__all__ = ["DecodeResult", "lm_decode", "seq2seq_decode", "token_lengths"]


class DecodeResult(NamedTuple):
  """Output of every decoding function (jax arrays).

  tokens: [B, L] int32 generated tokens (not the prompt), EOS included, then PAD.
  scores: [B] float32. greedy / sample: total log-probability of `tokens` under the
    model (temperature 1, unfiltered). beam: that log-probability divided by the GNMT
    length penalty ((5 + length) / 6) ** alpha.
  lengths: [B] int32 tokens up to and including the first EOS (L if none).
  beams: [B, k, L] all finished hypotheses, best first (beam search only, else None);
    a slot with score -inf is empty.
  beam_scores: [B, k] their scores (beam search only).
  """

  tokens: jax.Array
  scores: jax.Array
  lengths: jax.Array
  beams: jax.Array | None = None
  beam_scores: jax.Array | None = None


def token_lengths(tokens: jax.Array, eos_id: int | jax.Array) -> jax.Array:
  """int32 [B]: tokens of each row [B, L] up to and including its first EOS (L if none)."""
  is_eos = tokens == eos_id  # [B, L]
  return jnp.where(is_eos.any(-1), jnp.argmax(is_eos, -1) + 1, tokens.shape[-1]).astype(jnp.int32)


def _decode_loop(start: Start, length: int, select: Select, eos_id) -> DecodeResult:
  """Feeds a token, picks the next with `select(logits [B, V], i) -> [B]`, until EOS / length."""
  step, positions = start.step, start.positions
  b = start.tokens.shape[0]

  def cond(carry):
    i, _, _, _, done, _ = carry
    return (i < length) & ~jnp.all(done)

  def body(carry):
    i, tokens, state, out, done, logprob = carry
    logits, state = step(state, tokens, positions + i)  # [B, V]
    new = jnp.where(done, PAD_ID, select(logits, i).astype(jnp.int32))  # [B]
    token_logprob = jnp.take_along_axis(jax.nn.log_softmax(logits), new[:, None], -1)[:, 0]
    logprob = logprob + jnp.where(done, 0.0, token_logprob)
    out = lax.dynamic_update_slice(out, new[:, None], (0, i))  # [B, L]
    return i + 1, new, state, out, done | (new == eos_id), logprob

  out = jnp.zeros((b, length), jnp.int32)  # [B, L]
  init = (0, start.tokens, start.state, out, jnp.zeros(b, bool), jnp.zeros(b))
  _, _, _, out, _, logprob = lax.while_loop(cond, body, init)
  return DecodeResult(out, logprob, token_lengths(out, eos_id))


@functools.partial(jax.jit, static_argnames=("model", "length"))
def lm_decode(
  model: DecoderLM,
  params: Any,
  prompts: jax.Array,
  lengths: jax.Array,
  *,
  length: int,
  sampling: Sampling | None = None,
  eos_id: int | jax.Array = -1,
) -> DecodeResult:
  """Greedy (sampling None) or sampled continuation of L = `length` tokens.

  prompts: [B, P] left-padded (see `left_pad`); lengths: [B] real prompt lengths.
  """
  start = lm_start(model, params, prompts, lengths)
  return _decode_loop(start, length, selector(sampling), eos_id)


@functools.partial(jax.jit, static_argnames=("model", "length"))
def seq2seq_decode(
  model: EncoderDecoder,
  params: Any,
  inputs: jax.Array,
  *,
  length: int,
  sampling: Sampling | None = None,
  eos_id: int | jax.Array = -1,
) -> DecodeResult:
  """Greedy (sampling None) or sampled targets of L tokens for inputs [B, S] (PAD = pad)."""
  start = seq2seq_start(model, params, inputs)
  return _decode_loop(start, length, selector(sampling), eos_id)

"""Greedy and sampled decoding: `lax.while_loop`s over the KV cache, one token a step.

Letters: B batch, P prompt length, L generated length, S source length, V vocabulary.

`lm_decode` and `seq2seq_decode` are jitted (static: the model, L and the initial cache
length; greedy and sampling differ in the `sampling` pytree); temperature, top-k, top-p
and eos_id are traced, so changing them does not recompile. They check nothing:
`generate` and `translate` validate their input and then call them. eos_id = -1 means
none.

The first token comes from the prefill's logits; each step then feeds the last token and
picks the next, L - 1 steps in all. They run in one while loop per cache length of
`cache.cache_lengths` (`grow_loop`): the cache grows between them (doubled while small,
then by a quarter), so a step attends over at most about twice the slots filled, and
over at most a quarter more once the cache is long.

Rows stop independently at `eos_id`: the EOS token is emitted, later slots are PAD and
the row's score stops changing (finished rows are still fed PAD to keep the batch in
lockstep); the loop exits once every row has finished.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from transformer.data.tokenizers import PAD_ID
from transformer.decode.cache import (
  INITIAL_CACHE_LEN,
  Start,
  cache_lengths,
  lm_start,
  resize,
  seq2seq_start,
)
from transformer.decode.sampling import Sampling, Select, selector
from transformer.nn.models import DecoderLM, EncoderDecoder

__all__ = ["DecodeResult", "decode_loop", "grow_loop", "lm_decode", "seq2seq_decode"]
__all__ += ["token_lengths"]


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


def grow_loop(
  cond: Callable[[Any], jax.Array],
  body: Callable[[Any], Any],
  carry: tuple[Any, Any, Any],
  start: Start,
  length: int,
  sizes: list[int],
) -> tuple[Any, Any, Any]:
  """`lax.while_loop(cond, body, carry)` over growing caches, carry = (i, cache, rest).

  Iteration i (from 1) feeds token i - 1 into cache slot start.filled + i - 1, so with a
  cache of `size` slots the loop runs while i <= size - start.filled (and i < length);
  then the cache grows to the next of `sizes` (the first is the prefill's). Each size is
  one while loop, so one compiled copy of `body`.
  """
  for n, size in enumerate(sizes):
    i, cache, rest = carry
    if n:
      cache = resize(cache, size)
    stop = min(size - start.filled + 1, length)
    carry = lax.while_loop(lambda c, stop=stop: (c[0] < stop) & cond(c), body, (i, cache, rest))
  return carry


def decode_loop(
  start: Start, length: int, select: Select, eos_id, sizes: list[int]
) -> DecodeResult:
  """Token i = `select(logits [B, V], i) -> [B]` of the logits after token i - 1 (the
  prefill's for i = 0), until every row has emitted EOS or `length` tokens."""
  b = start.logits.shape[0]

  def choose(i, logits, out, done, logprob):
    new = jnp.where(done, PAD_ID, select(logits, i).astype(jnp.int32))  # [B]
    chosen = jnp.take_along_axis(logits, new[:, None], -1)[:, 0]  # [B]
    token_logprob = chosen - jax.nn.logsumexp(logits, axis=-1)  # no [B, V] log_softmax
    logprob = logprob + jnp.where(done, 0.0, token_logprob)
    out = lax.dynamic_update_slice(out, new[:, None], (0, i))  # [B, L]
    return new, out, done | (new == eos_id), logprob

  def body(carry):
    i, cache, (new, out, done, logprob) = carry
    logits, cache = start.step(cache, new, start.positions + i - 1)  # [B, V]
    return i + 1, cache, choose(i, logits, out, done, logprob)

  out = jnp.zeros((b, length), jnp.int32)  # [B, L]
  first = choose(0, start.logits, out, jnp.zeros(b, bool), jnp.zeros(b))
  not_done = lambda carry: ~jnp.all(carry[2][2])
  carry = grow_loop(not_done, body, (1, start.cache, first), start, length, sizes)
  _, out, _, logprob = carry[2]
  return DecodeResult(out, logprob, token_lengths(out, eos_id))


@functools.partial(jax.jit, static_argnames=("model", "length", "initial_cache_len"))
def lm_decode(
  model: DecoderLM,
  params: Any,
  prompts: jax.Array,
  lengths: jax.Array,
  *,
  length: int,
  sampling: Sampling | None = None,
  eos_id: int | jax.Array = -1,
  initial_cache_len: int = INITIAL_CACHE_LEN,
) -> DecodeResult:
  """Greedy (sampling None) or sampled continuation of L = `length` tokens.

  prompts: [B, P] left-padded (see `left_pad`); lengths: [B] real prompt lengths.
  initial_cache_len: the first cache length (`cache.cache_lengths`).
  """
  sizes = cache_lengths(prompts.shape[1], length, initial_cache_len)
  start = lm_start(model, params, prompts, lengths, sizes[0])
  return decode_loop(start, length, selector(sampling), eos_id, sizes)


@functools.partial(jax.jit, static_argnames=("model", "length", "initial_cache_len"))
def seq2seq_decode(
  model: EncoderDecoder,
  params: Any,
  inputs: jax.Array,
  *,
  length: int,
  sampling: Sampling | None = None,
  eos_id: int | jax.Array = -1,
  initial_cache_len: int = INITIAL_CACHE_LEN,
) -> DecodeResult:
  """Greedy (sampling None) or sampled targets of L tokens for inputs [B, S] (PAD = pad)."""
  sizes = cache_lengths(1, length, initial_cache_len)
  start = seq2seq_start(model, params, inputs, sizes[0])
  return decode_loop(start, length, selector(sampling), eos_id, sizes)

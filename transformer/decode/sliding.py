"""Generation past a DecoderLM's context: a sliding window, recomputed for every token.

Letters: B batch, P prompt length, L new tokens, W window (= config.max_len), V vocabulary.

`generate_sliding(model, params, prompts, max_new_tokens=L, ...)` predicts each new token
from the last W tokens of prompt + generated so far, run through the model in full with
positions restarting at 0 (nanoGPT's `generate` crops `idx[:, -block_size:]` the same
way). A model with absolute positions (learned, sinusoidal) thus never meets a position
it was not trained on, and any number of tokens can be generated; RoPE and relative
models slide the same way. While prompt + generated fit in W, the window holds the
whole sequence from position 0: the same computation as cached decoding (`generate`),
so the same tokens. Past W each token sees only the W - 1 before it. There is no KV
cache: every token costs one forward pass over W positions. The loop is the cached
loops' own (`loops.decode_loop`), started from `sliding_start`, whose "cache" is the
buffer of tokens the window slides over.

The window is laid out as cached decoding lays out prompts: left-padded, pads in segment
0 (never attended), positions counted from each row's first real token, the newest token
last, so only its logits are computed.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from transformer.data.tokenizers import EOS_ID, PAD_ID
from transformer.decode.api import check_tokens, left_pad
from transformer.decode.cache import Start
from transformer.decode.loops import DecodeResult, decode_loop
from transformer.decode.sampling import Sampling, checked, selector, unwrap
from transformer.nn.models import DecoderLM

__all__ = ["generate_sliding", "sliding_decode", "sliding_start"]


def sliding_start(
  model: DecoderLM, params: Any, prompts: jax.Array, lengths: jax.Array, length: int
) -> Start:
  """Left-padded prompts [B, P] (real lengths [B]) as the Start of L = `length` tokens,
  its cache the token buffer: (tokens, segment ids, the next slot). Each step writes the
  token fed and runs the model over the W tokens ending with it (the window's own
  positions, not the ones the loop passes)."""
  w = model.config.max_len
  b, p = prompts.shape
  # W pads in front, so the window [end - W, end) always lies inside the buffer.
  tokens = jnp.concatenate(
    [jnp.full((b, w), PAD_ID, jnp.int32), prompts, jnp.full((b, length), PAD_ID, jnp.int32)],
    axis=1,
  )  # [B, W + P + L]
  real = (jnp.arange(p)[None, :] >= p - lengths[:, None]).astype(jnp.int32)  # [B, P]
  valid = jnp.concatenate(
    [jnp.zeros((b, w), jnp.int32), real, jnp.zeros((b, length), jnp.int32)], axis=1
  )  # [B, W + P + L]

  def window_logits(tokens, valid, end):
    window = lax.dynamic_slice_in_dim(tokens, end - w, w, axis=1)  # [B, W]
    segments = lax.dynamic_slice_in_dim(valid, end - w, w, axis=1)  # [B, W]
    positions = jnp.maximum(jnp.cumsum(segments, axis=1) - 1, 0)  # [B, W]
    return model.apply(
      {"params": params}, window, positions=positions, segment_ids=segments, last_logits=True
    )[:, 0]  # [B, V]

  def step(cache, new, positions):
    tokens, valid, end = cache
    tokens = lax.dynamic_update_slice_in_dim(tokens, new[:, None], end, axis=1)
    valid = lax.dynamic_update_slice_in_dim(valid, jnp.ones((b, 1), jnp.int32), end, axis=1)
    return window_logits(tokens, valid, end + 1), (tokens, valid, end + 1)

  end = jnp.int32(w + p)  # the buffer index the next token goes to
  logits = window_logits(tokens, valid, end)
  return Start(step, (tokens, valid, end), (0, 0, None), logits, lengths, w + p)


@functools.partial(jax.jit, static_argnames=("model", "length"))
def sliding_decode(
  model: DecoderLM,
  params: Any,
  prompts: jax.Array,
  lengths: jax.Array,
  *,
  length: int,
  sampling: Sampling | None = None,
  eos_id: int | jax.Array = -1,
) -> DecodeResult:
  """L = `length` tokens after left-padded prompts [B, P] (real lengths [B]), each from a
  window of the last W tokens. Greedy when `sampling` is None; token i draws with
  `fold_in(rng, i)`, as the cached loops do. Unchecked (see `generate_sliding`)."""
  start = sliding_start(model, params, prompts, lengths, length)
  # One buffer of every slot the loop writes: `grow_loop` never resizes it.
  return decode_loop(start, length, selector(sampling), eos_id, [start.filled + length])


def generate_sliding(
  model: DecoderLM,
  params: Any,
  prompts: Sequence[Sequence[int]] | np.ndarray,
  *,
  max_new_tokens: int,
  method: str = "greedy",
  sampling: Sampling | None = None,
  eos_id: int | None = EOS_ID,
) -> DecodeResult:
  """Continues each prompt by `max_new_tokens` tokens through a sliding window of the
  model's `max_len` tokens (any length; a prompt longer than the window is read through
  its last `max_len` tokens). method: 'greedy' or 'sample' (options as in `generate`).
  Raises ValueError for a bad prompt or option. Returns tokens [B, max_new_tokens]."""
  if not isinstance(model, DecoderLM):
    raise ValueError(f"generate_sliding needs a DecoderLM, got {type(model).__name__}")
  config = model.config
  if method not in ("greedy", "sample"):
    raise ValueError(f"method={method!r}: a sliding window decodes 'greedy' or 'sample'")
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
  sampling = checked(method, sampling)
  if eos_id is not None and not 0 <= eos_id < config.vocab_size:
    raise ValueError(f"eos_id={eos_id} is outside the vocabulary [0, {config.vocab_size})")
  tokens, lengths = left_pad(prompts)  # [B, P], [B]
  check_tokens(tokens, config.vocab_size, "prompt")
  keep = min(tokens.shape[1], config.max_len)  # the window reads at most max_len of a prompt
  tokens, lengths = tokens[:, -keep:], np.minimum(lengths, keep)
  eos = -1 if eos_id is None else eos_id
  return sliding_decode(
    model, unwrap(params), tokens, lengths, length=max_new_tokens, sampling=sampling, eos_id=eos
  )

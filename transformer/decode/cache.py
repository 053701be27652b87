"""The KV cache and how each model family takes one cached step.

Letters: B batch, P prompt length, S source length, D model dim, V vocabulary.

A DecoderLM batch is left-padded to a common length P. Pads get segment id 0 and real
tokens segment id 1, so the causal + segment mask (with the segment ids kept in the
cache) never lets a real token attend to a pad; positions restart at 0 at each row's
first real token. `lm_start` prefills prompts[:, :-1] in one batched call; the loop then
feeds the last prompt token first, at the row's explicit position. Every row's last
prompt token sits in column P - 1, so all rows share the cache index, and the longest
prompt bounds the batch: P + new tokens <= config.max_len.

`seq2seq_start` encodes the sources once; the decoder starts every row from PAD at
position 0, as `shift_right` does in training.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.data.tokenizers import PAD_ID
from transformer.nn.models import DecoderLM, EncoderDecoder

__all__ = ["Start", "Step", "init_cache", "lm_start", "seq2seq_start"]

# (state, tokens [B], positions [B]) -> (logits [B, V], new state)
Step = Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, Any]]


class Start(NamedTuple):
  """Where a decoding loop begins.

  step: feeds one token per row to the cached model. state: what `step` carries (the
  cache, plus the encoder output for an EncoderDecoder). axes: per leaf of `state`, its
  batch axis, or None for a leaf shared by every row (the cache index). tokens: [B] the
  first tokens to feed. positions: [B] their positions.
  """

  step: Step
  state: Any
  axes: Any
  tokens: jax.Array
  positions: jax.Array


@functools.lru_cache(maxsize=64)
def _cache_shapes(model: nn.Module, batch: int) -> Any:
  key, tokens = jax.random.key(0), jnp.zeros((batch, 1), jnp.int32)
  if isinstance(model, EncoderDecoder):
    encoded = jnp.zeros((batch, 1, model.config.d_model), jnp.dtype(model.config.dtype))
    fn = lambda: model.init(key, encoded, tokens, tokens, decode=True, method="decode")
  else:
    fn = lambda: model.init(key, tokens, decode=True)
  return jax.eval_shape(fn)["cache"]


def init_cache(model: DecoderLM | EncoderDecoder, batch: int) -> Any:
  """The zeroed 'cache' collection of `model` for `batch` rows (nothing is compiled)."""
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), _cache_shapes(model, batch))


def _cache_batch_axes(model: nn.Module) -> Any:
  """Per cache leaf, the batch axis (0, or 1 under nn.scan) or None (the cache index)."""

  def axis(a, b):
    diff = [i for i, (m, n) in enumerate(zip(a.shape, b.shape, strict=True)) if m != n]
    return diff[0] if diff else None

  return jax.tree.map(axis, _cache_shapes(model, 1), _cache_shapes(model, 2))


def lm_start(model: DecoderLM, params: Any, prompts: jax.Array, lengths: jax.Array) -> Start:
  """Prefills left-padded prompts[:, :-1] ([B, P], real lengths [B]); feeds the last next."""
  b, p = prompts.shape
  column = jnp.arange(p)[None, :]  # [1, P]
  first_real = (p - lengths)[:, None]  # [B, 1]
  positions = jnp.maximum(column - first_real, 0)  # [B, P]
  segments = (column >= first_real).astype(jnp.int32)  # [B, P]
  cache = init_cache(model, b)
  if p > 1:
    variables = {"params": params, "cache": cache}
    _, variables = model.apply(
      variables,
      prompts[:, :-1],
      positions[:, :-1],
      segments[:, :-1],
      decode=True,
      mutable=["cache"],
    )
    cache = variables["cache"]

  def step(cache, tokens, positions):
    variables = {"params": params, "cache": cache}
    logits, variables = model.apply(
      variables, tokens[:, None], positions[:, None], decode=True, mutable=["cache"]
    )  # [B, 1, V]
    return logits[:, 0], variables["cache"]  # [B, V]

  return Start(step, cache, _cache_batch_axes(model), prompts[:, -1], lengths - 1)


def seq2seq_start(model: EncoderDecoder, params: Any, inputs: jax.Array) -> Start:
  """Encodes inputs [B, S] (PAD = padding); the state is (cache, encoded, source segments)."""
  b = inputs.shape[0]
  segments = (inputs != PAD_ID).astype(jnp.int32)  # [B, S]
  encoded = model.apply({"params": params}, inputs, segments, method="encode")  # [B, S, D]

  def step(state, tokens, positions):
    cache, encoded, segments = state
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
    return logits[:, 0], (variables["cache"], encoded, segments)  # [B, V]

  state = (init_cache(model, b), encoded, segments)
  axes = (_cache_batch_axes(model), 0, 0)
  start = jnp.full((b,), PAD_ID, jnp.int32)  # [B] T5: the decoder starts from PAD
  return Start(step, state, axes, start, jnp.zeros((b,), jnp.int32))

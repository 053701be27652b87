"""Autoregressive decoding on the KV cache: greedy, sampling (temperature, top-k, top-p), beam.

Letters: B batch, P prompt length, L generated length, S source length, V vocabulary,
k beam size.

Public API:
  generate(model, params, prompts, ...)   DecoderLM: continue prompts of any lengths.
  translate(model, params, inputs, ...)   EncoderDecoder: decode targets for sources.
  lm_decode / lm_beam_search / seq2seq_decode / seq2seq_beam_search: the jitted loops
    (no input checking; `generate` / `translate` validate and then call these).
  DecodeResult, Sampling, top_k_filter, top_p_filter, left_pad, init_cache.

Every loop is one `jax.jit` (static: the model, the length, the beam size; greedy and
sampling differ in the `sampling` pytree) around a `lax.while_loop` that feeds one token
per iteration to the cached model; temperature, top-k, top-p, alpha and eos_id are traced,
so changing them does not recompile.

Prompts of a DecoderLM batch are left-padded to a common length P. Pads get segment id 0
and real tokens segment id 1, so the causal + segment mask (`MaskInfo.block_mask`, with
the segment ids kept in the cache by `_update_cache`) never lets a real token attend to a
pad; positions restart at 0 at each row's first real token. The prompt minus its last
column is prefilled in one batched call; each loop iteration then feeds the previous
token at the row's explicit position (the last prompt token first) and picks the next
one. Every row's last prompt token sits in column P - 1, so all rows share the cache
index. Hence the longest prompt bounds the batch: P + max_new_tokens <= config.max_len.
An EncoderDecoder starts every row from PAD (0) at position 0, as `shift_right` does.

Rows stop independently at `eos_id`: the EOS token is emitted, later slots are PAD and the
row's score stops changing (finished rows are still fed PAD to keep the batch in lockstep);
the loop exits once every row has finished.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from transformer.models.decoder import DecoderLM
from transformer.models.seq2seq import EncoderDecoder

__all__ = [
  "DecodeResult",
  "Sampling",
  "generate",
  "init_cache",
  "left_pad",
  "lm_beam_search",
  "lm_decode",
  "seq2seq_beam_search",
  "seq2seq_decode",
  "top_k_filter",
  "top_p_filter",
  "translate",
]

PAD_ID, EOS_ID = 0, 2
METHODS = ("greedy", "sample", "beam")
Step = Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, Any]]


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


class Sampling(NamedTuple):
  """Sampling options of the jitted loops; all traced, so new values do not recompile.

  Step i draws with `fold_in(rng, i)`: temperature > 0, then top_k (0 = off), then
  top_p (1 = off). A loop given `sampling=None` is greedy.
  """

  rng: jax.Array
  temperature: float | jax.Array = 1.0
  top_k: int | jax.Array = 0
  top_p: float | jax.Array = 1.0


# ----------------------------------------------------------------------------------------
# Logit filters.


def top_k_filter(logits: jax.Array, k: int | jax.Array) -> jax.Array:
  """Keeps the k largest logits of each row [..., V]; the rest become -inf.

  k: a scalar or one per row [...]; k <= 0 or k >= V keeps everything. Ties: every logit
  equal to the k-th largest is kept, so more than k may survive. k may be traced.
  """
  v = logits.shape[-1]
  k = jnp.asarray(k, jnp.int32)
  k = jnp.where((k <= 0) | (k > v), v, k)
  ordered = -jnp.sort(-logits, axis=-1)  # [..., V] descending
  kth = jnp.take_along_axis(ordered, jnp.broadcast_to(k - 1, logits.shape[:-1])[..., None], -1)
  return jnp.where(logits >= kth, logits, -jnp.inf)


def top_p_filter(logits: jax.Array, p: float | jax.Array) -> jax.Array:
  """Nucleus filter: keeps the smallest set of most probable tokens whose mass reaches p.

  logits: [..., V]; the rest become -inf. p: a scalar or one per row [...]. The most
  probable token is always kept; p >= 1 keeps everything. Ties: every token whose logit
  equals the smallest kept logit is kept, so the result does not depend on the order of
  tied tokens. p may be traced.
  """
  v = logits.shape[-1]
  ordered = -jnp.sort(-logits, axis=-1)  # [..., V] descending
  probs = jax.nn.softmax(ordered, axis=-1)  # [..., V]
  mass_before = jnp.cumsum(probs, axis=-1) - probs  # [..., V] mass of the better tokens
  p = jnp.asarray(p)[..., None]  # [..., 1]
  count = jnp.sum(mass_before < p, axis=-1)  # [...] tokens needed to reach p (>= 1)
  count = jnp.where(p[..., 0] >= 1.0, v, jnp.maximum(count, 1))
  threshold = jnp.take_along_axis(ordered, (count - 1)[..., None], -1)  # [..., 1]
  return jnp.where(logits >= threshold, logits, -jnp.inf)


def _sample(logits, rng, temperature, top_k, top_p):
  """One token per row [B, V] -> [B]: temperature, then top-k, then top-p."""
  logits = top_p_filter(top_k_filter(logits / temperature, top_k), top_p)
  return jax.random.categorical(rng, logits, axis=-1)


# ----------------------------------------------------------------------------------------
# The cache and how each family takes one step.


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


def _lm_start(model: DecoderLM, params, prompts: jax.Array, lengths: jax.Array):
  """Prefills prompts[:, :-1]; returns (step, cache, batch axes, first tokens, positions)."""
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
    return logits[:, 0], variables["cache"]

  return step, cache, _cache_batch_axes(model), prompts[:, -1], lengths - 1


def _seq2seq_start(model: EncoderDecoder, params, inputs: jax.Array):
  """Encodes inputs [B, S] (0 = pad); the state is (cache, encoded, source segments)."""
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
    )
    return logits[:, 0], (variables["cache"], encoded, segments)

  state = (init_cache(model, b), encoded, segments)
  axes = (_cache_batch_axes(model), 0, 0)
  start = jnp.full((b,), PAD_ID, jnp.int32)  # T5: the decoder starts from PAD
  return step, state, axes, start, jnp.zeros((b,), jnp.int32)


# ----------------------------------------------------------------------------------------
# The loops.


def _lengths(tokens: jax.Array, eos_id: jax.Array) -> jax.Array:
  is_eos = tokens == eos_id  # [B, L]
  return jnp.where(is_eos.any(-1), jnp.argmax(is_eos, -1) + 1, tokens.shape[-1]).astype(jnp.int32)


def _decode_loop(step: Step, state, tokens, positions, length: int, select, eos_id):
  """Feeds a token, picks the next with `select(logits [B, V], i) -> [B]`, until EOS / length."""
  b = tokens.shape[0]

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

  init = (0, tokens, state, jnp.zeros((b, length), jnp.int32), jnp.zeros(b, bool), jnp.zeros(b))
  _, _, _, out, _, logprob = lax.while_loop(cond, body, init)
  return DecodeResult(out, logprob, _lengths(out, eos_id))


def _gather_beams(x: jax.Array, axis: int | None, index: jax.Array) -> jax.Array:
  """Rows b * k_old + index[b, j] of x's batch axis, for index [B, k_new]."""
  if axis is None:
    return x
  b, k_new = index.shape
  x = jnp.moveaxis(x, axis, 0)
  x = x.reshape((b, -1) + x.shape[1:])  # [B, k_old, ...]
  x = x[jnp.arange(b)[:, None], index]  # [B, k_new, ...]
  return jnp.moveaxis(x.reshape((b * k_new,) + x.shape[2:]), 0, axis)


def _beam_loop(step: Step, state, axes, tokens, positions, length: int, beam: int, alpha, eos_id):
  """Beam search with a separate top-k set of finished hypotheses (flax wmt / t5x style).

  Each step extends the k live hypotheses by every token and keeps the best 2k
  candidates; those ending in EOS (all of them at the last step) compete for the
  finished set by length-normalised score, the rest for the k live slots. The loop stops
  when no live hypothesis can beat the worst finished one (valid for alpha >= 0).
  """
  b, k = tokens.shape[0], beam
  leaf = lambda x: x is None
  state = jax.tree.map(
    lambda ax, x: x if ax is None else jnp.repeat(x, k, axis=ax), axes, state, is_leaf=leaf
  )  # batch B -> B * k
  tokens, positions = jnp.repeat(tokens, k), jnp.repeat(positions, k)  # [B * k]
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

  empty = jnp.zeros((b, k, length), jnp.int32)
  live_logprob = jnp.where(jnp.arange(k) == 0, 0.0, -jnp.inf) * jnp.ones((b, 1))  # [B, k]
  init = (0, tokens, state, empty, live_logprob, empty, jnp.full((b, k), -jnp.inf))
  *_, seqs, scores = lax.while_loop(cond, body, init)
  return DecodeResult(seqs[:, 0], scores[:, 0], _lengths(seqs[:, 0], eos_id), seqs, scores)


def _selector(sampling: Sampling | None):
  if sampling is None:
    return lambda logits, i: jnp.argmax(logits, axis=-1)
  rng, temperature, top_k, top_p = sampling
  return lambda logits, i: _sample(logits, jax.random.fold_in(rng, i), temperature, top_k, top_p)


# ----------------------------------------------------------------------------------------
# Jitted entry points (no input checking: see `generate` and `translate`). Static: the
# model, the length L and the beam size; eos_id = -1 means none.


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

  prompts: [B, P] left-padded; lengths: [B] real prompt lengths.
  """
  step, state, _, tokens, positions = _lm_start(model, params, prompts, lengths)
  return _decode_loop(step, state, tokens, positions, length, _selector(sampling), eos_id)


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
  """Beam search over L = `length` new tokens after left-padded prompts [B, P]."""
  step, state, axes, tokens, positions = _lm_start(model, params, prompts, lengths)
  return _beam_loop(step, state, axes, tokens, positions, length, beam_size, alpha, eos_id)


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
  """Greedy (sampling None) or sampled targets of L tokens for inputs [B, S] (0 = pad)."""
  step, state, _, tokens, positions = _seq2seq_start(model, params, inputs)
  return _decode_loop(step, state, tokens, positions, length, _selector(sampling), eos_id)


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
  """Beam search over targets of L = `length` tokens for inputs [B, S] (0 = pad)."""
  step, state, axes, tokens, positions = _seq2seq_start(model, params, inputs)
  return _beam_loop(step, state, axes, tokens, positions, length, beam_size, alpha, eos_id)


# ----------------------------------------------------------------------------------------
# Checked public API.


def _pad(rows: Sequence[Sequence[int]] | np.ndarray, length: int | None, left: bool, what: str):
  rows = [np.asarray(row) for row in rows]
  if not rows:
    raise ValueError(f"no {what}s given")
  for i, row in enumerate(rows):
    if row.ndim != 1 or row.size == 0:
      raise ValueError(f"{what} {i} must be a non-empty 1-D sequence of token ids")
    if row.dtype.kind not in "iu":
      raise ValueError(f"{what} {i} must hold integer token ids, got dtype {row.dtype}")
  lengths = np.array([row.size for row in rows], np.int32)
  p = int(lengths.max()) if length is None else length
  if p < lengths.max():
    raise ValueError(f"length={p} is shorter than the longest {what} ({lengths.max()})")
  out = np.full((len(rows), p), PAD_ID, np.int32)
  for i, row in enumerate(rows):
    if left:
      out[i, p - row.size :] = row
    else:
      out[i, : row.size] = row
  return out, lengths


def left_pad(
  prompts: Sequence[Sequence[int]] | np.ndarray, length: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
  """Ragged prompts -> (int32 [B, P] left-padded with PAD, int32 [B] real lengths).

  An array [B, P] is B prompts of P tokens each (nothing in it is taken as padding).
  P is the longest prompt, or `length` if given (to reuse one compilation).
  Raises ValueError for no prompts, an empty or non-integer prompt, or a short `length`.
  """
  return _pad(prompts, length, left=True, what="prompt")


def _unwrap(params: Any) -> Any:
  return params["params"] if isinstance(params, dict) and set(params) == {"params"} else params


def _check_tokens(tokens: np.ndarray, vocab: int, what: str) -> None:
  bad = (tokens < 0) | (tokens >= vocab)
  if bad.any():
    row, col = np.argwhere(bad)[0]
    raise ValueError(
      f"{what} row {row} holds token id {tokens[row, col]} outside the vocabulary [0, {vocab})"
    )


def _check_options(config, method, temperature, top_k, top_p, beam_size, alpha, eos_id, rng):
  if method not in METHODS:
    raise ValueError(f"method={method!r}: expected one of {', '.join(METHODS)}")
  if method == "sample":
    if temperature < 0:
      raise ValueError(f"temperature={temperature} must be >= 0")
    if top_k < 0 or not 0.0 < top_p <= 1.0:
      raise ValueError(f"top_k={top_k} must be >= 0 and top_p={top_p} in (0, 1]")
    if rng is None and temperature > 0:
      raise ValueError("method='sample' needs an rng (a jax PRNG key)")
  if method == "beam" and (beam_size < 1 or alpha < 0):
    raise ValueError(f"beam_size={beam_size} must be >= 1 and alpha={alpha} >= 0")
  if eos_id is not None and not 0 <= eos_id < config.vocab_size:
    raise ValueError(f"eos_id={eos_id} is outside the vocabulary [0, {config.vocab_size})")


def _run(decode, beam_search, args, length, method, sampling, beam_size, alpha, eos_id):
  eos = -1 if eos_id is None else eos_id
  if method == "beam":
    return beam_search(*args, length=length, beam_size=beam_size, alpha=alpha, eos_id=eos)
  greedy = method == "greedy" or sampling.temperature == 0
  return decode(*args, length=length, sampling=None if greedy else sampling, eos_id=eos)


def generate(
  model: DecoderLM,
  params: Any,
  prompts: Sequence[Sequence[int]] | np.ndarray,
  *,
  max_new_tokens: int,
  method: str = "greedy",
  temperature: float = 1.0,
  top_k: int = 0,
  top_p: float = 1.0,
  beam_size: int = 4,
  alpha: float = 0.6,
  eos_id: int | None = EOS_ID,
  rng: jax.Array | None = None,
  prompt_len: int | None = None,
) -> DecodeResult:
  """Continues each prompt of a DecoderLM by up to `max_new_tokens` tokens.

  prompts: B non-empty lists of token ids (any lengths), or an int array [B, P].
  method: 'greedy'; 'sample' (temperature, then top_k (0 = off), then top_p (1 = off);
    temperature 0 is greedy; seeded by the PRNG key `rng`); 'beam' (beam_size, GNMT
    length penalty exponent alpha >= 0). eos_id: None to always run max_new_tokens.
  prompt_len: left-pad to this length instead of the longest prompt, so batches of
    different prompt lengths share one compilation.
  Raises ValueError, before anything is compiled, for an empty or out-of-vocabulary
  prompt, longest prompt + max_new_tokens > config.max_len, or a bad option.
  Returns a DecodeResult with tokens [B, max_new_tokens] (new tokens only).
  """
  if not isinstance(model, DecoderLM):
    raise ValueError(f"generate needs a DecoderLM, got {type(model).__name__}")
  config = model.config
  _check_options(config, method, temperature, top_k, top_p, beam_size, alpha, eos_id, rng)
  tokens, lengths = left_pad(prompts, prompt_len)
  _check_tokens(tokens, config.vocab_size, "prompt")
  if max_new_tokens < 1 or tokens.shape[1] + max_new_tokens > config.max_len:
    raise ValueError(
      f"prompt length {tokens.shape[1]} + max_new_tokens={max_new_tokens} must be in "
      f"[{tokens.shape[1] + 1}, config.max_len={config.max_len}]"
    )
  sampling = Sampling(rng, temperature, top_k, top_p)
  args = (model, _unwrap(params), tokens, lengths)
  fns = (lm_decode, lm_beam_search)
  return _run(*fns, args, max_new_tokens, method, sampling, beam_size, alpha, eos_id)


def translate(
  model: EncoderDecoder,
  params: Any,
  inputs: Sequence[Sequence[int]] | np.ndarray,
  *,
  max_len: int | None = None,
  method: str = "greedy",
  beam_size: int = 4,
  alpha: float = 0.6,
  eos_id: int | None = EOS_ID,
  temperature: float = 1.0,
  top_k: int = 0,
  top_p: float = 1.0,
  rng: jax.Array | None = None,
) -> DecodeResult:
  """Decodes targets of up to `max_len` tokens (default config.max_len) for each source.

  inputs: int array [B, S] with PAD (0) as padding, or B lists (right-padded here).
  Options as in `generate`. Raises ValueError, before compiling, for an empty or
  out-of-vocabulary source, S or max_len beyond config.max_len, or a bad option.
  Returns a DecodeResult with tokens [B, max_len].
  """
  if not isinstance(model, EncoderDecoder):
    raise ValueError(f"translate needs an EncoderDecoder, got {type(model).__name__}")
  config = model.config
  _check_options(config, method, temperature, top_k, top_p, beam_size, alpha, eos_id, rng)
  if isinstance(inputs, np.ndarray | jax.Array) and np.ndim(inputs) == 2:
    tokens = np.asarray(inputs)
    if tokens.dtype.kind not in "iu":
      raise ValueError(f"inputs must hold integer token ids, got dtype {tokens.dtype}")
  else:
    tokens, _ = _pad(inputs, None, left=False, what="source")
  _check_tokens(tokens, config.vocab_size, "source")
  empty = np.flatnonzero((tokens != PAD_ID).sum(-1) == 0)
  if tokens.size == 0 or empty.size:
    raise ValueError(f"no sources, or source rows {empty.tolist()} empty (only PAD)")
  max_len = config.max_len if max_len is None else max_len
  if not 1 <= max_len <= config.max_len or tokens.shape[1] > config.max_len:
    raise ValueError(
      f"max_len={max_len} and source length {tokens.shape[1]} must be in "
      f"[1, config.max_len={config.max_len}]"
    )
  sampling = Sampling(rng, temperature, top_k, top_p)
  args = (model, _unwrap(params), tokens.astype(np.int32))
  fns = (seq2seq_decode, seq2seq_beam_search)
  return _run(*fns, args, max_len, method, sampling, beam_size, alpha, eos_id)

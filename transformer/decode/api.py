"""The checked decoding API: `generate` (DecoderLM) and `translate` (EncoderDecoder).

Letters: B batch, P prompt length, S source length.

Both validate everything (token ids, lengths against config.max_len, options) and raise
ValueError before anything is compiled, then call one jitted loop of `loops` or `beam`.
`left_pad` prepares ragged prompts for the unchecked `lm_decode` / `lm_beam_search`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from transformer.data.tokenizers import EOS_ID, PAD_ID
from transformer.decode.beam import lm_beam_search, seq2seq_beam_search
from transformer.decode.loops import DecodeResult, lm_decode, seq2seq_decode
from transformer.decode.sampling import Sampling, checked, unwrap
from transformer.nn.models import DecoderLM, EncoderDecoder

__all__ = ["check_tokens", "generate", "left_pad", "lower_generate", "translate"]

METHODS = ("greedy", "sample", "beam")


def _pad(rows: Sequence[Sequence[int]] | np.ndarray, length: int | None, left: bool, what: str):
  """(int32 [B, P] rows padded with PAD on the left or right, int32 [B] real lengths)."""
  rows = [np.asarray(row) for row in rows]
  if not rows:
    raise ValueError(f"no {what}s given")
  for i, row in enumerate(rows):
    if row.ndim != 1 or row.size == 0:
      raise ValueError(f"{what} {i} must be a non-empty 1-D sequence of token ids")
    if row.dtype.kind not in "iu":
      raise ValueError(f"{what} {i} must hold integer token ids, got dtype {row.dtype}")
  lengths = np.array([row.size for row in rows], np.int32)  # [B]
  p = int(lengths.max()) if length is None else length
  if p < lengths.max():
    raise ValueError(f"length={p} is shorter than the longest {what} ({lengths.max()})")
  out = np.full((len(rows), p), PAD_ID, np.int32)  # [B, P]
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

  The two arrays are the `prompts, lengths` arguments of `lm_decode` / `lm_beam_search`.
  An array [B, P] is B prompts of P tokens each (nothing in it is taken as padding).
  P is the longest prompt, or `length` if given (to reuse one compilation).
  Raises ValueError for no prompts, an empty or non-integer prompt, or a short `length`.
  """
  return _pad(prompts, length, left=True, what="prompt")


def check_tokens(tokens: np.ndarray, vocab: int, what: str) -> None:
  """Raises ValueError naming the first token id of `tokens` [B, P] outside [0, vocab)."""
  bad = (tokens < 0) | (tokens >= vocab)
  if bad.any():
    row, col = np.argwhere(bad)[0]
    raise ValueError(
      f"{what} row {row} holds token id {tokens[row, col]} outside the vocabulary [0, {vocab})"
    )


def _check_options(config, method, beam_size, alpha, eos_id):
  if method not in METHODS:
    raise ValueError(f"method={method!r}: expected one of {', '.join(METHODS)}")
  if method == "beam" and (beam_size < 1 or alpha < 0):
    raise ValueError(f"beam_size={beam_size} must be >= 1 and alpha={alpha} >= 0")
  if eos_id is not None and not 0 <= eos_id < config.vocab_size:
    raise ValueError(f"eos_id={eos_id} is outside the vocabulary [0, {config.vocab_size})")


def _program(decode, beam_search, args, length, method, sampling, beam_size, alpha, eos_id):
  """(the jitted loop, its arguments, its keyword arguments) that a call runs."""
  eos = -1 if eos_id is None else eos_id
  if method == "beam":
    return beam_search, args, dict(length=length, beam_size=beam_size, alpha=alpha, eos_id=eos)
  return decode, args, dict(length=length, sampling=sampling, eos_id=eos)


def _run(*program_args) -> DecodeResult:
  fn, args, kwargs = _program(*program_args)
  return fn(*args, **kwargs)


def generate(
  model: DecoderLM,
  params: Any,
  prompts: Sequence[Sequence[int]] | np.ndarray,
  *,
  max_new_tokens: int,
  method: str = "greedy",
  sampling: Sampling | None = None,
  beam_size: int = 4,
  alpha: float = 0.6,
  eos_id: int | None = EOS_ID,
  prompt_len: int | None = None,
) -> DecodeResult:
  """Continues each prompt of a DecoderLM by up to `max_new_tokens` tokens.

  prompts: B non-empty lists of token ids (any lengths), or an int array [B, P].
  method: 'greedy'; 'sample' (`sampling`: temperature, then top_k (0 = off), then top_p
    (1 = off); temperature 0 is greedy; seeded by the PRNG key `sampling.rng`); 'beam'
    (beam_size, GNMT length penalty exponent alpha >= 0). eos_id: None to always run
    max_new_tokens.
  prompt_len: left-pad to this length instead of the longest prompt, so batches of
    different prompt lengths share one compilation.
  Raises ValueError, before anything is compiled, for an empty or out-of-vocabulary
  prompt, longest prompt + max_new_tokens > config.max_len, or a bad option.
  Returns a DecodeResult with tokens [B, max_new_tokens] (new tokens only).
  """
  fn, args, kwargs = _lm_program(model, params, prompts, max_new_tokens, method, sampling,
                                 beam_size, alpha, eos_id, prompt_len)  # fmt: skip
  return fn(*args, **kwargs)


def lower_generate(
  model: DecoderLM,
  params: Any,
  prompts: Sequence[Sequence[int]] | np.ndarray,
  *,
  max_new_tokens: int,
  method: str = "greedy",
  sampling: Sampling | None = None,
  beam_size: int = 4,
  alpha: float = 0.6,
  eos_id: int | None = EOS_ID,
  prompt_len: int | None = None,
) -> jax.stages.Lowered:
  """The program `generate` runs with these arguments, lowered and not run: `.compile()`
  it to compile ahead, and the later `generate` call finds it compiled. `params` may be
  abstract (`jax.ShapeDtypeStruct`s with the shardings the real ones will have). Raises
  as `generate` does."""
  fn, args, kwargs = _lm_program(model, params, prompts, max_new_tokens, method, sampling,
                                 beam_size, alpha, eos_id, prompt_len)  # fmt: skip
  return fn.lower(*args, **kwargs)


def _lm_program(model, params, prompts, max_new_tokens, method, sampling, beam_size, alpha,
                eos_id, prompt_len):  # fmt: skip
  """`generate`'s checks, then (the jitted loop, its arguments, its keyword arguments)."""
  if not isinstance(model, DecoderLM):
    raise ValueError(f"generate needs a DecoderLM, got {type(model).__name__}")
  config = model.config
  _check_options(config, method, beam_size, alpha, eos_id)
  sampling = checked(method, sampling)
  tokens, lengths = left_pad(prompts, prompt_len)  # [B, P], [B]
  check_tokens(tokens, config.vocab_size, "prompt")
  if max_new_tokens < 1 or tokens.shape[1] + max_new_tokens > config.max_len:
    raise ValueError(
      f"prompt length {tokens.shape[1]} + max_new_tokens={max_new_tokens} must be in "
      f"[{tokens.shape[1] + 1}, config.max_len={config.max_len}]"
    )
  args = (model, unwrap(params), tokens, lengths)
  fns = (lm_decode, lm_beam_search)
  return _program(*fns, args, max_new_tokens, method, sampling, beam_size, alpha, eos_id)


def translate(
  model: EncoderDecoder,
  params: Any,
  inputs: Sequence[Sequence[int]] | np.ndarray,
  *,
  max_len: int | None = None,
  method: str = "greedy",
  sampling: Sampling | None = None,
  beam_size: int = 4,
  alpha: float = 0.6,
  eos_id: int | None = EOS_ID,
) -> DecodeResult:
  """Decodes targets of up to `max_len` tokens (default config.max_len) for each source.

  inputs: int array [B, S] with PAD as padding, or B lists (right-padded here).
  Options as in `generate`. Raises ValueError, before compiling, for an empty or
  out-of-vocabulary source, S or max_len beyond config.max_len, or a bad option.
  Returns a DecodeResult with tokens [B, max_len].
  """
  if not isinstance(model, EncoderDecoder):
    raise ValueError(f"translate needs an EncoderDecoder, got {type(model).__name__}")
  config = model.config
  _check_options(config, method, beam_size, alpha, eos_id)
  sampling = checked(method, sampling)
  if isinstance(inputs, np.ndarray | jax.Array) and np.ndim(inputs) == 2:
    tokens = np.asarray(inputs)  # [B, S]
    if tokens.dtype.kind not in "iu":
      raise ValueError(f"inputs must hold integer token ids, got dtype {tokens.dtype}")
  else:
    tokens, _ = _pad(inputs, None, left=False, what="source")  # [B, S]
  check_tokens(tokens, config.vocab_size, "source")
  empty = np.flatnonzero((tokens != PAD_ID).sum(-1) == 0)
  if tokens.size == 0 or empty.size:
    raise ValueError(f"no sources, or source rows {empty.tolist()} empty (only PAD)")
  max_len = config.max_len if max_len is None else max_len
  if not 1 <= max_len <= config.max_len or tokens.shape[1] > config.max_len:
    raise ValueError(
      f"max_len={max_len} and source length {tokens.shape[1]} must be in "
      f"[1, config.max_len={config.max_len}]"
    )
  args = (model, unwrap(params), tokens.astype(np.int32))
  fns = (seq2seq_decode, seq2seq_beam_search)
  return _run(*fns, args, max_len, method, sampling, beam_size, alpha, eos_id)

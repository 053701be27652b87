"""Autoregressive decoding on the KV cache: greedy, sampling (temperature, top-k, top-p), beam.

Letters: B batch, P prompt length, L generated length, S source length, V vocabulary,
k beam size.

Checked API (validates its input, raises ValueError before compiling):
  generate(model, params, prompts, ...)   DecoderLM: continue prompts of any lengths.
  translate(model, params, inputs, ...)   EncoderDecoder: decode targets for sources.
  lower_generate(...)                     what `generate` would run, lowered (to compile
                                          ahead; the parameters may be abstract).
  DecodeResult: tokens [B, L], scores [B], lengths [B] (+ beams [B, k, L] for beam).

Jitted loops, unchecked (static: the model, L, k and the initial cache length; every
other option is traced, so changing it does not recompile):
  lm_decode / seq2seq_decode (greedy, or sampled given a `Sampling`),
  lm_beam_search / seq2seq_beam_search; `left_pad` prepares prompts for the lm_ loops,
  `init_cache` builds the zeroed cache of a model for B rows (and S source positions),
  `cache_lengths` the cache lengths a loop goes through as the cache fills.
  The loops follow their inputs' sharding: prompts sharded by row over a mesh (parameters
  replicated) decode data-parallel, each device its own rows (docs/PERFORMANCE.md,
  "Batched decoding on two CPU devices").

Token selection, usable alone on logits [..., V]: top_k_filter, top_p_filter, sample,
argmax.

Files: sampling (filters, draws), cache (the cache, its growth, each family's prefill and
cached step; cross-attention keys and values once per source), loops (greedy / sampled
while loops over the growing cache), beam (beam search), api (checks, padding).
"""

from transformer.decode.api import generate, left_pad, lower_generate, translate
from transformer.decode.beam import lm_beam_search, seq2seq_beam_search
from transformer.decode.cache import cache_lengths, init_cache
from transformer.decode.loops import DecodeResult, lm_decode, seq2seq_decode
from transformer.decode.sampling import Sampling, argmax, sample, top_k_filter, top_p_filter

__all__ = [
  "DecodeResult",
  "Sampling",
  "argmax",
  "cache_lengths",
  "generate",
  "init_cache",
  "left_pad",
  "lm_beam_search",
  "lm_decode",
  "lower_generate",
  "sample",
  "seq2seq_beam_search",
  "seq2seq_decode",
  "top_k_filter",
  "top_p_filter",
  "translate",
]

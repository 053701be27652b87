"""Decoding speed: the reference GPT (greedy) and a seq2seq model of its size (beam 4).

  python benchmarks/decode.py                       # defaults below, ~2 min
  python benchmarks/decode.py --batch-sizes 1 --new-tokens 64 --no-cache-steps 16 --rounds 3

GPT (V=4096, D=256, 4 layers, max_len 512; 16-token prompts, 256 new tokens):
- "KV cache": `transformer.decode.lm_decode`, a jitted program that prefills the prompt
  and runs the steps in while loops over a cache that doubles as it fills
  (`decode.cache_lengths`). "no cache": a jitted loop running the full forward pass over
  a fixed [B, prompt + new] buffer every step (positions beyond the current token are
  PAD, invisible to the causal mask) and taking the argmax at the current position; its
  step cost does not depend on the step, so `--no-cache-steps` may time fewer steps.
- Per-token times: the same prefill and cached step, jitted, called from Python once per
  token (cache donated; grown between steps where the loop grows it, the growth counted
  in the token that needs it), so each token is timed on its own; they include the
  per-call dispatch that the while loop avoids. Token 1 comes from the prefill, so the
  first window averages the steps of tokens 2-32.
- Batch scaling bound: the step's weight matmuls ([B, in] x [in, out], each jitted and
  timed alone, less an empty call's dispatch) at the smallest and largest batch. Their
  sum at the large batch is a floor under its step, so B x (small-batch step) / (that
  sum) bounds the throughput ratio the KV-cache loop can reach.

Seq2seq (encoder-decoder of the GPT's size, 4 + 4 layers; sources [B, S], beam 4):
- "cross K/V cached": `decode.seq2seq_beam_search`: each decoder layer projects the
  encoder output into cross-attention keys and values once per source, in the prefill,
  and the beams of a source share them.
- "cross K/V re-projected": the same beam search as decoding worked before that cache:
  the encoder output repeated per beam and reordered with the beams, and every step
  projecting it again in every layer. Both must give the same beams (checked).

Random weights, no EOS: every row generates all tokens. Calls alternate between the
variants (one call each per round, after a warm-up call that compiles); the tables give
the first call (compilation included) and the median of --rounds calls. Prints Markdown.
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from transformer import decode
from transformer.data.tokenizers import NUM_SPECIAL, PAD_ID
from transformer.decode.cache import Start
from transformer.nn import cache_attention
from transformer.nn.config import ModelConfig
from transformer.nn.models import DecoderLM, EncoderDecoder
from transformer.train.machine import cpu_isa


def parse_args() -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--vocab", type=int, default=4096)
  p.add_argument("--d-model", type=int, default=256)
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--d-ff", type=int, default=1024)
  p.add_argument("--max-len", type=int, default=512)
  p.add_argument("--prompt-len", type=int, default=16)
  p.add_argument("--new-tokens", type=int, default=256)
  p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
  p.add_argument("--no-cache-steps", type=int, default=16, help="steps the no-cache loop times")
  p.add_argument("--initial-cache", type=int, default=decode.cache.INITIAL_CACHE_LEN)
  p.add_argument("--rounds", type=int, default=5, help="timed calls per variant (median)")
  p.add_argument(
    "--windows", default="1-32,97-128,225-256", help="token ranges (1-based) to average"
  )
  p.add_argument("--s2s-batch", type=int, default=8, help="seq2seq sources (0: skip)")
  p.add_argument("--source-len", type=int, default=64)
  p.add_argument("--target-len", type=int, default=64)
  p.add_argument("--beam", type=int, default=4)
  p.add_argument("--dtype", default="float32")
  return p.parse_args()


def alternate(fns: dict, rounds: int) -> dict:
  """name -> (first call s incl. compilation, median s of `rounds` calls), the calls of
  all variants alternating, one each per round."""
  first, times = {}, {name: [] for name in fns}
  for name, fn in fns.items():
    start = time.perf_counter()
    jax.block_until_ready(fn())
    first[name] = time.perf_counter() - start
  for _ in range(rounds):
    for name, fn in fns.items():
      start = time.perf_counter()
      jax.block_until_ready(fn())
      times[name].append(time.perf_counter() - start)
  return {name: (first[name], float(np.median(times[name]))) for name in fns}


def no_cache_decode(model: DecoderLM, steps: int):
  """Greedy loop recomputing the whole prefix: buffer [B, T] with the prompt in front."""

  @jax.jit
  def run(params, buffer, prompt_len):
    def body(i, buffer):
      logits = model.apply({"params": params}, buffer)  # [B, T, V]
      current = jax.lax.dynamic_index_in_dim(logits, prompt_len + i - 1, 1, False)  # [B, V]
      new = jnp.argmax(current, -1).astype(buffer.dtype)  # [B]
      return jax.lax.dynamic_update_index_in_dim(buffer, new, prompt_len + i, 1)

    return jax.lax.fori_loop(0, steps, body, buffer)

  return run


def per_token_runner(model: DecoderLM, params, prompts: np.ndarray, new_tokens: int, initial):
  """A function timing each cached step of a greedy decode; returns (seconds [L - 1] of
  the steps giving tokens 2..L, cache length after each of them)."""
  b, p = prompts.shape
  sizes = decode.cache_lengths(p, new_tokens, initial)

  @jax.jit
  def prefill(params, prompts):
    variables = {"params": params, "cache": decode.init_cache(model, b, sizes[0])}
    logits, variables = model.apply(
      variables, prompts, decode=True, last_logits=True, mutable=["cache"]
    )  # [B, 1, V]
    return decode.argmax(logits[:, 0]), variables["cache"]

  def step(params, cache, tokens, positions):
    logits, variables = model.apply(
      {"params": params, "cache": cache}, tokens, positions, decode=True, mutable=["cache"]
    )  # [B, 1, V]
    return decode.argmax(logits[:, 0])[:, None], variables["cache"]

  step = jax.jit(step, donate_argnums=1)
  grow = jax.jit(decode.cache.resize, static_argnums=1)

  def run():
    tokens, cache = prefill(params, jnp.asarray(prompts))
    tokens = tokens[:, None]  # [B, 1]
    jax.block_until_ready(tokens)
    times, lengths, size = [], [], 0
    for i in range(1, new_tokens):
      positions = jnp.full((b, 1), p + i - 1, jnp.int32)
      start = time.perf_counter()
      if p + i - 1 >= sizes[size]:  # the slot of token i - 1 is past the cache: grow it
        size += 1
        cache = grow(cache, sizes[size])
      tokens, cache = step(params, cache, tokens, positions)
      jax.block_until_ready(tokens)
      times.append(time.perf_counter() - start)
      lengths.append(sizes[size])
    return np.asarray(times), np.asarray(lengths)

  return run


def weight_dots_ms(a, batch: int, rounds: int) -> float:
  """ms of one decoding step's weight matmuls at `batch` rows, each [batch, in] x [in, out]
  jitted and timed alone (median of `rounds` loops of 200 calls), summed over the layers
  and the output layer: q, k, v and output projections, the two feed-forward matmuls and
  the [D, V] logits, less the time of a call that does nothing (the dispatch a while
  loop does not pay). A floor under the step's time with the weights hot in cache."""
  d, f, v, n = a.d_model, a.d_ff, a.vocab, a.layers

  def call_s(fn, *args) -> float:
    fn = jax.jit(fn)
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(rounds):
      start = time.perf_counter()
      for _ in range(200):
        out = fn(*args)
      jax.block_until_ready(out)
      times.append((time.perf_counter() - start) / 200)
    return float(np.median(times))

  empty = call_s(lambda x: x, jnp.ones((1,), a.dtype))
  total = 0.0
  for k, m, count in [(d, d, 4 * n), (d, f, n), (f, d, n), (d, v, 1)]:  # (in, out, count)
    x, w = jnp.ones((batch, k), a.dtype), jnp.ones((k, m), a.dtype)
    total += count * max(call_s(jnp.matmul, x, w) - empty, 0.0)
  return 1e3 * total


def reprojecting_start(model: EncoderDecoder, params, inputs: jax.Array, cache_length: int):
  """The seq2seq Start of decoding before the cross-attention cache: the encoder output
  and source segments travel with the cache (repeated per beam, reordered with the
  beams) and every step passes them to the decoder, which projects them again."""
  b, s = inputs.shape
  segments = (inputs != PAD_ID).astype(jnp.int32)  # [B, S]
  encoded = model.apply({"params": params}, inputs, segments, method="encode")  # [B, S, D]

  def step(state, tokens, positions):
    reproject = decode.cache.seq2seq_step(model, params, state["segments"], state["encoded"])
    logits, cache = reproject(state["cache"], tokens, positions)  # [B, V]
    return logits, dict(state, cache=cache)

  cache = decode.init_cache(model, b, cache_length, s)
  state = {"cache": cache, "encoded": encoded, "segments": segments}
  logits, state = step(state, jnp.full((b,), PAD_ID, jnp.int32), jnp.zeros((b,), jnp.int32))
  shared = decode.cache.seq2seq_start(model, params, inputs, cache_length).axes
  batch_axis = lambda path, ax: 0 if cache_attention.is_source_leaf(path) else ax
  axes = jax.tree_util.tree_map_with_path(batch_axis, shared, is_leaf=lambda x: x is None)
  axes = {"cache": axes, "encoded": 0, "segments": 0}  # everything per beam
  return Start(step, state, axes, logits, jnp.ones((b,), jnp.int32), 1)


@functools.partial(jax.jit, static_argnames=("model", "length", "beam"))
def reprojecting_beam_search(model, params, inputs, *, length: int, beam: int):
  sizes = decode.cache_lengths(1, length)
  start = reprojecting_start(model, params, inputs, sizes[0])
  return decode.beam.beam_loop(start, length, beam, 0.6, -1, sizes)


def gpt(a, config: ModelConfig):
  model = DecoderLM(config)
  params = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
  n_params = sum(x.size for x in jax.tree.leaves(params))
  steps = a.no_cache_steps or a.new_tokens
  rng = np.random.default_rng(0)
  fns, per_token = {}, {}
  for b in a.batch_sizes:
    prompts = rng.integers(NUM_SPECIAL, a.vocab, (b, a.prompt_len)).astype(np.int32)
    lengths = np.full(b, a.prompt_len, np.int32)
    run = functools.partial(
      decode.lm_decode, model, params, prompts, lengths, length=a.new_tokens,
      initial_cache_len=a.initial_cache,
    )  # fmt: skip
    fns[("KV cache", b)] = lambda run=run: run().tokens
    buffer = np.zeros((b, a.prompt_len + a.new_tokens), np.int32)
    buffer[:, : a.prompt_len] = prompts
    full = no_cache_decode(model, steps)
    fns[("no cache (full prefix)", b)] = lambda f=full, x=buffer: f(params, x, a.prompt_len)
    per_token[b] = per_token_runner(model, params, prompts, a.new_tokens, a.initial_cache)
  results = alternate(fns, a.rounds)
  per_token[a.batch_sizes[0]]()  # compile every cache length of the steps
  for b in a.batch_sizes[1:]:
    per_token[b]()
  times = {b: [] for b in a.batch_sizes}
  for _ in range(a.rounds):
    for b in a.batch_sizes:
      step_times, cache_lengths = per_token[b]()
      times[b].append(step_times)
  windows = [tuple(int(x) for x in w.split("-")) for w in a.windows.split(",")]

  print(
    f"\nGPT V={a.vocab} D={a.d_model} L={a.layers} N={a.heads} F={a.d_ff} "
    f"max_len={a.max_len} ({n_params / 1e6:.2f}M params, {a.dtype}), prompt {a.prompt_len} "
    f"tokens, greedy, {jax.devices()[0].platform} x{jax.local_device_count()}; "
    f"cache lengths {decode.cache_lengths(a.prompt_len, a.new_tokens, a.initial_cache)}\n"
  )
  print("| decoding | batch | new tokens timed | first call s (compile) | median s | tokens/s |")
  print("| --- | ---: | ---: | ---: | ---: | ---: |")
  tps = {}
  for (name, b), (first, median) in results.items():
    n = a.new_tokens if name == "KV cache" else steps
    tps[name, b] = b * n / median
    print(f"| {name} | {b} | {n} | {first:.2f} | {median:.3f} | {tps[name, b]:,.0f} |")
  lo, hi = min(a.batch_sizes), max(a.batch_sizes)
  if lo != hi:
    ratio = tps["KV cache", hi] / tps["KV cache", lo]
    print(f"\nKV cache: batch {hi} throughput / batch {lo} = {ratio:.2f}")
    dots = {b: weight_dots_ms(a, b, a.rounds) for b in (lo, hi)}
    step_lo = 1e3 * lo / tps["KV cache", lo]  # ms per step at the small batch
    print(
      f"Weight matmuls of one step, each timed alone: {dots[lo]:.3f} ms at batch {lo}, "
      f"{dots[hi]:.3f} ms at batch {hi}. Even if nothing else cost anything, batch {hi} "
      f"could reach at most {hi * step_lo / dots[hi]:.1f}x batch {lo}'s measured "
      f"{step_lo:.3f} ms per step."
    )
  print("\nPer-token time with the KV cache (ms, median over rounds; cache length in brackets):\n")
  print("| batch | " + " | ".join(f"tokens {lo}-{hi}" for lo, hi in windows) + " |")
  print("| ---: | " + " | ".join("---:" for _ in windows) + " |")
  for b in a.batch_sizes:
    ms = 1e3 * np.median(np.stack(times[b]), axis=0)  # [L - 1] steps of tokens 2..L
    cells = []
    for lo, hi in windows:
      sl = slice(max(lo, 2) - 2, hi - 1)
      sizes = sorted(set(cache_lengths[sl].tolist()))
      cells.append(f"{ms[sl].mean():.2f} ({'/'.join(map(str, sizes))})")
    print(f"| {b} | " + " | ".join(cells) + " |")


def seq2seq(a, config: ModelConfig):
  model = EncoderDecoder(config.replace(family="seq2seq"))
  tokens = jnp.ones((1, 8), jnp.int32)
  params = jax.jit(model.init)(jax.random.key(1), tokens, tokens)["params"]
  rng = np.random.default_rng(1)
  inputs = rng.integers(NUM_SPECIAL, a.vocab, (a.s2s_batch, a.source_len)).astype(np.int32)
  inputs[1::2, a.source_len // 2 :] = PAD_ID  # every other source half padded
  kwargs = dict(length=a.target_len)
  cached = functools.partial(
    decode.seq2seq_beam_search, model, params, inputs, beam_size=a.beam, **kwargs
  )
  again = functools.partial(reprojecting_beam_search, model, params, inputs, beam=a.beam, **kwargs)
  results = alternate(
    {"cross K/V cached once per source": lambda: cached().beams,
     "cross K/V re-projected every step": lambda: again().beams},
    a.rounds,
  )  # fmt: skip
  np.testing.assert_array_equal(cached().beams, again().beams)
  print(
    f"\nSeq2seq {a.layers} + {a.layers} layers, D={a.d_model}, beam {a.beam}: {a.s2s_batch} "
    f"sources of {a.source_len} tokens (every other half PAD), {a.target_len} target tokens\n"
  )
  print("| beam search | first call s (compile) | median s | target tokens/s | speed-up |")
  print("| --- | ---: | ---: | ---: | ---: |")
  slow = results["cross K/V re-projected every step"][1]
  for name, (first, median) in results.items():
    tps = a.s2s_batch * a.target_len / median
    print(f"| {name} | {first:.2f} | {median:.3f} | {tps:,.0f} | {slow / median:.2f}x |")


def main() -> None:
  a = parse_args()
  if a.prompt_len + a.new_tokens > a.max_len:
    raise SystemExit(f"--prompt-len + --new-tokens must be <= --max-len={a.max_len}")
  config = ModelConfig(
    family="decoder",
    vocab_size=a.vocab,
    d_model=a.d_model,
    num_layers=a.layers,
    num_heads=a.heads,
    d_ff=a.d_ff,
    max_len=a.max_len,
    dtype=a.dtype,
  )
  print(f"CPU: {cpu_isa()}; jax {jax.__version__}")
  gpt(a, config)
  if a.s2s_batch:
    seq2seq(a, config)


if __name__ == "__main__":
  main()

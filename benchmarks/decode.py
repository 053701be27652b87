"""Greedy decoding speed of the reference GPT with the KV cache and without it.

  python benchmarks/decode.py                        # V=4096, D=256, 4 layers, 256 new tokens
  python benchmarks/decode.py --batch-sizes 1 --new-tokens 64 --no-cache-steps 16

"cache": `transformer.decode.lm_decode`, a jitted while loop that prefills the prompt
and then feeds one token per step to the cached model. "no cache": a jitted while loop
that runs the full forward pass over a fixed [B, prompt + new] buffer every step
(positions beyond the current token are PAD, invisible to the causal mask) and takes the
argmax at the current position, so it compiles once; its step cost does not depend on
the step, so `--no-cache-steps` may time fewer steps than --new-tokens over the same
buffer. Random weights, no EOS: every row generates all tokens. Times are the minimum
over --repeats calls after a warm-up (compilation) call.

Per-token times: one jitted cached step (apply + argmax, cache donated) called from
Python for each new token, so each token can be timed on its own; they include the
per-call dispatch overhead that the while loop avoids. Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from transformer import decode
from transformer.data.tokenizers import NUM_SPECIAL
from transformer.nn.config import ModelConfig
from transformer.nn.models import DecoderLM


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
  p.add_argument("--no-cache-steps", type=int, default=None, help="default: --new-tokens")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument(
    "--windows", default="1-32,97-128,225-256", help="token ranges (1-based) to average"
  )
  p.add_argument("--dtype", default="float32")
  return p.parse_args()


def timed(fn, repeats: int) -> tuple[float, float]:
  """(first call seconds incl. compilation, best of `repeats` later calls)."""
  start = time.perf_counter()
  jax.block_until_ready(fn())
  first = time.perf_counter() - start
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - start)
  return first, best


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


def per_token_times(model: DecoderLM, params, prompts: np.ndarray, new_tokens: int) -> np.ndarray:
  """Seconds of each of the `new_tokens` cached steps, timed one by one."""
  b, p = prompts.shape

  @jax.jit
  def prefill(params, cache, prompts):
    _, variables = model.apply(
      {"params": params, "cache": cache}, prompts[:, :-1], decode=True, mutable=["cache"]
    )
    return variables["cache"]

  def step(params, cache, tokens, positions):
    logits, variables = model.apply(
      {"params": params, "cache": cache}, tokens, positions, decode=True, mutable=["cache"]
    )  # [B, 1, V]
    return jnp.argmax(logits, -1).astype(jnp.int32), variables["cache"]

  step = jax.jit(step, donate_argnums=1)
  cache = prefill(params, decode.init_cache(model, b), jnp.asarray(prompts))
  tokens = jnp.asarray(prompts[:, -1:])
  jax.block_until_ready(step(params, jax.tree.map(jnp.copy, cache), tokens, tokens))  # compile
  times = []
  for i in range(new_tokens):
    positions = jnp.full((b, 1), p - 1 + i, jnp.int32)
    start = time.perf_counter()
    tokens, cache = step(params, cache, tokens, positions)
    jax.block_until_ready(tokens)
    times.append(time.perf_counter() - start)
  return np.asarray(times)


def main() -> None:
  a = parse_args()
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
  model = DecoderLM(config)
  if a.prompt_len + a.new_tokens > a.max_len:
    raise SystemExit(f"--prompt-len + --new-tokens must be <= --max-len={a.max_len}")
  params = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
  n_params = sum(x.size for x in jax.tree.leaves(params))
  steps = a.no_cache_steps or a.new_tokens
  windows = [tuple(int(x) for x in w.split("-")) for w in a.windows.split(",")]
  rng = np.random.default_rng(0)
  throughput, per_token = [], []
  for b in a.batch_sizes:
    prompts = rng.integers(NUM_SPECIAL, a.vocab, (b, a.prompt_len)).astype(np.int32)
    lengths = np.full(b, a.prompt_len, np.int32)

    def cached(prompts=prompts, lengths=lengths):
      return decode.lm_decode(model, params, prompts, lengths, length=a.new_tokens).tokens

    first, best = timed(cached, a.repeats)
    throughput.append(("KV cache", b, a.new_tokens, first, best, b * a.new_tokens / best))

    buffer = np.zeros((b, a.prompt_len + a.new_tokens), np.int32)
    buffer[:, : a.prompt_len] = prompts
    run = no_cache_decode(model, steps)
    first, best = timed(lambda run=run, buffer=buffer: run(params, buffer, a.prompt_len), a.repeats)
    throughput.append(("no cache (full prefix)", b, steps, first, best, b * steps / best))

    times = per_token_times(model, params, prompts, a.new_tokens)
    per_token.append((b, [1e3 * times[lo - 1 : hi].mean() for lo, hi in windows]))

  print(
    f"\nGPT V={a.vocab} D={a.d_model} L={a.layers} N={a.heads} F={a.d_ff} "
    f"max_len={a.max_len} ({n_params / 1e6:.2f}M params, {a.dtype}), prompt {a.prompt_len} "
    f"tokens, greedy, {jax.devices()[0].platform} x{jax.local_device_count()}\n"
  )
  print("| decoding | batch | new tokens timed | first call s (compile) | best s | tokens/s |")
  print("| --- | ---: | ---: | ---: | ---: | ---: |")
  for name, b, n, first, best, tps in throughput:
    print(f"| {name} | {b} | {n} | {first:.2f} | {best:.3f} | {tps:,.0f} |")
  print("\nPer-token time with the KV cache (ms, one jitted step per token, incl. dispatch):\n")
  print("| batch | " + " | ".join(f"tokens {lo}-{hi}" for lo, hi in windows) + " |")
  print("| ---: | " + " | ".join("---:" for _ in windows) + " |")
  for b, ms in per_token:
    print(f"| {b} | " + " | ".join(f"{m:.2f}" for m in ms) + " |")


if __name__ == "__main__":
  main()

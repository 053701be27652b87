"""Multi-head latent attention against full attention: cache bytes per token and decoding
speed, greedy, at batch 1 and 16.

  python benchmarks/mla_decode.py                    # defaults below, ~3 min on 2 cores
  python benchmarks/mla_decode.py --batch-sizes 1 --new-tokens 64 --rounds 3

Three decoders alike but for their attention (V=4096, D=512, 4 layers, N=8 heads, F=2048,
max_len 512; 16-token prompts, 256 new tokens, random weights, no EOS):
- "MHA": 8 key/value heads of 64, the cache 2 N H numbers per layer and token;
- "GQA": 2 key/value heads of 64 (2 K H);
- "MLA": DeepSeek-V3's attention at this width (`mla_kv_rank` C=128, `mla_rope_dim` R=32,
  64 unrotated and 64 value features per head, queries through a rank-192 latent); the
  cache holds the latent and the rope key, C + R numbers (`nn/mla.py`).
Cache bytes are read from the shapes of each model's own cache (`decode.init_cache`).
Speed: `decode.lm_decode` (prefill, then while-loop steps over a cache that grows),
the variants' calls alternating, one each per round after a compiling call; the median
of --rounds. Prints Markdown with the CPU's flags.
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np
from decode import alternate

from transformer import decode
from transformer.data.tokenizers import NUM_SPECIAL
from transformer.nn.config import ModelConfig
from transformer.nn.models import DecoderLM
from transformer.train.machine import cpu_isa

VARIANTS = {
  "MHA": dict(attention_head_dim=64),
  "GQA": dict(attention_head_dim=64, num_kv_heads=2),
  "MLA": dict(attention_head_dim=64, mla_kv_rank=128, mla_rope_dim=32, mla_q_rank=192),
}


def parse_args() -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--prompt-len", type=int, default=16)
  p.add_argument("--new-tokens", type=int, default=256)
  p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
  p.add_argument("--rounds", type=int, default=5, help="timed calls per variant (median)")
  p.add_argument("--dtype", default="float32")
  return p.parse_args()


def config(a, fields) -> ModelConfig:
  return ModelConfig(
    family="decoder", vocab_size=4096, d_model=512, num_layers=4, num_heads=8, d_ff=2048,
    max_len=512, position="rope", dtype=a.dtype, **fields,
  )  # fmt: skip


def cache_bytes_per_token(model: DecoderLM) -> int:
  """Bytes of the self-attention cache per slot, all layers, one row (positions, segment
  ids and the index left out: every variant has them)."""
  cache = decode.init_cache(model, batch=1, length=64)
  leaves = jax.tree_util.tree_leaves_with_path(cache)
  kept = [x for path, x in leaves if jax.tree_util.keystr(path).split("'")[-2].startswith(
    ("cached_key", "cached_value", "cached_latent")
  )]  # fmt: skip
  return sum(x.size * x.dtype.itemsize for x in kept) // 64


def main() -> None:
  a = parse_args()
  print(f"CPU: {cpu_isa()}; jax {jax.__version__}; {a.dtype}\n")
  rng = np.random.default_rng(0)
  fns, sizes = {}, {}
  for name, fields in VARIANTS.items():
    model = DecoderLM(config(a, fields))
    params = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
    sizes[name] = (sum(x.size for x in jax.tree.leaves(params)), cache_bytes_per_token(model))
    for b in a.batch_sizes:
      prompts = rng.integers(NUM_SPECIAL, 4096, (b, a.prompt_len)).astype(np.int32)
      lengths = np.full(b, a.prompt_len, np.int32)
      run = functools.partial(
        decode.lm_decode, model, params, prompts, lengths, length=a.new_tokens
      )
      fns[name, b] = lambda run=run: run().tokens
  results = alternate(fns, a.rounds)
  print("| attention | parameters | cache bytes per token (4 layers) | MHA's / this |")
  print("| --- | ---: | ---: | ---: |")
  for name, (params, nbytes) in sizes.items():
    print(f"| {name} | {params / 1e6:.2f}M | {nbytes:,} | {sizes['MHA'][1] / nbytes:.1f} |")
  print(f"\n{a.new_tokens} new tokens after {a.prompt_len}-token prompts, greedy:\n")
  print("| attention | batch | first call s (compile) | median s | tokens/s |")
  print("| --- | ---: | ---: | ---: | ---: |")
  for (name, b), (first, median) in results.items():
    print(f"| {name} | {b} | {first:.2f} | {median:.3f} | {b * a.new_tokens / median:,.0f} |")


if __name__ == "__main__":
  main()

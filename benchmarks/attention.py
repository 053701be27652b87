"""Time and peak memory of each attention implementation, forward and forward+backward.

  python benchmarks/attention.py                       # B=1, N=4, H=64, causal, float32
  python benchmarks/attention.py --lengths 512 1024 --impls chunked --chunk-size 256

Memory is read from the compiled executable (`compiled.memory_analysis()`), not from the
process: "peak" is arguments + outputs + XLA temporaries - aliased bytes, the buffer
footprint of one call. The causal mask comes from a `MaskInfo`, so the chunked version
never builds a dense [T, S] mask. An implementation whose compiled footprint exceeds
--max-gb is not run (its memory is still reported from the compiled executable); one whose
score matrices alone would exceed the limit is not even compiled. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

from transformer.nn.kernels import dot_product_attention
from transformer.nn.masks import MaskInfo

GiB = 1024**3
MiB = 1024**2


def parse_args() -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
  p.add_argument("--impls", nargs="+", default=["xla", "jax", "chunked"])
  p.add_argument("--batch", type=int, default=1)
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--head-dim", type=int, default=64)
  p.add_argument("--chunk-size", type=int, default=512)
  p.add_argument("--max-gb", type=float, default=8.0, help="skip runs needing more memory")
  p.add_argument("--min-time", type=float, default=1.0, help="seconds of timed calls per cell")
  p.add_argument("--max-repeats", type=int, default=5)
  return p.parse_args()


def make_fns(impl: str, chunk_size: int):
  def forward(q, k, v, info):
    return dot_product_attention(q, k, v, mask_info=info, impl=impl, chunk_size=chunk_size)

  def loss(q, k, v, info):
    return forward(q, k, v, info).sum()

  return {"fwd": forward, "fwd+bwd": jax.grad(loss, argnums=(0, 1, 2))}


def footprint(compiled) -> tuple[int, int]:
  """(temp bytes, peak bytes) of one call of a compiled executable."""
  m = compiled.memory_analysis()
  peak = (
    m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
  )
  return m.temp_size_in_bytes, peak


def time_call(compiled, args, min_time: float, max_repeats: int) -> float:
  """Fastest of up to max_repeats timed calls (at least min_time seconds), after a warm-up."""
  jax.block_until_ready(compiled(*args))
  best, spent, n = float("inf"), 0.0, 0
  while n < max_repeats and (n == 0 or spent < min_time):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    elapsed = time.perf_counter() - start
    best, spent, n = min(best, elapsed), spent + elapsed, n + 1
  return best


def main() -> None:
  a = parse_args()
  b, n, h = a.batch, a.heads, a.head_dim
  rows = []
  for t in a.lengths:
    key_q, key_k, key_v = jax.random.split(jax.random.key(t), 3)
    q = jax.random.normal(key_q, (b, t, n, h), jnp.float32)  # [B, T, N, H]
    k = jax.random.normal(key_k, (b, t, n, h), jnp.float32)  # [B, S, N, H]
    v = jax.random.normal(key_v, (b, t, n, h), jnp.float32)  # [B, S, N, H]
    positions = jnp.broadcast_to(jnp.arange(t), (b, t))
    info = MaskInfo(positions, positions, causal=True)  # causal, no segments
    args = (q, k, v, info)
    for impl in a.impls:
      for mode, fn in make_fns(impl, a.chunk_size).items():
        row = dict(impl=impl, mode=mode, T=t)
        scores = b * n * t * t * 4  # one float32 [B, N, T, S] array
        if impl != "chunked" and scores > a.max_gb * GiB:
          row.update(note=f"skipped: one [B,N,T,S] array is {scores / GiB:.1f} GiB")
          rows.append(row)
          continue
        compiled = jax.jit(fn).lower(*args).compile()
        temp, peak = footprint(compiled)
        row.update(temp=temp, peak=peak)
        if peak > a.max_gb * GiB:
          row.update(note=f"not run: needs {peak / GiB:.1f} GiB > {a.max_gb:g} GiB")
        else:
          row.update(ms=1e3 * time_call(compiled, args, a.min_time, a.max_repeats))
        rows.append(row)
        print(_row_text(row), flush=True)
  print()
  print(
    f"B={b}, N={n}, H={h}, causal MaskInfo, float32, chunk {a.chunk_size}, "
    f"{jax.devices()[0].platform.upper()} ({jax.device_count()} device(s))"
  )
  print()
  print("| impl | pass | T | time (ms, best) | XLA temp (MiB) | peak (MiB) | note |")
  print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
  for row in rows:
    print(_row_text(row))


def _row_text(row: dict) -> str:
  ms = f"{row['ms']:.1f}" if "ms" in row else "-"
  temp = f"{row['temp'] / MiB:.1f}" if "temp" in row else "-"
  peak = f"{row['peak'] / MiB:.1f}" if "peak" in row else "-"
  return (
    f"| {row['impl']} | {row['mode']} | {row['T']} | {ms} | {temp} | {peak} "
    f"| {row.get('note', '')} |"
  )


if __name__ == "__main__":
  main()

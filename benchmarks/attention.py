"""Time and peak memory of each attention implementation, forward and forward+backward,
without a position bias and with the ALiBi / T5 / Shaw biases.

  python benchmarks/attention.py                       # B=1, N=4, H=64, causal, float32
  python benchmarks/attention.py --lengths 1024 2048 4096 8192 --positions alibi relative_t5 \\
      --impls xla chunked --memory-only
  python benchmarks/attention.py --lengths 512 1024 --impls chunked --chunk-size 256

Memory is read from the compiled executable (`compiled.memory_analysis()`), not from the
process: "peak" is arguments + outputs + XLA temporaries - aliased bytes, the buffer
footprint of one call. The causal mask comes from a `MaskInfo` and the position bias from
the position's `BlockBias` (built through its `bias` hook, as `MultiHeadAttention` does),
so the chunked version builds neither a dense [T, S] mask nor a dense bias; the others
build the bias whole. The backward pass also differentiates the bias parameters (T5 table,
Shaw embeddings). An implementation whose compiled footprint exceeds --max-gb is not run
(its memory is still reported from the compiled executable); one whose score matrices alone
would exceed the limit is not even compiled. Times: the implementations of one (length,
position, pass) are called in turn, --repeats rounds, and the median is reported. Prints
the CPU's vector ISA and a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.nn.config import ModelConfig
from transformer.nn.kernel_rules import AttentionOptions
from transformer.nn.kernels import dot_product_attention
from transformer.nn.masks import MaskInfo
from transformer.nn.positions import position_for
from transformer.train.machine import cpu_isa

GiB = 1024**3
MiB = 1024**2
POSITIONS = ("none", "alibi", "relative_t5", "relative_shaw")
T5_BUCKETS, T5_MAX_DISTANCE, SHAW_MAX_DISTANCE = 32, 128, 16  # T5's defaults; Shaw's k


def parse_args() -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
  p.add_argument("--impls", nargs="+", default=["xla", "jax", "chunked"])
  p.add_argument("--positions", nargs="+", choices=POSITIONS, default=["none"])
  p.add_argument("--batch", type=int, default=1)
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--head-dim", type=int, default=64)
  p.add_argument("--chunk-size", type=int, default=512)
  p.add_argument("--max-gb", type=float, default=8.0, help="skip runs needing more memory")
  p.add_argument("--repeats", type=int, default=5, help="timed rounds (median reported)")
  p.add_argument("--memory-only", action="store_true", help="compile only; no timed calls")
  return p.parse_args()


class _PositionBias(nn.Module):
  """The position's `bias` hook, called as `MultiHeadAttention` calls it."""

  config: ModelConfig

  @nn.compact
  def __call__(self, info: MaskInfo, table: jax.Array | None):
    return position_for(self.config).bias(self, info, table)


def bias_setup(position: str, b: int, n: int, h: int, info: MaskInfo):
  """(bias module or None, its parameters, the T5 table or None) for `position`."""
  if position == "none":
    return None, {}, None
  config = ModelConfig(
    vocab_size=8,
    d_model=n * h,
    num_heads=n,
    num_layers=1,
    d_ff=8,
    max_len=info.q_positions.shape[1],
    position=position,
    relative_num_buckets=T5_BUCKETS,
    relative_max_distance=T5_MAX_DISTANCE,
    shaw_max_distance=SHAW_MAX_DISTANCE,
  )
  module = _PositionBias(config)
  table = None
  if position == "relative_t5":
    table = 0.02 * jax.random.normal(jax.random.key(1), (T5_BUCKETS, n), jnp.float32)
  params = module.init(jax.random.key(0), info, table).get("params", {})
  return module, params, table


def make_fns(impl: str, chunk_size: int, module: nn.Module | None):
  def forward(q, k, v, info, params, table):
    bias = None if module is None else module.apply({"params": params}, info, table)
    out = dot_product_attention(q, k, v, info, AttentionOptions(impl, chunk_size), bias=bias)
    return out

  def loss(q, k, v, info, params, table):
    return forward(q, k, v, info, params, table).sum()

  return {"fwd": forward, "fwd+bwd": jax.grad(loss, argnums=(0, 1, 2, 4, 5))}


def footprint(compiled) -> tuple[int, int]:
  """(temp bytes, peak bytes) of one call of a compiled executable."""
  m = compiled.memory_analysis()
  peak = (
    m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
  )
  return m.temp_size_in_bytes, peak


def time_alternating(compiled: dict, args, repeats: int) -> dict:
  """Median seconds per call of each compiled function, called in turn for `repeats`
  rounds after one warm-up call each."""
  for fn in compiled.values():
    jax.block_until_ready(fn(*args))
  times = {name: [] for name in compiled}
  for _ in range(repeats):
    for name, fn in compiled.items():
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times[name].append(time.perf_counter() - start)
  return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
  a = parse_args()
  b, n, h = a.batch, a.heads, a.head_dim
  header = (
    f"B={b}, N={n}, H={h}, causal MaskInfo, float32, chunk {a.chunk_size}, "
    f"{jax.devices()[0].platform.upper()} ({jax.device_count()} device(s)); {cpu_isa()}"
  )
  print(header, flush=True)
  rows = []
  for t in a.lengths:
    key_q, key_k, key_v = jax.random.split(jax.random.key(t), 3)
    q = jax.random.normal(key_q, (b, t, n, h), jnp.float32)  # [B, T, N, H]
    k = jax.random.normal(key_k, (b, t, n, h), jnp.float32)  # [B, S, N, H]
    v = jax.random.normal(key_v, (b, t, n, h), jnp.float32)  # [B, S, N, H]
    positions = jnp.broadcast_to(jnp.arange(t), (b, t))
    info = MaskInfo(positions, positions, causal=True)  # causal, no segments
    for position in a.positions:
      module, params, table = bias_setup(position, b, n, h, info)
      args = (q, k, v, info, params, table)
      for mode in ("fwd", "fwd+bwd"):
        cells, runnable = [], {}
        for impl in a.impls:
          row = dict(impl=impl, position=position, mode=mode, T=t)
          cells.append(row)
          scores = b * n * t * t * 4  # one float32 [B, N, T, S] array
          if impl != "chunked" and scores > a.max_gb * GiB:
            row.update(note=f"skipped: one [B,N,T,S] array is {scores / GiB:.1f} GiB")
            continue
          fn = make_fns(impl, a.chunk_size, module)[mode]
          compiled = jax.jit(fn).lower(*args).compile()
          temp, peak = footprint(compiled)
          row.update(temp=temp, peak=peak)
          if peak > a.max_gb * GiB:
            row.update(note=f"not run: needs {peak / GiB:.1f} GiB > {a.max_gb:g} GiB")
          elif not a.memory_only:
            runnable[impl] = compiled
        if runnable:
          for impl, seconds in time_alternating(runnable, args, a.repeats).items():
            next(r for r in cells if r["impl"] == impl).update(ms=1e3 * seconds)
        for row in cells:
          print(_row_text(row), flush=True)
        rows.extend(cells)
  print()
  print(header)
  print()
  print("| impl | position | pass | T | time (ms, median) | XLA temp (MiB) | peak (MiB) | note |")
  print("| --- | --- | --- | ---: | ---: | ---: | ---: | --- |")
  for row in rows:
    print(_row_text(row))


def _row_text(row: dict) -> str:
  ms = f"{row['ms']:.1f}" if "ms" in row else "-"
  temp = f"{row['temp'] / MiB:.1f}" if "temp" in row else "-"
  peak = f"{row['peak'] / MiB:.1f}" if "peak" in row else "-"
  return (
    f"| {row['impl']} | {row['position']} | {row['mode']} | {row['T']} | {ms} | {temp} "
    f"| {peak} | {row.get('note', '')} |"
  )


if __name__ == "__main__":
  main()

"""Train-step throughput, compile time and MFU of the reference GPT config.

  python benchmarks/train_step.py [--steps 20] [--dtype float32] [--batch 16] [--seq 256]

Reference GPT: vocab 4096, d_model 256, 4 layers, 4 heads, d_ff 1024, sequence 256,
batch 16, dropout 0.1, label smoothing 0.1, AdamW, clipping 1.0. MFU is the model's
matmul FLOPs per second (`transformer.config.flops_per_token`, forward + backward) over
the machine's matmul peak, measured here with a large square matmul in the same dtype.
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from transformer.config import ModelConfig, flops_per_token
from transformer.models import build_model
from transformer.training.parallel import StepRunner, make_mesh
from transformer.training.train_step import StepConfig, create_train_state

REFERENCE = dict(
  family="decoder", vocab_size=4096, d_model=256, num_heads=4, num_layers=4, d_ff=1024,
  max_len=256, position="learned", activation="gelu", dropout_rate=0.1,
  attention_dropout_rate=0.1,
)  # fmt: skip


def matmul_peak(dtype: str = "float32", n: int = 2048, repeats: int = 10) -> float:
  """Best achieved FLOP/s of an n x n x n matmul (2 n^3 FLOPs), the machine's practical peak."""
  a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), dtype)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    f(a).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2 * n**3 / best


def lm_batch(rng, batch: int, seq: int, vocab: int) -> dict[str, np.ndarray]:
  tokens = rng.integers(1, vocab, size=(batch, seq + 1)).astype(np.int32)
  return {
    "inputs": tokens[:, :-1],
    "targets": tokens[:, 1:],
    "weights": np.ones((batch, seq), np.float32),
    "segment_ids": np.ones((batch, seq), np.int32),
    "positions": np.broadcast_to(np.arange(seq, dtype=np.int32), (batch, seq)).copy(),
  }


def benchmark(model_cfg: ModelConfig, batch: int, seq: int, steps: int, warmup: int = 3) -> dict:
  model = build_model(model_cfg)
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(3e-4, b2=0.98, eps=1e-9))
  step_cfg = StepConfig(model=model, tx=tx, kind="lm", label_smoothing=0.1)
  runner = StepRunner(step_cfg, "jit", make_mesh(jax.devices()[:1]))
  params = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.ones((1, seq), jnp.int32))["params"]
  state = runner.place_state(create_train_state(params, tx, jax.random.PRNGKey(1)))
  rng = np.random.default_rng(0)
  batches = [lm_batch(rng, batch, seq, model_cfg.vocab_size) for _ in range(4)]

  t = time.perf_counter()
  compiled = runner._train.lower(state, runner.place_batch(batches[0])).compile()
  compile_s = time.perf_counter() - t
  placed = [runner.place_batch(b) for b in batches]
  for i in range(warmup):
    state, m = compiled(state, placed[i % len(placed)])
  jax.block_until_ready(m)
  times = []
  for i in range(steps):
    t = time.perf_counter()
    state, m = compiled(state, placed[i % len(placed)])
    jax.block_until_ready(m)
    times.append(time.perf_counter() - t)
  step_s = statistics.median(times)
  tokens_per_s = batch * seq / step_s
  return {
    "compile_s": compile_s,
    "step_ms": 1e3 * step_s,
    "tokens_per_s": tokens_per_s,
    "model_flops_per_s": tokens_per_s * flops_per_token(model_cfg, seq, training=True),
    "loss": float(m["loss"]),
  }


def main():
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--seq", type=int, default=256)
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--attention_impl", default="xla")
  args = parser.parse_args()
  cfg = ModelConfig(**REFERENCE, dtype=args.dtype, attention_impl=args.attention_impl)
  peak = matmul_peak(args.dtype)
  r = benchmark(cfg, args.batch, args.seq, args.steps)
  print(f"device: {jax.devices()[0].device_kind} x{jax.device_count()}, dtype {args.dtype}")
  print("| metric | value |\n|---|---|")
  print(f"| measured matmul peak | {peak / 1e9:.1f} GFLOP/s |")
  print(f"| compile time | {r['compile_s']:.2f} s |")
  print(f"| step time (median of {args.steps}) | {r['step_ms']:.1f} ms |")
  print(f"| tokens/s | {r['tokens_per_s']:,.0f} |")
  print(f"| model FLOP/s | {r['model_flops_per_s'] / 1e9:.1f} GFLOP/s |")
  print(f"| MFU (vs measured peak) | {100 * r['model_flops_per_s'] / peak:.1f}% |")


if __name__ == "__main__":
  main()

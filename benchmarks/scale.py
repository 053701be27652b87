"""Compile time vs depth (scanned vs unrolled layers) and train-step memory with remat.

  python benchmarks/scale.py [--layers 2 8 24] [--remat_seq 1024]

Part 1 compiles the train step of a small GPT (d_model 128, 4 heads) at several depths,
with `scan_layers` off and on. Part 2 compiles the train step of a model whose
activations dominate (long sequence, small width) with each remat policy and reads the
peak memory from the compiled executable (`memory_analysis()`: arguments + outputs +
temporaries - aliased). Both print Markdown tables.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import optax

from transformer import tasks
from transformer.nn.config import ModelConfig
from transformer.nn.models import build_model
from transformer.train.machine import cpu_isa
from transformer.train.parallel import StepRunner, make_mesh
from transformer.train.step import StepConfig, create_train_state, train_step


def _gpt(**fields) -> ModelConfig:
  """The benchmarked GPT: D=128, 4 heads, d_ff 512; vocabulary, depth and length from
  `fields`."""
  return ModelConfig(family="decoder", d_model=128, num_heads=4, d_ff=512, **fields)


def _compiled(cfg: ModelConfig, batch: int, seq: int):
  """(compile seconds, compiled executable) of the train step for `cfg`."""
  model = build_model(cfg)
  tx = optax.adamw(1e-3)
  runner = StepRunner(
    StepConfig(model=model, tx=tx, task=tasks.get("lm")()),
    "jit",
    make_mesh(jax.devices()[:1]),
    update=train_step,
  )
  init = lambda r: model.init(r, jnp.ones((1, seq), jnp.int32))["params"]
  params = jax.eval_shape(init, jax.random.PRNGKey(0))
  state = jax.eval_shape(lambda p: create_train_state(p, tx, jax.random.PRNGKey(1)), params)
  b = {
    "inputs": jax.ShapeDtypeStruct((batch, seq), jnp.int32),
    "targets": jax.ShapeDtypeStruct((batch, seq), jnp.int32),
    "weights": jax.ShapeDtypeStruct((batch, seq), jnp.float32),
    "segment_ids": jax.ShapeDtypeStruct((batch, seq), jnp.int32),
    "positions": jax.ShapeDtypeStruct((batch, seq), jnp.int32),
  }
  target = runner.state_target(state)
  t = time.perf_counter()
  compiled = runner.train_step.lower(target, b).compile()
  return time.perf_counter() - t, compiled


def compile_times(depths: list[int]) -> None:
  print("| layers | unrolled compile (s) | scanned compile (s) |\n|---:|---:|---:|")
  for n in depths:
    base = _gpt(vocab_size=1024, num_layers=n, max_len=128)
    unrolled, _ = _compiled(base, 8, 128)
    scanned, _ = _compiled(base.replace(scan_layers=True), 8, 128)
    print(f"| {n} | {unrolled:.2f} | {scanned:.2f} |")


def remat_memory(seq: int) -> None:
  print(
    "| remat policy | compile (s) | peak memory (MiB) | temporaries (MiB) |\n|---|---:|---:|---:|"
  )
  for policy in ("none", "dots", "dots_no_batch", "full"):
    cfg = _gpt(vocab_size=256, num_layers=8, max_len=seq, scan_layers=True, remat_policy=policy)
    seconds, compiled = _compiled(cfg, 8, seq)
    m = compiled.memory_analysis()
    peak = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
    peak -= m.alias_size_in_bytes
    print(f"| {policy} | {seconds:.2f} | {peak / 2**20:.1f} | {m.temp_size_in_bytes / 2**20:.1f} |")


def main():
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--layers", type=int, nargs="+", default=[2, 8, 24])
  parser.add_argument("--remat_seq", type=int, default=1024)
  args = parser.parse_args()
  print(f"CPU: {cpu_isa()}")
  print(f"device: {jax.devices()[0].device_kind}; jax {jax.__version__}\n")
  compile_times(args.layers)
  print()
  remat_memory(args.remat_seq)


if __name__ == "__main__":
  main()

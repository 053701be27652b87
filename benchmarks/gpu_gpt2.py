"""GPT-2 small, bf16, sequence 1024 on one GPU: MFU of our train step, and the same model
under `torch.compile`, side by side.

  python benchmarks/gpu_gpt2.py [--batch 16] [--rounds 20] [--attention_impl jax]
  python benchmarks/gpu_gpt2.py --smoke      # tiny sizes on any device: checks the script

Ours: `named('gpt2_small')` (124M parameters, vocab 50257, 12 layers of 768, T = 1024)
with bfloat16 compute and float32 master weights, the train step of `train_step.py`
(AdamW, clipping, label smoothing 0.1, dropout 0.1 on embeddings and residual branches).
Attention dropout is 0 in both frameworks so that fused attention applies: ours with
`--attention_impl jax` (`jax.nn.dot_product_attention`, cuDNN flash attention on NVIDIA
GPUs), PyTorch with `F.scaled_dot_product_attention`. PyTorch: the same model from
`torch_reference.py` under bf16 autocast, fused AdamW, `torch.compile` (and eager with
`--modes eager compile`).

Timing: one step of each framework per round, alternating, after warm-up rounds; medians.
Both frameworks sync every step (the loss is read back). The peak is the better of a bf16
8192^3 matmul in JAX and in PyTorch, measured in the same run; MFU = model FLOP/s (all
matmuls, `flops_per_token`, forward + backward) / peak.

JAX gets at most `XLA_PYTHON_CLIENT_MEM_FRACTION` (default here 0.45) of the GPU memory
so that PyTorch fits beside it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.45")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402
from torch_reference import TorchStep  # noqa: E402  (benchmarks/ is on sys.path)
from train_step import OursStep, Workload  # noqa: E402

from transformer.nn.sizes import named  # noqa: E402


def workload(args) -> Workload:
  overrides = dict(dtype="bfloat16", attention_dropout_rate=0.0, attention_impl=args.attention_impl)
  if args.smoke:
    overrides.update(vocab_size=512, d_model=64, num_heads=2, num_layers=2, d_ff=256)
    return Workload("gpt2_smoke", named("gpt2_small", **overrides, max_len=128), "lm", 2, 128)
  return Workload("gpt2_small", named("gpt2_small", **overrides), "lm", args.batch, 1024)


def peak_flops(n: int, torch_device: str) -> tuple[float, float]:
  """Best bf16 n^3 matmul FLOP/s of (JAX, PyTorch) over 10 timed products each."""
  a = jnp.ones((n, n), jnp.bfloat16)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  best_jax = 0.0
  for _ in range(10):
    t = time.perf_counter()
    f(a).block_until_ready()
    best_jax = max(best_jax, 2 * n**3 / (time.perf_counter() - t))
  b = torch.randn(n, n, device=torch_device, dtype=torch.bfloat16)
  (b @ b).sum().item()
  best_torch = 0.0
  for _ in range(10):
    t = time.perf_counter()
    (b @ b).sum().item()  # the sum and read-back are < 1% of the product
    best_torch = max(best_torch, 2 * n**3 / (time.perf_counter() - t))
  return best_jax, best_torch


def timed(fn) -> float:
  t = time.perf_counter()
  fn()
  return time.perf_counter() - t


def main():
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--batch", type=int, default=16, help="sequences of 1024 per step")
  parser.add_argument("--rounds", type=int, default=20, help="timed rounds")
  parser.add_argument("--warmup", type=int, default=3, help="untimed rounds after compiling")
  parser.add_argument("--attention_impl", default="jax", choices=["xla", "jax", "chunked"])
  parser.add_argument("--modes", nargs="+", default=["compile"], choices=["eager", "compile"])
  parser.add_argument("--peak_n", type=int, default=8192, help="side of the peak matmul")
  parser.add_argument("--smoke", action="store_true", help="tiny sizes, any device")
  args = parser.parse_args()
  torch_device = "cuda" if torch.cuda.is_available() else "cpu"
  w = workload(args)
  peak_jax, peak_torch = peak_flops(256 if args.smoke else args.peak_n, torch_device)
  peak = max(peak_jax, peak_torch)

  ours = OursStep(w)
  compile_s = ours.compile()
  first = {"ours": compile_s + timed(ours.step)}
  steps = {"ours": ours.step}
  for mode in args.modes:
    torch_step = TorchStep(
      w, compiled=mode == "compile", device=torch_device, autocast_dtype=torch.bfloat16
    )
    first[mode] = timed(torch_step.step)  # torch.compile compiles here
    steps[mode] = torch_step.step
  for _ in range(args.warmup):
    for fn in steps.values():
      fn()
  times = {name: [] for name in steps}
  for _ in range(args.rounds):
    for name, fn in steps.items():
      times[name].append(timed(fn))

  print(
    f"{w.name}: batch {w.batch} x {w.seq}, bf16, attention '{args.attention_impl}' (ours);"
    f" JAX {jax.__version__} on {jax.devices()[0].device_kind}, torch {torch.__version__} on"
    f" {torch_device}; peak {peak / 1e12:.1f} TFLOP/s (JAX {peak_jax / 1e12:.1f}, torch"
    f" {peak_torch / 1e12:.1f}); medians of {args.rounds} alternating rounds"
  )
  print("| framework | step ms | tokens/s | MFU | first step (compile included) | ours / this |")
  print("|---|---|---|---|---|---|")
  ours_ms = 1e3 * statistics.median(times["ours"])
  for name, ts in times.items():
    ms = 1e3 * statistics.median(ts)
    flops = w.flops_per_step / (ms / 1e3)
    label = "ours (jax)" if name == "ours" else f"torch {name}"
    print(
      f"| {label} | {ms:.1f} | {w.tokens_per_step / (ms / 1e3):,.0f} | {100 * flops / peak:.1f}%"
      f" | {first[name]:.1f} s | {ms / ours_ms:.2f} |"
    )


if __name__ == "__main__":
  main()

"""The GPU check, one script of at most 8 minutes on one H200 (GPT-2 small, bf16):

  1. parity  cuDNN attention (`attention_impl='cudnn'`) against 'xla' on the GPU: forward
             and gradients in bf16, both measured against 'xla' in float32 on the same
             inputs, at GPT-2's attention shape (12 heads of 64, T = 1024): causal, packed
             segments with GQA, a causal window with MQA, bidirectional with padding, a
             logit bias (its gradient too), an odd length, cross-attention
  2. train   MFU of our train step at sequence 1024 and the same model under
             `torch.compile`, side by side (ours / torch.compile ratio)
  3. decode  greedy decoding throughput with the KV cache at batch 1 and 64

  python benchmarks/gpu_gpt2.py [--parts parity train decode] [--batch 16] [--rounds 20]
  python benchmarks/gpu_gpt2.py --smoke      # tiny sizes on any device: checks the script

Without cuDNN (any machine but an NVIDIA GPU) part 1 prints why it is skipped. Parity
passes when cuDNN's largest error against the float32 reference is at most twice that of
'xla' in bf16 plus 0.02 (bf16 keeps 8 bits); the HLO must hold the cuDNN fused-attention
call. The script exits with status 1 if a case fails.

Train: ours is `named('gpt2_small')` (124M parameters, vocab 50257, 12 layers of 768,
T = 1024) with bfloat16 compute and float32 master weights, the train step of
`train_step.py` (AdamW, clipping, label smoothing 0.1, dropout 0.1 on embeddings and
residual branches), attention `--attention_impl` (default 'auto': cuDNN on an NVIDIA GPU,
'xla' on the CPU; the printed header says which). Attention dropout is 0 in both
frameworks so that fused attention applies; PyTorch uses `F.scaled_dot_product_attention`.
PyTorch: the same model from `torch_reference.py` under bf16 autocast, fused AdamW,
`torch.compile` (and eager with `--modes eager compile`). Our batches carry segment ids
(all ones), which cuDNN takes as a dense mask (its API has no segment ids); PyTorch's
SDPA is causal only.

Timing: one step of each framework per round, alternating, after warm-up rounds; medians.
Both frameworks sync every step (the loss is read back). The peak is the better of a bf16
8192^3 matmul in JAX and in PyTorch, measured in the same run; MFU = model FLOP/s (all
matmuls, `flops_per_token`, forward + backward) / peak.

Decode: `transformer.decode.lm_decode` (prefill, then one token per step in a jitted
while loop), random weights, no EOS; the first call (compilation) and the best of
--repeats later calls. Cached decoding steps run 'xla' attention whatever the impl
(`kernels` docstring).

JAX gets at most `XLA_PYTHON_CLIENT_MEM_FRACTION` (default here 0.45) of the GPU memory
so that PyTorch fits beside it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.45")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch_reference import TorchStep  # noqa: E402  (benchmarks/ is on sys.path)
from train_step import OursStep, Workload  # noqa: E402

from transformer import decode  # noqa: E402
from transformer.nn import kernel_rules, kernels  # noqa: E402
from transformer.nn.config import ATTENTION_IMPLS, ModelConfig  # noqa: E402
from transformer.nn.masks import MaskInfo  # noqa: E402
from transformer.nn.models import build_model  # noqa: E402
from transformer.nn.sizes import named  # noqa: E402

PARTS = ("parity", "train", "decode")


def gpt2(args, **overrides) -> ModelConfig:
  overrides = dict(dtype="bfloat16", attention_dropout_rate=0.0, **overrides)
  if args.smoke:
    overrides.update(vocab_size=512, d_model=64, num_heads=2, num_layers=2, d_ff=256)
    return named("gpt2_small", **overrides, max_len=128)
  return named("gpt2_small", **overrides)


def workload(args, attention_impl: str) -> Workload:
  model = gpt2(args, attention_impl=attention_impl)
  if args.smoke:
    return Workload("gpt2_smoke", model, "lm", 2, 128)
  return Workload("gpt2_small", model, "lm", args.batch, 1024)


def timed(fn) -> float:
  t = time.perf_counter()
  fn()
  return time.perf_counter() - t


# ----------------------------------------------------------------------------------------
# 1. cuDNN attention against 'xla'


def parity_cases(smoke: bool) -> list[dict]:
  """(name, shapes, mask) of each parity case; T = 1024 and 12 heads of 64 (smoke: 64, 4)."""
  t, n = (64, 4) if smoke else (1024, 12)
  return [
    dict(name="causal, MHA", t=t, s=t, kv=n, causal=True),
    dict(name="causal, packed segments, GQA", t=t, s=t, kv=n // 4, causal=True, seg="packed"),
    dict(name=f"causal window {t // 4}, MQA", t=t, s=t, kv=1, causal=True, window=t // 4),
    dict(name="bidirectional, padding", t=t, s=t, kv=n, seg="padded"),
    dict(name="causal, logit bias (+ its grad)", t=t, s=t, kv=n, causal=True, bias=True),
    dict(name=f"causal, odd length {t - 1}, packed", t=t - 1, s=t - 1, kv=n, causal=True,
         seg="packed"),
    dict(name="cross-attention, padding", t=t // 2, s=t, kv=n, seg="cross"),
  ]  # fmt: skip


def parity_inputs(case: dict, n: int, h: int, b: int, rng: np.random.Generator):
  """Inputs (q, k, v[, bias]) in bf16, the MaskInfo and a cotangent for one case."""
  t, s, kv = case["t"], case["s"], case["kv"]
  arrays = [
    rng.standard_normal((b, t, n, h)),
    rng.standard_normal((b, s, kv, h)),
    rng.standard_normal((b, s, kv, h)),
  ]
  if case.get("bias"):
    arrays.append(rng.standard_normal((1, n, t, s)))
  arrays = [jnp.asarray(a, jnp.bfloat16) for a in arrays]
  ones = np.ones((b, t), np.int32)
  seg = case.get("seg")
  if seg == "packed":  # three documents per row
    q_seg = np.repeat(np.arange(1, 4), -(-t // 3))[:t] * ones
    info = MaskInfo.create(jnp.asarray(q_seg), causal=True, window=case.get("window"))
  elif seg == "padded":
    q_seg = ones.copy()
    q_seg[:, -t // 8 :] = 0
    info = MaskInfo.create(jnp.asarray(q_seg))
  elif seg == "cross":
    kv_seg = np.ones((b, s), np.int32)
    kv_seg[:, -s // 8 :] = 0
    info = MaskInfo.create(jnp.asarray(ones), jnp.asarray(kv_seg))
  else:
    info = MaskInfo.create(
      jnp.asarray(ones), causal=case.get("causal", False), window=case.get("window")
    ).replace(q_segment_ids=None, kv_segment_ids=None)
  cotangent = jnp.asarray(rng.standard_normal((b, t, n, h)), jnp.float32)
  return arrays, info, cotangent


def attention_and_grads(impl: str, arrays, info, cotangent, dtype):
  """The jitted forward and gradients (q, k, v[, bias]) of one implementation."""

  def f(*arrays):
    q, k, v, *bias = (a.astype(dtype) for a in arrays)
    out = kernels.dot_product_attention(
      q, k, v, info, kernel_rules.AttentionOptions(impl), bias=bias[0] if bias else None
    )
    return out.astype(jnp.float32)

  def run(*arrays):
    out, vjp = jax.vjp(f, *arrays)
    return out, vjp(cotangent.astype(out.dtype))

  compiled = jax.jit(run).lower(*arrays).compile()
  return compiled(*arrays), "__cudnn$fmha" in compiled.as_text()


def parity(args) -> bool:
  """Prints the parity table; False if a case fails. Without cuDNN: the reason only."""
  try:
    kernel_rules.resolve_attention_impl(ModelConfig(attention_impl="cudnn", dtype="bfloat16"))
  except ValueError as e:
    print(f"\ncuDNN parity: skipped: {e}")
    return True
  rng = np.random.default_rng(0)
  n, h, b = (4, 16, 2) if args.smoke else (12, 64, 4)
  print(f"\ncuDNN vs 'xla' attention, bf16, B={b} N={n} H={h}: max |error| against 'xla' in")
  print("float32 on the same bf16 inputs, cuDNN / xla-bf16\n")
  print("| case | out | dq | dk | dv | dbias | cuDNN call | ok |")
  print("|---|---|---|---|---|---|---|---|")
  ok_all = True
  for case in parity_cases(args.smoke):
    arrays, info, cotangent = parity_inputs(case, n, h, b, rng)
    ref, _ = attention_and_grads("xla", arrays, info, cotangent, jnp.float32)
    xla, _ = attention_and_grads("xla", arrays, info, cotangent, jnp.bfloat16)
    cudnn, fused = attention_and_grads("cudnn", arrays, info, cotangent, jnp.bfloat16)
    cells, ok = [], fused
    for r, x, c in zip(_flat(ref), _flat(xla), _flat(cudnn), strict=True):
      err_x, err_c = float(jnp.abs(x - r).max()), float(jnp.abs(c - r).max())
      ok = ok and err_c <= 2 * err_x + 0.02
      cells.append(f"{err_c:.3g} / {err_x:.3g}")
    cells += ["-"] * (5 - len(cells))
    ok_all = ok_all and ok
    print(f"| {case['name']} | {' | '.join(cells)} | {fused} | {'ok' if ok else 'FAIL'} |")
  return ok_all


def _flat(result) -> list[jax.Array]:
  """(out, grads) -> [out, *grads] in float32."""
  out, grads = result
  return [a.astype(jnp.float32) for a in (out, *grads)]


# ----------------------------------------------------------------------------------------
# 2. train step: ours against torch.compile


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


def train(args) -> None:
  torch_device = "cuda" if torch.cuda.is_available() else "cpu"
  impl, why = kernel_rules.resolve_attention_impl(gpt2(args, attention_impl=args.attention_impl))
  w = workload(args, impl)
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
    f"\n{w.name}: batch {w.batch} x {w.seq}, bf16, attention '{impl}' ({why}) (ours);"
    f" JAX {jax.__version__} on {jax.devices()[0].device_kind}, torch {torch.__version__} on"
    f" {torch_device}; peak {peak / 1e12:.1f} TFLOP/s (JAX {peak_jax / 1e12:.1f}, torch"
    f" {peak_torch / 1e12:.1f}); medians of {args.rounds} alternating rounds\n"
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


# ----------------------------------------------------------------------------------------
# 3. decoding throughput


def decoding(args) -> None:
  impl, why = kernel_rules.resolve_attention_impl(gpt2(args, attention_impl=args.attention_impl))
  config = gpt2(args, attention_impl=impl, dropout_rate=0.0)
  prompt, new = (8, 8) if args.smoke else (args.prompt_len, args.new_tokens)
  model = build_model(config)
  params = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
  rng = np.random.default_rng(0)
  print(
    f"\nDecoding {'gpt2_smoke' if args.smoke else 'gpt2_small'} (bf16, attention '{impl}':"
    f" {why}; cached steps run 'xla'), prompt {prompt}, {new} new tokens, greedy, best of"
    f" {args.repeats} after the first call\n"
  )
  print("| batch | first call s (compile) | best s | tokens/s | ms per step |")
  print("|---|---|---|---|---|")
  for b in (1, 64):
    prompts = rng.integers(10, config.vocab_size, (b, prompt)).astype(np.int32)
    lengths = np.full(b, prompt, np.int32)

    def run(prompts=prompts, lengths=lengths):
      jax.block_until_ready(decode.lm_decode(model, params, prompts, lengths, length=new).tokens)

    first = timed(run)
    best = min(timed(run) for _ in range(args.repeats))
    print(f"| {b} | {first:.1f} | {best:.3f} | {b * new / best:,.0f} | {1e3 * best / new:.2f} |")


def main():
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
  parser.add_argument("--batch", type=int, default=16, help="sequences of 1024 per step")
  parser.add_argument("--rounds", type=int, default=20, help="timed rounds")
  parser.add_argument("--warmup", type=int, default=3, help="untimed rounds after compiling")
  parser.add_argument("--attention_impl", default="auto", choices=ATTENTION_IMPLS)
  parser.add_argument("--modes", nargs="+", default=["compile"], choices=["eager", "compile"])
  parser.add_argument("--peak_n", type=int, default=8192, help="side of the peak matmul")
  parser.add_argument("--prompt_len", type=int, default=128, help="decoding prompt")
  parser.add_argument("--new_tokens", type=int, default=256, help="decoded tokens per row")
  parser.add_argument("--repeats", type=int, default=3, help="timed decoding calls")
  parser.add_argument("--smoke", action="store_true", help="tiny sizes, any device")
  args = parser.parse_args()
  print(f"JAX {jax.__version__}, {jax.devices()[0].device_kind} ({jax.default_backend()})")
  ok = True
  for part in args.parts:
    start = time.perf_counter()
    if part == "parity":
      ok = parity(args)
    elif part == "train":
      train(args)
    else:
      decoding(args)
    print(f"\n({part}: {time.perf_counter() - start:.0f} s)")
  if not ok:
    sys.exit("cuDNN attention parity failed (table above)")


if __name__ == "__main__":
  main()

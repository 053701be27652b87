"""Our train step against the same models in PyTorch (eager and torch.compile), side by side.

  python benchmarks/compare.py                       # all four workloads
  python benchmarks/compare.py --workload gpt --rounds 20
  python benchmarks/compare.py --malloc default --xla_flags=   # no process settings

For each workload of `train_step.WORKLOADS` (gpt, bert, seq2seq, vit) this builds our step
(`transformer.train.step` through `StepRunner`, as `benchmarks/train_step.py`)
and the PyTorch reference of `torch_reference.py` in both modes, in one process, then
times them alternately, one step each per round (ours, eager, compile, ours, ...), after
`--warmup` rounds that are not counted; every figure is a median over `--rounds`. Each
round also times one 2048^3 float32 matmul in JAX and in PyTorch: the machine's matmul
peak is the best rate either reached in the run, and MFU is model FLOP/s (the same
`transformer.nn.models.flops_per_token` count for both frameworks) over that peak. The
machine is shared, so the last table adds MFU against the faster library's median matmul
rate (timed under the same load as the steps), MFU of our fastest step, and the load.

Compile time: ours is lower + compile of the train step (its first step adds one step
on top); torch.compile's is its first step (Dynamo + Inductor for forward, backward and
the optimizer step), with a fresh Inductor cache unless `--warm_torch_cache`.

Process settings, applied before either framework starts (docs/PERFORMANCE.md):
`--malloc heap` (default) keeps freed memory in glibc's heap instead of unmapping it, for
both frameworks (otherwise every step re-faults its temporaries: one 780 MB XLA buffer
per GPT step); `--xla_flags` (default `--xla_cpu_prefer_vector_width=512`) is appended
to XLA_FLAGS; PyTorch gets `OMP_WAIT_POLICY=PASSIVE` and the settings of
`torch_reference.py` (fused AdamW eager, Inductor with `fallback_random`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

WORKLOAD_NAMES = ("gpt", "bert", "seq2seq", "vit")  # train_step.WORKLOADS (not imported yet)


def parse_args():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--workload", nargs="+", default=list(WORKLOAD_NAMES), choices=WORKLOAD_NAMES)
  p.add_argument("--rounds", type=int, default=12, help="timed rounds (one step of each)")
  p.add_argument("--warmup", type=int, default=3, help="untimed rounds after the first step")
  p.add_argument("--modes", nargs="+", default=["eager", "compile"], choices=["eager", "compile"])
  p.add_argument("--malloc", default="heap", choices=["heap", "default"])
  p.add_argument(
    "--xla_flags",
    default="--xla_cpu_prefer_vector_width=512",
    help="appended to XLA_FLAGS before JAX starts ('' for XLA's defaults)",
  )
  p.add_argument("--warm_torch_cache", action="store_true", help="reuse Inductor's disk cache")
  p.add_argument("--peak_n", type=int, default=2048, help="side of the peak-probe matmul")
  return p.parse_args()


class MatmulProbe:
  """One n x n x n float32 matmul in JAX or PyTorch, timed like a step (2 n^3 FLOPs)."""

  def __init__(self, lib: str, n: int):
    import numpy as np

    self.flops = 2 * n**3
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    if lib == "jax":
      import jax
      import jax.numpy as jnp

      x, f = jnp.asarray(a), jax.jit(lambda x: x @ x)
      self.run = lambda: f(x).block_until_ready()
    else:
      import torch

      x = torch.from_numpy(a)
      self.run = lambda: torch.mm(x, x)
    self.run()

  def step(self):
    self.run()


def timed(fn) -> tuple[float, float]:
  """(wall seconds, process CPU seconds) of one call."""
  t, c = time.perf_counter(), time.process_time()
  fn()
  return time.perf_counter() - t, time.process_time() - c


def run_workload(w, args) -> dict:
  from torch_reference import TorchStep
  from train_step import OursStep

  runners, first = {}, {}
  ours = OursStep(w)
  t = time.perf_counter()
  compile_s = ours.compile()
  ours.step()
  first["ours"] = time.perf_counter() - t
  runners["ours"] = ours
  for mode in args.modes:
    s = TorchStep(w, compiled=mode == "compile")
    first[mode], _ = timed(s.step)
    runners[mode] = s
  probes = {f"peak_{lib}": MatmulProbe(lib, args.peak_n) for lib in ("jax", "torch")}
  everything = {**runners, **probes}
  for _ in range(args.warmup):
    for r in everything.values():
      r.step()
  wall = {k: [] for k in everything}
  cpu = {k: [] for k in everything}
  for _ in range(args.rounds):
    for k, r in everything.items():
      dt, dc = timed(r.step)
      wall[k].append(dt)
      cpu[k].append(dc)
  best = {k: max(p.flops / t for t in wall[k]) for k, p in probes.items()}
  median = {k: statistics.median(p.flops / t for t in wall[k]) for k, p in probes.items()}
  return {
    "workload": w,
    "compile_s": compile_s,
    "first_s": first,
    "step_s": {k: statistics.median(wall[k]) for k in runners},
    "best_step_s": {k: min(wall[k]) for k in runners},
    "cpu_s": {k: statistics.median(cpu[k]) for k in runners},
    "peak": max(best.values()),
    "matmul_median": max(median.values()),  # the faster library's median, same load as steps
    "peak_by_lib": best,
    "load": os.getloadavg()[0],
  }


def report(results: list[dict], args) -> None:
  import jax
  import torch

  from transformer.train.machine import cpu_isa

  print(f"\nCPU: {cpu_isa()}; load average {os.getloadavg()[0]:.2f}")
  print(
    f"jax {jax.__version__} ({jax.devices()[0].device_kind}), torch {torch.__version__}"
    f" ({torch.get_num_threads()} threads), {os.cpu_count()} cores, float32, malloc={args.malloc},"
    f" XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r},"
    f" medians of {args.rounds} alternating rounds after {args.warmup} warm-up rounds\n"
  )
  modes = ["ours", *args.modes]
  head = "| workload | tokens/step | " + " | ".join(f"{m} tok/s" for m in modes)
  head += " | " + " | ".join(f"ours/{m}" for m in args.modes)
  head += " | " + " | ".join(f"MFU {m}" for m in modes) + " |"
  print(head)
  print("|" + "---|" * (2 + 2 * len(modes) + len(args.modes)))
  for r in results:
    w, step = r["workload"], r["step_s"]
    tps = {m: w.tokens_per_step / step[m] for m in modes}
    mfu = {m: w.flops_per_step / step[m] / r["peak"] for m in modes}
    row = f"| {w.name} | {w.batch} x {w.seq} | " + " | ".join(f"{tps[m]:,.0f}" for m in modes)
    row += " | " + " | ".join(f"{tps['ours'] / tps[m]:.2f}" for m in args.modes)
    row += " | " + " | ".join(f"{100 * mfu[m]:.0f}%" for m in modes) + " |"
    print(row)
  print("\n| workload | ours compile (lower+compile) | ours first step |", end="")
  print(" | ".join(f" {m} first step" for m in args.modes) + " |", end="")
  print(" step ms (" + ", ".join(modes) + ") | CPU s/step (" + ", ".join(modes) + ") |")
  print("|" + "---|" * (5 + len(args.modes)))
  for r in results:
    first = " | ".join(f"{r['first_s'][m]:.1f} s" for m in args.modes)
    steps = ", ".join(f"{1e3 * r['step_s'][m]:.0f}" for m in modes)
    cpus = ", ".join(f"{r['cpu_s'][m]:.2f}" for m in modes)
    print(
      f"| {r['workload'].name} | {r['compile_s']:.1f} s | {r['first_s']['ours']:.1f} s | {first} |"
      f" {steps} | {cpus} |"
    )
  print("\n| workload | matmul peak (best, GFLOP/s) | JAX best | torch best |", end="")
  print(" matmul median | MFU ours vs median matmul | MFU ours, fastest step vs peak | load avg |")
  print("|---|---|---|---|---|---|---|---|")
  for r in results:
    w = r["workload"]
    ours_rate = w.flops_per_step / r["step_s"]["ours"]
    print(
      f"| {w.name} | {r['peak'] / 1e9:.0f} | {r['peak_by_lib']['peak_jax'] / 1e9:.0f} |"
      f" {r['peak_by_lib']['peak_torch'] / 1e9:.0f} | {r['matmul_median'] / 1e9:.0f} |"
      f" {100 * ours_rate / r['matmul_median']:.0f}% |"
      f" {100 * w.flops_per_step / r['best_step_s']['ours'] / r['peak']:.0f}% | {r['load']:.1f} |"
    )


def main():
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  args = parse_args()
  from train_step import add_xla_flags, set_malloc_policy  # imports JAX, starts nothing

  set_malloc_policy(args.malloc)  # before JAX or PyTorch start threads or allocate much
  add_xla_flags(args.xla_flags)
  os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see torch_reference.configure
  if not args.warm_torch_cache:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor_")
  import torch
  import torch_reference  # noqa: F401  (its configure() runs before torch is first imported)
  from train_step import WORKLOADS

  torch.set_num_threads(os.cpu_count())
  results = []
  for name in args.workload:
    print(f"{name} ...", file=sys.stderr, flush=True)
    results.append(run_workload(WORKLOADS[name], args))
  report(results, args)


if __name__ == "__main__":
  main()

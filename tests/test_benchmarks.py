"""Benchmarks run end to end at tiny sizes on the CPU: the prepared GPU benchmark, so it
still works when a GPU machine is available (it is run there, not here), and
`benchmarks/decode_vs_hf.py`, whose greedy tokens equal Hugging Face's (exit status 0) and
whose table holds finite numbers; `benchmarks/mla_decode.py`, whose cache sizes are the
analytic ones; the helpers of two others."""

from __future__ import annotations

import importlib
import math
import os
import subprocess
import sys

from session_env import PATIENCE_S, xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_benchmark(script: str, *args: str) -> subprocess.CompletedProcess:
  """`python benchmarks/<script> ARGS` on one CPU device, its output captured."""
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.path.join(REPO, "benchmarks")])}
  env["XLA_FLAGS"] = xla_flags(1)
  return subprocess.run(
    [sys.executable, os.path.join(REPO, "benchmarks", script), *args],
    capture_output=True, text=True, env=env, timeout=PATIENCE_S,
  )  # fmt: skip


def test_gpu_gpt2_benchmark_smoke():
  out = _run_benchmark(
    "gpu_gpt2.py", "--smoke", "--rounds", "1", "--warmup", "0", "--modes", "eager"
  )
  assert out.returncode == 0, out.stderr[-3000:]
  lines = out.stdout.splitlines()
  # No cuDNN on the CPU: the parity part says so (the one part that needs the GPU).
  assert any(
    line.startswith("cuDNN parity: skipped:") and "backend is cpu" in line for line in lines
  ), out.stdout
  rows = [line.split(" | ")[0] for line in lines if line.startswith("| ")]
  assert rows == ["| framework", "| ours (jax)", "| torch eager", "| batch", "| 1", "| 64"], rows
  assert "gpt2_smoke: batch 2 x 128, bf16, attention 'xla' (auto, backend cpu)" in out.stdout


def test_decode_vs_hf_tiny():
  """On two CPU devices: batches 1 and 3 run on the first, batch 4 is split over both."""
  out = _run_benchmark(
    "decode_vs_hf.py", "--vocab", "128", "--layers", "2", "--d-model", "32", "--heads", "4",
    "--max-len", "64", "--prompt-len", "8", "--new-tokens", "8", "--batch-sizes", "1", "3",
    "4", "--rounds", "1", "--cpu-devices", "2",
  )  # fmt: skip
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  lines = out.stdout.splitlines()
  rows = [line.strip("|").split("|") for line in lines if line.startswith(("| greedy", "| top-k"))]
  assert [(r[0].strip(), r[1].strip()) for r in rows] == [
    ("greedy", "1"), ("greedy", "3"), ("greedy", "4"), ("top-k", "1"), ("top-k", "3"),
    ("top-k", "4"),
  ], out.stdout  # fmt: skip
  assert "(cpu x2)" in out.stdout, out.stdout
  for row in rows:
    numbers = [float(cell.replace(",", "")) for cell in row[2:]]
    assert len(numbers) == 5 and all(math.isfinite(x) and x >= 0 for x in numbers), row
    assert min(numbers[:3]) > 0, row  # tokens/s and their ratio
  for b in (1, 3, 4):
    assert f"greedy, batch {b}: ours and HF identical ({b} x 8 tokens)" in lines, out.stdout


def _import_benchmark(name: str):
  sys.path.insert(0, os.path.join(REPO, "benchmarks"))
  try:
    return importlib.import_module(name)
  finally:
    sys.path.remove(os.path.join(REPO, "benchmarks"))


def test_matmul_ceiling_reads_every_dot_of_a_compiled_program():
  """`benchmarks/matmul_ceiling.py` finds the dots of optimized HLO (inside fusions too) with
  their operand shapes and dimension numbers, and counts their FLOPs."""
  import jax
  import jax.numpy as jnp
  from jax import lax

  matmul_ceiling = _import_benchmark("matmul_ceiling")

  def f(x, w, q, k):
    h = jnp.tanh(x @ w)  # [8, 16] . [16, 32]
    dw = lax.dot_general(x, h, (((0,), (0,)), ((), ())))  # x^T h: [16, 32]
    s = jnp.einsum("bnth,bnsh->bnts", q, k)  # batched over [2, 3]
    return h.sum() + dw.sum() + s.sum()

  args = [jnp.ones(s, jnp.float32) for s in [(8, 16), (16, 32), (2, 3, 5, 4), (2, 3, 7, 4)]]
  dots = matmul_ceiling.dots_of(jax.jit(f).lower(*args).compile().as_text())
  expected = {
    ((8, 16), (16, 32), 2 * 8 * 16 * 32),
    ((8, 16), (8, 32), 2 * 16 * 32 * 8),
    ((2, 3, 5, 4), (2, 3, 7, 4), 2 * 2 * 3 * 5 * 7 * 4),
  }
  assert {(d.lhs, d.rhs, d.flops) for d in dots} == expected, dots
  batched = next(d for d in dots if d.lhs_batch)
  assert (batched.lhs_batch, batched.rhs_batch) == ((0, 1), (0, 1))
  assert (batched.lhs_contracting, batched.rhs_contracting) == ((3,), (3,))
  assert matmul_ceiling.time_dot(batched, repeats=2) > 0


def test_dense_layouts_times_three_gemms_per_layout():
  dense_layouts = _import_benchmark("dense_layouts")
  ms = dense_layouts.dense_gemms(64, 8, 16, repeats=1)
  assert sorted(ms) == ["feature-major", "token-major"]
  assert all(len(v) == 3 and all(t > 0 for t in v) for v in ms.values()), ms


def test_mla_decode_benchmark_tiny():
  """The latent cache is C + R = 160 numbers per layer and token against MHA's 2 N H =
  1,024, from the models' own caches; every variant decodes."""
  out = _run_benchmark("mla_decode.py", "--new-tokens", "4", "--batch-sizes", "1", "--rounds", "1")
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  lines = out.stdout.splitlines()
  for row in (
    "| MHA | 14.71M | 16,384 | 1.0 |",
    "| GQA | 13.13M | 4,096 | 4.0 |",
    "| MLA | 13.39M | 2,560 | 6.4 |",
  ):
    assert row in lines, out.stdout
  decoded = [line for line in lines if line.startswith(("| MHA | 1 ", "| GQA | 1 ", "| MLA | 1 "))]
  assert len(decoded) == 3, out.stdout

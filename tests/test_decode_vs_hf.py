"""`benchmarks/decode_vs_hf.py` runs end to end at a tiny size: our greedy tokens equal
Hugging Face's (exit status 0) and the table holds finite numbers."""

from __future__ import annotations

import math
import os
import subprocess
import sys

from session_env import PATIENCE_S, xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_decode_vs_hf_tiny():
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.path.join(REPO, "benchmarks")])}
  env["XLA_FLAGS"] = xla_flags(1)
  out = subprocess.run(
    [sys.executable, os.path.join(REPO, "benchmarks", "decode_vs_hf.py"), "--vocab", "128",
     "--layers", "2", "--d-model", "32", "--heads", "4", "--max-len", "64", "--prompt-len",
     "8", "--new-tokens", "8", "--batch-sizes", "1", "3", "--rounds", "1"],
    capture_output=True, text=True, env=env, timeout=PATIENCE_S,
  )  # fmt: skip
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  lines = out.stdout.splitlines()
  rows = [line.strip("|").split("|") for line in lines if line.startswith(("| greedy", "| top-k"))]
  assert [(r[0].strip(), r[1].strip()) for r in rows] == [
    ("greedy", "1"), ("greedy", "3"), ("top-k", "1"), ("top-k", "3")
  ], out.stdout  # fmt: skip
  for row in rows:
    numbers = [float(cell.replace(",", "")) for cell in row[2:]]
    assert len(numbers) == 5 and all(math.isfinite(x) and x >= 0 for x in numbers), row
    assert min(numbers[:3]) > 0, row  # tokens/s and their ratio
  for b in (1, 3):
    assert f"greedy, batch {b}: ours and HF identical ({b} x 8 tokens)" in lines, out.stdout

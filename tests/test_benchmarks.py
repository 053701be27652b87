"""The prepared GPU benchmark runs end to end at tiny sizes on the CPU, so it still works
when a GPU machine is available (it is run there, not here)."""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_gpu_gpt2_benchmark_smoke():
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.path.join(REPO, "benchmarks")])}
  env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
  out = subprocess.run(
    [sys.executable, os.path.join(REPO, "benchmarks", "gpu_gpt2.py"), "--smoke", "--rounds",
     "1", "--warmup", "0", "--modes", "eager"],
    capture_output=True, text=True, env=env, timeout=300,
  )  # fmt: skip
  assert out.returncode == 0, out.stderr[-3000:]
  rows = [line for line in out.stdout.splitlines() if line.startswith("| ")]
  assert [r.split(" | ")[0] for r in rows[1:]] == ["| ours (jax)", "| torch eager"], out.stdout
  assert "gpt2_smoke: batch 2 x 128, bf16" in out.stdout

"""The machine a figure was measured on, read from /proc with nothing heavy imported.

Timings on CPUs differ by instruction set (the same code can run twice as fast with
AVX-512 as with AVX2 only), so every benchmark prints `cpu_isa()` in its header and
every run record (`transformer/train/guard/run_record.py`) stores `cpu_info()` and the load.
"""

from __future__ import annotations

import os
from typing import Any

# The vector extensions worth knowing when comparing CPU timings (/proc/cpuinfo names).
ISA_FLAGS = (
  "sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile",
)  # fmt: skip


def cpu_info() -> dict[str, Any]:
  """The CPU's model name, which of `ISA_FLAGS` it has (from /proc/cpuinfo; empty where
  there is none) and how many CPUs this process may run on."""
  model, flags = "", []
  try:
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
      lines = f.read().splitlines()
    model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "")
    flags = next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), [])
  except OSError:
    pass
  try:
    count = len(os.sched_getaffinity(0))
  except (AttributeError, OSError):
    count = os.cpu_count()
  return {"cpu_model": model, "isa": [f for f in ISA_FLAGS if f in flags], "cpu_count": count}


def cpu_isa() -> str:
  """One line for a benchmark header: 'AMD EPYC; ISA: sse4_2 avx avx2 ...'."""
  info = cpu_info()
  isa = " ".join(info["isa"]) or "no SIMD flags listed"
  return f"{info['cpu_model'] or 'unknown CPU'}; ISA: {isa}"


def load_average() -> list[float] | None:
  """The 1, 5 and 15 minute load averages (None where the system has none)."""
  try:
    return [round(x, 2) for x in os.getloadavg()]
  except (AttributeError, OSError):
    return None

"""The machine a figure was measured on, read from /proc with nothing heavy imported.

Timings on CPUs differ by instruction set (AVX-512 against AVX2 only, say), so every
benchmark prints `cpu_isa()` in its header and
every run record (`transformer/train/guard/run_record.py`) stores `cpu_info()` and the load.
The same flags do not name one speed either: a virtual machine's model name is often just
'AMD EPYC', and an AMD EPYC of family 25, model 17 (Zen 4) and one of family 26 (Zen 5)
list the same AVX-512 flags while their float32 matmul peaks differ widely
(docs/PERFORMANCE.md), so the CPU's family and model numbers are printed too.
"""

from __future__ import annotations

import os
from typing import Any

# The vector extensions worth knowing when comparing CPU timings (/proc/cpuinfo names).
ISA_FLAGS = (
  "sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile",
)  # fmt: skip


def cpuinfo_fields() -> dict[str, str]:
  """The first CPU's block of /proc/cpuinfo as {field: value} ('model name', 'cpu family',
  'model', 'flags', ...); empty where there is no /proc/cpuinfo."""
  fields: dict[str, str] = {}
  try:
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
      for line in f.read().split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
  except OSError:
    pass
  return fields


def cpu_info() -> dict[str, Any]:
  """The CPU's model name, its family and model numbers ('family 25, model 17'), which of
  `ISA_FLAGS` it has (from /proc/cpuinfo; empty where there is none) and how many CPUs
  this process may run on."""
  fields = cpuinfo_fields()
  flags = fields.get("flags", "").split()
  family, number = fields.get("cpu family", ""), fields.get("model", "")
  try:
    count = len(os.sched_getaffinity(0))
  except (AttributeError, OSError):
    count = os.cpu_count()
  return {
    "cpu_model": fields.get("model name", ""),
    "cpu_family": f"family {family}, model {number}" if family and number else "",
    "isa": [f for f in ISA_FLAGS if f in flags],
    "cpu_count": count,
  }


def cpu_isa() -> str:
  """One line for a benchmark header: 'AMD EPYC (family 25, model 17); ISA: sse4_2 avx ...'."""
  info = cpu_info()
  isa = " ".join(info["isa"]) or "no SIMD flags listed"
  family = f" ({info['cpu_family']})" if info["cpu_family"] else ""
  return f"{info['cpu_model'] or 'unknown CPU'}{family}; ISA: {isa}"


def load_average() -> list[float] | None:
  """The 1, 5 and 15 minute load averages (None where the system has none)."""
  try:
    return [round(x, 2) for x in os.getloadavg()]
  except (AttributeError, OSError):
    return None

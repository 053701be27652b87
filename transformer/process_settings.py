"""Process-wide settings that make training on the CPU faster, applied before JAX starts.

`train.py` and `eval.py` call `apply(mode)` first thing (flag `--cpu_tuning`, default
'auto'). On a CPU run it does two things (their effect: docs/PERFORMANCE.md):

- glibc keeps freed memory (`mallopt`: one arena, no mmap for large blocks, no trimming;
  the same as MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647).
  XLA:CPU allocates each step's temporaries as one large block; with glibc's defaults it
  is mmap-ed and unmapped every step and the kernel faults and zeroes it again. The cost:
  memory freed during the run is not returned to the OS, and one arena for all threads.
- `--xla_cpu_prefer_vector_width=512` is appended to XLA_FLAGS (XLA's own loops use
  512-bit vectors where the CPU has them; ignored by GPU and TPU backends).

'auto' applies them when JAX will run on the CPU: JAX_PLATFORMS is unset or names only
cpu, and no GPU or TPU plugin (jax_cuda*/jax_rocm* plugins, libtpu) is installed. On
accelerator hosts the host's allocator is left alone (input pipelines there use many
threads, which one arena would serialise).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import pkgutil

MODES = ("auto", "on", "off")
CPU_XLA_FLAGS = "--xla_cpu_prefer_vector_width=512"
_ACCELERATOR_PACKAGES = ("jax_cuda", "jax_rocm", "libtpu", "jax_plugins")


def cpu_only() -> bool:
  """True when JAX is going to run on the CPU (no accelerator requested or installed)."""
  platforms = os.environ.get("JAX_PLATFORMS", "").strip().lower()
  if platforms:
    return set(platforms.split(",")) <= {"cpu"}
  for module in pkgutil.iter_modules():
    if module.name.startswith(_ACCELERATOR_PACKAGES):
      if module.name != "jax_plugins" or _has_plugins():
        return False
  return True


def _has_plugins() -> bool:
  """jax_plugins is a namespace package; it matters only when it holds a plugin."""
  spec = importlib.util.find_spec("jax_plugins")
  paths = list(spec.submodule_search_locations or []) if spec else []
  return any(any(pkgutil.iter_modules([p])) for p in paths)


def keep_freed_memory() -> bool:
  """glibc: one arena, no mmap for large blocks, no trimming. False where not glibc."""
  try:
    libc = ctypes.CDLL("libc.so.6")
    mallopt = libc.mallopt
  except (OSError, AttributeError):  # not Linux / not glibc (musl has no mallopt)
    return False
  m_trim_threshold, m_mmap_max, m_arena_max = -1, -4, -8
  for option, value in ((m_arena_max, 1), (m_mmap_max, 0), (m_trim_threshold, 2**31 - 1)):
    if not mallopt(option, value):
      return False
  return True


def add_xla_flags(flags: str) -> None:
  """Appends to XLA_FLAGS (effective only before the first JAX computation)."""
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()


def apply(mode: str = "auto") -> list[str]:
  """Applies the CPU settings per `mode` ('auto' | 'on' | 'off'); returns what was applied.

  An XLA_FLAGS that already sets the vector width is left as it is.
  """
  if mode not in MODES:
    raise ValueError(f"--cpu_tuning must be one of {MODES}, got {mode!r}")
  if mode == "off" or (mode == "auto" and not cpu_only()):
    return []
  applied = []
  if keep_freed_memory():
    applied.append("malloc: keep freed memory")
  if "xla_cpu_prefer_vector_width" not in os.environ.get("XLA_FLAGS", ""):
    add_xla_flags(CPU_XLA_FLAGS)
    applied.append(CPU_XLA_FLAGS)
  return applied

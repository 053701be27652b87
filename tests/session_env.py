"""The environment of every process of a test session, set before JAX starts.

conftest.py calls `configure()` first thing, in the pytest process and in each xdist worker;
every subprocess a test starts inherits the result (or takes it from `xla_flags`):

- XLA_FLAGS: eight fake CPU devices, and the CPU vector width `train.py` sets
  (`process_settings`), so in-process results round as `train.py` subprocesses do. Flags the
  caller gave are kept, here and in every subprocess: `make test-isa` runs the suite with
  `--xla_cpu_max_isa=AVX2` (or `SSE4_2`), and a subprocess that dropped the cap would test
  another instruction set than the one asked for.
- Quick compilation: XLA:CPU's LLVM back end at `-O0`, and fusions emitted by its older
  element-wise emitter (`QUICK_COMPILE`). More than half of the suite's time was XLA:CPU
  compiling small programs that then run for milliseconds; these two flags compile them
  about three times as fast. XLA's graph passes (fusion, layouts, the schedule) and the
  library kernels (the dots) are unchanged, so a program computes what it computes with
  XLA's defaults, rounded differently in the last bits, as on another CPU. Tests whose
  numbers are the ones users get (the golden curves, the research claims, the benchmarks'
  rows) compile as users' runs do: `release_flags()` for their subprocesses,
  `in_release_codegen(fn, ...)` for work in the test process. `TESTS_XLA_CODEGEN=release`
  runs the whole session that way (`make test-isa` does).
- A persistent JAX compilation cache for the session (a temporary folder, removed at the
  end; every program cached, however fast it compiled). Tests compile the same small
  programs again and again: the tiny LM's train step alone in dozens of `train.py` runs. A
  cached executable is the one XLA compiled, so results are bit for bit those of a fresh
  compilation; JAX keys the cache on the program, the XLA flags, the backend and the
  versions, so runs with other devices counts or ISA caps never share an entry.

- One cache for every process of a `jax.distributed` run (`share_compilations_between_processes`,
  called by the test's training scripts, tests/traced_train.py). JAX keys a program by,
  among other things, the topology of its devices as the compiling process sees it, and
  on the CPU that differs from process to process; only process 0 writes entries, so
  process 1 of every two-process run found none and compiled the train step afresh. Keyed
  instead by what names the devices in every process (platform, kind, id, process index),
  process 1 loads the executable process 0 compiled for the same program and devices.
  Programs on one process's own device keep their own keys (their device assignments
  differ), and a one-process run never shares an entry with a two-process one (the
  process indices differ).

- No Python source locations in the programs JAX lowers (JAX_INCLUDE_FULL_TRACEBACKS_IN_LOCATIONS=0,
  JAX_TRACEBACK_IN_LOCATIONS_LIMIT=0). By default JAX attaches each operation's Python
  call stack to the MLIR it lowers, for profiles and HLO dumps; no test reads them, and
  lowering without them saves about 2% of an in-process test file's CPU time. The
  compiled programs are the same (only the instructions' names and metadata differ), so
  the results are bit for bit the same.

- HF_DATASETS_OFFLINE=1: `datasets` (data.source='hf') reads its cache only, as a test may
  reach no network; a Hub name not cached fails at once instead of after retries.

  share_compilations_between_processes()   in a training subprocess, before it compiles
  xla_flags(devices, release=False) -> str   the session's XLA_FLAGS with `devices` CPU
      devices, for a `train.py` subprocess (the caller's flags, an ISA cap among them, kept;
      the quick-compile ones dropped if `release`)
  release_flags() -> str      the session's XLA_FLAGS without the quick-compile ones
  in_release_codegen(fn, *args, **kwargs)   fn's result, computed in a new Python process
                              that compiles with `release_flags()`
  PATIENCE_S                  how long any test waits for a subprocess or a condition
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import shutil
import tempfile

DEVICES_FLAG = "--xla_force_host_platform_device_count"
VECTOR_FLAG = "--xla_cpu_prefer_vector_width"
CACHE_VARIABLE = "JAX_COMPILATION_CACHE_DIR"
_OWNED = "TESTS_JAX_CACHE_OWNER"  # set by the process that made the cache folder
CODEGEN_VARIABLE = "TESTS_XLA_CODEGEN"  # quick (the default) | release
# XLA:CPU compiles small programs about three times as fast with these (module docstring).
QUICK_COMPILE = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")
# How long a test waits for a subprocess to end or a condition to hold before it fails:
# only a hang should reach it. The longest such wait takes about 2 minutes on 2 idle cores
# (a golden curve at its real size, a Ray sweep); a machine running a second suite beside
# this one takes several times as long, and no test may fail for being slow.
PATIENCE_S = 1200.0


def _flags() -> list[str]:
  return os.environ.get("XLA_FLAGS", "").split()


def _quick(flag: str) -> bool:
  return flag.split("=")[0] in {q.split("=")[0] for q in QUICK_COMPILE}


def xla_flags(devices: int, release: bool = False) -> str:
  """XLA_FLAGS for a subprocess with `devices` fake CPU devices: the caller's own flags (an
  ISA cap among them) and the quick-compile ones unless `release`, nothing else of the
  session's; train.py adds its vector width."""
  kept = [f for f in _flags() if not f.startswith((DEVICES_FLAG, VECTOR_FLAG))]
  kept = [f for f in kept if not (release and _quick(f))]
  return " ".join([f"{DEVICES_FLAG}={devices}", *kept])


def release_flags() -> str:
  """The session's XLA_FLAGS without the quick-compile flags: XLA's own code generation."""
  return " ".join(f for f in _flags() if not _quick(f))


def in_release_codegen(fn, *args, **kwargs):
  """`fn(*args, **kwargs)` in a new Python process that compiles with `release_flags()` (the
  flags are read once, when JAX starts, so the test process cannot switch): for in-process
  work whose numbers are users' numbers, such as a research claim. `fn`, its arguments and
  its result must pickle; an exception in it is raised here, with its traceback."""
  saved = os.environ["XLA_FLAGS"]
  os.environ["XLA_FLAGS"] = release_flags()  # the new process copies the environment
  try:
    context = multiprocessing.get_context("spawn")  # a fresh interpreter, no forked JAX
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
      return pool.submit(fn, *args, **kwargs).result(timeout=PATIENCE_S)
  finally:
    os.environ["XLA_FLAGS"] = saved


def configure() -> None:
  """XLA_FLAGS and the compilation cache (see the module docstring); idempotent."""
  flags = _flags()
  if not any(f.startswith(DEVICES_FLAG) for f in flags):
    flags.insert(0, f"{DEVICES_FLAG}=8")
  if not any(f.startswith(VECTOR_FLAG) for f in flags):
    flags.append(f"{VECTOR_FLAG}=512")  # as train.py on the CPU
  codegen = os.environ.setdefault(CODEGEN_VARIABLE, "quick")
  if codegen not in ("quick", "release"):
    raise ValueError(f"{CODEGEN_VARIABLE}={codegen!r}: expected 'quick' or 'release'")
  flags = [f for f in flags if not _quick(f)]  # 'release': XLA's own code generation
  if codegen == "quick":
    flags += QUICK_COMPILE
  os.environ["XLA_FLAGS"] = " ".join(flags)
  if CACHE_VARIABLE not in os.environ:  # the first process; xdist workers inherit its folder
    os.environ[CACHE_VARIABLE] = tempfile.mkdtemp(prefix="transformer-tests-jax-cache-")
    os.environ[_OWNED] = str(os.getpid())
  os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
  # No Python source locations in the lowered programs (module docstring).
  os.environ.setdefault("JAX_INCLUDE_FULL_TRACEBACKS_IN_LOCATIONS", "0")
  os.environ.setdefault("JAX_TRACEBACK_IN_LOCATIONS_LIMIT", "0")


def remove_cache() -> None:
  """Removes the session's cache folder, in the process that made it (not a user's own)."""
  if os.environ.get(_OWNED) == str(os.getpid()):
    shutil.rmtree(os.environ[CACHE_VARIABLE], ignore_errors=True)


def share_compilations_between_processes() -> None:
  """Keys cached programs by their devices' platform, kind, id and process index instead of
  the topology fingerprint, which on the CPU differs between the processes of one run (see
  the module docstring). A program's other key parts (module, compile options with the
  device assignment, flags, versions) are JAX's own."""
  from jax._src import cache_key

  def by_device_names(hash_obj, devices) -> None:
    for d in devices.flat:
      cache_key._hash_string(hash_obj, f"{d.platform}/{d.device_kind}/{d.id}/{d.process_index}")

  cache_key._hash_accelerator_config = by_device_names

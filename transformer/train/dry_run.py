"""Will it fit? `train.py --config C --workdir W --dry_run --target=NAME` lowers and
compiles the real train step for the target's mesh without training, prints its memory
per device against the target's HBM, its largest buffers and its collectives, and exits
0 if it fits, 3 if not.

Targets (`TARGETS`): TPU slices by their usual names (`tpu-v5p-64`: 64 TensorCores, 32
chips, each one JAX device), GPU hosts as `h200x8`, or any `--target_devices=N
--target_hbm_gib=G`. Where this machine is not the target, the step is compiled for N
fake CPU devices in a child process (`--xla_force_host_platform_device_count`): the same
partitioning, collectives and shapes, but XLA:CPU's buffer assignment, which
docs/SCALING.md compares with a TPU's and a GPU's. The data is prepared in the workdir as
a run would; nothing is trained and no checkpoint is written.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from typing import Any

import jax
import numpy as np
from absl import flags

from transformer.nn import partitioning
from transformer.train import experiment, setup

FITS, DOES_NOT_FIT = 0, 3
CHILD = "TRANSFORMER_DRY_RUN_CHILD"  # set in the child compiling on fake devices
DEVICES_FLAG = "--xla_force_host_platform_device_count"
# TPU generation -> (HBM GiB per chip, TensorCores per chip: the name counts cores).
TPUS = {"v4": (32, 2), "v5p": (95, 2), "v5e": (16, 1), "v5litepod": (16, 1), "v6e": (32, 1)}
# GPU -> HBM GiB per device, as the device reports it (nvidia-smi's MiB / 1024).
GPUS = {"a100": 80.0, "h100": 79.6, "h200": 140.4}
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "collective-permute", "all-to-all")


@dataclasses.dataclass(frozen=True)
class Target:
  name: str
  devices: int
  hbm_gib: float


def define_flags() -> None:
  flags.DEFINE_bool("dry_run", False, "compile the train step for --target and exit: 0 fits, 3 not")
  flags.DEFINE_string("target", None, "dry run target: tpu-v5p-64, h200x8, ... (see dry_run.py)")
  flags.DEFINE_integer("target_devices", 0, "dry run target without a name: devices")
  flags.DEFINE_float("target_hbm_gib", 0.0, "dry run target without a name: HBM GiB per device")


def target(name: str | None, devices: int = 0, hbm_gib: float = 0.0) -> Target:
  """The target a dry run compiles for: a name, or devices and HBM (either overrides the
  name's). An unknown name is one line."""
  if name:
    tpu = re.fullmatch(r"tpu-(v4|v5p|v5e|v5litepod|v6e)-(\d+)", name)
    gpu = re.fullmatch(r"(a100|h100|h200)x(\d+)", name)
    if tpu:
      gib, cores = TPUS[tpu.group(1)]
      chips = max(int(tpu.group(2)) // cores, 1)
      return Target(name, devices or chips, hbm_gib or gib)
    if gpu:
      return Target(name, devices or int(gpu.group(2)), hbm_gib or GPUS[gpu.group(1)])
    raise ValueError(
      f"--target={name!r}: unknown; expected tpu-(v4|v5p|v5e|v5litepod|v6e)-N, "
      "(a100|h100|h200)xN, or --target_devices=N --target_hbm_gib=G"
    )
  if devices < 1 or hbm_gib <= 0:
    raise ValueError("--dry_run needs --target, or --target_devices=N and --target_hbm_gib=G")
  return Target(f"{devices} devices", devices, hbm_gib)


def main(config: Any, workdir: str, t: Target) -> int:
  """The dry run's exit code; here, or in a child process with t.devices CPU devices."""
  if os.environ.get(CHILD) != "1" and not _is_target_here(t):
    return _run_in_child(t)
  report = analyze(config, workdir, t)
  print(report.text())
  return FITS if report.fits else DOES_NOT_FIT


def _is_target_here(t: Target) -> bool:
  return jax.default_backend() != "cpu" and jax.device_count() == t.devices


def _run_in_child(t: Target) -> int:
  kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(DEVICES_FLAG)]
  env = {
    **os.environ,
    CHILD: "1",
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": " ".join([f"{DEVICES_FLAG}={t.devices}", *kept]),
  }
  argv = [a for a in sys.argv if not a.startswith(("--target_devices", "--target_hbm_gib"))]
  argv += [f"--target_devices={t.devices}", f"--target_hbm_gib={t.hbm_gib}"]
  print(f"dry run: compiling for {t.devices} CPU devices in a child process", flush=True)
  return subprocess.run([sys.executable, *argv], env=env, check=False).returncode


@dataclasses.dataclass
class Report:
  target: Target
  mesh: str
  memory: dict[str, int]  # arguments, outputs, aliased, temporaries, total (bytes per device)
  largest: list[tuple[str, int, str]]  # (kind, bytes, what) per device, largest first
  collectives: dict[str, tuple[int, int]]  # kind -> (ops, bytes per step per device)

  @property
  def fits(self) -> bool:
    return self.memory["total"] <= self.target.hbm_gib * 2**30

  def text(self) -> str:
    m, hbm = self.memory, self.target.hbm_gib * 2**30
    verdict = "fits" if self.fits else "DOES NOT FIT"
    lines = [
      f"dry run: {self.target.name}: {self.target.devices} devices,"
      f" {self.target.hbm_gib:g} GiB HBM each; mesh {self.mesh}",
      f"memory per device: arguments {_size(m['arguments'])}, outputs {_size(m['outputs'])}"
      f" ({_size(m['aliased'])} aliased), temporaries {_size(m['temporaries'])};"
      f" total {_size(m['total'])} of {_size(hbm)} ({100 * m['total'] / hbm:.0f}%): {verdict}",
      "largest buffers per device:",
      *(f"  {kind:<9} {_size(n):>10}  {what}" for kind, n, what in self.largest),
      "collectives per step, per device (result sizes; a loop body's once):",
    ]
    for kind in COLLECTIVES:
      ops, n = self.collectives.get(kind, (0, 0))
      lines.append(f"  {kind:<18} {ops:>4} ops {_size(n):>10}")
    return "\n".join(lines)


def analyze(config: Any, workdir: str, t: Target) -> Report:
  """Compile `config`'s train step on this process's devices (the target's count) and
  read its memory, largest buffers and collectives."""
  if jax.device_count() != t.devices:
    raise ValueError(
      f"the dry run for {t.name} needs {t.devices} devices, has {jax.device_count()}"
    )
  exp = experiment.validate(config, workdir)
  built = setup.build(exp, workdir, abstract=True)
  runner = built.runner
  if runner.parallelism != "jit":
    raise ValueError("--dry_run compiles the jit step: set parallelism='jit'")
  state = runner.state_target(built.state)
  batch = {
    k: jax.ShapeDtypeStruct(shape, dtype, sharding=runner.batch_sharding)
    for k, (shape, dtype) in built.info.batch_shapes(True).items()
  }
  compiled = runner.train_step.lower(state, batch).compile()
  stats = compiled.memory_analysis()
  memory = {
    "arguments": stats.argument_size_in_bytes,
    "outputs": stats.output_size_in_bytes,
    "aliased": stats.alias_size_in_bytes,
    "temporaries": stats.temp_size_in_bytes,
  }
  memory["total"] = memory["arguments"] + memory["outputs"] - memory["aliased"]
  memory["total"] += memory["temporaries"]
  hlo = compiled.as_text()
  largest = sorted(_arguments(state) + _temporaries(hlo), key=lambda x: -x[1])[:5]
  return Report(t, partitioning.describe(runner.mesh), memory, largest, collectives(hlo))


def _arguments(state: Any) -> list[tuple[str, int, str]]:
  """(kind, bytes per device, path) of the state's largest leaves."""
  out = []
  for path, leaf in jax.tree_util.tree_leaves_with_path(state):
    shard = leaf.sharding.shard_shape(leaf.shape)
    n = int(np.prod(shard)) * np.dtype(leaf.dtype).itemsize
    out.append(("argument", n, f"{jax.tree_util.keystr(path)} {leaf.dtype}{list(shard)}"))
  return sorted(out, key=lambda x: -x[1])[:3]


_NAME = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = ")
_OP = re.compile(r" ([a-z][\w\-]*)\(")
_ARRAY = re.compile(r"(pred|s4|u4|s8|u8|s16|u16|s32|u32|s64|u64|f16|bf16|f32|f64)\[([\d,]*)\]")
_BYTES = {"pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2}
_NOT_BUFFERS = ("parameter", "get-tuple-element", "tuple", "bitcast", "constant")


def _instruction(line: str) -> tuple[str, str] | None:
  """(result shape, opcode) of an HLO instruction line (a tuple shape may nest), or None."""
  head = _NAME.match(line)
  if not head:
    return None
  rest = line[head.end() :]
  for m in _OP.finditer(rest):
    shape = rest[: m.start()]
    if shape.count("(") == shape.count(")"):
      return shape, m.group(1)
  return None


def _array_bytes(shape: str) -> list[int]:
  sizes = []
  for dtype, dims in _ARRAY.findall(shape):
    count = int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
    sizes.append(count * _BYTES.get(dtype, 8 if dtype.endswith("64") else 4))
  return sizes


def _computations(hlo: str) -> list[tuple[str, list[str]]]:
  """(name, instruction lines) of each computation in HLO text."""
  out, name, lines = [], None, []
  for line in hlo.splitlines():
    head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
    if head and not line.startswith(" "):
      name, lines = head.group(1), []
      out.append((name, lines))
    elif name is not None:
      lines.append(line)
  return out


def _temporaries(hlo: str) -> list[tuple[str, int, str]]:
  """(kind, bytes, what) of the largest buffers the program's instructions produce
  (fused computations' insides are not buffers)."""
  out = []
  for name, lines in _computations(hlo):
    if "fused" in name or name.startswith(("fusion", "wrapped")):
      continue
    for line in lines:
      found = _instruction(line)
      if not found or found[1] in _NOT_BUFFERS:
        continue
      shape, op = found
      sizes = _array_bytes(shape)
      if not sizes:
        continue
      biggest = max(_ARRAY.finditer(shape), key=lambda a: _array_bytes(a.group(0))[0]).group(0)
      source = re.search(r'op_name="([^"]+)"', line)
      what = f"{biggest} {op}" + (f" ({source.group(1)[-90:]})" if source else "")
      out.append(("temporary", max(sizes), what))
  return sorted(out, key=lambda x: -x[1])[:3]


def collectives(hlo: str) -> dict[str, tuple[int, int]]:
  """Kind -> (ops, bytes of their results) in HLO text; an async op counted at its start."""
  out: dict[str, list[int]] = {}
  for line in hlo.splitlines():
    found = _instruction(line)
    if not found:
      continue
    shape, op = found
    kind = op.removesuffix("-start")
    if kind not in COLLECTIVES:
      continue
    sizes = _array_bytes(shape)
    n = max(sizes) if op.endswith("-start") else sum(sizes)
    ops, total = out.get(kind, [0, 0])
    out[kind] = [ops + 1, total + n]
  return {k: (v[0], v[1]) for k, v in out.items()}


def _size(n: float) -> str:
  for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if n >= scale:
      return f"{n / scale:.1f} {unit}"
  return f"{int(n)} B"

"""What the training loop measures besides the metrics: MFU, compiled memory, a profile.

MFU (model FLOPs utilisation) = model FLOP/s / (peak FLOP/s per device x devices). The
model FLOPs are the analytic matmul count of `transformer.nn.models.flops_per_token`
(forward + backward, 3x the forward; attention scores included, causal attention at half
the full count and sliding windows at their band, MaxText's convention: docs/MONITORING.md),
times the tokens the step consumed. The peak comes
from `config.peak_flops` if set, else from `PEAK_FLOPS` for the device kind and compute
dtype, else (CPU, or a device the table lacks) from a timed matmul when
`config.measure_peak_flops` is set; otherwise MFU is not reported.

`memory_summary(compiled)`: the sizes XLA planned for the compiled train step on one
device (arguments, outputs, temporaries), printed once when training starts.

`ProfileWindow(workdir, (first, last))`: a `jax.profiler` trace of updates first..last,
written to `workdir/plugins/profile/<date>/`, where TensorBoard's Profile tab finds it
(`tensorboard --logdir workdir`).
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp

from transformer.data.files import is_remote
from transformer.train import setup
from transformer.train.overview import parameter_overview

# Dense peak FLOP/s of one device by device-kind prefix and compute dtype, without
# sparsity. 'float32' on NVIDIA GPUs is the TF32 tensor-core peak: XLA runs float32 matmuls
# in TF32 there at JAX's default precision. TPUs list bfloat16 only: at the default
# precision a float32 matmul is one bfloat16 pass of the MXU, so its peak is the same.
# NVIDIA H100 / H200 datasheets (SXM), A100 datasheet; Google Cloud TPU system
# architecture pages (per chip).
PEAK_FLOPS: dict[str, dict[str, float]] = {
  "NVIDIA H200": {"bfloat16": 989.4e12, "float16": 989.4e12, "float32": 494.7e12},
  "NVIDIA H100 PCIe": {"bfloat16": 756.0e12, "float16": 756.0e12, "float32": 378.0e12},
  "NVIDIA H100": {"bfloat16": 989.4e12, "float16": 989.4e12, "float32": 494.7e12},  # SXM
  "NVIDIA A100": {"bfloat16": 312.0e12, "float16": 312.0e12, "float32": 156.0e12},
  "TPU v4": {"bfloat16": 275.0e12, "float32": 275.0e12},
  "TPU v5 lite": {"bfloat16": 197.0e12, "float32": 197.0e12},  # v5e
  "TPU v5e": {"bfloat16": 197.0e12, "float32": 197.0e12},
  "TPU v5p": {"bfloat16": 459.0e12, "float32": 459.0e12},
  "TPU v5": {"bfloat16": 459.0e12, "float32": 459.0e12},  # v5p reports 'TPU v5'
  "TPU v6 lite": {"bfloat16": 918.0e12, "float32": 918.0e12},  # v6e (Trillium)
  "TPU v6e": {"bfloat16": 918.0e12, "float32": 918.0e12},
}


def table_peak(device_kind: str, dtype: str) -> float | None:
  """The table's peak FLOP/s for a device kind (`jax.Device.device_kind`) and compute
  dtype; None where it has none (the CPU, unknown devices or dtypes). The longest
  matching prefix wins ('NVIDIA H100 PCIe' before 'NVIDIA H100')."""
  for prefix in sorted(PEAK_FLOPS, key=len, reverse=True):
    if device_kind.startswith(prefix):
      return PEAK_FLOPS[prefix].get(dtype)
  return None


def measure_matmul_peak(dtype: str = "float32", n: int = 1024, repeats: int = 5) -> float:
  """FLOP/s of the best of `repeats` timed [n, n] x [n, n] matmuls on the default device."""
  x = jnp.ones((n, n), dtype)
  matmul = jax.jit(lambda a: a @ a)
  matmul(x).block_until_ready()  # compile
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    matmul(x).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2.0 * n**3 / max(best, 1e-12)


def peak_flops(given: float, measure: bool, dtype: str) -> tuple[float | None, str]:
  """(peak FLOP/s of one device, where it came from), or (None, why) for no MFU."""
  kind = jax.devices()[0].device_kind
  if given > 0:
    return given, "config.peak_flops"
  peak = table_peak(kind, dtype)
  if peak is not None:
    return peak, f"{kind}, {dtype}"
  if measure:
    return measure_matmul_peak(dtype), f"a timed {dtype} matmul on {kind}"
  return None, f"no peak FLOP/s known for {kind!r} ({dtype}): set peak_flops or measure_peak_flops"


def mfu(flops_per_token: float, tokens_per_sec: float, peak: float, devices: int) -> float:
  """Model FLOPs utilisation (a fraction) of all `devices`."""
  return flops_per_token * tokens_per_sec / (peak * devices)


def _mib(n: float) -> str:
  return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


def memory_summary(compiled: Any) -> str | None:
  """One line of the compiled step's memory per device (None where XLA does not say)."""
  stats = compiled.memory_analysis()
  if stats is None:
    return None
  args, out = stats.argument_size_in_bytes, stats.output_size_in_bytes
  alias, temp = stats.alias_size_in_bytes, stats.temp_size_in_bytes
  code = stats.generated_code_size_in_bytes
  total = args + out - alias + temp + code
  return (
    f"compiled train step, memory per device: arguments {_mib(args)}, outputs {_mib(out)} "
    f"({_mib(alias)} of them aliased to arguments), temporaries {_mib(temp)}"
    + (f", code {_mib(code)}" if code else "")
    + f"; about {_mib(total)} in all"
  )


class ProfileWindow:
  """A `jax.profiler` trace of updates `first`..`last` (1-based, inclusive), under
  `workdir/plugins/profile`. The loop calls `before(update)` ahead of each update and
  `after(update, state)` once it is dispatched; the trace stops when `last` has finished
  (or at `close`, if the run ends first). A window that starts before the first update of
  this run (a resume past it) is skipped."""

  def __init__(self, workdir: str, steps: tuple[int, ...], first_update: int, enabled: bool):
    self.workdir = workdir  # an object-storage workdir: a local folder (the profiler's files)
    if is_remote(workdir) and steps and enabled:
      self.workdir = tempfile.mkdtemp(prefix="profile-")
      print(f"profile_steps: {workdir} is not a local folder; the trace goes to {self.workdir}")
    self.window = tuple(steps) if steps else None
    self.active = False
    if self.window and self.window[0] < first_update:
      if enabled:
        print(f"profile_steps={self.window}: starts before update {first_update}; no trace")
      self.window = None
    if not enabled:
      self.window = None

  @property
  def directory(self) -> str:
    return os.path.join(self.workdir, "plugins", "profile")

  def before(self, update: int) -> None:
    if self.window and update == self.window[0] and not self.active:
      # No Python function tracing: it adds memory per update and slows the traced
      # updates; the device ops and the runtime's host events remain.
      options = jax.profiler.ProfileOptions()
      options.python_tracer_level = 0
      jax.profiler.start_trace(self.workdir, profiler_options=options)
      self.active = True

  def after(self, update: int, state: Any) -> None:
    if self.active and update >= self.window[1]:
      self._stop(state)

  def close(self, state: Any = None) -> None:
    if self.active:
      self._stop(state)

  def _stop(self, state: Any) -> None:
    if state is not None:
      jax.block_until_ready(state)  # the traced updates have run, not only been dispatched
    jax.profiler.stop_trace()
    self.active = False
    first, last = self.window
    print(f"profile of updates {first}-{last} -> {self.directory} (TensorBoard: Profile tab)")


def flops_summary(flops_per_token: float, peak: float | None, why: str, devices: int) -> str:
  """The start-up line about MFU: its inputs, or why it is omitted."""
  head = f"model FLOPs: {_si(flops_per_token)}FLOP per token counted (train step)"
  if peak is None:
    return f"{head}; MFU omitted ({why})"
  return f"{head}; MFU against {devices} x {_si(peak)}FLOP/s ({why})"


def _si(value: float) -> str:
  for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
    if value >= factor:
      return f"{value / factor:.4g} {prefix}"
  return f"{value:.4g} "


def report_start(s: setup.Setup, state: Any) -> tuple[float, float | None]:
  """Once before the first update: the parameter overview, the compiled train step's
  memory (compiling the step the loop then runs, once `StepRunner.check_update` has passed
  the update) and the MFU inputs, printed by process 0. Returns (training FLOPs per unit
  the task counts, the peak FLOP/s of one device or None)."""
  tele = s.exp.telemetry
  overview = parameter_overview(s.runner.host_state(state).params)
  compiled = s.runner.lower_train(state, setup.zeros_batch(s.info)).compile()
  memory = memory_summary(compiled)
  flops_per_count = s.exp.task.flops_per_count(s.model_cfg, s.info)
  peak, why = peak_flops(tele.peak_flops, tele.measure_peak_flops, s.model_cfg.dtype)
  if jax.process_index() == 0:
    print(overview.table())
    print(memory or "compiled train step: the backend reports no memory analysis")
    print(flops_summary(flops_per_count, peak, why, jax.device_count()))
  return flops_per_count, peak

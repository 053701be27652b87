"""The MFU our train step would reach if only its matmuls took time, each at its own speed.

  python benchmarks/matmul_ceiling.py                 # reference GPT
  python benchmarks/matmul_ceiling.py --workload vit --repeats 20

Compiles our train step as `benchmarks/train_step.py` does, reads every dot of the
optimized HLO (inside fusions too), times each distinct dot alone (a jitted
`lax.dot_general` on random operands of the same shapes and dimension numbers, row-major),
and prints:
  - per dot class: how many the step runs, FLOPs, time alone, GFLOP/s;
  - the sum of those times next to the measured step time, i.e. what is left for
    everything else (elementwise work, reductions, copies, the optimizer);
  - the MFU ceiling: model FLOPs (`flops_per_token`, the MFU numerator of
    `train_step.py` and `compare.py`) over the matmul-only time, against the machine's
    matmul peak measured in the same run.
If the ceiling is below a target, no amount of work outside the matmuls reaches it; only
faster kernels (or fewer executed FLOPs, as the causal query blocks do) can.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import train_step as ts
from jax import lax

from transformer.train.machine import cpu_isa

_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\w+)\[([\d,]*)\]")
_DOT = re.compile(r" dot\(%?([\w.\-]+), %?([\w.\-]+)\)")


@dataclasses.dataclass(frozen=True)
class Dot:
  """One dot of the compiled program: operand shapes and dimension numbers."""

  dtype: str
  lhs: tuple[int, ...]
  rhs: tuple[int, ...]
  lhs_contracting: tuple[int, ...]
  rhs_contracting: tuple[int, ...]
  lhs_batch: tuple[int, ...]
  rhs_batch: tuple[int, ...]

  @property
  def flops(self) -> int:
    """2 x (product of the output dims) x (contraction size)."""
    free_l = [d for i, d in enumerate(self.lhs) if i not in self.lhs_contracting + self.lhs_batch]
    free_r = [d for i, d in enumerate(self.rhs) if i not in self.rhs_contracting + self.rhs_batch]
    batch = [self.lhs[i] for i in self.lhs_batch]
    contraction = [self.lhs[i] for i in self.lhs_contracting]
    return 2 * int(np.prod(batch + free_l + free_r + contraction, dtype=np.int64))

  def describe(self) -> str:
    spec = f"contract {list(self.lhs_contracting)}x{list(self.rhs_contracting)}"
    if self.lhs_batch:
      spec += f", batch {list(self.lhs_batch)}x{list(self.rhs_batch)}"
    return f"{list(self.lhs)} . {list(self.rhs)} ({spec})"


def _dims(line: str, name: str) -> tuple[int, ...]:
  m = re.search(name + r"=\{([\d,]*)\}", line)
  return tuple(int(d) for d in m.group(1).split(",") if d) if m else ()


def dots_of(hlo_text: str) -> list[Dot]:
  """Every dot instruction of an HLO module's text, with its operands' shapes.

  Operand names are looked up in the computation that holds the dot (XLA names are
  unique per module, so one table serves all computations).
  """
  shapes: dict[str, tuple[str, tuple[int, ...]]] = {}
  dot_lines = []
  for line in hlo_text.splitlines():
    m = _INSTRUCTION.match(line)
    if not m:
      continue
    shapes[m.group(1)] = (m.group(2), tuple(int(d) for d in m.group(3).split(",") if d))
    if _DOT.search(line):
      dot_lines.append(line)
  dots = []
  for line in dot_lines:
    lhs_name, rhs_name = _DOT.search(line).groups()
    dtype, lhs = shapes[lhs_name]
    dots.append(
      Dot(
        dtype=dtype,
        lhs=lhs,
        rhs=shapes[rhs_name][1],
        lhs_contracting=_dims(line, "lhs_contracting_dims"),
        rhs_contracting=_dims(line, "rhs_contracting_dims"),
        lhs_batch=_dims(line, "lhs_batch_dims"),
        rhs_batch=_dims(line, "rhs_batch_dims"),
      )
    )
  return dots


_DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16, "f64": jnp.float64}


def time_dot(d: Dot, repeats: int) -> float:
  """Median seconds of the dot alone (compiled, operands already on the device)."""
  rng = np.random.default_rng(0)
  dtype = _DTYPES[d.dtype]
  a = jnp.asarray(rng.standard_normal(d.lhs), dtype)
  b = jnp.asarray(rng.standard_normal(d.rhs), dtype)
  numbers = ((d.lhs_contracting, d.rhs_contracting), (d.lhs_batch, d.rhs_batch))
  f = jax.jit(lambda x, y: lax.dot_general(x, y, numbers))
  f(a, b).block_until_ready()
  return ts.median_seconds(lambda: f(a, b).block_until_ready(), repeats)


def main():
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--workload", default="gpt", choices=sorted(ts.WORKLOADS))
  parser.add_argument("--repeats", type=int, default=10, help="timings per dot and of the step")
  parser.add_argument("--malloc", default="heap", choices=["heap", "default"])
  parser.add_argument("--xla_flags", default="--xla_cpu_prefer_vector_width=512")
  args = parser.parse_args()
  ts.set_malloc_policy(args.malloc)
  ts.add_xla_flags(args.xla_flags)
  w = ts.WORKLOADS[args.workload]

  ours = ts.OursStep(w)
  ours.compile()
  dots = dots_of(ours.compiled.as_text())
  if not dots:
    raise SystemExit("no dot found in the compiled step's HLO")
  for _ in range(3):
    ours.step()
  step_s = ts.median_seconds(ours.step, args.repeats)
  peak = ts.matmul_peak("float32")

  counts = collections.Counter(dots)
  rows = []
  for d, n in counts.items():
    t = time_dot(d, args.repeats)
    rows.append((n * t, n, d, t))
  rows.sort(key=lambda r: -r[0])
  total_s = sum(r[0] for r in rows)
  executed = sum(n * d.flops for _, n, d, _ in rows)

  print(f"CPU: {cpu_isa()}")
  print(f"workload: {w.name}, batch {w.batch} x {w.seq}; {len(dots)} dots, {len(counts)} distinct")
  print("\n| dot | count | GFLOP each | ms each | GFLOP/s | ms total |\n|---|---|---|---|---|---|")
  for total, n, d, t in rows:
    print(
      f"| {d.describe()} | {n} | {d.flops / 1e9:.3f} | {1e3 * t:.2f} | "
      f"{d.flops / t / 1e9:.0f} | {1e3 * total:.1f} |"
    )
  print("\n| figure | value |\n|---|---|")
  print(f"| measured matmul peak | {peak / 1e9:.0f} GFLOP/s |")
  print(f"| step time (median of {args.repeats}) | {1e3 * step_s:.1f} ms |")
  print(f"| its dots, each timed alone, summed | {1e3 * total_s:.1f} ms |")
  print(f"| left for everything else | {1e3 * (step_s - total_s):.1f} ms |")
  model_flops = w.flops_per_step
  print(f"| executed dot FLOPs / model FLOPs | {executed / 1e9:.1f} / {model_flops / 1e9:.1f} G |")
  print(f"| dots' mean rate | {executed / total_s / 1e9:.0f} GFLOP/s |")
  print(f"| MFU of the step | {100 * model_flops / step_s / peak:.1f}% |")
  ceiling = model_flops / total_s / peak
  print(f"| MFU ceiling (dots only, at their own rates) | {100 * ceiling:.1f}% |")


if __name__ == "__main__":
  main()

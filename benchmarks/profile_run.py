"""Where the default run's wall time goes, from the start of the process to its end.

  python benchmarks/profile_run.py                                  # configs/lm_shakespeare.py
  python benchmarks/profile_run.py --config configs/NAME.py --set num_train_steps=200

Runs `train_and_evaluate` in this process, as `python train.py` does (the same CPU
process settings first), with the loop's `Hooks`: `phase` stamps each phase as the loop
enters it and `batch` stamps every update as its host batch arrives. Then, on the same
setup (built again in a scratch directory), it times the pieces alone:

- the data pipeline: `--probe-steps` host batches drawn back to back;
- the train step: the same number of updates on one real batch, dispatched back to back
  and waited for once (the device time of a step, no host work between them);
- one evaluation over the configured split.

The table splits the run into imports, build (data preparation, tokenizer, model init,
optimizer), start (restore, writers, parameter overview and the train step's
compilation), training, evaluations, checkpoints and the end (the final sample and the
curve plot). "Between steps" is the training phase's wall time less updates x the step's
time alone: the host work the loop does not hide behind the step (batches, logging,
dispatch). Prints Markdown with the CPU's ISA.
"""

from __future__ import annotations

import time

PROCESS_START = time.perf_counter()

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

from transformer import process_settings  # noqa: E402
from transformer.train.machine import cpu_isa  # noqa: E402


def parse_args() -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--config", default="configs/lm_shakespeare.py")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                 help="config override, e.g. num_train_steps=200 (repeatable)")  # fmt: skip
  p.add_argument("--workdir", default=None, help="run directory (default: a fresh temporary one)")
  p.add_argument("--probe-steps", type=int, default=200, help="batches and steps timed alone")
  p.add_argument("--cpu-tuning", default="auto", choices=process_settings.MODES)
  return p.parse_args()


def load_config(path: str, overrides: list[str]):
  spec = importlib.util.spec_from_file_location("_profiled_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  for item in overrides:  # KEY=VALUE, the value parsed as the field's type
    key, _, value = item.partition("=")
    *path, leaf = key.split(".")
    parent = config
    for part in path:
      parent = parent[part]
    old = parent[leaf]
    parent[leaf] = value.lower() in ("1", "true") if isinstance(old, bool) else type(old)(value)
  return config


def main() -> None:
  a = parse_args()
  applied = process_settings.apply(a.cpu_tuning)  # before JAX starts, as train.py does
  t_imports = time.perf_counter()
  import jax

  from transformer.train import actions, experiment, loop, setup

  imported = time.perf_counter()
  config = load_config(a.config, a.set)
  workdir = a.workdir or tempfile.mkdtemp(prefix="profile_run_")
  stamps: list[tuple[str, int, float]] = []  # (phase, update, perf_counter)
  batches: list[float] = []

  def on_phase(name: str, step: int) -> None:
    stamps.append((name, step, time.perf_counter()))

  def on_batch(step: int, batch: dict) -> dict:
    batches.append(time.perf_counter())
    return batch

  run_start = time.perf_counter()
  metrics = loop.train_and_evaluate(config, workdir, loop.Hooks(phase=on_phase, batch=on_batch))
  run_end = time.perf_counter()

  # Phase totals: each phase lasts until the next stamp (the last until the run returns).
  totals: dict[str, float] = {}
  counts: dict[str, int] = {}
  for (name, _, t), nxt in zip(stamps, [*stamps[1:], ("end", 0, run_end)], strict=False):
    totals[name] = totals.get(name, 0.0) + nxt[2] - t
    counts[name] = counts.get(name, 0) + 1
  updates = len(batches)
  first_step = batches[1] - batches[0] if updates > 1 else float("nan")

  # The pieces alone, on the same setup.
  scratch = tempfile.mkdtemp(prefix="profile_probe_")
  exp = experiment.validate(config, scratch)
  s = setup.build(exp, scratch)
  state = s.runner.place_state(s.state)
  n = min(a.probe_steps, updates) or a.probe_steps
  start = time.perf_counter()
  host = [next(s.train_iter) for _ in range(n)]
  data_s = (time.perf_counter() - start) / n
  state, out = s.runner.train(state, host[0])  # compiles
  jax.block_until_ready(out)
  start = time.perf_counter()
  for _ in range(n):
    state, out = s.runner.train(state, host[0])
  jax.block_until_ready(out)
  step_s = (time.perf_counter() - start) / n
  start = time.perf_counter()
  actions.evaluate(s.runner, state, s.eval_factory, exp.eval.eval_batches)
  eval_s = time.perf_counter() - start
  shutil.rmtree(scratch, ignore_errors=True)
  if a.workdir is None:
    shutil.rmtree(workdir, ignore_errors=True)

  load = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else ["?"]
  total = run_end - PROCESS_START
  train_s = totals.get("train", 0.0)
  between = train_s - updates * step_s
  rows = [
    ("imports (jax, flax, tensorflow-datasets, the project)", imported - t_imports, ""),
    ("process start before the imports", t_imports - PROCESS_START, ""),
    ("config", run_start - imported, ""),
    ("build: data preparation, tokenizer, model init, optimizer", totals.get("build", 0), ""),
    ("start: restore, writers, overview, train step compilation", totals.get("restore", 0), ""),
    (f"training: {updates} updates", train_s, f"{1e3 * train_s / max(updates, 1):.2f} ms each"),
    ("  of which the first update (after compilation)", first_step, ""),
    (f"  of which between steps (wall - {updates} x step alone)", between,
     f"{1e3 * between / max(updates, 1):.2f} ms per update"),
    (f"evaluations: {counts.get('eval', 0)}", totals.get("eval", 0),
     f"{totals.get('eval', 0) / max(counts.get('eval', 1), 1):.2f} s each"),
    (f"checkpoints: {counts.get('save', 0)}", totals.get("save", 0), ""),
    ("end: final sample, curve plot, checkpoint wait", totals.get("finish", 0), ""),
  ]  # fmt: skip
  print(f"\nCPU: {cpu_isa()}; load average {' '.join(load)}; jax {jax.__version__}")
  print(f"config {a.config} {' '.join(a.set)}; process settings: {', '.join(applied) or 'none'}")
  print(f"final metrics: {', '.join(f'{k} {v:.4f}' for k, v in sorted(metrics.items()))}\n")
  print("| part of the run | wall s | share | note |")
  print("| --- | ---: | ---: | --- |")
  for name, seconds, note in rows:
    print(f"| {name} | {seconds:.2f} | {100 * seconds / total:.1f}% | {note} |")
  print(f"| **total, process start to the end of training** | {total:.2f} | 100% | |")
  print(
    f"\nAlone, on the same setup ({n} each): a host batch {1e3 * data_s:.3f} ms, a train "
    f"step {1e3 * step_s:.2f} ms, one evaluation {eval_s:.2f} s."
  )


if __name__ == "__main__":
  main()

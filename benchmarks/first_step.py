"""Time to the first training step: a launch with an empty compilation cache against one
with the cache a previous launch wrote.

  python benchmarks/first_step.py                        # the default run, 3 rounds
  python benchmarks/first_step.py --config tests/tiny_lm_config.py --rounds 5

Each launch is `python train.py --config CONFIG --workdir TMP --config.log_every=1
--config.compilation_cache_dir=CACHE` in a fresh workdir, from the repository root; the
clock starts at the subprocess launch and stops when its stdout shows `step 1/` (the
first update done, its loss read back), after which the process is killed. Round r runs
a cold launch (CACHE empty) and then a warm one (CACHE as the cold launch left it), so
the two are side by side under the same load. `--min_compile_time` sets JAX's own
threshold (JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS; JAX's default keeps only programs
that took over 1 s to compile, the runs' default keeps every one) to show what that
choice is worth. Prints the CPU flags and a Markdown table with medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from transformer.train.machine import cpu_isa  # noqa: E402


def launch(config: str, workdir: str, cache: str, env: dict) -> float:
  """Seconds from launch to the first `step 1/` line of a `train.py` run (then killed)."""
  command = [
    sys.executable,
    os.path.join(REPO, "train.py"),
    f"--config={config}",
    f"--workdir={workdir}",
    "--config.log_every=1",
    f"--config.compilation_cache_dir={cache}",
  ]
  start = time.monotonic()
  run = subprocess.Popen(
    command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
  )
  try:
    for line in run.stdout:
      if line.startswith("step 1/"):
        return time.monotonic() - start
    raise RuntimeError(f"{config}: the run ended before its first step (exit {run.wait()})")
  finally:
    run.kill()
    run.wait()


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/lm_shakespeare.py")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--min_compile_time", default=None, help="JAX's threshold, seconds")
  args = parser.parse_args()
  env = dict(os.environ)
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  if args.min_compile_time is not None:
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = args.min_compile_time
  print(f"CPU: {cpu_isa()}; load average {os.getloadavg()[0]:.2f}")
  threshold = args.min_compile_time or "the runs' default, 0"
  print(f"config {args.config}; JAX min compile time (s): {threshold}")
  cold, warm = [], []
  with tempfile.TemporaryDirectory() as tmp:
    for r in range(args.rounds):
      cache = os.path.join(tmp, f"cache{r}")
      cold.append(launch(args.config, os.path.join(tmp, f"cold{r}"), cache, env))
      warm.append(launch(args.config, os.path.join(tmp, f"warm{r}"), cache, env))
  print("\n| launch | median s | all rounds, s |\n| --- | ---: | --- |")
  for name, times in (("cold (empty cache)", cold), ("warm (second launch)", warm)):
    print(f"| {name} | {statistics.median(times):.2f} | {', '.join(f'{t:.2f}' for t in times)} |")


if __name__ == "__main__":
  main()

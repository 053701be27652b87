"""SIGKILL a training run at random moments; the same command resumes it bit-exactly.

  python benchmarks/kill_resume.py                 # 20 trials, seed 0, 1 CPU device
  python benchmarks/kill_resume.py --trials 5 --devices 2

One uninterrupted reference run of the tiny char LM (tests/tiny_lm_config.py, 40 updates,
an asynchronous checkpoint every 4, an evaluation every 10), then per trial: a fresh
workdir, the same command killed with SIGKILL a random time after training starts
(uniform over the reference's training time, from a seeded RNG), then the same command
again to the end; the final train state (params, optimizer state, step, rng, NaN
counters) must equal the reference's byte for byte. What the run was doing at the kill
comes from its `phase` trace (TRANSFORMER_TRACE_PHASES=1): `train` (updates), `eval`,
`save` (starting a checkpoint, which first waits for the previous write), `finish` (final
wait, curves), with `+write` when an asynchronous checkpoint write was in flight (an orbax
temporary directory existed), or `exited` if the run had already ended. Prints a
Markdown table and a summary; exits 1 if any trial failed.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
import fault_harness as fh  # noqa: E402


def parse_args() -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--trials", type=int, default=20)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--devices", type=int, default=1, help="fake CPU devices per run")
  p.add_argument("--workdir", default=None, help="where the runs go (default: a temp dir)")
  return p.parse_args()


def main() -> int:
  args = parse_args()
  root = args.workdir or tempfile.mkdtemp(prefix="kill_resume_")
  env = fh.child_env(os.path.join(root, "compile_cache"), args.devices)
  rng = np.random.default_rng(args.seed)

  t0 = time.time()
  # Two uninterrupted runs: the first fills the compilation cache, the second (as fast as
  # the trials) times the training phase; both must agree bit for bit.
  states = []
  for name in ("reference", "reference_warm"):
    ref_dir = os.path.join(root, name)
    ref = fh.Run(fh.train_command(ref_dir, *fh.KILL_RUN), env)
    if ref.wait() != 0:
      print(ref.output())
      return 1
    states.append(fh.final_state(ref_dir))
  if fh.bit_equal(states[0]["state"], states[1]["state"]):
    print("the two uninterrupted runs differ: training is not deterministic")
    return 1
  reference = states[1]
  begin, end = fh.training_window(ref)
  print(f"reference: {reference['step']} updates, training phase {end - begin:.2f}s\n")

  print("| trial | kill at (s) | doing | checkpoints at kill | resumed from | bit-exact |")
  print("| --- | --- | --- | --- | --- | --- |")
  phases: collections.Counter[str] = collections.Counter()
  failures = 0
  for trial in range(args.trials):
    workdir = os.path.join(root, f"trial_{trial:02d}")
    delay = float(rng.uniform(0.0, end - begin))
    run = fh.Run(fh.train_command(workdir, *fh.KILL_RUN), env)
    killed = fh.interrupt(run, workdir, delay, signal.SIGKILL)
    resumed = fh.Run(fh.train_command(workdir, *fh.KILL_RUN), env)
    code = resumed.wait()
    out = resumed.output()
    origin = next((ln.split()[3] for ln in out.splitlines() if ln.startswith("resumed from")), "0")
    ok = code == 0
    diff = []
    if ok:
      final = fh.final_state(workdir)
      diff = fh.bit_equal(final["state"], reference["state"])
      ok = final["step"] == reference["step"] and not diff
    failures += not ok
    phases[killed["phase"]] += 1
    verdict = "yes" if ok else f"NO (status {code}; {len(diff)} leaves differ)"
    print(
      f"| {trial} | {delay:.2f} | {killed['phase']} | {killed['steps']} | {origin} | {verdict} |",
      flush=True,
    )
    if not ok:
      print(out[-3000:])
  print(f"\n{args.trials} trials, {failures} failures; kills by phase: {dict(phases)}")
  print(f"wall time {time.time() - t0:.0f}s; runs under {root}")
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())

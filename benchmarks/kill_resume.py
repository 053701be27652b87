"""SIGKILL a training run at random moments; the same command resumes it bit-exactly.

  python benchmarks/kill_resume.py                 # 20 trials, seed 0, 1 CPU device
  python benchmarks/kill_resume.py --trials 5 --devices 2
  python benchmarks/kill_resume.py --trials 0 --multihost-preemption   # 2 processes

Two uninterrupted reference runs of the tiny char LM (tests/tiny_lm_config.py, 40 updates,
an asynchronous checkpoint every 4, an evaluation every 10; the first fills the persistent
compilation cache, the second times the run, and they must agree), then per trial: a fresh
workdir, the same command killed with SIGKILL a random time after training starts (even
trials: uniform over the reference's training time from the `phase train` line, first
update and its compilation included; odd trials: uniform over the time after the first
update, from its progress line; seeded RNG), then the same command again to the end; the
final train state (params, optimizer state, step, rng, NaN
counters) must equal the reference's byte for byte. What the run was doing at the kill
comes from its `phase` trace (tests/traced_train.py): `train` (updates), `eval`,
`save` (starting a checkpoint, which first waits for the previous write), `finish` (final
wait, curves), with `+write` when an asynchronous checkpoint write was in flight (an orbax
temporary directory existed), or `exited` if the run had already ended. Prints a
Markdown table and a summary; exits 1 if any trial failed.

`--multihost-preemption`: the same run as two `jax.distributed` processes on this machine
(gloo collectives); SIGTERM goes to process 1 only. JAX's preemption sync point must stop
both processes at the same step, both save it and exit 0, and the same two commands then
finish the run bit-exactly against an uninterrupted two-process run.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import signal
import socket
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
  p.add_argument("--multihost-preemption", action="store_true", help="also the 2-process check")
  return p.parse_args()


def _two_processes(workdir: str, env: dict[str, str]) -> list[fh.Run]:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  return [
    fh.Run(
      fh.train_command(workdir, *fh.KILL_RUN),
      dict(
        env,
        TRANSFORMER_COORDINATOR=f"127.0.0.1:{port}",
        TRANSFORMER_NUM_PROCESSES="2",
        TRANSFORMER_PROCESS_ID=str(i),
      ),
    )
    for i in range(2)
  ]


def multihost_preemption(root: str, env: dict[str, str], delay: float) -> bool:
  """SIGTERM to process 1 of 2; both must save the same step, exit 0, and resume exactly."""
  ref_dir, run_dir = os.path.join(root, "mh_reference"), os.path.join(root, "mh_preempted")
  if any(r.wait() for r in _two_processes(ref_dir, env)):
    print("the uninterrupted 2-process run failed")
    return False
  runs = _two_processes(run_dir, env)
  for run in runs:
    run.wait_for(lambda line: line.startswith("phase save 8"))  # well into training
  time.sleep(delay)
  runs[1].signal(signal.SIGTERM)
  codes = [run.wait() for run in runs]
  said = [re.findall(r"sync point: saved a checkpoint at step (\d+)", r.output()) for r in runs]
  steps = fh.saved_steps(run_dir)
  resumed = _two_processes(run_dir, env)
  resumed_codes = [r.wait() for r in resumed]
  diff = fh.bit_equal(fh.final_state(run_dir)["state"], fh.final_state(ref_dir)["state"])
  ok = codes == [0, 0] and said[0] == said[1] != [] and resumed_codes == [0, 0] and not diff
  print(
    f"2 processes, SIGTERM to process 1 after {delay:.2f}s: exit statuses {codes}, saved steps "
    f"{said} (on disk {steps}); resumed: {resumed_codes}; bit-exact: {not diff} -> "
    f"{'ok' if ok else 'FAILED'}"
  )
  return ok


def main() -> int:
  args = parse_args()
  root = args.workdir or tempfile.mkdtemp(prefix="kill_resume_")
  env = fh.child_env(os.path.join(root, "compile_cache"), args.devices)
  rng = np.random.default_rng(args.seed)

  t0 = time.time()
  source = fh.source_fingerprint()  # bit-for-bit comparisons need the same code throughout
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
  first = next(t for t, line in ref.lines if line.startswith("step 1/"))
  print(
    f"reference: {reference['step']} updates, training phase {end - begin:.2f}s "
    f"({end - first:.2f}s after the first update)\n"
  )

  print("| trial | kill at (s) | doing | checkpoints at kill | resumed from | bit-exact |")
  print("| --- | --- | --- | --- | --- | --- |")
  phases: collections.Counter[str] = collections.Counter()
  failures = 0
  for trial in range(args.trials):
    workdir = os.path.join(root, f"trial_{trial:02d}")
    run = fh.Run(fh.train_command(workdir, *fh.KILL_RUN), env)
    if trial % 2 == 0:  # from the start of training (first update and its compilation included)
      delay = float(rng.uniform(0.0, end - begin))
      killed = fh.interrupt(run, workdir, delay, signal.SIGKILL)
    else:  # from the end of the first update: covers the later steps as well
      delay = float(rng.uniform(0.0, end - first))
      since = run.wait_for(lambda line: line.startswith("step 1/"))
      killed = fh.interrupt(run, workdir, delay, signal.SIGKILL, since=since)
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
  if args.multihost_preemption:
    failures += not multihost_preemption(root, env, float(rng.uniform(0.0, 0.3) * (end - first)))
  if fh.source_fingerprint() != source:
    print("transformer/*.py changed during the sweep: the comparisons are not meaningful")
    failures += 1
  print(f"wall time {time.time() - t0:.0f}s; runs under {root}")
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())

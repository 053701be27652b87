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

`--processes 2 --trials N`: the faults of several hosts and of storage, on two
`jax.distributed` processes of a 12-update run (a checkpoint every 2, an evaluation every
4, every checkpoint kept, `distributed_timeout_s=5`). Per trial a fresh workdir, one fault
drawn at random (seeded), then the same two commands again to the end; the final state
must equal an uninterrupted two-process run's byte for byte:

  kill-step    SIGKILL to a random process between updates (random update, 0-50 ms after)
  kill-save    SIGKILL to a random process while an asynchronous checkpoint write is in
               flight (its orbax temporary folder exists)
  kill-eval    SIGKILL to a random process as it enters a random evaluation
  preempt      SIGTERM to a random process while both are held at a random update
  config       process 1 started with another batch size
  disk-full    the checkpoint folder is a small tmpfs (tests/fault_harness.py `SmallDisk`),
               filled once a random checkpoint is committed, freed before the resume

Expected: a killed process's survivor exits 75 with one `error: process K of 2 was lost`
line naming the latest committed checkpoint (or none); a preempted run exits 0 on both processes
having saved one agreed step; a config mismatch exits 1 on both before building; a full
disk exits non-zero on both with one `error:` line each. Prints a Markdown table (time to
detect: SIGKILL to the survivor's exit) and a summary; exits 1 if any trial failed.
"""

from __future__ import annotations

import argparse
import collections
import errno
import os
import re
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
  p.add_argument("--multihost-preemption", action="store_true", help="also the 2-process check")
  p.add_argument(
    "--processes", type=int, default=1, choices=(1, 2), help="2: the faults of two processes"
  )
  return p.parse_args()


def multihost_preemption(root: str, env: dict[str, str], delay: float) -> bool:
  """SIGTERM to process 1 of 2; both must save the same step, exit 0, and resume exactly."""
  ref_dir, run_dir = os.path.join(root, "mh_reference"), os.path.join(root, "mh_preempted")
  if any(r.wait() for r in fh.processes(2, ref_dir, env, *fh.KILL_RUN)):
    print("the uninterrupted 2-process run failed")
    return False
  runs = fh.processes(2, run_dir, env, *fh.KILL_RUN)
  for run in runs:
    run.wait_for(lambda line: line.startswith("phase save 8"))  # well into training
  time.sleep(delay)
  runs[1].signal(signal.SIGTERM)
  codes = [run.wait() for run in runs]
  said = [re.findall(r"sync point: saved a checkpoint at step (\d+)", r.output()) for r in runs]
  steps = fh.saved_steps(run_dir)
  resumed = fh.processes(2, run_dir, env, *fh.KILL_RUN)
  resumed_codes = [r.wait() for r in resumed]
  diff = fh.bit_equal(fh.final_state(run_dir)["state"], fh.final_state(ref_dir)["state"])
  ok = codes == [0, 0] and said[0] == said[1] != [] and resumed_codes == [0, 0] and not diff
  print(
    f"2 processes, SIGTERM to process 1 after {delay:.2f}s: exit statuses {codes}, saved steps "
    f"{said} (on disk {steps}); resumed: {resumed_codes}; bit-exact: {not diff} -> "
    f"{'ok' if ok else 'FAILED'}"
  )
  return ok


# -- two processes -----------------------------------------------------------------------

TWO = fh.TWO_PROCESS_RUN
KINDS = ("kill-step", "kill-save", "kill-eval", "preempt", "config", "disk-full")
LOST = re.compile(r"error: process (\d) of 2 .*was lost .*Last good checkpoint: (step \d+|none) ")


def _phase_line(name: str, step: int):
  return lambda line: line == f"phase {name} {step}"


def _fault(kind: str, workdir: str, env: dict, rng, disk) -> dict:
  """Runs the two processes of `workdir` with fault `kind`; what happened and whether it
  is what the fault must give."""
  victim = int(rng.integers(2))
  if kind == "config":
    runs = fh.processes(2, workdir, env, *TWO, each=[[], ["--config.batch_size=16"]])
    codes = [run.wait(300) for run in runs]
    lines = [fh.error_lines(run) for run in runs]
    ok = codes == [1, 1] and all(
      len(e) == 1 and "config.batch_size is 8 on process 0 and 16 on process 1" in e[0]
      for e in lines
    )
    return {"victim": "-", "at": "start", "codes": codes, "ok": ok, "detect": None}
  release = os.path.join(workdir + "_release")
  if kind == "preempt":  # both held at a random update while the notice arrives
    step = int(rng.choice([2, 4, 6, 8]))
    env = fh.pause_env(env, f"train {step}", release)
  wrap = disk.wrap if disk is not None else None
  runs = fh.processes(2, workdir, env, *TWO, wrap=wrap, script=fh.PAUSABLE)
  target = runs[victim]
  if kind == "kill-save":
    step = int(rng.choice([2, 4, 6, 8, 10]))
    target.wait_for(_phase_line("save", step))
    deadline = time.monotonic() + 5
    while not fh.in_flight_writes(workdir) and time.monotonic() < deadline:
      time.sleep(0.002)
    at = f"save {step}" + ("+write" if fh.in_flight_writes(workdir) else "")
  elif kind == "kill-eval":
    step = int(rng.choice([4, 8]))
    target.wait_for(_phase_line("eval", step))
    at = f"eval {step}"
  elif kind == "kill-step":
    step = int(rng.choice([2, 4, 6, 8]))
    target.wait_for(_phase_line("train", step))
    time.sleep(float(rng.uniform(0.0, 0.05)))
    at = f"train {step}"
  elif kind == "preempt":
    for run in runs:
      run.wait_for(lambda line: line == f"paused train {step}")
    at = f"train {step} (held)"
  else:  # disk-full: once a random checkpoint is committed
    step = int(rng.choice([2, 4, 6, 8]))
    seen = disk.view(os.path.join(workdir, "checkpoints"))
    deadline = time.monotonic() + 300
    while not os.path.isdir(os.path.join(seen, str(step))) and time.monotonic() < deadline:
      time.sleep(0.01)
    _fill(seen)
    codes = [run.wait(300) for run in runs]
    if os.path.exists(os.path.join(seen, "ballast")):
      os.remove(os.path.join(seen, "ballast"))  # space freed
    lines = [fh.error_lines(run) for run in runs]
    ended = codes == [0, 0] and not any(lines)  # filled after the last write: no fault
    stopped = all(c != 0 for c in codes) and all(len(e) == 1 for e in lines)
    return {"victim": "-", "at": f"after {step}", "codes": codes, "ok": ended or stopped,
            "detect": None}  # fmt: skip
  sent = time.monotonic()
  target.signal(signal.SIGTERM if kind == "preempt" else signal.SIGKILL)
  if kind == "preempt":  # JAX's notifier has it: let both go on to the sync point
    target.wait_for(lambda line: "SIGTERM caught" in line, timeout=60)
    time.sleep(2.0)
    open(release, "w").close()
  survivor = runs[1 - victim]
  survivor.wait(300)
  detect = time.monotonic() - sent if kind != "preempt" else None  # to the survivor's exit
  codes = [run.wait(300) for run in runs]
  if kind == "preempt":
    said = [re.findall(r"sync point: saved a checkpoint at step (\d+)", r.output()) for r in runs]
    ok = codes == [0, 0] and said[0] == said[1] and len(said[0]) == 1
    ok = ok and int(said[0][0]) in fh.committed(workdir)
  else:
    match = [LOST.match(line) for line in fh.error_lines(survivor)]
    ok = (
      codes[victim] == -signal.SIGKILL
      and codes[1 - victim] == 75
      and len(match) == 1
      and match[0] is not None
      and int(match[0].group(1)) == victim
      and match[0].group(2) == (f"step {max(done)}" if (done := fh.committed(workdir)) else "none")
    )
  return {"victim": victim, "at": at, "codes": codes, "ok": ok, "detect": detect}


def _fill(folder: str) -> None:
  """Fills the disk of `folder` with a ballast file (it may be full already)."""
  try:
    with open(os.path.join(folder, "ballast"), "wb") as f:
      while True:
        f.write(b"\0" * 65536)
        f.flush()
  except OSError as e:
    if e.errno != errno.ENOSPC:
      raise


def _final(workdir: str, disk) -> dict:
  return fh.final_state(disk.view(workdir) if disk is not None else workdir)


def two_processes(args) -> int:
  """`--processes 2`: random faults of two processes (module docstring)."""
  root = args.workdir or tempfile.mkdtemp(prefix="kill_resume_2p_")
  env = fh.child_env(os.path.join(root, "compile_cache"))
  rng = np.random.default_rng(args.seed)
  t0 = time.time()
  source = fh.source_fingerprint()
  ref_dir = os.path.join(root, "reference")
  runs = fh.processes(2, ref_dir, env, *TWO)
  if [run.wait(600) for run in runs] != [0, 0]:
    print(runs[0].output()[-3000:])
    return 1
  reference = fh.final_state(ref_dir)
  no_disk = fh.SmallDisk.available()
  kinds = [k for k in KINDS if k != "disk-full" or no_disk is None]
  if no_disk:
    print(f"(no disk-full trials: {no_disk})")
  print("| trial | fault | process | at | statuses | resumed from | bit-exact | detect (s) |")
  print("| --- | --- | --- | --- | --- | --- | --- | --- |")
  by_kind: collections.Counter[str] = collections.Counter()
  detections, exact, failures = [], 0, 0
  for trial in range(args.trials):
    kind = str(rng.choice(kinds))
    workdir = os.path.join(root, f"trial_{trial:02d}")
    disk = None
    if kind == "disk-full":
      disk = fh.SmallDisk(os.path.join(workdir, "checkpoints"), "8m")
    try:
      done = _fault(kind, workdir, env, rng, disk)
      resumed = fh.processes(2, workdir, env, *TWO, wrap=disk.wrap if disk else None)
      codes = [run.wait(600) for run in resumed]
      out = resumed[0].output()
      origin = next(
        (ln.split()[3] for ln in out.splitlines() if ln.startswith("resumed from")), "0"
      )
      same = codes == [0, 0] and not fh.bit_equal(
        _final(workdir, disk)["state"], reference["state"]
      )
    finally:
      if disk is not None:
        disk.close()
    by_kind[kind] += 1
    exact += same
    ok = done["ok"] and same
    failures += not ok
    if done["detect"] is not None:
      detections.append(done["detect"])
    detect = f"{done['detect']:.1f}" if done["detect"] is not None else "-"
    print(
      f"| {trial} | {kind} | {done['victim']} | {done['at']} | {done['codes']} | {origin} | "
      f"{'yes' if same else 'NO'} | {detect} |" + ("" if ok else " FAILED"),
      flush=True,
    )
  print(
    f"\n{args.trials} trials, {failures} failures; faults by kind: {dict(by_kind)}; "
    f"resumes bit-exact: {exact}/{args.trials}"
  )
  if detections:
    print(
      f"time to detect a dead peer (SIGKILL to the survivor's exit, timeout 5 s): min "
      f"{min(detections):.1f}s, median {float(np.median(detections)):.1f}s, max "
      f"{max(detections):.1f}s over {len(detections)} kills"
    )
  if fh.source_fingerprint() != source:
    print("transformer/*.py changed during the sweep: the comparisons are not meaningful")
    failures += 1
  print(f"wall time {time.time() - t0:.0f}s; runs under {root}")
  return 1 if failures else 0


def main() -> int:
  args = parse_args()
  if args.processes == 2:
    return two_processes(args)
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

"""Two `jax.distributed` processes on localhost: exact resume of packed data, and the CRCs
of the array shards each process holds.

Packed MLM on the shipped verses (tiny model, replicated): an uninterrupted two-process
run; the same two commands SIGKILLed once the checkpoint of step 4 is on disk; the same
commands again, which must resume from step 4 and end with a train state equal byte for
byte to the uninterrupted run's. Each process saved its own data-iterator state, and for
packed data those states differ (the check that the per-process files are needed).

Packed seq2seq on the shipped verse pairs, on an FSDP mesh over the two processes, so
every parameter is split between them: after the run, one value is altered in a part held
by process 0 (step 8) and in one held by process 1 (step 6); the rerun must find both
(each process checks its own shards), move them aside, resume from step 4 and end
bit-exact with the run before the alteration. A resume with one process is refused in
one line naming both counts.

Run as a script, this file is `train.py` with the loop's phases on stderr (as
`tests/traced_train.py`) that, given HOLD_AT_PHASE="NAME STEP", stops at that phase
until the test kills it.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import signal
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "data", "bible_kjv_rv1909_en_es.tsv.gz")

# Tiny versions of the shipped recipes; rows long enough that several verses share one.
TINY = {
  "model.d_model": 32,
  "model.num_heads": 2,
  "model.num_layers": 1,
  "model.d_ff": 64,
  "model.max_len": 160,
  "data.tokenizer": "char",
  "data.path": DATA,
  "seq_len": 160,
  "batch_size": 4,  # 2 rows per process
  "num_train_steps": 8,
  "schedule.warmup_steps": 2,
  "checkpoint_every": 2,
  "eval_every": 0,
  "eval_batches": 1,
  "log_every": 2,
}
TASKS = {
  "seq2seq": (
    "configs/translate_en_es.py",
    {"model.num_decoder_layers": 1, "evaluate.bleu.every": 0, "mesh.data": 1, "mesh.fsdp": 2},
  ),
  "mlm": ("configs/mlm_bible.py", {"mesh.data": 2}),
}  # seq2seq: every parameter split over the two processes (FSDP); mlm: replicated


def _overrides(task: str, data_dir: str) -> list[str]:
  values = {**TINY, **TASKS[task][1], "data.data_dir": data_dir}
  return [f"--config.{k}={v}" for k, v in values.items()]


if __name__ == "__main__":  # the training process
  import traced_train

  hold = os.environ.get("HOLD_AT_PHASE")

  def phase(name: str, step: int) -> None:
    print(f"phase {name} {step}", file=sys.stderr, flush=True)
    if hold == f"{name} {step}":
      time.sleep(600)  # the test SIGKILLs this process here

  traced_train.main(phase)
  sys.exit(0)

import fault_harness as fh  # noqa: E402
import pytest  # noqa: E402


def _changed(source: str) -> str:
  changed = fh.source_fingerprint() != source
  return "transformer/*.py changed during the test: different code" if changed else ""


def _command(task: str, workdir: str, data_dir: str) -> list[str]:
  """The command of a one-process run of `task`."""
  config = os.path.join(REPO, TASKS[task][0])
  command = fh.train_command(workdir, script=os.path.abspath(__file__), config=config)
  return command + _overrides(task, data_dir)


def _start(task: str, workdir: str, data_dir: str, env: dict, hold: str | None = None) -> list:
  """Both processes of one run (a fresh coordinator port each time)."""
  config = os.path.join(REPO, TASKS[task][0])
  extra = {"HOLD_AT_PHASE": hold} if hold else {}
  overrides = _overrides(task, data_dir)
  return fh.processes(
    2, workdir, env, *overrides, script=os.path.abspath(__file__), config=config, envs=[extra] * 2
  )


def _finish(runs: list) -> list[str]:
  codes = [run.wait() for run in runs]
  outputs = [run.output() for run in runs]
  assert codes == [0, 0], "\n---\n".join(out[-3000:] for out in outputs)
  return outputs


def _kill_after_checkpoint(runs: list, workdir: str, step: int) -> None:
  """Waits until both processes hold after saving `step` and it is on disk; SIGKILLs both."""
  for run in runs:
    run.wait_for(lambda line: line == f"phase train {step}")
  deadline = time.monotonic() + fh.PATIENCE_S
  while not os.path.isdir(os.path.join(workdir, "checkpoints", str(step))):
    assert time.monotonic() < deadline, f"checkpoint {step} never committed"
    time.sleep(0.1)
  for run in runs:
    run.signal(signal.SIGKILL)
  assert [run.wait() for run in runs] == [-signal.SIGKILL] * 2


def _data_states(workdir: str, step: int) -> list[dict]:
  folder = os.path.join(workdir, "checkpoints", str(step), "data")
  names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
  assert names == ["process_0-of-2.json", "process_1-of-2.json"]
  return [json.loads(open(os.path.join(folder, n)).read()) for n in names]


def _alter_part(workdir: str, step: int, part: int) -> str:
  """Adds 1 to the first value of the `part`-th saved slice of the first array split over
  the processes (through tensorstore: the chunk stays well-formed, as after a flipped
  byte); returns the array's path."""
  import tensorstore as ts

  step_dir = os.path.join(workdir, "checkpoints", str(step))
  with open(os.path.join(step_dir, "checksums", "metadata")) as f:
    shards = json.load(f)["shards"]
  path = next(p for p in sorted(shards) if p.startswith("params/"))
  index = shards[path]["parts"][part][0]
  kvstore = {"driver": "ocdbt", "base": {"driver": "file", "path": f"{step_dir}/state/"}}
  name = path.replace("/", ".")
  array = ts.open({"driver": "zarr", "kvstore": {**kvstore, "path": f"{name}/"}}).result()
  start = tuple(a for a, _ in index)
  array[start].write(array[start].read().result() + 1).result()
  return path


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  """The shipped TSV prepared once (two processes must not race to build it) and a
  compilation cache shared by every run."""
  from transformer.data import sources
  from transformer.train import experiment

  root = tmp_path_factory.mktemp("multihost")
  data_dir = str(root / "tfds")
  for task, (config_file, _) in TASKS.items():
    config = runpy.run_path(os.path.join(REPO, config_file))["get_config"]()
    for key, value in {**TINY, **TASKS[task][1], "data.data_dir": data_dir}.items():
      *parents, leaf = key.split(".")
      block = config
      for parent in parents:
        block = block[parent]
      block[leaf] = value
    sources.open_splits(experiment.validate(config).data, root / task)
  return {"root": root, "data_dir": data_dir, "env": fh.child_env()}


@pytest.mark.slow
def test_two_processes_killed_and_resumed_end_bit_exact(prepared):
  """MLM, replicated: both processes SIGKILLed once step 4 is on disk; the rerun resumes
  there, each process from its own data position, and ends as the uninterrupted run."""
  root, data_dir, env = prepared["root"], prepared["data_dir"], prepared["env"]
  source = fh.source_fingerprint()
  reference, run = str(root / "mlm_reference"), str(root / "mlm_killed")
  _finish(_start("mlm", reference, data_dir, env))

  _kill_after_checkpoint(_start("mlm", run, data_dir, env, hold="train 4"), run, 4)
  states = _data_states(run, 4)
  assert states[0] != states[1], states  # packed per process: the positions differ
  outputs = _finish(_start("mlm", run, data_dir, env))
  assert all("resumed from step 4" in out for out in outputs), outputs[0][-2000:]
  assert fh.final_state(run)["step"] == 8
  diff = fh.bit_equal(fh.final_state(run)["state"], fh.final_state(reference)["state"])
  assert not diff, (diff, _changed(source))


@pytest.mark.slow
def test_two_processes_find_their_corrupt_shards_resume_and_end_bit_exact(prepared):
  """Seq2seq, every parameter split over the two processes (FSDP): after the run, one
  saved part held by process 0 is altered at step 8 and one held by process 1 at step 6.
  The rerun finds both (each process checks its own shards), moves them aside, resumes
  from step 4, each process from its own data position, and ends as the run did before
  the alteration. (A SIGKILL before the resume is the MLM test's: the checkpoint of step
  4 is the same committed one either way.)"""
  root, data_dir, env = prepared["root"], prepared["data_dir"], prepared["env"]
  source = fh.source_fingerprint()
  run = str(root / "seq2seq")
  _finish(_start("seq2seq", run, data_dir, env))
  states = _data_states(run, 4)
  assert states[0] != states[1], states  # packed per process: the positions differ
  uninterrupted = fh.final_state(run)
  assert uninterrupted["step"] == 8

  altered = {8: _alter_part(run, 8, part=0), 6: _alter_part(run, 6, part=-1)}
  outputs = _finish(_start("seq2seq", run, data_dir, env))
  said = [
    re.findall(r"checkpoint step (\d+) in \S+ is corrupt \(on process (\d): checksum mismatch", out)
    for out in outputs
  ]
  for found in said:
    assert {s for s, _ in found} == {"8", "6"} and {p for _, p in found} == {"0", "1"}, found
  for step, path in altered.items():
    assert all(f"{path}[" in out for out in outputs), path
    assert os.path.isdir(os.path.join(run, "checkpoints", "corrupt", str(step)))
  assert all("resumed from step 4" in out for out in outputs)
  resumed = fh.final_state(run)
  assert resumed["step"] == 8
  diff = fh.bit_equal(resumed["state"], uninterrupted["state"])
  assert not diff, (diff, _changed(source))

  # One process cannot continue the two processes' data positions: refused in one line.
  one = fh.Run(_command("seq2seq", run, data_dir) + ["--config.mesh.fsdp=1"], env)
  assert one.wait() == 1
  errors = [line for line in one.output().splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "data-iterator states of 2 processes and this run has 1" in errors[0]

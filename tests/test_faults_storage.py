"""Storage faults while a checkpoint is written: object storage going away, a full disk.

  outage     the Cloud Storage emulator dies in the middle of the write of step 4 and is
             back 2 s later: the storage clients retry and step 4 is committed; it dies
             again in the middle of step 6 and the run is killed while it is down: step 6
             is left partial (no `commit_success.txt`), the resume loads step 4, removes
             the partial folder and ends bit-exact
  disk full  the checkpoint folder is a small tmpfs (a real ENOSPC from the kernel), filled
             up after step 2 is committed: the run stops with one line naming step 4, the
             error and step 2 (kept, and no partial write left); once the space is freed
             the same command resumes from step 2 and ends bit-exact

Both runs are tests/fault_runs.py's in-process run as train.py subprocesses (as many
devices as this process), so they end on the `trained` fixture's state byte for byte.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import time

import fault_harness as fh
import jax
import pytest
from fault_runs import train_flags
from session_env import PATIENCE_S

STEPS = train_flags(num_train_steps=6)  # checkpoints at 2, 4, 6: the `trained` run


def _objects(store: str, prefix: str) -> str:
  """Where the emulator keeps the objects under `prefix` (one file per object)."""
  return os.path.join(store, ".cloudstorage", fh.StorageEmulator.BUCKET, prefix)


def _gcs_steps(folder: str) -> dict[int, bool]:
  """Step folders of a checkpoint root in the bucket -> whether committed."""
  if not os.path.isdir(folder):
    return {}
  return {
    int(name): os.path.exists(os.path.join(folder, name, "commit_success.txt"))
    for name in os.listdir(folder)
    if name.isdigit()
  }


def _bucket_env(emulator: fh.StorageEmulator) -> dict[str, str]:
  """The environment of a run on as many devices as this process, its storage the emulator."""
  env = dict(fh.child_env(devices=jax.device_count()))
  env.update(fh.storage_env(emulator.endpoint))
  env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
  return env


def _resume(emulator: fh.StorageEmulator, command: list[str], env: dict, step: int, partial: int):
  """With the storage back, `command` resumes from `step` and removes the partial write of
  step `partial`."""
  emulator.start()
  resumed = fh.Run(command, env)
  code = resumed.wait(timeout=PATIENCE_S)
  out = resumed.output()
  assert code == 0, out[-3000:]
  assert f"resumed from step {step} (" in out, out[-3000:]
  assert f"removing the partial checkpoint write gs://bucket/run/checkpoints/{partial}" in out


def _check_bucket_run(store: str, tmp_path, trained) -> None:
  """The bucket holds the committed steps 2, 4 and 6; the last is the `trained` state."""
  assert _gcs_steps(_objects(store, "run/checkpoints")) == {2: True, 4: True, 6: True}
  local = str(tmp_path / "copy" / "checkpoints")  # the bucket's objects, read as files
  shutil.copytree(_objects(store, "run/checkpoints"), local)
  final = fh.final_state(os.path.dirname(local))
  assert final["step"] == 6 and not fh.bit_equal(final["state"], trained["state"])


@pytest.mark.slow
def test_storage_outage_mid_save_is_retried_or_never_loaded(tmp_path, trained):
  store = str(tmp_path / "store")
  emulator = fh.StorageEmulator(store)
  url = f"gs://{fh.StorageEmulator.BUCKET}/run"
  mid_write = r"uploadType=.*name=run/checkpoints/{}/state/"  # the 3rd array object of a step
  env = _bucket_env(emulator)
  try:
    emulator.start(die_at=(mid_write.format(4), 3))
    run = fh.Run(fh.train_command(url, *STEPS), env)
    assert "checkpoints/4/state/" in emulator.wait_dead(timeout=PATIENCE_S)
    time.sleep(2.0)  # storage unreachable for 2 s in the middle of the write
    emulator.start(die_at=(mid_write.format(6), 3))
    assert "checkpoints/6/state/" in emulator.wait_dead(timeout=PATIENCE_S)  # step 4 went through
    time.sleep(2.0)
    run.signal(signal.SIGKILL)  # the scheduler gives up on it while the storage is down
    assert run.wait(timeout=PATIENCE_S) == -signal.SIGKILL
    steps = _gcs_steps(_objects(store, "run/checkpoints"))
    assert steps == {2: True, 4: True, 6: False}, steps  # 6: begun, never committed
    _resume(emulator, fh.train_command(url, *STEPS), env, step=4, partial=6)
  finally:
    emulator.stop()
  _check_bucket_run(store, tmp_path, trained)


OUT_OF_RETRIES = re.compile(
  r"error: (checkpoint step 4 could not be written to gs://bucket/run/checkpoints|the metrics "
  r"could not be written to gs://bucket/run) \(.+\).* the latest complete checkpoint is step 2 "
  r"(in gs://bucket/run/checkpoints )?\(kept\)"
)


@pytest.mark.slow
def test_storage_outage_past_the_retries_ends_in_one_line_and_resumes_exactly(tmp_path, trained):
  """The emulator dies in the middle of step 4's write and stays down: with 2 attempts per
  request (`storage_retries`) the run ends within a minute in one line naming step 4 (or
  the metrics) and step 2, status 1; once the storage is back, the same command resumes
  from step 2, removes the partial step 4 and ends bit-exact."""
  store = str(tmp_path / "store")
  emulator = fh.StorageEmulator(store)
  url = f"gs://{fh.StorageEmulator.BUCKET}/run"
  command = fh.train_command(url, *STEPS, "--config.storage_retries=2")
  env = _bucket_env(emulator)
  try:
    emulator.start(die_at=(r"uploadType=.*name=run/checkpoints/4/state/", 3))
    run = fh.Run(command, env)
    assert "checkpoints/4/state/" in emulator.wait_dead(timeout=PATIENCE_S)
    died = time.monotonic()
    code = run.wait(timeout=PATIENCE_S)
    ended = time.monotonic() - died
    errors = fh.error_lines(run)
    assert code == 1 and len(errors) == 1, run.output()[-3000:]
    assert OUT_OF_RETRIES.match(errors[0]), errors[0]
    assert ended < 90, ended  # the clients' own retries: 15 minutes
    assert _gcs_steps(_objects(store, "run/checkpoints")) == {2: True, 4: False}
    _resume(emulator, command, env, step=2, partial=4)
  finally:
    emulator.stop()
  _check_bucket_run(store, tmp_path, trained)


def _fill(folder: str) -> int:
  """Writes a ballast file into `folder` until the disk is full; returns its size."""
  # Unbuffered: a buffered file keeps the tail of a partial write and raises ENOSPC again
  # when it is closed.
  size, chunk = 0, b"\0" * 65536
  fd = os.open(os.path.join(folder, "ballast"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
  try:
    while True:
      size += os.write(fd, chunk)  # a partial write when the disk is nearly full
  except OSError as e:
    assert e.errno == errno.ENOSPC, e
  finally:
    os.close(fd)
  return size


@pytest.mark.slow
def test_disk_full_mid_save_stops_in_one_line_and_resumes_once_freed(tmp_path, trained):
  why_not = fh.SmallDisk.available()
  if why_not:  # the kernel refuses unprivileged user namespaces (no fake: a real disk)
    pytest.skip(f"cannot mount a small disk here: {why_not}")
  workdir = str(tmp_path / "run")
  folder = os.path.join(workdir, "checkpoints")
  disk = fh.SmallDisk(folder, "8m")
  try:
    release = str(tmp_path / "release")
    env = fh.pause_env(fh.child_env(devices=jax.device_count()), "train 2", release)
    cmd = disk.wrap(fh.train_command(workdir, *STEPS, script=fh.PAUSABLE))
    run = fh.Run(cmd, env)
    run.wait_for(lambda line: line == "paused train 2")
    seen = disk.view(folder)
    deadline = time.monotonic() + PATIENCE_S
    while not os.path.isdir(os.path.join(seen, "2")) and time.monotonic() < deadline:
      time.sleep(0.05)
    assert _fill(seen) > 0  # another writer fills the disk once step 2 is committed
    open(release, "w").close()
    code = run.wait(timeout=PATIENCE_S)
    errors = fh.error_lines(run)
    assert code == 1 and len(errors) == 1, run.output()[-3000:]
    assert errors[0].startswith(f"error: checkpoint step 4 could not be written to {folder} ")
    assert "No space left on device" in errors[0], errors[0]
    assert "the latest complete checkpoint is step 2 (kept)" in errors[0], errors[0]
    left = sorted(name for name in os.listdir(seen) if name != "ballast")
    assert left == ["2"], left  # the partial write of step 4 is gone, step 2 intact
    with open(os.path.join(seen, "2", "checksums", "metadata")) as f:
      assert json.load(f)["crc32"]  # still readable; the resume verifies its CRCs

    os.remove(os.path.join(seen, "ballast"))  # space freed
    resumed = fh.Run(disk.wrap(fh.train_command(workdir, *STEPS)), env)
    code = resumed.wait(timeout=PATIENCE_S)
    assert code == 0, resumed.output()[-3000:]
    assert "resumed from step 2 (" in resumed.output()
    final = fh.final_state(disk.view(workdir))
  finally:
    disk.close()
  assert final["step"] == 6 and not fh.bit_equal(final["state"], trained["state"])

"""Corrupt checkpoints, end to end: truncated and bit-flipped checkpoints are detected, moved
aside, and the rerun falls back to the newest valid one and finishes bit-exactly.

The rerun is a train.py subprocess (tests/fault_harness.py) on a copy of the shared
`trained` workdir (tests/fault_runs.py)."""

from __future__ import annotations

import glob
import os
import re
import shutil

import fault_harness as fh
import jax
import pytest
from fault_runs import train_flags

from transformer.train import checkpoints


def _array_files(step_dir):
  """The OCDBT data files of a checkpoint's state (where orbax puts the array chunks)."""
  files = glob.glob(f"{step_dir}/state/**/d/*", recursive=True)
  assert files
  return files


def _alter_array_silently(ckpt: str, step: int, name: str) -> None:
  """Adds 1 to the first element of array `name` of checkpoint `step`, through tensorstore:
  compression and indexes stay valid, so orbax reads the new value without any error (as
  it does a byte flipped inside a compressed chunk; see docs/RELIABILITY.md)."""
  import tensorstore as ts

  with checkpoints.CheckpointManager(ckpt, async_save=False) as mngr:
    before = mngr.restore_numpy(step)
    kvstore = {"driver": "ocdbt", "base": {"driver": "file", "path": f"{ckpt}/{step}/state/"}}
    array = ts.open({"driver": "zarr", "kvstore": {**kvstore, "path": f"{name}/"}}).result()
    values = array.read().result()
    values.reshape(-1)[0] += 1.0
    array.write(values).result()
    after = mngr.restore_numpy(step)  # no error: only the values differ
  assert fh.bit_equal(after, before) == [f"[{']['.join(repr(k) for k in name.split('.'))}]"]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_truncated_and_silently_altered_checkpoints_fall_back_and_finish_bit_exact(
  tmp_path, trained
):
  workdir = str(tmp_path / "run")
  shutil.copytree(trained["workdir"], workdir)
  ckpt = os.path.join(workdir, "checkpoints")
  for path in _array_files(f"{ckpt}/6"):  # truncated: unreadable chunks
    with open(path, "r+b") as f:
      f.truncate(os.path.getsize(path) // 2)
  _alter_array_silently(ckpt, 4, "params.decoder.final_norm.scale")

  # The same run again, through train.py (as many devices as this process has).
  env = fh.child_env(devices=jax.device_count())
  rerun = fh.Run(fh.train_command(workdir, *train_flags(num_train_steps=6)), env)
  assert rerun.wait() == 0, rerun.output()[-3000:]
  out = rerun.output()
  reasons = re.findall(r"CorruptCheckpointWarning: (.*)", out)
  assert len(reasons) == 2, out[-3000:]
  unreadable = r"\((state arrays unreadable|cannot read the state metadata): .*\); moved to "
  assert re.search(r"step 6 .* is corrupt " + unreadable, reasons[0]), reasons
  assert re.search(
    r"step 4 .* is corrupt \(checksum mismatch in 1 array\(s\): params/decoder/final_norm/scale "
    r"\(saved crc32 "
    r"0x[0-9a-f]{8}, read 0x[0-9a-f]{8}\)\); moved to .*corrupt/4",
    reasons[1],
  ), reasons
  assert "resumed from step 2" in out
  for step in ("4", "6"):  # kept aside, not deleted
    assert os.path.isdir(os.path.join(ckpt, checkpoints.CORRUPT_DIR, step, "state"))
  assert fh.saved_steps(workdir) == [2, 4, 6]  # resumed from 2 and saved 4 and 6 again
  final = fh.final_state(workdir)
  assert final["step"] == 6 and fh.bit_equal(final["state"], trained["state"]) == []

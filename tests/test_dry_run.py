"""The dry run (`train/dry_run.py`): the real train step compiled for a target's device
count, its memory against the target's HBM (exit 0 fits, 3 does not, naming the largest
buffers), its collectives by kind, and the targets by name; bad targets are one line."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import tiny_lm_config
from session_env import PATIENCE_S, xla_flags

from transformer.train import dry_run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(**mesh):
  config = tiny_lm_config.get_config()
  for axis, size in mesh.items():
    setattr(config.mesh, axis, size)
  return config


def test_a_config_that_fits_exits_0_and_one_that_does_not_exits_3(tmp_path, monkeypatch, capsys):
  monkeypatch.setenv(dry_run.CHILD, "1")  # compile here, on this session's 8 CPU devices
  fits = dry_run.main(_config(), str(tmp_path), dry_run.Target("8 devices", 8, 16.0))
  out = capsys.readouterr().out
  assert fits == dry_run.FITS, out
  assert "): fits" in out and "mesh data 8" in out

  report = dry_run.analyze(_config(), str(tmp_path), dry_run.Target("tiny", 8, 1e-4))
  assert not report.fits
  assert report.memory["total"] > 1e-4 * 2**30
  text = report.text()
  assert "DOES NOT FIT" in text
  kind, size, what = report.largest[0]  # the largest buffer, named by path or op
  assert size == max(n for _, n, _ in report.largest)
  assert what in text and ("token_embed" in what or "[" in what)


def test_collectives_change_from_data_to_fsdp(tmp_path):
  data = dry_run.analyze(_config(data=8), str(tmp_path), dry_run.Target("t", 8, 16.0))
  fsdp = dry_run.analyze(_config(data=1, fsdp=8), str(tmp_path), dry_run.Target("t", 8, 16.0))
  # Data parallelism all-reduces gradients and gathers nothing; FSDP gathers the weights.
  assert data.collectives.get("all-reduce", (0, 0))[0] > 0
  assert data.collectives.get("all-gather", (0, 0))[0] == 0
  assert fsdp.collectives.get("all-gather", (0, 0))[0] > 0
  # The weights a device holds shrink 8-fold under FSDP: its arguments fall.
  assert fsdp.memory["arguments"] < data.memory["arguments"] / 4


def test_the_command_compiles_for_a_named_target_in_a_child_and_exits_3(tmp_path):
  """train.py --dry_run --target=h100x8 with an HBM below the need: the parent (one CPU
  device) compiles in a child with 8, which prints the verdict; the exit code is 3."""
  result = subprocess.run(
    [
      sys.executable,
      os.path.join(REPO, "train.py"),
      f"--config={os.path.join(REPO, 'tests', 'tiny_lm_config.py')}",
      f"--workdir={tmp_path}",
      "--dry_run",
      "--target=h100x8",
      "--target_hbm_gib=0.0001",
    ],
    env={**os.environ, "XLA_FLAGS": xla_flags(1)},
    capture_output=True,
    text=True,
    timeout=PATIENCE_S,
  )
  assert result.returncode == 3, result.stdout[-2000:] + result.stderr[-2000:]
  assert "compiling for 8 CPU devices in a child process" in result.stdout
  assert "dry run: h100x8: 8 devices, 0.0001 GiB HBM each; mesh data 8" in result.stdout
  assert "DOES NOT FIT" in result.stdout
  named = r"largest buffers per device:\n  (argument|temporary) +[\d.]+ (B|KiB|MiB|GiB)  \S"
  assert re.search(named, result.stdout), result.stdout[-2000:]
  assert not os.path.exists(os.path.join(tmp_path, "checkpoints"))


def test_targets_by_name_and_bad_targets_in_one_line():
  assert dry_run.target("tpu-v5p-64") == dry_run.Target("tpu-v5p-64", 32, 95)
  assert dry_run.target("tpu-v5e-16") == dry_run.Target("tpu-v5e-16", 16, 16)
  assert dry_run.target("h200x8") == dry_run.Target("h200x8", 8, 140.4)
  assert dry_run.target(None, 4, 24.0) == dry_run.Target("4 devices", 4, 24.0)
  with pytest.raises(ValueError, match=r"^--target='tpu-v9-8': unknown; expected"):
    dry_run.target("tpu-v9-8")
  with pytest.raises(ValueError, match="needs --target, or --target_devices"):
    dry_run.target(None)


def test_collectives_are_read_from_hlo_text():
  hlo = """HloModule m
ENTRY %main (p: f32[8]) -> f32[8] {
  %all-reduce.1 = (f32[4,2]{1,0}, f32[8]{0}) all-reduce(%a, %b), replica_groups={}
  %ag = bf16[16,4]{1,0} all-gather(%c), dimensions={0}
  %cp-start = ((f32[8]{0}), f32[8]{0}, u32[], u32[]) collective-permute-start(%d)
  %cp-done = f32[8]{0} collective-permute-done(%cp-start)
  ROOT %x = f32[8]{0} add(%e, %f)
}
"""
  assert dry_run.collectives(hlo) == {
    "all-reduce": (1, (8 + 8) * 4),
    "all-gather": (1, 16 * 4 * 2),
    "collective-permute": (1, 8 * 4),
  }

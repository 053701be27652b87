"""A run written before the package was reorganised still restores and trains on.

`tests/fixtures/legacy_lm_run` is `tests/tiny_lm_config.py` trained for 3 of its 6 steps
(`--config.num_train_steps=3 --config.keep_checkpoints=1`) by the code as it stood before
the tasks / typed-config / layout refactor (commit ab4f0fa). Continued to step 6 by that
same code, the run logged the figures below; the code of today must resume from step 3 and
reach them.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
from session_env import PATIENCE_S, xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(REPO, "tests", "fixtures", "legacy_lm_run")

# metrics.jsonl of the continuation (steps 4-6) by the code that wrote the fixture.
LEGACY_STEP6_TRAIN_LOSS = 4.421627521514893
LEGACY_STEP6_EVAL_LOSS = 4.499118089675903


@pytest.mark.slow
def test_checkpoint_from_before_the_refactor_resumes_and_trains_on(tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(FIXTURE, workdir)
  env = dict(os.environ, XLA_FLAGS=xla_flags(1), JAX_PLATFORMS="cpu")
  cmd = [
    sys.executable,
    os.path.join(REPO, "train.py"),
    f"--config={os.path.join(REPO, 'tests', 'tiny_lm_config.py')}",
    f"--workdir={workdir}",
    "--config.keep_checkpoints=1",
  ]
  result = subprocess.run(
    cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=PATIENCE_S
  )
  assert result.returncode == 0, result.stdout + result.stderr
  assert "resumed from step 3" in result.stdout
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  train6 = [r for r in records if r["step"] == 6 and r["split"] == "train"][-1]
  eval6 = [r for r in records if r["step"] == 6 and r["split"] == "eval"][-1]
  assert train6["loss"] == pytest.approx(LEGACY_STEP6_TRAIN_LOSS, rel=1e-6)
  assert eval6["loss"] == pytest.approx(LEGACY_STEP6_EVAL_LOSS, rel=1e-6)
  assert sorted(os.listdir(workdir / "checkpoints")) == ["6"]

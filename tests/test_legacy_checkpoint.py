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


def test_a_config_saved_before_fields_moved_loads_with_them_at_their_new_places(tmp_path):
  """`eval.py` reads a run's saved config.json: top-level `label_smoothing` and the MLM
  options saved under `data` land in `config.task`, the evaluators' top-level fields in
  `config.evaluate`; a task option the run's task does not take (an LM run's
  `data.mask_rate`, which had no effect) is dropped."""
  from transformer.eval.evaluate import load_config
  from transformer.train.moved_fields import upgrade

  legacy = load_config(FIXTURE)  # an LM run: label_smoothing 0.0 and data.mask_rate 0.15
  assert legacy.task.to_dict() == {"label_smoothing": 0.0, "z_loss": 0.0}
  assert "mask_rate" not in legacy.data and "label_smoothing" not in legacy
  sample = legacy.evaluate.sample  # sample_prompt '', sample_tokens 0, sample_temperature 0.8
  assert (sample.prompts, sample.max_new_tokens, sample.temperature) == ((), 0, 0.8)
  assert legacy.evaluate.bleu.to_dict() == {"every": 0, "beam_size": 1}
  assert "sample_tokens" not in legacy and "bleu_every" not in legacy
  with open(os.path.join(FIXTURE, "config.json")) as f:
    saved = json.load(f)
  saved["data"].update(kind="mlm", mask_rate=0.3, whole_word_masking=True)
  saved["label_smoothing"] = 0.1
  (tmp_path / "config.json").write_text(json.dumps(saved))
  task = load_config(str(tmp_path)).task.to_dict()
  expected = {"label_smoothing": 0.1, "z_loss": 0.0, "mask_rate": 0.3, "whole_word_masking": True}
  assert task == expected
  assert upgrade(saved)["task"]["mask_rate"] == 0.3
  saved.update(sample_prompt="ROMEO:", harness_tasks=["hellaswag"], harness_fewshot=2)
  moved = upgrade(saved)["evaluate"]
  assert moved["sample"]["prompts"] == ("ROMEO:",) and moved["harness"]["num_fewshot"] == 2
  assert moved["harness"]["tasks"] == ["hellaswag"] and "sample_prompt" not in upgrade(saved)

"""Golden curves: the real recipes still learn exactly as fast as when they were recorded.

The other tests check that training runs and stays finite, not that it learns as well: a
wrong scale, a mask off by one or a schedule off by an update trains on, finite, only
slower. Here the default run (configs/lm_shakespeare.py) and one recipe of each other
family (classify_testament: encoder, translate_en_es: encoder-decoder, vit_fashion_mnist:
ViT) train at their real sizes, on their real data, with their real optimizer and
schedule, for their first N updates, and must reproduce what tests/golden/NAME.json
recorded: the N training losses, the N learning rates and one evaluation loss after
update N. The schedule keeps the full run's length (`schedule.total_steps`), so update n
has its full-run learning rate; the run just stops after N (scripts/record_golden.py,
which the test runs with `--out`, so recording and checking run the same thing: each
recipe in its own process, on one CPU device as `train.py` on a CPU host).

Tolerances (docs/GOLDEN.md has the tables). On one machine the runs are deterministic
(run twice: every number bit-identical). Between CPUs XLA:CPU's kernels differ. Measured
on a 2-core AVX-512 CPU (AMD EPYC) against the same runs with `--xla_cpu_max_isa=AVX2`,
with `--xla_cpu_max_isa=SSE4_2` (no FMA), with the matmuls on XLA's own emitter instead
of YNNPACK (`--xla_cpu_experimental_ynn_fusion_type=-individual_dot`) and on one core
instead of two, the largest difference of a training or evaluation loss was 4.8e-6
(translate_en_es, AVX2), of a learning rate 8.5e-6 relative (SSE4_2: the cosine without
FMA). `LOSS_ATOL` = 1e-4 is 20 times that loss drift, `LR_RTOL` = 1e-4 12 times that
rate drift. Regressions move the curves 9 to 2,600 times `LOSS_ATOL`: a peak learning
rate 1% lower by 1.4e-3..3.6e-3 (the largest difference over the N updates), the
attention scale 10% off by 9.1e-4..1.6e-2, the causal mask showing the next token by 0.26
(lm_shakespeare); a warmup one update longer also moves every learning rate by 0.5..1.6%
(50 times `LR_RTOL` and more). Not caught: a layer-norm epsilon of 1e-3 instead of 1e-5
moves translate_en_es and vit_fashion_mnist by less than 1e-4 in these few updates.

A failure is one line per recipe: the first update whose loss differs, recorded vs got,
the tolerance and the command that re-records. Re-record only on purpose, and say why in
the commit message.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from session_env import PATIENCE_S, release_flags

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "record_golden.py"
GOLDEN_DIR = REPO / "tests" / "golden"
LOSS_ATOL = 1e-4  # training and evaluation losses, per update (cross-CPU drift <= 4.8e-6)
LR_RTOL = 1e-4  # learning rates, relative (cross-CPU drift <= 8.5e-6)


def _load_script():
  """scripts/record_golden.py as a module (importing it changes nothing in this process)."""
  spec = importlib.util.spec_from_file_location("record_golden", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


record_golden = _load_script()
NAMES = sorted(record_golden.GOLDEN)


def _first_difference(recorded, got, atol=0.0, rtol=0.0):
  """(update, recorded, got) of the first value outside atol + rtol * |recorded|, or None."""
  for step, (r, g) in enumerate(zip(recorded, got, strict=True), start=1):
    if g is None or not abs(g - r) <= atol + rtol * abs(r):  # NaN / Inf fail too
      return step, r, g
  return None


def _fmt(x: float | None) -> str:
  """A recorded number as the JSON holds it (None: the run logged NaN or Inf)."""
  return "a non-finite value" if x is None else f"{x:.9g}"


def _versions_note(recorded: dict, got: dict) -> str:
  """Which package versions differ from the recording's (often the reason), or ''."""
  old, new = recorded["recorded"]["versions"], got["recorded"]["versions"]
  changed = [f"{p} {old[p]} -> {new.get(p)}" for p in sorted(old) if old[p] != new.get(p)]
  return f" (recorded with other versions: {', '.join(changed)})" if changed else ""


def compare(name: str, recorded: dict, got: dict) -> str | None:
  """One line naming what differs first (training loss, then learning rate, then the
  evaluation loss) against the tolerance, and how to re-record; None if all match."""
  rerecord = (
    f"if the change is intended, re-record with `python scripts/record_golden.py --config "
    f"{name}` and give the reason in the commit message (docs/GOLDEN.md)"
  )
  head = f"{name} (configs/{name}.py, first {recorded['steps']} updates)"
  loss = _first_difference(recorded["train_loss"], got["train_loss"], atol=LOSS_ATOL)
  lr = _first_difference(recorded["learning_rate"], got["learning_rate"], rtol=LR_RTOL)
  if loss is not None:
    step, r, g = loss
    line = f"training loss differs first at update {step}: recorded {r:.9g}, got {_fmt(g)}"
    line += f" (|diff| {abs(g - r):.2e} > tolerance {LOSS_ATOL:g})" if g is not None else ""
    if lr is not None:
      line += f"; the learning rate differs too, first at update {lr[0]}: {lr[1]:.6g} -> "
      line += _fmt(lr[2])
  elif lr is not None:
    step, r, g = lr
    line = (
      f"learning rate differs first at update {step}: recorded {r:.9g}, got {_fmt(g)} "
      f"(relative tolerance {LR_RTOL:g}); the losses still match"
    )
  elif _first_difference([recorded["eval_loss"]], [got["eval_loss"]], atol=LOSS_ATOL):
    r, g = recorded["eval_loss"], got["eval_loss"]
    line = f"evaluation loss after update {recorded['steps']} differs: recorded {r:.9g}, got "
    line += f"{_fmt(g)} (tolerance {LOSS_ATOL:g}); the training losses match"
  else:
    return None
  return f"{head}: {line}{_versions_note(recorded, got)}; {rerecord}"


def test_golden_files_are_current_and_as_the_script_writes_them():
  """One file per recipe of the script, unedited (the script's own formatting), recorded
  with the updates and overrides the script now uses; else every comparison is moot."""
  stems = sorted(p.stem for p in GOLDEN_DIR.glob("*.json"))
  assert stems == NAMES, f"tests/golden/ has {stems}; scripts/record_golden.py GOLDEN {NAMES}"
  for name in NAMES:
    text = (GOLDEN_DIR / f"{name}.json").read_text()
    recorded = json.loads(text)
    assert record_golden.dumps(recorded) == text, f"{name}.json: not as the script writes it"
    _, overrides = record_golden.golden_config(name, record_golden.GOLDEN[name])
    assert (recorded["steps"], recorded["overrides"]) == (record_golden.GOLDEN[name], overrides), (
      f"{name}.json was recorded with other settings: re-record it "
      f"(python scripts/record_golden.py --config {name})"
    )
    steps = recorded["steps"]
    assert len(recorded["train_loss"]) == len(recorded["learning_rate"]) == steps


def test_comparison_names_the_first_differing_update():
  """The failure line: recipe, first update off, recorded vs got, tolerance, the fix."""
  recorded = json.loads((GOLDEN_DIR / "lm_shakespeare.json").read_text())
  assert compare("lm_shakespeare", recorded, recorded) is None
  got = json.loads(json.dumps(recorded))
  got["train_loss"][6] += LOSS_ATOL / 2  # within the tolerance
  assert compare("lm_shakespeare", recorded, got) is None
  got["train_loss"][9] += 3 * LOSS_ATOL
  line = compare("lm_shakespeare", recorded, got)
  r = recorded["train_loss"][9]
  assert line.startswith("lm_shakespeare (configs/lm_shakespeare.py, first 30 updates): ")
  assert f"differs first at update 10: recorded {r:.9g}, got {r + 3 * LOSS_ATOL:.9g}" in line
  assert f"> tolerance {LOSS_ATOL:g}" in line and "record_golden.py --config lm_shakespeare" in line
  assert "\n" not in line
  got = json.loads(json.dumps(recorded))
  got["learning_rate"][0] *= 1.01
  assert "learning rate differs first at update 1" in compare("lm_shakespeare", recorded, got)
  got = json.loads(json.dumps(recorded))
  got["eval_loss"] = float("nan")
  assert "evaluation loss after update 30 differs" in compare("lm_shakespeare", recorded, got)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_recipe_follows_its_golden_curve(name, tmp_path):
  recorded = json.loads((GOLDEN_DIR / f"{name}.json").read_text())
  cmd = [sys.executable, str(SCRIPT), "--config", name, "--out", str(tmp_path)]
  cmd += ["--workdir", str(tmp_path / "runs")]
  # compiled as users' runs are: the recorded curves are their numbers
  env = dict(os.environ, PYTHONUNBUFFERED="1", XLA_FLAGS=release_flags())
  out = subprocess.run(cmd, capture_output=True, text=True, timeout=PATIENCE_S, cwd=REPO, env=env)
  if out.returncode:
    tail = "\n".join((out.stdout + out.stderr).splitlines()[-30:])
    pytest.fail(f"{name}: scripts/record_golden.py exited {out.returncode}:\n{tail}")
  got = json.loads((tmp_path / f"{name}.json").read_text())
  problem = compare(name, recorded, got)
  if problem:
    pytest.fail(problem, pytrace=False)

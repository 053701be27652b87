"""benchmarks/race.py end to end at a tiny size, and the pieces of its nanoGPT side
(benchmarks/nanogpt_torch.py) against their definitions."""

from __future__ import annotations

import importlib
import math
import os
import re
import subprocess
import sys

import pytest
from session_env import PATIENCE_S, xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(REPO, "benchmarks")


def _import_benchmark(name: str):
  sys.path.insert(0, BENCHMARKS)
  try:
    return importlib.import_module(name)
  finally:
    sys.path.remove(BENCHMARKS)


@pytest.mark.slow
def test_race_runs_both_sides_and_prints_finite_rows():
  env = {**os.environ, "XLA_FLAGS": xla_flags(1, release=True)}  # batch 12; timed as users run
  out = subprocess.run(
    [sys.executable, os.path.join(BENCHMARKS, "race.py"), "--quick", "--max-iters", "10",
     "--eval-interval", "5", "--our-steps", "10", "--our-eval-every", "5", "--target", "3.8",
     "--override", "evaluate.sample.max_new_tokens=0"],
    capture_output=True, text=True, env=env, cwd=REPO, timeout=PATIENCE_S,
  )  # fmt: skip
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert "ISA: " in out.stdout and "Caveat:" in out.stdout, out.stdout
  assert "--config.evaluate.sample.max_new_tokens=0" in out.stdout, out.stdout
  rows = {}
  for line in out.stdout.splitlines():
    cells = [c.strip() for c in line.strip("|").split("|")]
    if line.startswith("| 1 | "):
      rows[cells[1].split()[0]] = cells
  assert sorted(rows) == ["ours", "theirs"], out.stdout
  for cells in rows.values():
    time_to_target, step, best, total, full_val = cells[3:8]
    assert int(step) in (5, 10), cells  # about 3.55 at step 5 on both sides
    for value in (time_to_target, best, total, full_val):
      assert math.isfinite(float(value)) and float(value) > 0, cells
    assert float(time_to_target) <= float(total), cells
  ratio = re.search(r"round 1: ours / theirs time to target = \S+ / \S+ = (\S+)", out.stdout)
  assert ratio and math.isfinite(float(ratio.group(1))), out.stdout


def test_race_table_compares_total_walls_when_a_side_misses_the_target():
  race = _import_benchmark("race")
  ours = race.Result(race.OURS, "0.1 / 0.2 / 0.3", [(500, 30.0, 2.1), (1000, 50.0, 1.85)], 70.0)
  theirs = race.Result(race.THEIRS, "1 / 1 / 1", [(0, 2.0, 4.2), (250, 20.0, 1.95)], 60.0, 1.9)
  lines = race.table([(ours, theirs)], 1.88)
  text = "\n".join(lines)
  assert "| 1 | ours (train.py, JAX) | 0.1 / 0.2 / 0.3 | 50.0 | 1000 | 1.8500 | 70.0 |" in text
  assert "| 1 | theirs (nanoGPT, PyTorch) | 1 / 1 / 1 | not reached | - | 1.9500 | 60.0 |" in text
  assert "theirs (nanoGPT, PyTorch) did not reach 1.88, so this compares total walls" in text
  assert "ours / theirs = 70.0 / 60.0 = 1.17" in text


def test_nanogpt_schedule_parameter_count_and_weight_decay_match_their_definitions():
  torch = pytest.importorskip("torch")
  ng = _import_benchmark("nanogpt_torch")

  # get_lr: warmup lr (it + 1) / (warmup + 1), cosine from lr to min_lr over [100, 2000].
  lr, min_lr = 1e-3, 1e-4
  cosine = lambda it: min_lr + 0.5 * (1 + math.cos(math.pi * (it - 100) / 1900)) * (lr - min_lr)
  expected = {
    0: lr * 1 / 101,
    99: lr * 100 / 101,
    100: lr,
    1050: min_lr + 0.5 * (lr - min_lr),
    2000: min_lr,
    2001: min_lr,
  }
  for it, want in expected.items():
    assert ng.get_lr(it) == pytest.approx(want, rel=1e-12, abs=1e-15), it
    if 100 <= it <= 2000:
      assert ng.get_lr(it) == pytest.approx(cosine(it), rel=1e-12), it

  # Parameters of 4 layers x 4 heads x 128 wide, vocab 65, block 64, no biases.
  torch.manual_seed(0)
  V, T, D, L = 65, 64, 128, 4
  model = ng.GPT(ng.GPTConfig(block_size=T, vocab_size=V, n_layer=L, n_head=4, n_embd=D))
  per_layer = 2 * D + D * 3 * D + D * D + D * 4 * D + 4 * D * D  # ln_1, ln_2, attn, MLP
  total = V * D + T * D + L * per_layer + D  # wte (tied with lm_head), wpe, blocks, ln_f
  assert total == 804_096
  assert model.get_num_params(non_embedding=False) == total
  assert model.get_num_params() == total - T * D  # what nanoGPT prints (0.80M)
  assert model.lm_head.weight is model.transformer.wte.weight
  proj = model.transformer.h[0].mlp.c_proj.weight  # 65,536 draws: std within 2%
  assert float(proj.detach().std()) == pytest.approx(0.02 / math.sqrt(2 * L), rel=0.02)
  assert float(model.transformer.h[0].mlp.c_fc.weight.detach().std()) == pytest.approx(
    0.02, rel=0.02
  )

  # Weight decay 0.1 on exactly the tensors with dim >= 2; plain (unfused) AdamW.
  opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
  decay = {id(p) for g in opt.param_groups if g["weight_decay"] == 0.1 for p in g["params"]}
  no_decay = {id(p) for g in opt.param_groups if g["weight_decay"] == 0.0 for p in g["params"]}
  params = dict(model.named_parameters())  # the tied table once
  assert decay == {id(p) for p in params.values() if p.dim() >= 2}
  assert no_decay == {id(p) for p in params.values() if p.dim() < 2}
  assert len(decay) == 2 + 4 * L and len(no_decay) == 2 * L + 1
  assert {n for n, p in params.items() if id(p) in no_decay} == {
    *(f"transformer.h.{i}.ln_{j}.weight" for i in range(L) for j in (1, 2)),
    "transformer.ln_f.weight",
  }
  for g in opt.param_groups:
    assert g["betas"] == (0.9, 0.99) and g["eps"] == 1e-8 and not g["fused"], g

"""The parameter EMA (`config.ema_decay`): the recurrence, resume, evaluation, old checkpoints.

The step's EMA equals a NumPy recurrence over the parameters the same steps produced; a
run stopped and resumed from its checkpoint ends bit-identical (EMA included) to one run
straight through; evaluation logs `eval_ema/*` next to `eval/*` and `eval.py --ema`
reproduces it; a checkpoint written before the state had an EMA resumes with the EMA
starting from its parameters. The bit-exact resume uses the tiny LM of tests/fault_runs.py
(one layer, 4 updates) with Muon and the WSD schedule switched on, so it also trains those
end to end (sharded state included).
"""

from __future__ import annotations

import json
import os
import shutil

import fault_harness as fh
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tiny_lm_config as tiny_lm_config_file
from absl import flags
from conftest import make_lm_batch
from fault_runs import tiny_lm_config

from transformer import eval_main, tasks
from transformer.eval.evaluate import evaluate
from transformer.nn.config import ModelConfig
from transformer.nn.models import build_model
from transformer.train import experiment
from transformer.train import loop as train_lib
from transformer.train.checkpoints import CheckpointManager
from transformer.train.optimizer import create_optimizer
from transformer.train.parallel import StepRunner, make_mesh
from transformer.train.step import StepConfig, create_train_state, train_step

LEGACY_RUN = os.path.join(os.path.dirname(__file__), "fixtures", "legacy_lm_run")
DECAY = 0.2  # with warmup: d_t = min(0.2, (1 + t) / (10 + t)) = 0.1, 0.18.., 0.2, 0.2


def test_ema_in_the_step_equals_the_numpy_recurrence_and_skips_bad_updates():
  cfg = ModelConfig(
    family="decoder", vocab_size=32, d_model=16, num_heads=2, num_layers=1, d_ff=32, max_len=8
  )
  model = build_model(cfg)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.ones((1, 8), jnp.int32))["params"]
  tx = create_optimizer({"kind": "adamw", "weight_decay": 0.1}, 1e-2, params)
  step_cfg = StepConfig(
    model=model, tx=tx, task=tasks.get("lm")(), ema_decay=DECAY, ema_warmup=True
  )
  runner = StepRunner(step_cfg, "jit", make_mesh(jax.devices()[:1]), update=train_step)
  state = runner.place_state(create_train_state(params, tx, jax.random.PRNGKey(1), ema=True))
  rng = np.random.default_rng(0)
  history = [jax.device_get(state.params)]  # p_0, p_1, ...
  for _ in range(4):
    state, _ = runner.train(state, make_lm_batch(rng, b=4))
    history.append(jax.device_get(state.params))

  want = jax.tree.map(lambda x: np.asarray(x, np.float64), history[0])  # e_0 = p_0
  for t, p in enumerate(history[1:]):
    d = min(DECAY, (1 + t) / (10 + t))
    want = jax.tree.map(lambda e, x, d=d: d * e + (1 - d) * np.asarray(x, np.float64), want, p)
  got = jax.device_get(state.ema_params)
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7), got, want)
  assert not np.allclose(jax.tree.leaves(got)[0], jax.tree.leaves(history[-1])[0])

  # A NaN/Inf update is not applied: the EMA stays with the parameters.
  before = jax.device_get(state.ema_params)
  poisoned = state.replace(params=jax.tree.map(lambda x: x * jnp.nan, state.params))
  after, _ = runner.train(poisoned, make_lm_batch(rng, b=4))
  assert int(after.nonfinite_count) == 1
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(after.ema_params), before)


FEATURES = {
  "ema_decay": 0.5,
  "optimizer.kind": "muon",
  "schedule.kind": "wsd",
  "schedule.total_steps": 4,  # the same schedule for the run stopped at step 2
  "schedule.decay_fraction": 0.5,
  "eval_every": 2,
}


def _records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def test_resume_is_bit_exact_and_eval_logs_and_eval_py_ema_evaluate_the_ema(tmp_path, capsys):
  """A run killed right after its step-2 checkpoint (a copy of the straight run without
  the later checkpoint) resumes to the same step-4 state, bit for bit."""
  straight, stopped = str(tmp_path / "straight"), str(tmp_path / "stopped")
  final = train_lib.train_and_evaluate(tiny_lm_config(**FEATURES), straight)
  assert fh.saved_steps(straight) == [2, 4]
  shutil.copytree(straight, stopped)
  shutil.rmtree(os.path.join(stopped, "checkpoints", "4"))
  train_lib.train_and_evaluate(tiny_lm_config(**FEATURES), stopped)
  assert "resumed from step 2" in capsys.readouterr().out
  a, b = fh.final_state(straight), fh.final_state(stopped)
  assert a["step"] == b["step"] == 4
  assert set(a["state"]["ema_params"]) == set(a["state"]["params"])
  assert fh.bit_equal(a["state"], b["state"]) == []
  ema, params = a["state"]["ema_params"], a["state"]["params"]
  assert not np.array_equal(jax.tree.leaves(ema)[0], jax.tree.leaves(params)[0])

  # Every evaluation is logged for the raw and the EMA weights; the run returns both.
  records = _records(straight)
  raw = {r["step"]: r["loss"] for r in records if r["split"] == "eval"}
  averaged = {r["step"]: r["loss"] for r in records if r["split"] == "eval_ema"}
  assert sorted(raw) == sorted(averaged) == [2, 4]
  assert final["loss"] == raw[4] and final["ema_loss"] == averaged[4] != raw[4]

  # eval.py --ema evaluates the EMA weights.
  try:
    flags.FLAGS(["eval.py", f"--workdir={straight}", "--ema"])
    eval_main._run()
  finally:
    flags.FLAGS.unparse_flags()
  lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("step 4 |")]
  assert len(lines) == 1 and lines[0].endswith("| weights ema"), lines
  with open(os.path.join(straight, "eval_step_4_ema.json")) as f:
    assert json.load(f)["loss"] == pytest.approx(averaged[4], rel=1e-6)


def test_a_checkpoint_from_before_the_ema_existed_resumes_with_the_ema_from_its_weights(
  tmp_path, capsys
):
  """tests/fixtures/legacy_lm_run (step 3, written before the train state had an EMA
  field) continued for one update with ema_decay=0.25: e_4 = 0.25 * p_3 + 0.75 * p_4."""
  workdir = str(tmp_path / "run")
  shutil.copytree(LEGACY_RUN, workdir)
  with pytest.raises(ValueError, match=r"^--ema: the run in .* keeps no EMA of its parameters"):
    evaluate(workdir, ema=True)
  config = tiny_lm_config_file.get_config()
  config.update(num_train_steps=4, ema_decay=0.25)
  train_lib.train_and_evaluate(config, workdir)
  out = capsys.readouterr().out
  assert "resumed from step 3" in out
  assert "checkpoint step 3 has no parameter EMA: it starts from its weights" in out
  with CheckpointManager(os.path.join(workdir, "checkpoints"), async_save=False) as mgr:
    assert mgr.all_steps() == [3, 4]
    state3, state4 = mgr.restore_numpy(3), mgr.restore_numpy(4)
  assert "ema_params" not in state3  # the field did not exist when it was written
  p3 = state3["params"]
  want = jax.tree.map(lambda a, b: 0.25 * a + 0.75 * b, p3, state4["params"])
  jax.tree.map(
    lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7), state4["ema_params"], want
  )


@pytest.mark.parametrize(
  "changes, message",
  [
    ({"ema_decay": 1.0}, r"^config.ema_decay=1.0: must be in \(0, 1\), or 0 for no EMA$"),
    ({"ema_decay": -0.5}, r"^config.ema_decay=-0.5: must be in \(0, 1\)"),
    ({"ema_warmup": True}, r"^config.ema_warmup=True: needs ema_decay in \(0, 1\)$"),
    ({"best_metric": "ema_loss"}, r"^config.best_metric='ema_loss': ranks the EMA weights"),
  ],
)
def test_bad_ema_fields_are_one_line_errors(changes, message):
  with pytest.raises(ValueError, match=message):
    experiment.validate(tiny_lm_config(**changes))

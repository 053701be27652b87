"""The training loop end to end on tiny configs, and the step's parallel equivalences."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import make_lm_batch, train_losses
from session_env import PATIENCE_S

from transformer import tasks
from transformer.data import masking
from transformer.data.tokenizers import CLS_ID, NUM_SPECIAL, PAD_ID, SEP_ID
from transformer.eval.evaluate import evaluate
from transformer.nn.config import ModelConfig
from transformer.nn.models import build_model
from transformer.tasks.mlm import MaskedLanguageModeling, MLMOptions
from transformer.train import experiment
from transformer.train import loop as train_lib
from transformer.train import step as train_step_lib
from transformer.train.parallel import StepRunner, make_mesh
from transformer.train.step import StepConfig, create_train_state, train_step

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_lm_config(**loop):
  """The default config shrunk to seconds: 2 layers of width 32 on 16-character rows."""
  config = experiment.default_config()
  m = config.model
  m.family, m.d_model, m.num_heads, m.num_layers, m.d_ff, m.max_len = "decoder", 32, 2, 2, 64, 32
  config.data.path = os.path.join(REPO, "data", "tinyshakespeare.txt.gz")
  config.data.validation_fraction = 0.1
  config.data.test_fraction = 0.0
  config.schedule.warmup_steps = 2
  fields = dict(
    batch_size=8,
    seq_len=16,
    num_train_steps=6,
    log_every=2,
    eval_every=3,
    eval_batches=2,
    checkpoint_every=3,
  )
  config.evaluate.sample.max_new_tokens = 0
  config.update({**fields, **loop})
  return config


# --------------------------------------------------------------------------------------
# Steps: parallelism and accumulation are exact rewrites of the same update.


def _runner(parallelism, devices=None, accum=1, clip=1.0, lr=3e-3):
  cfg = ModelConfig(
    family="decoder", vocab_size=32, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_len=16
  )
  model = build_model(cfg)
  tx = optax.chain(optax.clip_by_global_norm(clip), optax.adamw(lr, b2=0.98, eps=1e-9))
  step_cfg = StepConfig(
    model=model,
    tx=tx,
    task=tasks.get("lm")(options=tasks.CrossEntropyOptions(label_smoothing=0.1)),
    grad_accum_steps=accum,
  )
  mesh = make_mesh(devices) if devices is not None else None
  runner = StepRunner(step_cfg, parallelism, mesh, update=train_step)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.ones((1, 8), jnp.int32))["params"]
  return runner, create_train_state(params, tx, jax.random.PRNGKey(1))


def _losses(runner, state, batches):
  losses, state = train_losses(runner, state, batches)
  return losses, runner.host_state(state)


def test_jit_and_pmap_on_8_devices_match_one_device():
  assert jax.device_count() == 8, "tests/conftest.py fakes 8 CPU devices"
  rng = np.random.default_rng(0)
  batches = [make_lm_batch(rng) for _ in range(5)]
  single, s1 = _losses(*_runner("jit", jax.devices()[:1]), batches)
  jit8, s8 = _losses(*_runner("jit"), batches)
  pmap8, sp = _losses(*_runner("pmap"), batches)
  np.testing.assert_allclose(jit8, single, atol=1e-5)
  np.testing.assert_allclose(pmap8, single, atol=1e-5)
  assert single[-1] < single[0]  # it learns
  # Parameters are not compared elementwise: Adam divides by sqrt(v) + 1e-9, so entries
  # whose gradient is ~0 turn reduction-order noise into lr-sized steps on every path.
  del s1, s8, sp


def test_gradient_accumulation_equals_one_large_batch():
  rng = np.random.default_rng(1)
  batches = [make_lm_batch(rng) for _ in range(3)]
  devices = jax.devices()[:1]
  big, s_big = _losses(*_runner("jit", devices, accum=1), batches)
  acc, s_acc = _losses(*_runner("jit", devices, accum=4), batches)
  np.testing.assert_allclose(acc, big, atol=1e-5)
  del s_big, s_acc  # see the comment in the test above


MLM_RATE, MLM_LEN = 0.15, 24


def _mlm_batch(rng, b=8, t=MLM_LEN, vocab=40):
  """Rows of [CLS] text [SEP] PAD... masked by `masking.mask_tokens`, as the pipeline does."""
  rows = {k: [] for k in ("inputs", "targets", "weights", "segment_ids", "positions")}
  for i in range(b):
    n = int(rng.integers(4, t + 1))
    ids = np.full(t, PAD_ID, np.int32)
    ids[0], ids[1 : n - 1], ids[n - 1] = CLS_ID, rng.integers(NUM_SPECIAL, vocab, n - 2), SEP_ID
    if i == 0:  # a row of ordinary tokens only: as many scored positions as any row can have
      ids = rng.integers(NUM_SPECIAL, vocab, t).astype(np.int32)
    inputs, weights = masking.mask_tokens(ids, rng, vocab, mask_rate=MLM_RATE)
    rows["inputs"].append(inputs)
    rows["targets"].append(ids)
    rows["weights"].append(weights)
    rows["segment_ids"].append((ids != PAD_ID).astype(np.int32))
    rows["positions"].append(np.arange(t, dtype=np.int32))
  return {k: np.stack(v) for k, v in rows.items()}


def _mlm_runner(max_predictions):
  cfg = ModelConfig(
    family="encoder", vocab_size=40, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_len=32
  )
  model = build_model(cfg)
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(3e-3, b2=0.98, eps=1e-9))
  step_cfg = StepConfig(
    model=model,
    tx=tx,
    task=MaskedLanguageModeling(max_predictions, options=MLMOptions(label_smoothing=0.1)),
  )
  runner = StepRunner(step_cfg, "jit", make_mesh(jax.devices()[:1]), update=train_step)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.ones((1, 8), jnp.int32))["params"]
  return runner, create_train_state(params, tx, jax.random.PRNGKey(1)), model


def test_mlm_logits_at_scored_positions_only_give_the_same_updates():
  """BERT's max_predictions_per_seq: the head runs on the scored positions (padded to the
  per-row bound); loss, metrics and gradients equal those of logits at every position."""
  rng = np.random.default_rng(4)
  batches = [_mlm_batch(rng) for _ in range(3)]
  bound = masking.max_selected(MLM_RATE, MLM_LEN)
  counts = np.concatenate([(b["weights"] > 0).sum(-1) for b in batches])
  assert counts.max() == bound and counts.min() < bound  # full rows and padded ones
  metrics, grads = {}, {}
  for max_predictions in (None, bound):
    runner, state, model = _mlm_runner(max_predictions)
    params = jax.device_get(state.params)  # the step donates the state
    loss_sum = functools.partial(
      train_step_lib._objective,
      runner.cfg,
      frozen=None,
      rng=jax.random.PRNGKey(7),
      deterministic=False,
    )
    grad = jax.jit(jax.grad(lambda p, b, f=loss_sum: f(p, batch=b)["loss"]))
    grads[max_predictions] = grad(params, batches[0])
    state = runner.place_state(state)
    metrics[max_predictions] = []
    for b in batches:
      state, m = runner.train(state, b)
      metrics[max_predictions].append({k: float(v) for k, v in jax.device_get(m).items()})
  for a, g in zip(metrics[None], metrics[bound], strict=True):
    for k in ("loss", "perplexity", "accuracy", "grad_norm", "param_norm"):
      assert g[k] == pytest.approx(a[k], rel=2e-5), k
  close = lambda a, g: np.testing.assert_allclose(g, a, rtol=1e-4, atol=2e-6)
  jax.tree.map(close, grads[None], grads[bound])
  # The model itself: logits at given positions are the full logits there.
  b = batches[0]
  predict = np.argsort(b["weights"] <= 0, axis=-1, kind="stable")[:, :bound]
  args = (b["inputs"], b["segment_ids"], b["positions"])
  all_logits = model.apply({"params": params}, *args)
  some = model.apply({"params": params}, *args, predict_positions=predict)
  np.testing.assert_allclose(
    some, np.take_along_axis(np.asarray(all_logits), predict[..., None], 1), rtol=1e-5, atol=1e-5
  )


def test_mlm_row_scoring_more_positions_than_predicted_is_refused():
  runner, state, _ = _mlm_runner(max_predictions=2)
  batch = _mlm_batch(np.random.default_rng(5))
  batch["weights"][:] = 0.0
  batch["weights"][3, 1:4] = 1.0
  state = runner.place_state(state)
  with pytest.raises(ValueError, match="scores 3 positions, more than the 2"):
    runner.train(state, batch)


def test_tiny_model_memorises_one_batch():
  batch = make_lm_batch(np.random.default_rng(2), b=4, t=8)
  runner, state = _runner("jit", jax.devices()[:1], clip=10.0, lr=1e-2)
  state = runner.place_state(state)
  for _ in range(150):
    state, metrics = runner.train(state, batch)
  # Label smoothing 0.1 puts the floor at the smoothed distribution's entropy.
  assert float(metrics["normalized_loss"]) < 0.05
  assert float(metrics["accuracy"]) == 1.0


def test_nonfinite_update_is_not_applied_and_reported():
  runner, state = _runner("jit", jax.devices()[:1])
  batch = make_lm_batch(np.random.default_rng(3))
  state = runner.place_state(state)
  state, _ = runner.train(state, batch)
  before = jax.device_get(state.params)
  poisoned = jax.tree.map(lambda x: x, state)
  poisoned = poisoned.replace(params=jax.tree.map(lambda x: x * jnp.nan, state.params))
  after, metrics = runner.train(poisoned, batch)
  assert not np.isfinite(float(metrics["loss"]))
  assert int(after.nonfinite_count) == 1 and int(after.first_nonfinite_step) == 2
  del before


# --------------------------------------------------------------------------------------
# The loop: resume, evaluation, bad input.


def test_train_resume_and_eval_reproduce(tmp_path):
  workdir = str(tmp_path / "run")
  metrics = train_lib.train_and_evaluate(tiny_lm_config(), workdir)
  assert set(os.listdir(os.path.join(workdir, "checkpoints"))) >= {"3", "6"}
  for name in ("config.json", "model_config.json", "metrics.jsonl", "curves.png"):
    assert os.path.exists(os.path.join(workdir, name)), name
  assert any(f.startswith("events") for f in os.listdir(os.path.join(workdir, "tensorboard")))
  # eval.py's library function reproduces the final logged evaluation.
  result = evaluate(workdir)
  assert result["step"] == 6
  np.testing.assert_allclose(result["loss"], metrics["loss"], rtol=1e-6)
  logged = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  final_eval = [r for r in logged if r["split"] == "eval"][-1]
  np.testing.assert_allclose(result["loss"], final_eval["loss"], rtol=1e-6)
  # Rerunning a finished run restores it and changes nothing.
  again = train_lib.train_and_evaluate(tiny_lm_config(), workdir)
  np.testing.assert_allclose(again["loss"], metrics["loss"], rtol=1e-6)


def _run_cli(workdir, steps, extra=(), wait=True):
  cmd = [
    sys.executable,
    os.path.join(REPO, "train.py"),
    f"--config={os.path.join(REPO, 'tests', 'tiny_lm_config.py')}",
    f"--workdir={workdir}",
    f"--config.num_train_steps={steps}",
    *extra,
  ]
  if wait:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=PATIENCE_S)
  return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


# SIGKILL / SIGTERM at random moments, then bit-exact resume: tests/test_reliability.py
# (and the 20-trial sweep, benchmarks/kill_resume.py).


def test_bad_override_is_one_line_error(tmp_path):
  out = _run_cli(str(tmp_path / "w"), 6, ["--config.model.d_model=31"])
  assert out.returncode == 1
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith("error: ") and "d_model=31" in last and "num_heads" in last
  out = _run_cli(str(tmp_path / "w"), 2, ["--config.not_a_field=3"])
  assert out.returncode != 0 and "not_a_field" in out.stderr
  assert "Traceback" not in out.stderr


def test_unwritable_workdir_and_incompatible_checkpoint(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("x")
  with pytest.raises(ValueError, match="not a directory"):
    train_lib.train_and_evaluate(tiny_lm_config(), str(blocker))
  workdir = str(tmp_path / "run")
  train_lib.train_and_evaluate(tiny_lm_config(num_train_steps=3), workdir)
  other = tiny_lm_config(num_train_steps=6)
  other.model.d_model = 64
  with pytest.raises(ValueError, match=r"model.d_model: checkpoint 32 vs config 64"):
    train_lib.train_and_evaluate(other, workdir)
  assert os.listdir(os.path.join(workdir, "checkpoints")) == ["3"]  # nothing lost


def test_init_from_refuses_a_run_with_another_tokenizer(tmp_path, monkeypatch):
  """Fine-tuning from a run whose character vocabulary differs fails before compiling;
  reusing that run's tokenizer (`data.tokenizer_from`) trains, with `init_from` given
  relative to the current directory as the documented commands do."""
  source = str(tmp_path / "source")
  train_lib.train_and_evaluate(tiny_lm_config(num_train_steps=3), source)
  text = tmp_path / "other.txt"
  text.write_text("abc def ghi, jkl!\n" * 3000)  # another character set, same tokenizer kind
  config = tiny_lm_config(num_train_steps=3, init_from=source)
  config.data.path = str(text)
  with pytest.raises(ValueError, match=r"init_from=.* differs from this run's.*tokenizer_from"):
    train_lib.train_and_evaluate(config, str(tmp_path / "own_vocab"))
  config.data.tokenizer_from = source
  monkeypatch.chdir(tmp_path)
  config.init_from = "source"  # orbax wants absolute paths: finetune makes it one
  metrics = train_lib.train_and_evaluate(config, str(tmp_path / "shared_vocab"))
  assert np.isfinite(metrics["loss"])


def test_workdir_lock_refuses_live_owner_and_recovers_stale(tmp_path):
  from transformer.train.guard.lock import LOCK_FILE, WorkdirLock

  workdir = str(tmp_path)
  with WorkdirLock(workdir):
    with pytest.raises(RuntimeError, match=f"in use by process {os.getpid()}"):
      with WorkdirLock(workdir):
        pass
  dead = subprocess.run(
    [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
  )
  import socket

  with open(os.path.join(workdir, LOCK_FILE), "w") as f:
    json.dump({"host": socket.gethostname(), "pid": int(dead.stdout)}, f)
  with WorkdirLock(workdir) as lock:
    assert lock.held
  assert not os.path.exists(os.path.join(workdir, LOCK_FILE))

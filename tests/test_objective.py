"""A task with a non-cross-entropy objective, defined and registered here, trains through
the unchanged step: a pairwise logistic margin loss normalised per pair (Bradley-Terry, the
shape of a reward model's or DPO's loss), with an option of its own (`config.task.beta`,
declared here too). Its loss and gradients equal a float64 NumPy
computation on one device, under jit on 2 devices, under pmap and with gradient
accumulation; its metrics reach the log under its own names. And the bad inputs: a loss
that is not a scalar, a metric that takes the step's name, a batch with nothing to
average over."""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import make_lm_batch
from fault_runs import tiny_lm_config

from transformer import tasks
from transformer.data.config import fail
from transformer.nn.config import ModelConfig
from transformer.nn.models import build_model
from transformer.tasks.lm import LanguageModeling
from transformer.train import experiment
from transformer.train import loop as train_lib
from transformer.train.parallel import StepRunner, make_mesh
from transformer.train.step import StepConfig, create_train_state, train_step


def _scores(embedding: jax.Array, batch) -> jax.Array:
  """[B]: each row's weighted sum of its tokens' first embedding coordinate."""
  return jnp.sum(embedding[batch["inputs"], 0] * batch["weights"], axis=-1)


@dataclasses.dataclass(frozen=True)
class PairOptions:
  """`config.task.*` of the pairwise task."""

  beta: float = 2.0  # scale of the margin inside the logistic loss

  def __post_init__(self):
    if not self.beta > 0:
      fail("task.beta", self.beta, "must be > 0")


@dataclasses.dataclass(frozen=True)
class PairMargin(LanguageModeling):
  """Rows 2i and 2i + 1 of a batch are a pair, chosen and rejected; the loss of a pair is
  softplus(-beta * (score_chosen - score_rejected)), its normalizer the pairs with tokens
  on both sides."""

  name = "pair_margin"
  prompts = False
  evaluators = ()
  Options = PairOptions

  def loss(self, model, batch, deterministic, frozen):
    del deterministic, frozen
    score = _scores(model.variables["params"]["token_embed"]["embedding"], batch)
    has = jnp.sum(batch["weights"], axis=-1) > 0
    pair = (has[0::2] & has[1::2]).astype(jnp.float32)  # [B / 2]
    margin = score[0::2] - score[1::2]
    loss_sum = jnp.sum(pair * jax.nn.softplus(-self.options.beta * margin))
    metrics = {"margin": jnp.sum(pair * margin), "pair_accuracy": jnp.sum(pair * (margin > 0))}
    return loss_sum, jnp.sum(pair), metrics


def _reference(embedding: np.ndarray, batch, beta: float) -> tuple[float, np.ndarray, dict]:
  """(mean loss, gradient of the embedding, metric means) in float64 NumPy, by hand."""
  e = np.asarray(embedding, np.float64)
  ids, w = np.asarray(batch["inputs"]), np.asarray(batch["weights"], np.float64)
  score = (e[ids, 0] * w).sum(-1)
  has = w.sum(-1) > 0
  pair = (has[0::2] & has[1::2]).astype(np.float64)
  n = pair.sum()
  margin = score[0::2] - score[1::2]
  loss = (pair * np.logaddexp(0.0, -beta * margin)).sum() / n
  # d loss / d margin_i = -beta * sigmoid(-beta * margin_i) * pair_i / n; margin_i adds the
  # chosen row's token weights to the first coordinate of their embeddings, and subtracts
  # the rejected row's.
  dmargin = -beta * pair / (1.0 + np.exp(beta * margin)) / n
  grad = np.zeros_like(e)
  for i, d in enumerate(dmargin):
    np.add.at(grad[:, 0], ids[2 * i], d * w[2 * i])
    np.add.at(grad[:, 0], ids[2 * i + 1], -d * w[2 * i + 1])
  metrics = {"margin": (pair * margin).sum() / n, "pair_accuracy": (pair * (margin > 0)).sum() / n}
  return loss, grad, metrics


def _runner(task, parallelism="jit", devices=1, accum=1):
  cfg = ModelConfig(
    family="decoder", vocab_size=32, d_model=16, num_heads=2, num_layers=1, d_ff=32, max_len=16
  )
  model = build_model(cfg)
  tx = optax.sgd(1.0)  # the update is minus the gradient
  step_cfg = StepConfig(model=model, tx=tx, task=task, grad_accum_steps=accum)
  mesh = make_mesh(jax.devices()[:devices]) if parallelism == "jit" else None
  runner = StepRunner(step_cfg, parallelism, mesh, update=train_step)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.ones((1, 8), jnp.int32))["params"]
  return runner, create_train_state(params, tx, jax.random.PRNGKey(1))


@pytest.mark.parametrize(
  "parallelism, devices, accum, beta",
  [("jit", 1, 1, 2.0), ("jit", 2, 1, 2.0), ("pmap", 8, 1, 2.0), ("jit", 1, 2, 0.5)],
  ids=["one-device", "jit-2-devices", "pmap-8-devices", "accumulate-2-beta-0.5"],
)
def test_a_pairwise_objective_trains_through_the_step_as_numpy_computes_it(
  parallelism, devices, accum, beta
):
  rng = np.random.default_rng(0)
  batch = make_lm_batch(rng, b=16, t=8)
  batch["weights"][6:8] = 0.0  # a pair without tokens: not counted
  batch["weights"][11, 5:] = 0.0  # a shorter rejected row
  runner, state = _runner(PairMargin(options=PairOptions(beta)), parallelism, devices, accum)
  before = jax.device_get(state.params)
  state = runner.place_state(state)
  state, metrics = runner.train(state, batch)
  after = jax.device_get(runner.host_state(state).params)

  loss, grad, means = _reference(before["token_embed"]["embedding"], batch, beta)
  metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
  assert metrics["normalizer"] == 7.0  # 8 pairs, one without tokens
  np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-5)
  for name, value in means.items():
    np.testing.assert_allclose(metrics[name], value, rtol=1e-5, atol=1e-7)
  assert "accuracy" not in metrics and "perplexity" not in metrics  # not this task's
  step = np.float64(before["token_embed"]["embedding"]) - after["token_embed"]["embedding"]
  np.testing.assert_allclose(step, grad, rtol=1e-5, atol=1e-6)  # sgd(1): minus the gradient
  rest = lambda p: {k: v for k, v in p.items() if k != "token_embed"}  # noqa: E731
  jax.tree.map(np.testing.assert_array_equal, rest(after), rest(before))  # no gradient there


def test_the_registered_task_logs_its_own_metrics_through_the_loop(tmp_path, monkeypatch):
  """Registered in `tasks.TASKS` here, the task is what `data.kind` names: the loop trains
  and evaluates it with the option the config sets, and metrics.jsonl holds its metrics,
  not the cross-entropy's."""
  monkeypatch.setitem(tasks.TASKS, PairMargin.name, PairMargin)
  workdir = str(tmp_path / "run")
  config = tiny_lm_config(num_train_steps=3, checkpoint_every=3)
  config.data.kind = PairMargin.name
  config.task = experiment.task_block(PairMargin.name)
  config.task.beta = 0.5
  assert experiment.validate(config).task.options == PairOptions(beta=0.5)
  train_lib.train_and_evaluate(config, workdir)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    lines = [json.loads(line) for line in f]
  train = [r for r in lines if r["split"] == "train"]
  evals = [r for r in lines if r["split"] == "eval"]
  assert [r["step"] for r in train] == [1, 2, 3] and evals
  for record in train + evals:
    assert {"loss", "normalizer", "margin", "pair_accuracy"} <= set(record), record
    assert not {"accuracy", "perplexity", "nll"} & set(record), record
    assert record["normalizer"] == 4.0  # 8 rows of real tokens: 4 pairs
    assert 0.0 <= record["pair_accuracy"] <= 1.0


@dataclasses.dataclass(frozen=True)
class _PerRow(PairMargin):
  name = "per_row"

  def loss(self, model, batch, deterministic, frozen):
    loss_sum, normalizer, metrics = super().loss(model, batch, deterministic, frozen)
    return jnp.full((2,), loss_sum), normalizer, metrics


@dataclasses.dataclass(frozen=True)
class _TakesAStepName(PairMargin):
  name = "takes_a_step_name"

  def loss(self, model, batch, deterministic, frozen):
    loss_sum, normalizer, metrics = super().loss(model, batch, deterministic, frozen)
    return loss_sum, normalizer, {**metrics, "grad_norm": loss_sum}


@pytest.mark.parametrize(
  "task, message",
  [
    (_PerRow(), "task 'per_row': its loss gave loss_sum of shape (2,); Task.loss returns scalars"),
    (_TakesAStepName(), "task 'takes_a_step_name': metric names ['grad_norm'] are the step's"),
  ],
  ids=["not-a-scalar", "a-step-metric-name"],
)
def test_a_malformed_loss_is_one_line_naming_the_task_before_any_update(task, message):
  runner, state = _runner(task)
  state = runner.place_state(state)
  with pytest.raises(ValueError) as e:
    runner.train(state, make_lm_batch(np.random.default_rng(0)))
  assert message in str(e.value) and "\n" not in str(e.value)


def test_an_update_with_nothing_to_average_over_is_skipped_and_counted():
  """A global batch whose normalizer is 0 (no pair with tokens) applies nothing, never
  divides by zero, and is counted apart from the non-finite updates."""
  rng = np.random.default_rng(1)
  runner, state = _runner(PairMargin(), "jit", 2)
  before = jax.device_get(state.params)
  state = runner.place_state(state)
  empty = make_lm_batch(rng)
  empty["weights"][1::2] = 0.0  # every rejected row empty
  state, metrics = runner.train(state, empty)
  host = jax.device_get(runner.host_state(state))
  assert float(metrics["normalizer"]) == 0.0 and np.isfinite(float(metrics["loss"]))
  assert int(host.step) == 1 and int(host.empty_count) == 1 and int(host.nonfinite_count) == 0
  jax.tree.map(np.testing.assert_array_equal, host.params, before)
  state, metrics = runner.train(state, make_lm_batch(rng))  # the next one is applied
  host = jax.device_get(runner.host_state(state))
  assert int(host.step) == 2 and int(host.empty_count) == 1
  changed = host.params["token_embed"]["embedding"] != before["token_embed"]["embedding"]
  assert changed.any()


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("beta", -1.0, "config.task.beta=-1.0: must be > 0"),
    ("label_smoothing", 0.1, "config.task.label_smoothing=0.1: unknown field; known: beta"),
  ],
)
def test_the_options_the_task_declares_are_checked_in_one_line(monkeypatch, field, value, message):
  monkeypatch.setitem(tasks.TASKS, PairMargin.name, PairMargin)
  config = tiny_lm_config()
  config.data.kind = PairMargin.name
  config.task = experiment.task_block(PairMargin.name)
  config.task[field] = value
  with pytest.raises(ValueError) as e:
    experiment.validate(config)
  assert str(e.value) == message

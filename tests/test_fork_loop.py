"""Forking the loop forks the update: `train/loop.py` copied to another module, with only
its `update` changed, trains with that update, through the same compiled machinery,
checkpoints and resume. The change here is Gaussian noise on the mean gradient, checked
against the plain gradient plus the same noise computed apart."""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import sys
from pathlib import Path

import fault_harness as fh
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from fault_runs import tiny_lm_config

from transformer.train import experiment, setup, step
from transformer.train import loop as train_lib

NOISE, NOISE_SEED = 0.05, 7

SIGNATURE = "def update(state: TrainState, batch: Batch, *, cfg: StepConfig):\n"

NOISY_UPDATE = (
  SIGNATURE
  + f'''  """The plain update, Gaussian noise of deviation {NOISE} on the gradient."""
  grads, sums = step.gradients(state, batch, cfg)
  leaves, tree = jax.tree.flatten(grads)
  key = jax.random.fold_in(jax.random.PRNGKey({NOISE_SEED}), state.step)
  keys = jax.random.split(key, len(leaves))
  noise = [{NOISE} * jax.random.normal(k, g.shape, g.dtype) for k, g in zip(keys, leaves)]
  grads = jax.tree.map(jnp.add, grads, jax.tree.unflatten(tree, noise))
  return step.apply_gradients(state, grads, sums, batch, cfg)
'''
)


def fork(tmp_path: Path, new_update: str, name: str = "forked_loop"):
  """train/loop.py copied to `tmp_path/NAME.py` with its `update` replaced, imported."""
  path = tmp_path / f"{name}.py"
  shutil.copy(train_lib.__file__, path)
  source = path.read_text()
  pattern = r"^def update\(.*?^  return step\.apply_gradients\(.*?\)\n"
  changed, count = re.subn(pattern, lambda _: new_update, source, flags=re.M | re.S)
  assert count == 1, "train/loop.py no longer defines `update` as this test expects"
  path.write_text(changed)
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module  # its dataclasses look their module up there
  spec.loader.exec_module(module)
  return module


def noise_like(grads, count: int):
  """The noise the forked update adds at update count `count`, drawn here apart."""
  leaves, tree = jax.tree.flatten(grads)
  key = jax.random.fold_in(jax.random.PRNGKey(NOISE_SEED), count)
  keys = jax.random.split(key, len(leaves))
  return jax.tree.unflatten(
    tree, [NOISE * jax.random.normal(k, g.shape) for k, g in zip(keys, leaves, strict=True)]
  )


def test_the_forked_update_is_the_plain_gradient_plus_its_noise(tmp_path):
  forked = fork(tmp_path, NOISY_UPDATE)
  workdir = str(tmp_path / "run")
  exp = experiment.validate(tiny_lm_config(), workdir)
  s = setup.build(exp, workdir, update=forked.update)
  params = jax.device_get(s.state.params)
  batch = next(s.train_iter)

  # Apart: the task's mean loss differentiated directly, the noise added, one optimizer step.
  def mean_loss(p):
    inputs = {k: jnp.asarray(v) for k, v in batch.items()}
    loss_sum, normalizer, _ = s.exp.task.objective(s.model, {"params": p}, inputs, True, {})
    return loss_sum / normalizer

  grads = jax.tree.map(jnp.add, jax.grad(mean_loss)(params), noise_like(params, 0))
  updates, _ = s.tx.update(grads, s.tx.init(params), params)
  expected = optax.apply_updates(params, updates)

  plain, _ = jax.jit(lambda st, b: step.train_step(st, b, cfg=s.runner.cfg))(s.state, batch)
  state = s.runner.place_state(s.state)
  new, metrics = s.runner.train_step(state, s.runner.place_batch(batch))
  got, plain = jax.device_get(new.params), jax.device_get(plain.params)
  assert int(new.step) == 1 and np.isfinite(metrics["loss"])
  for path, want in jax.tree_util.tree_leaves_with_path(expected):
    have = dict(jax.tree_util.tree_leaves_with_path(got))[path]
    np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-6, err_msg=str(path))
  pairs = zip(jax.tree.leaves(got), jax.tree.leaves(plain), strict=True)
  moved = max(float(np.abs(a - b).max()) for a, b in pairs)
  assert moved > 1e-4  # the noise changed the update


def test_a_forked_loop_trains_checkpoints_and_resumes_with_its_update(tmp_path):
  forked = fork(tmp_path, NOISY_UPDATE)
  config = tiny_lm_config(
    **{"num_train_steps": 2, "checkpoint_every": 1, "schedule.warmup_steps": 1}
  )
  whole = str(tmp_path / "whole")
  forked.train_and_evaluate(config, whole)

  def killed(done, batch):
    if done == 2:
      raise KeyboardInterrupt("killed before update 2")
    return batch

  resumed = str(tmp_path / "resumed")
  with pytest.raises(KeyboardInterrupt):
    forked.train_and_evaluate(config, resumed, forked.Hooks(batch=killed))
  assert fh.saved_steps(resumed) == [1]
  forked.train_and_evaluate(config, resumed)
  a, b = fh.final_state(whole), fh.final_state(resumed)
  assert a["step"] == b["step"] == 2
  assert fh.bit_equal(a["state"], b["state"]) == []

  plain = str(tmp_path / "plain")
  train_lib.train_and_evaluate(config, plain)
  differ = fh.bit_equal(fh.final_state(plain)["state"]["params"], a["state"]["params"])
  assert differ  # the copy trained with its own update, not the original's


BFLOAT16_PARAMS = (
  SIGNATURE
  + """  grads, sums = step.gradients(state, batch, cfg)
  new, metrics = step.apply_gradients(state, grads, sums, batch, cfg)
  halved = jax.tree.map(lambda x: x.astype(jnp.bfloat16), new.params)
  return new.replace(params=halved), metrics
"""
)

STATE_ONLY = (
  SIGNATURE
  + """  grads, sums = step.gradients(state, batch, cfg)
  return step.apply_gradients(state, grads, sums, batch, cfg)[0]
"""
)


@pytest.mark.parametrize(
  ("body", "message"),
  [
    (BFLOAT16_PARAMS, r"^update update: returns the state's leaf \.params\[.*\] as bfloat16\["),
    (STATE_ONLY, r"^update update: must return \(state, metrics\), got TrainState$"),
  ],
)
def test_an_update_that_changes_the_state_is_refused_before_the_first_step(tmp_path, body, message):
  forked = fork(tmp_path, body)
  workdir = str(tmp_path / "run")
  phases = []
  hooks = forked.Hooks(phase=lambda name, done: phases.append(name))
  with pytest.raises((ValueError, TypeError), match=message):
    forked.train_and_evaluate(tiny_lm_config(), workdir, hooks)
  assert "train" not in phases and fh.saved_steps(workdir) == []


def test_the_loop_reads_in_one_sitting():
  """train/loop.py stays short, builds its actions with keyword arguments (`actions.for_run`
  and the constructors it calls) and leaves the formatter on."""
  loop_source = Path(train_lib.__file__).read_text()
  assert len(loop_source.splitlines()) <= 300
  assert "fmt: skip" not in loop_source
  actions_file = Path(train_lib.__file__).with_name("actions.py")
  constructors = {"Log", "Evaluate", "Save", "NonFinite", "Actions", "for_run"}
  positional = []
  for path in (Path(train_lib.__file__), actions_file):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Call):
        name = getattr(node.func, "id", getattr(node.func, "attr", None))
        allowed = 1 if name == "for_run" else 0  # for_run(s, ...): the run it acts for
        if name in constructors and len(node.args) > allowed:
          positional.append(f"{path.name}:{node.lineno} {name}")
  assert positional == []

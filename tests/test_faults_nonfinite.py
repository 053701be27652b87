"""Numerics, end to end: a NaN in the inputs, loss or gradients stops the run naming the
step, the quantity and the last good checkpoint; `skip_nonfinite` skips and counts."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import ClassVar

import fault_harness as fh
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fault_runs import tiny_lm_config

from transformer import tasks
from transformer.tasks.lm import LanguageModeling
from transformer.train import checkpoints, guard
from transformer.train import loop as train_lib


@dataclasses.dataclass(frozen=True)
class _Poisoned(LanguageModeling):
  """The LM task, plus a NaN in the loss or the gradients of the updates whose batch
  carries `poison` = 1 (a [B] float key the test's batch hook adds to every batch)."""

  name = "lm_poisoned"
  where: ClassVar[str] = "loss"

  def loss(self, model, batch, deterministic, frozen):
    batch = dict(batch)
    poison = batch.pop("poison", None)  # evaluation batches have none
    loss_sum, normalizer, metrics = super().loss(model, batch, deterministic, frozen)
    if poison is not None and self.where == "loss":
      loss_sum = loss_sum + jnp.where(jnp.max(poison) > 0, jnp.nan, 0.0)
    elif poison is not None:
      loss_sum = _nan_gradient(loss_sum, jnp.max(poison))
    return loss_sum, normalizer, metrics


@jax.custom_vjp
def _nan_gradient(x, poison):
  """x; its gradient NaN where `poison` > 0."""
  return x


def _nan_gradient_fwd(x, poison):
  return x, poison


def _nan_gradient_bwd(poison, g):
  return g * jnp.where(poison > 0, jnp.nan, 1.0), jnp.zeros_like(poison)


_nan_gradient.defvjp(_nan_gradient_fwd, _nan_gradient_bwd)


def nan_at(update: int, where: str, monkeypatch) -> train_lib.Hooks:
  """Hooks that make update `update` (1-based) NaN in its inputs, loss or gradients: the
  inputs through the batch; the loss or the gradients through a task installed for the
  test (`data.kind='lm_poisoned'`), the train step itself unchanged."""

  def batch(done, batch):
    out = dict(batch)
    if where == "inputs":
      if done == update:  # a NaN in the first element of every floating-point array
        for key, value in batch.items():
          if np.issubdtype(np.asarray(value).dtype, np.floating):
            out[key] = np.array(value, copy=True)
            out[key].reshape(-1)[0] = np.nan
      return out
    rows = len(next(iter(batch.values())))
    out["poison"] = np.full(rows, float(done == update), np.float32)
    return out

  if where != "inputs":
    poisoned = type("Poisoned", (_Poisoned,), {"where": where})
    monkeypatch.setitem(tasks.TASKS, _Poisoned.name, dataclasses.dataclass(frozen=True)(poisoned))
  return train_lib.Hooks(batch=batch)


def _config(where: str, **overrides):
  config = tiny_lm_config(**overrides)
  if where != "inputs":
    config.data.kind = _Poisoned.name
  return config


@pytest.mark.parametrize(
  ("where", "named"),
  [
    ("inputs", "non-finite inputs (a NaN/Inf in the batch)"),
    ("loss", "non-finite loss (nan)"),
    ("grads", "non-finite gradients (global norm nan)"),
  ],
)
def test_injected_nan_stops_naming_step_quantity_and_last_good_checkpoint(
  tmp_path, where, named, monkeypatch
):
  workdir = str(tmp_path / "run")
  with pytest.raises(guard.NonFiniteError) as error:
    train_lib.train_and_evaluate(_config(where), workdir, nan_at(3, where, monkeypatch))
  message = str(error.value)
  assert message.startswith(f"step 3: {named}")
  assert f"last good checkpoint: step 2 in {workdir}/checkpoints (kept)" in message
  assert "\n" not in message
  if where == "grads":
    assert "loss was " in message  # the loss itself was finite
  assert fh.saved_steps(workdir) == [2]  # nothing written past the NaN
  assert not os.path.exists(os.path.join(workdir, "run.lock"))


def test_skip_nonfinite_skips_the_update_and_counts_it(tmp_path, monkeypatch):
  workdir = str(tmp_path / "run")
  config = _config("grads", skip_nonfinite=True, checkpoint_every=1)
  train_lib.train_and_evaluate(config, workdir, nan_at(3, "grads", monkeypatch))
  with checkpoints.CheckpointManager(os.path.join(workdir, "checkpoints"), async_save=False) as m:
    states = {step: m.restore_numpy(step) for step in (2, 3, 4)}
  assert fh.bit_equal(states[2]["params"], states[3]["params"]) == []  # update 3 not applied
  assert fh.bit_equal(states[3]["params"], states[4]["params"])  # update 4 was
  assert int(states[4]["nonfinite_count"]) == 1 and int(states[4]["first_nonfinite_step"]) == 3
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    logged = {r["step"]: r for r in map(json.loads, f) if r["split"] == "train"}
  assert logged[2]["nonfinite_skipped"] == 0 and logged[3]["nonfinite_skipped"] == 1
  assert logged[3]["grad_norm"] is None  # NaN, written as null

"""Numerics, end to end: a NaN in the inputs, loss or gradients stops the run naming the
step, the quantity and the last good checkpoint; `skip_nonfinite` skips and counts."""

from __future__ import annotations

import json
import os

import fault_harness as fh
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fault_runs import tiny_lm_config

from transformer.train import actions, checkpoints
from transformer.train import loop as train_lib


def nan_at(update: int, where: str) -> train_lib.Hooks:
  """Hooks that make update `update` (1-based) NaN in its inputs, loss or gradients."""
  if where == "inputs":

    def batch(done, batch):
      if done != update:
        return batch
      out = dict(batch)  # a NaN in the first element of every floating-point array
      for key, value in batch.items():
        if np.issubdtype(np.asarray(value).dtype, np.floating):
          out[key] = np.array(value, copy=True)
          out[key].reshape(-1)[0] = np.nan
      return out

    return train_lib.Hooks(batch=batch)

  def perturb(count, sums, grads):
    nan = jnp.where(count + 1 == update, jnp.nan, 0.0)
    if where == "loss":
      return {**sums, "loss_sum": sums["loss_sum"] + nan}, grads
    return sums, jax.tree.map(lambda g: g + nan.astype(g.dtype), grads)

  return train_lib.Hooks(perturb=perturb)


@pytest.mark.parametrize(
  ("where", "named"),
  [
    ("inputs", "non-finite inputs (a NaN/Inf in the batch)"),
    ("loss", "non-finite loss (nan)"),
    ("grads", "non-finite gradients (global norm nan)"),
  ],
)
def test_injected_nan_stops_naming_step_quantity_and_last_good_checkpoint(tmp_path, where, named):
  workdir = str(tmp_path / "run")
  with pytest.raises(actions.NonFiniteError) as error:
    train_lib.train_and_evaluate(tiny_lm_config(), workdir, nan_at(3, where))
  message = str(error.value)
  assert message.startswith(f"step 3: {named}")
  assert f"last good checkpoint: step 2 in {workdir}/checkpoints (kept)" in message
  assert "\n" not in message
  if where == "grads":
    assert "loss was " in message  # the loss itself was finite
  assert fh.saved_steps(workdir) == [2]  # nothing written past the NaN
  assert not os.path.exists(os.path.join(workdir, "run.lock"))


def test_skip_nonfinite_skips_the_update_and_counts_it(tmp_path):
  workdir = str(tmp_path / "run")
  config = tiny_lm_config(skip_nonfinite=True, checkpoint_every=1)
  train_lib.train_and_evaluate(config, workdir, nan_at(3, "grads"))
  with checkpoints.CheckpointManager(os.path.join(workdir, "checkpoints"), async_save=False) as m:
    states = {step: m.restore_numpy(step) for step in (2, 3, 4)}
  assert fh.bit_equal(states[2]["params"], states[3]["params"]) == []  # update 3 not applied
  assert fh.bit_equal(states[3]["params"], states[4]["params"])  # update 4 was
  assert int(states[4]["nonfinite_count"]) == 1 and int(states[4]["first_nonfinite_step"]) == 3
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    logged = {r["step"]: r for r in map(json.loads, f) if r["split"] == "train"}
  assert logged[2]["nonfinite_skipped"] == 0 and logged[3]["nonfinite_skipped"] == 1
  assert logged[3]["grad_norm"] is None  # NaN, written as null

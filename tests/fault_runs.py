"""In-process fault runs: the tiny LM of tests/tiny_lm_config.py cut down, and one finished
run shared by the tests that damage or plant files in a copy of its workdir.

  IN_PROCESS               one layer, no dropout, 4 updates, checkpoints every 2,
                           evaluation only at the end
  tiny_lm_config(**changes) that config (with `changes`, {'a.b': value}) as a ConfigDict
  train_flags(**changes)   the same as train.py flags
  trained                  (session fixture) a finished 6-update run with checkpoints at
                           2, 4 and 6: {'workdir', 'step', 'state'}; tests copy it before
                           changing anything

conftest.py imports `trained`, so every test module can ask for it and it runs once.
"""

from __future__ import annotations

import fault_harness as fh
import pytest

# The in-process runs: tests/tiny_lm_config.py with one layer, no dropout, 4 updates,
# checkpoints every 2, evaluation only at the end. As train.py flags: `train_flags(**changes)`.
IN_PROCESS = {
  "model.num_layers": 1,
  "model.dropout_rate": 0.0,
  "num_train_steps": 4,
  "checkpoint_every": 2,
  "log_every": 1,
  "eval_batches": 1,
}


def tiny_lm_config(**changes):
  import tiny_lm_config as tiny_lm_config_file  # the config stack: conftest imports this module

  config = tiny_lm_config_file.get_config()
  for key, value in {**IN_PROCESS, **changes}.items():
    block, _, name = key.rpartition(".")
    (config[block] if block else config)[name] = value
  return config


def train_flags(**changes) -> list[str]:
  return [f"--config.{k}={v}" for k, v in {**IN_PROCESS, **changes}.items()]


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
  """A finished 6-update run with checkpoints at 2, 4 and 6, and its final state."""
  from transformer.train import loop as train_lib  # the training stack: only when asked for

  workdir = str(tmp_path_factory.mktemp("trained") / "run")
  train_lib.train_and_evaluate(tiny_lm_config(num_train_steps=6), workdir)
  assert fh.saved_steps(workdir) == [2, 4, 6]
  return {"workdir": workdir, **fh.final_state(workdir)}

"""A seconds-long character LM for end-to-end tests of train.py (not a recipe)."""

import os

from transformer.train.experiment import default_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def get_config(arg=None):
  del arg
  config = default_config()
  m = config.model
  m.family = "decoder"  # causal LM
  m.d_model = 32  # width
  m.num_heads = 2  # heads
  m.num_layers = 2  # blocks
  m.d_ff = 64  # feed-forward width
  m.max_len = 32  # longest context
  m.dropout_rate = 0.1  # exercise dropout randomness across resumes
  config.data.path = os.path.join(REPO, "data", "tinyshakespeare.txt.gz")  # shipped text
  config.data.validation_fraction = 0.1  # validation share
  config.data.test_fraction = 0.0  # no test split
  config.schedule.warmup_steps = 2  # short warmup
  config.batch_size = 8  # rows per update
  config.seq_len = 16  # context
  config.num_train_steps = 6  # updates
  config.log_every = 2  # console interval
  config.eval_every = 0  # evaluate at the end only
  config.eval_batches = 2  # validation batches
  config.checkpoint_every = 3  # checkpoint interval
  config.evaluate.sample.max_new_tokens = 0  # no sample
  return config


def sweep():
  """Two learning rates (tests/test_analysis.py runs this sweep)."""
  return [{"schedule.learning_rate": lr} for lr in (1e-3, 3e-3)]

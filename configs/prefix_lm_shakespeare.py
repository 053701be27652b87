"""Prefix-LM pretraining of a character GPT on tiny shakespeare.

Each 64-character window is cut at a random point: the prefix is read bidirectionally,
the suffix predicted causally, and the loss covers the suffix only (Raffel et al. 2020,
3.2.1; see transformer/tasks/prefix_lm.py). Model and data as configs/lm_shakespeare.py;
the schedule is nanoGPT's CPU recipe (batch 12, lr 1e-3, 2,000 updates).

  python train.py --config configs/prefix_lm_shakespeare.py --workdir runs/prefix_lm

Result: docs/RESULTS.md.
"""

from pathlib import Path

from transformer.train.config_files import load_module
from transformer.train.experiment import default_config

common = load_module(Path(__file__).with_name("common.py"), "configs_common")


def get_config(arg=None):
  del arg
  config = default_config()
  common.nanogpt_char_model(config.model)  # a decoder whose prefix attends bidirectionally
  config.data.kind = "prefix_lm"  # bidirectional prefix, causal suffix, loss on the suffix
  common.shakespeare_chars(config.data)
  common.nanogpt_adamw(config, learning_rate=1e-3)
  config.num_train_steps = 2000
  config.batch_size = 12
  config.seq_len = 64  # the model's whole context
  config.log_every = 100
  common.evaluate_and_checkpoint(config, 500)  # the whole validation split
  # No sample: the task offers no plain-causal continuation.
  config.evaluate.sample.max_new_tokens = 0
  return config

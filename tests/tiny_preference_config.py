"""A seconds-long preference (DPO) run for end-to-end tests of train.py (not a recipe).

`get_config('sft')` is the chat SFT run it starts from, on data/arith; `get_config()` the
preference run, whose `init_from` (the SFT workdir, which also gives the tokenizer) and
`data.path` (a folder of train.jsonl and test.jsonl pairs) the test sets.
"""

import os

from transformer.train.experiment import default_config, task_block

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def get_config(arg=None):
  config = default_config()
  m = config.model
  m.family = "decoder"
  m.d_model, m.num_heads, m.num_layers, m.d_ff = 32, 2, 1, 64
  m.max_len = 48
  m.dropout_rate = 0.1  # exercise dropout randomness across resumes
  d = config.data
  d.source = "hf"
  d.tokenizer = "char"
  d.eval_split = "test"
  d.num_workers = 0
  config.schedule.warmup_steps = 2
  config.batch_size = 8
  config.seq_len = 48
  config.log_every = 2
  config.eval_every = 0  # evaluate at the end only
  config.eval_batches = 2
  config.checkpoint_every = 3
  config.evaluate.sample.max_new_tokens = 0
  if arg == "sft":
    d.kind = "sft"
    d.path = os.path.join(REPO, "data", "arith")
    d.text_column = "messages"
    config.task = task_block("sft")
    config.evaluate.exact_match.examples = 8
    config.num_train_steps = 4
    return config
  d.kind = "preference"
  config.task = task_block("preference")
  config.task.beta = 0.5
  config.num_train_steps = 8
  return config

"""Character-level GPT on tiny shakespeare (the default run; data shipped in data/).

nanoGPT's CPU model (4 layers, 4 heads, 128 wide, context 64, no dropout, pre-LN, GELU,
learned positions, AdamW with betas 0.9 / 0.99, weight decay 0.1, clipping at 1.0, 100
warmup steps and cosine decay to a tenth) with a schedule that gets to nanoGPT's
validation loss sooner: batch 24 at a peak learning rate of 3e-3 for 800 updates (19,200
sequences) instead of batch 12 at 1e-3 for 2,000 (24,000). The like-for-like nanoGPT
recipe is `configs/lm_shakespeare_nanogpt.py`; `benchmarks/race.py` races this run
against a PyTorch re-implementation of nanoGPT's loop.

  python train.py --config configs/lm_shakespeare.py --workdir runs/lm_shakespeare

Validation loss over the whole validation split (111,537 predicted characters) at the end:
docs/RESULTS.md; the batch and learning-rate search behind this schedule and the wall
time: docs/PERFORMANCE.md ("The default run, end to end").
"""

from pathlib import Path

from transformer.train.config_files import load_module
from transformer.train.experiment import default_config

common = load_module(Path(__file__).with_name("common.py"), "configs_common")


def get_config(arg=None):
  del arg
  config = default_config()
  common.nanogpt_char_model(config.model)
  config.data.kind = "lm"
  common.shakespeare_chars(config.data)
  # nanoGPT's optimizer (weight decay not on biases / norms / embeddings) at 3x its peak rate.
  common.nanogpt_adamw(config, learning_rate=3e-3)
  config.num_train_steps = 800
  config.batch_size = 24  # twice nanoGPT's: fewer, larger updates get there sooner
  config.seq_len = 64  # the model's whole context
  config.log_every = 100
  common.evaluate_and_checkpoint(config, 400)  # the whole validation split (111,538 characters)
  # Characters sampled at the end (they fill the 64-character context).
  config.evaluate.sample.max_new_tokens = 63
  return config


def sweep():
  """Pre-LN vs post-LN at depth 4 and 12 without warmup: does post-LN need warmup at depth
  (Xiong et al. 2020)? As full training runs; `python -m transformer.research.ln_depth`
  answers it, see docs/RESEARCH.md.

  python -m transformer.research.sweep --config configs/lm_shakespeare.py --workdir runs/ln_depth \
      --override schedule.warmup_steps=0 --parallel 2
  """
  return [
    {"model.norm_position": norm, "model.num_layers": depth}
    for depth in (4, 12)
    for norm in ("pre", "post")
  ]

"""Character-level GPT on tiny shakespeare (the default run; data shipped in data/).

nanoGPT's CPU model (4 layers, 4 heads, 128 wide, context 64, no dropout, pre-LN, GELU,
learned positions, AdamW with betas 0.9 / 0.99, weight decay 0.1, clipping at 1.0, 100
warmup steps and cosine decay to a tenth) with a schedule that gets to nanoGPT's
validation loss sooner: batch 24 at a peak learning rate of 3e-3 for 800 updates (19,200
sequences) instead of batch 12 at 1e-3 for 2,000 (24,000). The like-for-like nanoGPT
recipe is `configs/lm_shakespeare_nanogpt.py`; `benchmarks/race.py` races this run
against a PyTorch re-implementation of nanoGPT's loop.

  python train.py --config configs/lm_shakespeare.py --workdir runs/lm_shakespeare

Validation loss over the whole validation split (111,537 predicted characters) at the
end: 1.8396 (seed 0), 1.8528 (seed 1), 1.8603 (seed 2); nanoGPT's recipe
(configs/lm_shakespeare_nanogpt.py) gives 1.8434 after 2,000 updates at batch 12, and
this model with biases everywhere 1.8425 (seed 0). Searched on the same machine (2-core AMD EPYC,
AVX-512), all at 4 layers x 128: batch 12 at 2e-3 reaches 1.8715 after 1,250 of 2,000
steps; batch 12 at 3e-3 for 1,200 steps 1.8629 (seed 0) but 1.8949 (seed 1); batch 16
at 3e-3 for 900 1.8800; batch 24 at 3e-3 for 600 1.9272 and for 1,000 1.7733; batch 24
at 4e-3 for 700 1.8519; batch 32 at 3e-3 for 500 1.9486; batch 48 at 4e-3 for 400
1.9222. Wall time: docs/PERFORMANCE.md ("The default run, end to end").
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
  (Xiong et al. 2020)? As full training runs; the measured answer (post-LN at depth 12
  stays at the unigram loss) comes from `python -m transformer.research.ln_depth`, see
  docs/RESEARCH.md.

  python -m transformer.research.sweep --config configs/lm_shakespeare.py --workdir runs/ln_depth \
      --override schedule.warmup_steps=0 --parallel 2
  """
  return [
    {"model.norm_position": norm, "model.num_layers": depth}
    for depth in (4, 12)
    for norm in ("pre", "post")
  ]

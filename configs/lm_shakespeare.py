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

from transformer.train.experiment import default_config


def get_config(arg=None):
  del arg
  config = default_config()
  m = config.model
  m.family = "decoder"  # GPT-style causal LM
  m.vocab_size = 0  # from the character tokenizer
  m.d_model = 128  # width
  m.num_heads = 4  # attention heads
  m.num_layers = 4  # blocks
  m.d_ff = 512  # 4 * d_model
  m.max_len = 64  # nanoGPT block_size: positions beyond the trained context stay untrained
  m.position = "learned"  # GPT-2 style absolute positions
  m.dropout_rate = 0.0  # nanoGPT CPU recipe: no dropout
  d = config.data
  d.kind = "lm"  # next-token prediction
  d.source = "text"  # a local text file
  d.path = "data/tinyshakespeare.txt.gz"  # shipped with the project
  d.tokenizer = "char"  # character vocabulary
  d.validation_fraction = 0.1  # last 10% of the text for validation (as nanoGPT)
  d.test_fraction = 0.0  # no test split
  d.eval_batch_size = 128  # rows per evaluation batch
  config.optimizer.b2 = 0.99  # nanoGPT: betas (0.9, 0.99)
  config.optimizer.eps = 1e-8  # AdamW epsilon
  config.optimizer.weight_decay = 0.1  # decoupled, not on biases / norms / embeddings
  config.optimizer.clip_norm = 1.0  # global-norm clipping
  config.schedule.kind = "cosine"  # warmup then cosine decay
  config.schedule.learning_rate = 3e-3  # peak learning rate
  config.schedule.warmup_steps = 100  # linear warmup
  config.schedule.final_fraction = 0.1  # decay to 1e-4
  config.num_train_steps = 800  # updates
  config.batch_size = 24  # sequences per update
  config.seq_len = 64  # context length
  config.log_every = 100  # console / TensorBoard interval
  config.eval_every = 400  # validation interval
  config.eval_batches = 0  # 0 = the whole validation split (111,538 characters)
  config.checkpoint_every = 400  # checkpoint interval
  config.sample_tokens = 63  # characters sampled at the end (fills the 64-character context)
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

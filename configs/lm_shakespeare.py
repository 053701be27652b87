"""Character-level GPT on tiny shakespeare (the default run; data shipped in data/).

nanoGPT's CPU recipe: 4 layers, 4 heads, 128 wide, context 64, batch 12, 2,000 steps,
no dropout, pre-LN, GELU, learned positions, AdamW lr 1e-3 with cosine decay.

  python train.py --config configs/lm_shakespeare.py --workdir runs/lm_shakespeare

Result (2-core CPU shared with other jobs, load average about 2): 76 s wall (116 s user +
6 s system CPU; 94 s with --cpu_tuning=off), start-up, compilation and four evaluations
included; validation loss
1.8425 over the whole validation split (111,537 predicted characters; nanoGPT reports
1.88), 2.0028 at step 1,000. Unchanged hyperparameters; the final sample fills the
64-character context (the model has no positions beyond it).
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
  d.eval_batch_size = 128  # rows per evaluation batch (larger batches evaluate faster)
  config.optimizer.b2 = 0.99  # nanoGPT: betas (0.9, 0.99)
  config.optimizer.eps = 1e-8  # AdamW epsilon
  config.optimizer.weight_decay = 0.1  # decoupled, not on biases / norms / embeddings
  config.optimizer.clip_norm = 1.0  # global-norm clipping
  config.schedule.kind = "cosine"  # warmup then cosine decay
  config.schedule.learning_rate = 1e-3  # peak learning rate
  config.schedule.warmup_steps = 100  # linear warmup
  config.schedule.final_fraction = 0.1  # decay to 1e-4
  config.num_train_steps = 2000  # updates
  config.batch_size = 12  # sequences per update
  config.seq_len = 64  # context length
  config.log_every = 100  # console / TensorBoard interval
  config.eval_every = 500  # validation interval
  config.eval_batches = 0  # 0 = the whole validation split (111,538 characters)
  config.checkpoint_every = 500  # checkpoint interval
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

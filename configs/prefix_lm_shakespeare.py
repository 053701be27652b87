"""Prefix-LM pretraining of a character GPT on tiny shakespeare.

Each 64-character window is cut at a random point: the prefix is read bidirectionally,
the suffix predicted causally, and the loss covers the suffix only (Raffel et al. 2020,
3.2.1; see transformer/tasks/prefix_lm.py). Model and data as configs/lm_shakespeare.py;
the schedule is nanoGPT's CPU recipe (batch 12, lr 1e-3, 2,000 updates), the default
run's before it moved to batch 24.

  python train.py --config configs/prefix_lm_shakespeare.py --workdir runs/prefix_lm

Result (2-core AVX-512 CPU shared with other jobs, load ~4): 81 s wall (94 s user CPU);
validation loss on the suffixes 2.031 nats/char over the whole validation split (2.473 at
step 500); see docs/RESULTS.md.
"""

from transformer.train.experiment import default_config


def get_config(arg=None):
  del arg
  config = default_config()
  m = config.model
  m.family = "decoder"  # a causal LM whose prefix attends bidirectionally
  m.vocab_size = 0  # from the character tokenizer
  m.d_model = 128  # width
  m.num_heads = 4  # attention heads
  m.num_layers = 4  # blocks
  m.d_ff = 512  # 4 * d_model
  m.max_len = 64  # the training context
  m.position = "learned"  # GPT-2 style absolute positions
  d = config.data
  d.kind = "prefix_lm"  # bidirectional prefix, causal suffix, loss on the suffix
  d.source = "text"  # a local text file, read as one token stream
  d.path = "data/tinyshakespeare.txt.gz"  # shipped with the project
  d.tokenizer = "char"  # character vocabulary
  d.validation_fraction = 0.1  # last 10% of the text for validation
  d.test_fraction = 0.0  # no test split
  d.eval_batch_size = 128  # rows per evaluation batch
  config.optimizer.b2 = 0.99  # betas (0.9, 0.99), as lm_shakespeare
  config.optimizer.eps = 1e-8  # AdamW epsilon
  config.optimizer.weight_decay = 0.1  # decoupled, not on biases / norms / embeddings
  config.optimizer.clip_norm = 1.0  # global-norm clipping
  config.schedule.kind = "cosine"  # warmup then cosine decay
  config.schedule.learning_rate = 1e-3  # peak learning rate
  config.schedule.warmup_steps = 100  # linear warmup
  config.schedule.final_fraction = 0.1  # decay to 1e-4
  config.num_train_steps = 2000  # updates
  config.batch_size = 12  # windows per update
  config.seq_len = 64  # context length
  config.log_every = 100  # console / TensorBoard interval
  config.eval_every = 500  # validation interval
  config.eval_batches = 0  # the whole validation split
  config.checkpoint_every = 500  # checkpoint interval
  config.sample_tokens = 0  # no sample: the task offers no plain-causal continuation
  return config

"""nanoGPT's CPU shakespeare_char recipe, like for like: the comparison config.

The run `benchmarks/race.py` puts against `benchmarks/nanogpt_torch.py`, a PyTorch
re-implementation of nanoGPT's `train.py` with

  python train.py config/train_shakespeare_char.py --device=cpu --compile=False \\
      --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 \\
      --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0

4 layers, 4 heads, 128 wide, context 64, batch 12, 2,000 updates, no dropout, pre-LN,
exact GELU, learned positions, tied output embedding, no biases in the projections,
AdamW lr 1e-3 (betas 0.9 / 0.99, weight decay 0.1 on every matrix and embedding table,
clipping at 1.0), 100 warmup steps and cosine decay to 1e-4. The default run
(`configs/lm_shakespeare.py`) keeps the model and changes the schedule and batch to get
there sooner.

Differences left: LayerNorms keep their bias (nanoGPT's have none: 1,280 parameters);
queries, keys and values are three projections instead of one fused one (the same
function); the vocabulary has the project's 7 special tokens besides the 65 characters
(they never occur, so the model learns to give them no mass); 2,000 updates instead of
nanoGPT's 2,001 (its loop trains iteration 2,000 at the final learning rate too); the
validation loss is over the whole validation split, not 20 random batches.

  python train.py --config configs/lm_shakespeare_nanogpt.py --workdir runs/nanogpt

Result: docs/RESULTS.md; the race against a PyTorch re-implementation:
docs/PERFORMANCE.md (`benchmarks/race.py`).
"""

from pathlib import Path

from transformer.train.config_files import load_module
from transformer.train.experiment import default_config

common = load_module(Path(__file__).with_name("common.py"), "configs_common")


def get_config(arg=None):
  del arg
  config = default_config()
  common.nanogpt_char_model(config.model)  # n_layer, n_head, n_embd, block_size, dropout
  config.model.use_bias = False  # bias=False (attention and MLP projections)
  config.data.kind = "lm"
  common.shakespeare_chars(config.data)
  # learning_rate=1e-3, warmup_iters=100, min_lr=1e-4, beta2=0.99, weight_decay=0.1, grad_clip=1:
  common.nanogpt_adamw(config, learning_rate=1e-3)
  config.optimizer.decay_embeddings = True  # nanoGPT decays every tensor of 2+ dims: wte, wpe
  config.num_train_steps = 2000  # max_iters
  config.batch_size = 12  # nanoGPT's batch_size
  config.seq_len = 64  # block_size
  config.log_every = 100
  config.eval_every = 250  # eval_interval
  config.eval_batches = 0  # the whole validation split
  config.checkpoint_every = 2000  # one checkpoint, at the end
  config.evaluate.sample.max_new_tokens = 63  # characters sampled at the end
  return config

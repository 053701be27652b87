"""GPT-2 small / medium / large (Radford et al. 2019) as a decoder-only LM.

  python train.py --config configs/gpt2.py:small --workdir runs/gpt2_small

Data: the TFDS dataset lm1b (prepare it once with `tfds build lm1b`, which needs
TensorFlow; see docs/DATA.md) with a 32k SentencePiece vocabulary trained at first use.
Hyperparameters follow the nanoGPT / GPT-3 small recipe (AdamW betas (0.9, 0.95), peak lr
6e-4 with 2,000 warmup steps and cosine decay, weight decay 0.1, clipping 1.0).
No reference result on this machine: a full run needs accelerators.
"""

from transformer.nn.sizes import NAMED_SIZES
from transformer.train.experiment import default_config

SIZES = ("small", "medium", "large")


def get_config(arg="small"):
  if arg not in SIZES:
    raise ValueError(f"configs/gpt2.py: size must be one of {SIZES}, got {arg!r}")
  config = default_config()
  config.model.update(NAMED_SIZES[f"gpt2_{arg}"])  # Radford et al. 2019, Table 2
  config.model.vocab_size = 0  # from the SentencePiece vocabulary
  config.data.kind = "lm"  # next-token prediction
  config.data.source = "tfds"  # a prepared TFDS dataset
  config.data.path = "lm1b"  # One Billion Word benchmark
  config.data.text_column = "text"  # lm1b feature with the sentence
  config.data.eval_split = "test"  # lm1b has train and test
  config.data.tokenizer = "sentencepiece"  # subwords trained on the training split
  config.data.vocab_size = 32000  # SentencePiece pieces
  config.data.packing = True  # sentences packed into full rows
  config.optimizer.b2 = 0.95  # GPT-3 betas
  config.optimizer.eps = 1e-8  # AdamW epsilon
  config.optimizer.weight_decay = 0.1  # decoupled weight decay
  config.optimizer.clip_norm = 1.0  # global-norm clipping
  config.schedule.kind = "cosine"  # warmup then cosine decay
  config.schedule.learning_rate = 6e-4  # peak (small; larger sizes may want less)
  config.schedule.warmup_steps = 2000  # linear warmup
  config.schedule.final_fraction = 0.1  # decay to 6e-5
  config.num_train_steps = 100_000  # updates
  config.batch_size = 256  # sequences per update
  config.seq_len = 1024  # GPT-2 context
  config.model.dtype = "bfloat16"  # bf16 compute, fp32 weights and optimizer
  config.eval_every = 2000  # validation interval
  config.eval_batches = 100  # validation batches
  config.checkpoint_every = 2000  # checkpoint interval
  return config

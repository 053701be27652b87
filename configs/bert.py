"""BERT base / large (Devlin et al. 2019) masked-LM pretraining.

  python train.py --config configs/bert.py:base --workdir runs/bert_base

Data: the TFDS dataset lm1b as the text corpus (prepare with `tfds build lm1b`; see
docs/DATA.md), sentences packed into 128-token rows, 15% of tokens masked (80% [MASK],
10% random, 10% kept), a 30k SentencePiece vocabulary trained at first use. Optimiser as
in the paper: Adam betas (0.9, 0.999), eps 1e-6, peak lr 1e-4, 10,000 warmup steps, linear
decay approximated by cosine, weight decay 0.01. No reference result on this machine.
"""

from transformer.nn.sizes import NAMED_SIZES
from transformer.train.experiment import default_config

SIZES = ("base", "large")


def get_config(arg="base"):
  if arg not in SIZES:
    raise ValueError(f"configs/bert.py: size must be one of {SIZES}, got {arg!r}")
  config = default_config()
  config.model.update(NAMED_SIZES[f"bert_{arg}"])  # Devlin et al. 2019, Section 3
  config.model.vocab_size = 0  # from the SentencePiece vocabulary
  config.data.kind = "mlm"  # masked-LM batches
  config.data.source = "tfds"  # a prepared TFDS dataset
  config.data.path = "lm1b"  # text corpus
  config.data.eval_split = "test"  # lm1b has train and test
  config.data.tokenizer = "sentencepiece"  # subwords trained on the training split
  config.data.vocab_size = 30522  # as BERT's WordPiece vocabulary
  config.data.mask_rate = 0.15  # BERT masking rate
  config.optimizer.b2 = 0.999  # BERT Adam beta2
  config.optimizer.eps = 1e-6  # BERT Adam epsilon
  config.optimizer.weight_decay = 0.01  # decoupled weight decay
  config.optimizer.clip_norm = 1.0  # global-norm clipping
  config.schedule.kind = "cosine"  # warmup then decay
  config.schedule.learning_rate = 1e-4  # peak learning rate
  config.schedule.warmup_steps = 10_000  # linear warmup
  config.num_train_steps = 1_000_000  # updates (the paper's 1M)
  config.batch_size = 256  # sequences per update
  config.seq_len = 128  # the paper's first-phase length
  config.eval_every = 10_000  # validation interval
  config.eval_batches = 100  # validation batches
  config.checkpoint_every = 10_000  # checkpoint interval
  config.best_metric = "loss"  # keep the best masked-LM loss
  return config

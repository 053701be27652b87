"""BERT base / large (Devlin et al. 2019) masked-LM pretraining.

  python train.py --config configs/bert.py:base --workdir runs/bert_base

Data: the TFDS dataset lm1b as the text corpus (prepare with `tfds build lm1b`; see
docs/DATA.md), sentences packed into 128-token rows, 15% of tokens masked (80% [MASK],
10% random, 10% kept), a 30k SentencePiece vocabulary trained at first use. Optimiser as
in the paper: Adam betas (0.9, 0.999), eps 1e-6, peak lr 1e-4, 10,000 warmup steps, linear
decay approximated by cosine, weight decay 0.01. No reference result on this machine.
"""

from pathlib import Path

from transformer.train.config_files import load_module
from transformer.train.experiment import task_block

common = load_module(Path(__file__).with_name("common.py"), "configs_common")

SIZES = ("base", "large")


def get_config(arg="base"):
  config = common.named_size(__file__, arg, SIZES, "bert")  # Devlin et al. 2019, Section 3
  config.data.kind = "mlm"
  common.lm1b_sentencepiece(config.data, vocab_size=30522)  # as BERT's WordPiece vocabulary
  config.task = task_block("mlm")
  config.task.mask_rate = 0.15  # BERT's
  common.bert_adam(config)
  config.schedule.learning_rate = 1e-4  # the paper's
  config.schedule.warmup_steps = 10_000  # the paper's
  config.num_train_steps = 1_000_000  # the paper's 1M
  config.batch_size = 256
  config.seq_len = 128  # the paper's first-phase length
  common.evaluate_and_checkpoint(config, 10_000, batches=100)
  config.best_metric = "loss"  # keep the best masked-LM loss
  return config

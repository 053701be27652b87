"""A small BERT: masked-LM pretraining on the English verses of the shipped bible TSV.

The KJV column (`en`) of data/bible_kjv_rv1909_en_es.tsv.gz, verses packed into 128-token
rows, a 4,000-piece SentencePiece vocabulary trained on the training verses at first use.
30% of tokens are predicted (80% [MASK], 10% random, 10% kept): Wettig et al. 2023 find
rates above BERT's 15% as good or better. The MLM head runs at the predicted positions
only (38 of 128 per row), the encoder at all. Pre-LN, GELU, learned positions, logits
tied to the token embedding. The checkpoint initialises configs/classify_testament.py.

  python train.py --config configs/mlm_bible.py --workdir runs/mlm_bible

Result: docs/RESULTS.md.
"""

from pathlib import Path

from transformer.train.config_files import load_module
from transformer.train.experiment import default_config, task_block

common = load_module(Path(__file__).with_name("common.py"), "configs_common")


def get_config(arg=None):
  del arg
  config = default_config()
  m = config.model
  common.small_bible_encoder(m)
  m.dropout_rate = 0.0  # a few epochs only: no regularisation needed
  m.tie_embeddings = True  # masked-LM logits through the token embedding
  d = config.data
  d.kind = "mlm"  # [CLS] verse [SEP] segments packed into rows, tokens masked
  # The testament labels are unused here; reading them keeps classify_testament's split.
  common.bible_testament_labels(d)
  common.bible_sentencepiece(d)  # unigram pieces trained on the training verses
  d.eval_batch_size = 64
  config.task = task_block("mlm")
  config.task.mask_rate = 0.3  # more predictions per step for free (logits cover every position)
  config.optimizer.b2 = 0.98  # a short run
  config.optimizer.eps = 1e-6  # BERT's
  config.optimizer.weight_decay = 0.01  # BERT's
  config.optimizer.clip_norm = 1.0
  config.schedule.kind = "cosine"
  config.schedule.learning_rate = 2e-3
  config.schedule.warmup_steps = 100
  config.schedule.final_fraction = 0.05  # decay to 1e-4
  config.num_train_steps = 1000  # about 1.7 epochs of the training verses
  config.batch_size = 16  # rows of 128 tokens (smaller rows run faster per token here)
  config.seq_len = 128
  config.log_every = 100
  common.evaluate_and_checkpoint(config, 500)  # the whole validation split
  config.best_metric = "loss"  # keep the best masked-LM loss
  return config

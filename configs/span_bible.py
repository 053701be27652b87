"""T5 span corruption on the English and Spanish bible verses, with the translation model.

Pretraining for `configs/translate_en_es.py` when parallel data is scarce: the same
encoder-decoder (3+3 layers, width 128, sinusoidal positions, tied embeddings) and the
same 4,000-piece SentencePiece vocabulary (trained on both columns of the training pairs),
on the objective of Raffel et al. 2020 (noise density 0.15, mean span 3, 100 sentinel ids
above the tokenizer's; transformer/tasks/span_corruption.py). The text is monolingual:
the token stream is every English training verse, then every Spanish one, one per line,
so no window holds a verse next to its translation. Only the training split is read for
training (the translation test verses are never seen); validation uses its own split.

  python train.py --config configs/span_bible.py --workdir runs/span_transfer/span_bible

Result: docs/RESULTS.md.

A translation run starts from it with `--config.init_from=DIR
--config.data.tokenizer_from=DIR`: every tensor is copied, the token embedding without
its 100 sentinel rows. `python -m transformer.research.span_transfer`
compares that with training from scratch on 10% of the pairs; what it found:
docs/RESEARCH.md.
"""

from pathlib import Path

from transformer.train.config_files import load_module
from transformer.train.experiment import default_config

common = load_module(Path(__file__).with_name("common.py"), "configs_common")


def get_config(arg=None):
  del arg
  config = default_config()
  common.small_translation_model(config.model)  # its vocabulary + the task's 100 sentinels
  common.span_corruption_pretraining(config, 1000)
  d = config.data
  common.bible_pairs(d)  # read as text of both languages
  d.windows = True  # one token stream: the English verses, then the Spanish ones
  common.bible_sentencepiece(d)  # the translation recipe's: trained on both columns
  d.target_seq_len = 24  # targets: 15% of a 105-token window, its 5 sentinels and EOS
  d.eval_batch_size = 64
  common.short_translation_adamw(config)
  config.num_train_steps = 3000
  config.seq_len = 96  # encoder input length S
  config.log_every = 250
  return config

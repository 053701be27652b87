"""Old / New Testament classification of KJV verses, fine-tuned from configs/mlm_bible.py.

The encoder of configs/mlm_bible.py (same sizes, same 128-row position table) with a
[CLS] pooler and a 2-way classifier; each row is `[CLS] verse`, padded or truncated to 64
tokens. `init_from` copies the pretrained `token_embed` and `encoder/...` parameters (the
pooler and classifier start fresh); `data.tokenizer_from` reuses the pretraining run's
SentencePiece model, so token ids mean the same in both runs. Evaluated on the test split
(1,574 verses; 72.7% are OT, the majority-class baseline).

  python train.py --config configs/mlm_bible.py --workdir runs/mlm_bible
  python train.py --config configs/classify_testament.py --workdir runs/testament \\
    --config.init_from=runs/mlm_bible --config.data.tokenizer_from=runs/mlm_bible
  # the same classifier from scratch (same tokenizer):
  python train.py --config configs/classify_testament.py --workdir runs/testament_scratch \\
    --config.data.tokenizer_from=runs/mlm_bible

Both arms read the mlm_bible run's tokenizer; their test accuracy: docs/RESULTS.md.

With few labels pretraining pays off more: `python -m transformer.research.low_label` trains
both arms on a fixed random 1,000 or 3,000 of the training verses (`data.train_examples`,
drawn from `config.seed`, the same for both arms of a seed) over three seeds; results in
docs/RESEARCH.md ("Pretraining with few labels").
"""

from pathlib import Path

from transformer.train.config_files import load_module
from transformer.train.experiment import default_config

common = load_module(Path(__file__).with_name("common.py"), "configs_common")


def get_config(arg=None):
  del arg
  config = default_config()
  m = config.model
  common.small_bible_encoder(m)  # the pretraining run's, so every tensor is copied
  m.num_classes = 0  # from the data: OT, NT
  m.pooling = "cls"  # classify from the [CLS] token
  m.dropout_rate = 0.1  # fine-tuning regularisation
  common.testament_classification(config)  # [CLS] verse -> OT / NT
  common.bible_sentencepiece(config.data)  # as mlm_bible
  config.data.tokenizer_from = ""  # the pretraining workdir's tokenizer; '' = train one
  config.init_from = ""  # the pretraining workdir (mlm_bible); '' = from scratch
  config.optimizer.b2 = 0.98
  config.schedule.learning_rate = 3e-4
  config.eval_every = 200
  return config

"""BERT base fine-tuned on SST-2 (GLUE sentiment; the TFDS dataset glue/sst2).

  python train.py --config configs/bert.py:base --workdir runs/bert_base
  python train.py --config configs/bert_sst2.py --workdir runs/bert_sst2 \\
    --config.init_from=runs/bert_base --config.data.tokenizer_from=runs/bert_base

Data: `tfds build glue/sst2 --file_format=array_record` once (needs TensorFlow; see
docs/DATA.md): 67,349 training sentences, 872 validation sentences (GLUE's test labels
are hidden, so the validation split is evaluated). Each row is `[CLS] sentence`, padded or
truncated to 128 tokens; the [CLS] pooler and the 2-way classifier start fresh, the
encoder comes from the pretraining run (`init_from`) and so does the tokenizer
(`data.tokenizer_from`: token ids mean what they meant in pretraining). Fine-tuning as in
Devlin et al. 2019, Section 4.1 / A.3: batch 32, lr 2e-5, 3 epochs, 10% warmup,
dropout 0.1. No reference result on this machine (the paper's BERT base: 93.5% on the
GLUE test server).
"""

from pathlib import Path

from transformer.nn.sizes import NAMED_SIZES
from transformer.train.config_files import load_module
from transformer.train.experiment import default_config

common = load_module(Path(__file__).with_name("common.py"), "configs_common")


def get_config(arg=None):
  del arg
  config = default_config()
  config.model.update(NAMED_SIZES["bert_base"])  # Devlin et al. 2019, Section 3
  m = config.model
  m.vocab_size = 0  # from the SentencePiece vocabulary (the pretraining run's)
  m.num_classes = 0  # from the data: negative, positive
  m.pooling = "cls"  # classify from the [CLS] token
  d = config.data
  d.kind = "classification"  # [CLS] sentence -> label
  d.source = "tfds"
  d.path = "glue/sst2"  # Socher et al. 2013, binary
  d.text_column = "sentence"  # the TFDS feature with the text
  d.label_column = "label"  # ClassLabel: negative, positive
  d.eval_split = "validation"  # GLUE test labels are hidden (-1)
  d.tokenizer = "sentencepiece"  # as configs/bert.py
  d.vocab_size = 30522  # as configs/bert.py (tokenizer_from looks up this size)
  d.tokenizer_from = ""  # the pretraining workdir whose tokenizer to reuse; '' = train one
  d.eval_batch_size = 128
  config.init_from = ""  # the pretraining workdir (configs/bert.py); '' = from scratch
  common.bert_adam(config)
  config.schedule.learning_rate = 2e-5  # one of the paper's {5e-5, 3e-5, 2e-5}
  config.schedule.warmup_steps = 631  # 10% of the updates
  config.schedule.final_fraction = 0.0
  config.num_train_steps = 6315  # 3 epochs of 67,349 sentences at batch 32
  config.batch_size = 32
  config.seq_len = 128  # [CLS] + sentence (SST-2 sentences are short)
  config.log_every = 100
  common.evaluate_and_checkpoint(config, 1000)  # the whole validation split
  common.keep_most_accurate(config)  # on validation
  return config

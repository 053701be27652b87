"""Fine-tune a Hugging Face BERT directory on Old / New Testament classification (`hf:DIR`).

The task of configs/classify_testament.py (KJV verse -> OT / NT, test split of 1,574
verses, 72.7% OT) from a `BertForMaskedLM` (or `BertForSequenceClassification`)
directory: the model config, the encoder weights and the WordPiece tokenizer come from
it. Rows are `[CLS] verse [SEP]` in the tokenizer's own ids, as BERT was pretrained. The
[CLS] pooler and the 2-way classifier start fresh on a masked-LM checkpoint (its MLM head
is not used); a `BertForSequenceClassification` with 2 labels brings its own. With no
network, make a tiny random BERT first:

  python scripts/make_tiny_hf.py runs/tiny_hf bert
  python train.py --config configs/finetune_bert_testament.py --workdir runs/ft_bert

The learning rate suits the tiny random BERT, which has everything to learn; a pretrained
one (e.g. a `save_pretrained` copy of `bert-base-uncased`) takes BERT's fine-tuning rate
(Devlin et al. 2019, A.3: 5e-5, 3e-5 or 2e-5):

  python train.py --config configs/finetune_bert_testament.py:path/to/bert --workdir runs/ft \\
    --config.schedule.learning_rate=3e-5

The tiny random BERT of scripts/make_tiny_hf.py has a 300-piece WordPiece trained on 400
lines of Shakespeare: it splits words finely, and many verses are truncated to 62 pieces.
Result: docs/FINETUNING.md.
"""

from pathlib import Path

from transformer.train.config_files import load_module

common = load_module(Path(__file__).with_name("common.py"), "configs_common")

DEFAULT_DIR = "runs/tiny_hf/bert"  # written by scripts/make_tiny_hf.py


def get_config(arg=None):
  config = common.from_hf(arg, DEFAULT_DIR)  # model, weights and tokenizer
  m = config.model
  m.max_len = 64  # positions used (the first rows of the checkpoint's table)
  m.num_classes = 0  # from the data: OT, NT (a masked-LM checkpoint has no classifier)
  m.pooling = "cls"  # BERT's pooler: dense + tanh on the [CLS] token
  m.dropout_rate = 0.1  # BERT's hidden_dropout_prob (runtime fields are the config's)
  m.attention_dropout_rate = 0.1  # BERT's attention_probs_dropout_prob
  common.testament_classification(config)  # [CLS] verse [SEP] -> OT / NT
  config.schedule.learning_rate = 1e-3  # for the tiny random BERT (see above)
  config.eval_every = 300
  return config

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

Result (2-core CPU shared with other jobs, load ~4.5), the tiny random BERT of
scripts/make_tiny_hf.py (its 300-piece WordPiece, trained on 400 lines of Shakespeare,
splits words finely: 38% of the verses are truncated to 62 pieces): 600 steps in 24 s wall
(21 + 2 s CPU), test accuracy 77.64% (loss 0.475; step 300: 75.73%), above the
majority class's 72.7% but short of the 4-layer classify_testament (about 89%).
"""

from transformer.train.experiment import default_config

DEFAULT_DIR = "runs/tiny_hf/bert"  # written by scripts/make_tiny_hf.py


def get_config(arg=None):
  config = default_config()
  config.init_from = f"hf:{arg or DEFAULT_DIR}"  # model, weights and tokenizer
  m = config.model
  m.max_len = 64  # positions used (the first rows of the checkpoint's table)
  m.num_classes = 0  # from the data: OT, NT (a masked-LM checkpoint has no classifier)
  m.pooling = "cls"  # BERT's pooler: dense + tanh on the [CLS] token
  m.dropout_rate = 0.1  # BERT's hidden_dropout_prob (runtime fields are the config's)
  m.attention_dropout_rate = 0.1  # BERT's attention_probs_dropout_prob
  d = config.data
  d.kind = "classification"  # [CLS] verse [SEP] -> label
  d.source = "labelled"  # the TSV: verse text + label
  d.path = "data/bible_kjv_rv1909_en_es.tsv.gz"  # shipped with the project
  d.text_column = "en"  # King James Version
  d.label_column = "testament"  # OT / NT
  d.label_names = ("OT", "NT")  # label ids 0 and 1
  d.eval_split = "test"  # report test accuracy (no model selection on it: last checkpoint)
  d.eval_batch_size = 128  # rows per evaluation batch
  config.optimizer.eps = 1e-6  # BERT's Adam epsilon
  config.optimizer.weight_decay = 0.01  # BERT's decoupled weight decay
  config.optimizer.clip_norm = 1.0  # global-norm clipping
  config.schedule.kind = "cosine"  # warmup then decay
  config.schedule.learning_rate = 1e-3  # peak, for the tiny random BERT (see above)
  config.schedule.warmup_steps = 60  # linear warmup (10%)
  config.schedule.final_fraction = 0.0  # decay to 0
  config.num_train_steps = 600  # updates (0.7 epochs of 28,041 training verses)
  config.batch_size = 32  # verses per update
  config.seq_len = 64  # tokens per row ([CLS] verse [SEP])
  config.log_every = 100  # console / TensorBoard interval
  config.eval_every = 300  # test-accuracy interval
  config.eval_batches = 0  # the whole test split
  config.checkpoint_every = 600  # checkpoint at the end
  config.best_metric = ""  # keep only the last checkpoints
  return config

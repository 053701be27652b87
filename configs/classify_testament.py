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

Result (2-core CPU shared with other jobs), test accuracy (loss) after 600 steps, two seeds:
  fine-tuned from mlm_bible  seed 0: 89.77% (0.247)   seed 1: 90.15% (0.246)   mean 89.96%
  from scratch               seed 0: 89.07% (0.272)   seed 1: 88.50% (0.255)   mean 88.79%
Fine-tuning is ahead at every evaluation of both seeds (steps 200 / 400: 85.6 / 89.6 and
87.0 / 89.5 vs 85.3 / 89.0 and 85.3 / 88.3). Wall time 137-324 s per run depending on
the load (86-144 s user CPU). All four runs used the mlm_bible run's tokenizer (the
byte-identical SentencePiece model); mlm_bible itself: 27.0% masked-LM accuracy.
Fine-tuned from a later mlm_bible run (its MLM head at the predicted positions only, same
27.0%), seed 0: 90.03% (0.250) in 60 s wall (93 s user CPU, load ~2).

With few labels pretraining pays off more: `python -m transformer.research.low_label` trains
both arms on a fixed random 1,000 or 3,000 of the training verses (`data.train_examples`,
drawn from `config.seed`, the same for both arms of a seed) over three seeds; results in
docs/RESEARCH.md ("Pretraining with few labels").
"""

from transformer.train.experiment import default_config


def get_config(arg=None):
  del arg
  config = default_config()
  m = config.model
  m.family = "encoder"  # bidirectional encoder with a sequence classifier
  m.vocab_size = 0  # from the SentencePiece vocabulary (the pretraining run's)
  m.d_model = 128  # width (as mlm_bible)
  m.num_heads = 4  # attention heads (as mlm_bible)
  m.num_layers = 4  # blocks (as mlm_bible)
  m.d_ff = 512  # feed-forward width (as mlm_bible)
  m.max_len = 128  # position table rows (as mlm_bible, so it is copied)
  m.position = "learned"  # as mlm_bible
  m.num_classes = 0  # from the data: OT, NT
  m.pooling = "cls"  # classify from the [CLS] token
  m.dropout_rate = 0.1  # fine-tuning regularisation
  d = config.data
  d.kind = "classification"  # [CLS] verse -> label
  d.source = "labelled"  # the TSV: verse text + label
  d.path = "data/bible_kjv_rv1909_en_es.tsv.gz"  # shipped with the project
  d.text_column = "en"  # King James Version
  d.label_column = "testament"  # OT / NT
  d.label_names = ("OT", "NT")  # label ids 0 and 1
  d.tokenizer = "sentencepiece"  # as mlm_bible
  d.vocab_size = 4000  # as mlm_bible (tokenizer_from looks up this size)
  d.tokenizer_from = ""  # the pretraining workdir whose tokenizer to reuse; '' = train one
  d.eval_split = "test"  # report test accuracy (no model selection on it: last checkpoint)
  d.eval_batch_size = 128  # rows per evaluation batch
  config.init_from = ""  # the pretraining workdir (mlm_bible); '' = from scratch
  config.optimizer.b2 = 0.98  # AdamW beta2
  config.optimizer.eps = 1e-6  # AdamW epsilon
  config.optimizer.weight_decay = 0.01  # decoupled weight decay
  config.optimizer.clip_norm = 1.0  # global-norm clipping
  config.schedule.kind = "cosine"  # warmup then cosine decay
  config.schedule.learning_rate = 3e-4  # peak learning rate
  config.schedule.warmup_steps = 60  # linear warmup (10%)
  config.schedule.final_fraction = 0.0  # decay to 0
  config.num_train_steps = 600  # updates (0.7 epochs of 28,041 training verses)
  config.batch_size = 32  # verses per update
  config.seq_len = 64  # tokens per row ([CLS] + verse; 3% of verses are truncated)
  config.log_every = 100  # console / TensorBoard interval
  config.eval_every = 200  # test-accuracy interval
  config.eval_batches = 0  # the whole test split
  config.checkpoint_every = 600  # checkpoint at the end
  config.best_metric = ""  # keep only the last checkpoints
  return config

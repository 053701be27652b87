"""A small BERT: masked-LM pretraining on the English verses of the shipped bible TSV.

The KJV column (`en`) of data/bible_kjv_rv1909_en_es.tsv.gz, verses packed into 128-token
rows, a 4,000-piece SentencePiece vocabulary trained on the training verses at first use.
30% of tokens are predicted (80% [MASK], 10% random, 10% kept): Wettig et al. 2023 find
rates above BERT's 15% as good or better. The MLM head runs at the predicted positions
only (38 of 128 per row), the encoder at all. Pre-LN, GELU, learned positions, logits
tied to the token embedding. The checkpoint initialises configs/classify_testament.py.

  python train.py --config configs/mlm_bible.py --workdir runs/mlm_bible

Result (2-core CPU, load average ~2): 1,000 steps in 106 s wall (163 s user + 12 s system
CPU), 22k tokens/s; validation masked-LM accuracy 27.0%, loss 4.542 (15,255 predicted
tokens of the 1,535 validation verses; 18.6% / 5.167 at step 500). With the head at every
position (before it ran at the predicted ones only) the same run took 127 s at 17k
tokens/s and reached 27.0% / 4.541. With 15% masking and lr 1e-3 the same budget reached
only 17.8% / 5.192.
"""

from transformer.train.experiment import default_config


def get_config(arg=None):
  del arg
  config = default_config()
  m = config.model
  m.family = "encoder"  # bidirectional encoder with a masked-LM head
  m.vocab_size = 0  # from the SentencePiece vocabulary
  m.d_model = 128  # width
  m.num_heads = 4  # attention heads
  m.num_layers = 4  # blocks
  m.d_ff = 512  # 4 * d_model
  m.max_len = 128  # position table; classify_testament must use the same to reuse it
  m.position = "learned"  # BERT: learned absolute positions
  m.dropout_rate = 0.0  # a few epochs only: no regularisation needed
  m.tie_embeddings = True  # masked-LM logits through the token embedding
  d = config.data
  d.kind = "mlm"  # [CLS] verse [SEP] segments packed into rows, tokens masked
  d.source = "labelled"  # the TSV (verse text + testament label; the label is unused here)
  d.path = "data/bible_kjv_rv1909_en_es.tsv.gz"  # shipped with the project
  d.text_column = "en"  # King James Version
  d.label_column = "testament"  # OT / NT (ignored by MLM; keeps the split of classify_testament)
  d.label_names = ("OT", "NT")  # label ids 0 and 1
  d.tokenizer = "sentencepiece"  # unigram subwords trained on the training verses
  d.vocab_size = 4000  # pieces, including the 7 special ids
  d.mask_rate = 0.3  # more predictions per step for free (logits cover every position anyway)
  d.eval_batch_size = 64  # rows per evaluation batch
  config.optimizer.b2 = 0.98  # AdamW beta2 (short run)
  config.optimizer.eps = 1e-6  # AdamW epsilon (BERT)
  config.optimizer.weight_decay = 0.01  # BERT weight decay
  config.optimizer.clip_norm = 1.0  # global-norm clipping
  config.schedule.kind = "cosine"  # warmup then cosine decay
  config.schedule.learning_rate = 2e-3  # peak learning rate
  config.schedule.warmup_steps = 100  # linear warmup
  config.schedule.final_fraction = 0.05  # decay to 1e-4
  config.num_train_steps = 1000  # updates (about 1.7 epochs of the training verses)
  config.batch_size = 16  # rows of 128 tokens per update (smaller rows run faster per token here)
  config.seq_len = 128  # tokens per row
  config.log_every = 100  # console / TensorBoard interval
  config.eval_every = 500  # validation interval
  config.eval_batches = 0  # the whole validation split
  config.checkpoint_every = 500  # checkpoint interval
  config.best_metric = "loss"  # keep the best masked-LM loss
  return config

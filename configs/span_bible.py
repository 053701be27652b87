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

Result (2-core AMD EPYC, AVX-512; load 0.4 at the start, 2.2 at the end, shared with a few
short test runs): 3,000 steps in 805 s wall (901 s user + 24 s system CPU); validation
target loss 3.780 and token accuracy 32.3% (20 batches; 31.4% at step 1,000, 31.9% at
2,000).

A translation run starts from it with `--config.init_from=DIR
--config.data.tokenizer_from=DIR`: every tensor is copied, the token embedding without
its 100 sentinel rows. `python -m transformer.research.span_transfer`
compares that with training from scratch on 10% of the pairs (docs/RESEARCH.md): with
2,800 pairs, 1,000 updates at peak lr 2e-3 (each arm's pick of the same grid), test BLEU
6.24 ± 0.29 from this run's weights against 10.71 ± 0.26 from scratch over seeds 0, 1, 2.
Here the pretraining hurts: the pretrained arm's training loss is ahead at step 250 and
behind from step 500 on.
"""

from transformer.train.experiment import default_config


def get_config(arg=None):
  del arg
  config = default_config()
  m = config.model  # the model of configs/translate_en_es.py (a test checks they match)
  m.family = "seq2seq"  # encoder-decoder with cross-attention
  m.vocab_size = 0  # the shared SentencePiece vocabulary + the task's 100 sentinels
  m.d_model = 128  # width
  m.num_heads = 4  # attention heads
  m.num_layers = 3  # encoder blocks
  m.num_decoder_layers = 3  # decoder blocks
  m.d_ff = 512  # 4 * d_model
  m.max_len = 96  # longest side (inputs)
  m.position = "sinusoidal"  # Vaswani et al. 2017, 3.5
  m.norm_position = "pre"  # pre-LN
  m.activation = "relu"  # as the paper
  m.tie_embeddings = True  # one embedding for source, target and logits
  m.scale_embeddings = True  # tokens * sqrt(D)
  m.dropout_rate = 0.0  # pretraining without dropout (T5.1.1); fine-tuning sets its own
  d = config.data
  d.kind = "span_corruption"  # sentinels replace dropped spans; targets restore them
  d.source = "pairs"  # the TSV of aligned verses, read as text of both languages
  d.windows = True  # one token stream: the English verses, then the Spanish ones
  d.path = "data/bible_kjv_rv1909_en_es.tsv.gz"  # shipped with the project
  d.source_column = "en"  # King James Version
  d.target_column = "es"  # Reina-Valera 1909
  d.tokenizer = "sentencepiece"  # the translation recipe's: both columns, 4,000 pieces
  d.vocab_size = 4000  # pieces, including the 7 special ids
  d.target_seq_len = 24  # targets: 15% of a 105-token window, its 5 sentinels and EOS
  d.eval_batch_size = 64  # windows per evaluation batch
  config.optimizer.b2 = 0.98  # as the translation recipe
  config.optimizer.eps = 1e-9
  config.optimizer.weight_decay = 0.01  # decoupled, not on norms / embeddings
  config.optimizer.clip_norm = 1.0  # global-norm clipping
  config.schedule.kind = "cosine"  # warmup then cosine decay
  config.schedule.learning_rate = 2e-3  # peak learning rate
  config.schedule.warmup_steps = 200  # linear warmup
  config.schedule.final_fraction = 0.05  # decay to 1e-4
  config.num_train_steps = 3000  # updates
  config.batch_size = 32  # windows per update
  config.seq_len = 96  # encoder input length S
  config.log_every = 250  # console / TensorBoard interval
  config.eval_every = 1000  # validation interval
  config.eval_batches = 20  # validation batches
  config.checkpoint_every = 1000  # checkpoint interval
  return config

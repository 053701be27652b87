"""English -> Spanish translation of bible verses (KJV -> Reina-Valera 1909), shipped data.

A small encoder-decoder ("Attention Is All You Need" layout at toy size: pre-LN, ReLU,
sinusoidal positions, tied embeddings scaled by sqrt(D)) on the verse pairs of
data/bible_kjv_rv1909_en_es.tsv.gz, with one SentencePiece vocabulary trained on the
English and Spanish training verses together. Pairs are packed jointly into 96-token rows
for training; BLEU (sacrebleu corpus BLEU against the raw Spanish references, beam
search of width 4, length penalty alpha 0.6) is computed at the end on the held-out test
verses, which are never trained on. The console prints the score with sacrebleu's
signature.

  python train.py --config configs/translate_en_es.py --workdir runs/translate_en_es
  python eval.py --workdir runs/translate_en_es --bleu_method beam

4,000 steps are about 5 epochs: the loss still falls after one, so dropout 0.1 guards the
repeated ones; a 200-step warmup; beam search for BLEU; `scale_embeddings` keeps the
positions from drowning out the tokens. Result and wall time: docs/RESULTS.md.

The `long` variant spends a 45-minute budget on a wider model (width 192, FFN 768) for
8,000 steps (about 10 epochs):

  python train.py --config configs/translate_en_es.py:long --workdir runs/translate_en_es_long

Result: docs/RESULTS.md.
"""

from pathlib import Path

from transformer.train.config_files import load_module
from transformer.train.experiment import default_config

common = load_module(Path(__file__).with_name("common.py"), "configs_common")

VARIANTS = (None, "long")


def get_config(arg=None):
  common.check_arg(__file__, arg, VARIANTS, what="variant")
  config = default_config()
  m = config.model
  common.small_translation_model(m)
  m.dropout_rate = 0.1  # five epochs of the same verses: some regularisation
  d = config.data
  common.bible_translation(d)
  common.bible_sentencepiece(d)  # one unigram vocabulary for both languages
  config.task.label_smoothing = 0.1  # Vaswani et al. 2017, 5.4
  common.short_translation_adamw(config)
  config.optimizer.weight_decay = 0.0  # none in the paper
  config.num_train_steps = 4000  # about five epochs of the training pairs
  config.batch_size = 24  # packed rows
  config.seq_len = 96  # tokens per row, source and target (3 of 1,574 test pairs are longer)
  config.log_every = 250
  common.evaluate_and_checkpoint(config, 1000)  # test loss on the whole test split
  config.evaluate.bleu.every = 4000  # BLEU at the end only (beam search is slow)
  config.evaluate.bleu.beam_size = 4  # beam search (length penalty alpha 0.6)
  if arg == "long":  # the 45-minute budget: a wider model for twice the epochs
    m.d_model = 192  # 4 heads of 48
    m.d_ff = 768  # 4 * d_model
    config.schedule.warmup_steps = 300
    config.num_train_steps = 8000  # about ten epochs
    common.evaluate_and_checkpoint(config, 2000)
    config.evaluate.bleu.every = 8000  # BLEU at the end only
  return config

"""Fine-tune a Hugging Face T5 directory on English -> Spanish bible verses (`hf:DIR`).

The data of configs/translate_en_es.py (KJV -> Reina-Valera 1909, BLEU on the 1,574 test
verses) from a `T5ForConditionalGeneration` directory: the model config (relative
position buckets, RMSNorm, T5 v1.0 or v1.1), the weights and the SentencePiece tokenizer
(`spiece.model`, 100 sentinels above its pieces) come from it. T5's ids are kept: PAD 0
pads the rows and starts the decoder (`shift_right`), EOS 1 ends every source and target
and stops decoding. Pairs are packed jointly for training; T5's fine-tuning recipe
(Raffel et al. 2020, section 3.1): Adafactor, constant learning rate 1e-3, dropout 0.1. With no
network, make a tiny random T5 first:

  python scripts/make_tiny_hf.py runs/tiny_hf t5
  python train.py --config configs/finetune_t5_en_es.py --workdir runs/ft_t5
  python eval.py --workdir runs/ft_t5 --bleu_method greedy

Another directory (e.g. a `save_pretrained` copy of `t5-small`):

  python train.py --config configs/finetune_t5_en_es.py:path/to/t5 --workdir runs/ft

The tiny random T5 of scripts/make_tiny_hf.py: width 32, one layer each side, 300 pieces
trained on Shakespeare and English / Spanish training verses, + 100 sentinels. A model
this small does not learn to translate in a short run. Result: docs/FINETUNING.md.
"""

from pathlib import Path

from transformer.train.config_files import load_module

common = load_module(Path(__file__).with_name("common.py"), "configs_common")

DEFAULT_DIR = "runs/tiny_hf/t5"  # written by scripts/make_tiny_hf.py


def get_config(arg=None):
  config = common.from_hf(arg, DEFAULT_DIR)  # model, weights and tokenizer
  m = config.model
  m.max_len = 96  # longest source / target (relative positions: any length)
  m.dropout_rate = 0.1  # T5's dropout_rate (runtime fields are the config's)
  m.attention_dropout_rate = 0.1  # T5 applies the same rate to attention weights
  common.bible_translation(config.data)  # tokenized by the directory's tokenizer
  config.task.label_smoothing = 0.0  # T5 fine-tunes without
  config.optimizer.kind = "adafactor"  # T5's optimizer
  config.optimizer.clip_norm = 1.0
  config.schedule.kind = "constant"  # T5 fine-tuning: a constant rate
  config.schedule.learning_rate = 1e-3  # T5's fine-tuning rate
  config.schedule.warmup_steps = 0  # T5 fine-tunes without warmup (Adafactor clips updates)
  config.num_train_steps = 800  # about one epoch of the training pairs
  config.batch_size = 24  # packed rows
  config.seq_len = 96  # tokens per row, source and target
  config.log_every = 100
  common.evaluate_and_checkpoint(config, 400)  # test loss on the whole test split
  config.evaluate.bleu.every = 800  # BLEU at the end only
  config.evaluate.bleu.beam_size = 1  # greedy decoding
  return config

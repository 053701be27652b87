"""The Transformer base / big (Vaswani et al. 2017) on WMT14 English-German.

  python train.py --config configs/transformer_wmt.py:base --workdir runs/wmt_base
  python eval.py --workdir runs/wmt_base  # beam 4, alpha 0.6: BLEU on newstest2014

Data: the TFDS dataset wmt14_translate/de-en (prepare with `tfds build
wmt14_translate/de-en --file_format=array_record`, which needs TensorFlow; see
docs/DATA.md), a shared 37,000-piece SentencePiece vocabulary for both languages (the
paper's shared BPE size), examples packed into 256-token rows. Hyperparameters from the
paper (5.3, 5.4): Adam betas (0.9, 0.98), eps 1e-9, the Noam schedule with 4,000 warmup
steps, label smoothing 0.1, dropout 0.1 (big: 0.3), post-LN, sinusoidal positions, shared
embeddings. Evaluation is on `test`, newstest2014 (3,003 sentences), the split of the
paper's Table 2: corpus BLEU by sacrebleu (its signature is reported with the score) of
beam-4 translations against the raw reference text of the split. sacrebleu scores
detokenized text, so it is not the paper's tokenized, compound-split BLEU. No checkpoint
is selected on the test split (only the last ones are kept); for development figures on
newstest2013 use `--config.data.eval_split=validation`. No reference result on this
machine: the paper's base model trains 100k steps on 8 GPUs.
"""

from pathlib import Path

from transformer.train.config_files import load_module

common = load_module(Path(__file__).with_name("common.py"), "configs_common")

SIZES = ("base", "big")


def get_config(arg="base"):
  config = common.named_size(__file__, arg, SIZES, "transformer")  # Vaswani et al. 2017, Table 3
  d = config.data
  d.kind = "seq2seq"
  d.source = "tfds"
  d.path = "wmt14_translate/de-en"  # WMT14 English-German
  d.source_column = "en"  # translate English ...
  d.target_column = "de"  # ... into German
  d.tokenizer = "sentencepiece"  # one vocabulary for both languages
  d.vocab_size = 37000  # the paper's shared vocabulary size
  d.packing = True  # pack sentence pairs into full rows
  d.eval_split = "test"  # newstest2014, as the paper reports (validation: 2013)
  config.optimizer.b1 = 0.9  # paper 5.3
  config.optimizer.b2 = 0.98  # paper 5.3
  config.optimizer.eps = 1e-9  # paper 5.3
  config.schedule.kind = "noam"  # d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
  config.schedule.warmup_steps = 4000  # paper 5.3
  config.schedule.scale = 1.0  # the paper's multiplier
  config.task.label_smoothing = 0.1  # paper 5.4
  config.num_train_steps = 100_000 if arg == "base" else 300_000  # paper 5.2
  config.batch_size = 128  # rows of 256 tokens (~25k source + target tokens per batch)
  config.seq_len = 256  # source and target row length
  common.evaluate_and_checkpoint(config, 5000)  # the whole of newstest2014 (3,003 pairs)
  config.evaluate.bleu.every = 10_000  # corpus BLEU on the test split (and at the end)
  config.evaluate.bleu.beam_size = 4  # paper 6.1: beam 4, length penalty 0.6
  config.best_metric = ""  # no model selection on the test split: keep the last checkpoints
  return config

"""GPT-2 small / medium / large (Radford et al. 2019) as a decoder-only LM.

  python train.py --config configs/gpt2.py:small --workdir runs/gpt2_small

Data: the TFDS dataset lm1b (prepare it once with `tfds build lm1b`, which needs
TensorFlow; see docs/DATA.md) with a 32k SentencePiece vocabulary trained at first use.
Hyperparameters follow the nanoGPT / GPT-3 small recipe (AdamW betas (0.9, 0.95), peak lr
6e-4 with 2,000 warmup steps and cosine decay, weight decay 0.1, clipping 1.0).
No reference result on this machine: a full run needs accelerators.
"""

from pathlib import Path

from transformer.train.config_files import load_module

common = load_module(Path(__file__).with_name("common.py"), "configs_common")

SIZES = ("small", "medium", "large")


def get_config(arg="small"):
  config = common.named_size(__file__, arg, SIZES, "gpt2")  # Radford et al. 2019, Table 2
  config.model.dtype = "bfloat16"  # bf16 compute, fp32 weights and optimizer
  config.data.kind = "lm"
  common.lm1b_sentencepiece(config.data, vocab_size=32000)
  config.data.text_column = "text"  # lm1b's feature with the sentence
  config.data.packing = True  # lm1b sentences are short: fill the 1,024-token rows
  config.optimizer.b2 = 0.95  # GPT-3 betas
  config.optimizer.eps = 1e-8
  config.optimizer.weight_decay = 0.1
  config.optimizer.clip_norm = 1.0
  config.schedule.kind = "cosine"
  config.schedule.learning_rate = 6e-4  # for small; larger sizes may want less
  config.schedule.warmup_steps = 2000
  config.schedule.final_fraction = 0.1
  config.num_train_steps = 100_000
  config.batch_size = 256
  config.seq_len = 1024  # GPT-2 context
  common.evaluate_and_checkpoint(config, 2000, batches=100)
  return config

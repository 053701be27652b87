"""Fine-tune a Hugging Face Gemma 2 directory on tiny shakespeare (`init_from='hf:DIR'`).

A Gemma-style decoder: RMSNorm by (1 + w) before and after each sublayer, embeddings x
sqrt(D), tanh GeGLU, wide heads, local and global layers, soft-capped attention scores
and logits (docs/PRETRAINED.md). The model config, weights and SentencePiece tokenizer
come from the directory. With no network, make a tiny random Gemma 2 first:

  python scripts/make_tiny_hf.py runs/tiny_hf gemma2
  python train.py --config configs/finetune_gemma2_shakespeare.py --workdir runs/ft_gemma2

The tiny random Gemma 2 of scripts/make_tiny_hf.py has 300 SentencePiece pieces. Result:
docs/FINETUNING.md.

Gemma 1 (`GemmaForCausalLM`) and Gemma 3 text (`Gemma3ForCausalLM`) directories work the
same way:

  python train.py --config configs/finetune_gemma2_shakespeare.py:path/to/gemma --workdir runs/ft \\
    --config.schedule.learning_rate=1e-5
"""

from pathlib import Path

from transformer.train.config_files import load_module

common = load_module(Path(__file__).with_name("common.py"), "configs_common")

DEFAULT_DIR = "runs/tiny_hf/gemma2"  # written by scripts/make_tiny_hf.py


def get_config(arg=None):
  config = common.from_hf(arg, DEFAULT_DIR)  # model, weights and tokenizer
  m = config.model
  m.max_len = 64  # the context trained (RoPE: any length up to the checkpoint's)
  m.dropout_rate = 0.0  # Gemma fine-tunes without dropout here
  m.attention_dropout_rate = 0.0
  config.data.kind = "lm"
  common.shakespeare_text(config.data)  # tokenized by the directory's tokenizer
  config.optimizer.b2 = 0.95
  config.optimizer.weight_decay = 0.1
  config.schedule.learning_rate = 1e-3  # for the tiny random Gemma 2
  common.shakespeare_finetune_run(config)
  config.evaluate.sample.prompts = ("ROMEO:",)
  return config

"""Fine-tune a Hugging Face GPT-2 directory on tiny shakespeare (`init_from='hf:DIR'`).

The model config, the weights and the byte-level BPE tokenizer all come from the
directory; the config sets only the run (data, optimizer, steps) and runtime fields.
With no network, make a tiny random GPT-2 first:

  python scripts/make_tiny_hf.py runs/tiny_hf gpt2
  python train.py --config configs/finetune_gpt2_shakespeare.py --workdir runs/ft_gpt2

Another directory (e.g. a `save_pretrained` copy of `gpt2`):

  python train.py --config configs/finetune_gpt2_shakespeare.py:path/to/gpt2 --workdir runs/ft
"""

from pathlib import Path

from transformer.train.config_files import load_module

common = load_module(Path(__file__).with_name("common.py"), "configs_common")

DEFAULT_DIR = "runs/tiny_hf/gpt2"  # written by scripts/make_tiny_hf.py


def get_config(arg=None):
  config = common.from_hf(arg, DEFAULT_DIR)  # model, weights and tokenizer
  m = config.model
  m.max_len = 64  # positions used (at most the checkpoint's n_positions)
  m.dropout_rate = 0.1  # GPT-2's resid_pdrop (runtime fields are the config's)
  m.attention_dropout_rate = 0.1  # GPT-2's attn_pdrop
  config.data.kind = "lm"
  common.shakespeare_text(config.data)  # tokenized by the directory's tokenizer
  config.optimizer.weight_decay = 0.01
  config.schedule.learning_rate = 1e-4  # fine-tuning: a small peak rate
  common.shakespeare_finetune_run(config)
  return config

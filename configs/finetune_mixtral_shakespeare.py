"""Fine-tune a Hugging Face Mixtral directory on tiny shakespeare (`init_from='hf:DIR'`).

A mixture-of-experts decoder: every layer's feed-forward is E SwiGLU experts, each token
routed to its top 2 (`nn/moe.py`, dropless as Mixtral). The model config, the weights and
the SentencePiece tokenizer come from the directory; the router's load-balancing loss is
Mixtral's (`router_aux_loss_coef` x K as our `moe_balance_loss`) and is added to the
training loss. With no network, make a tiny random Mixtral first:

  python scripts/make_tiny_hf.py runs/tiny_hf mixtral
  python train.py --config configs/finetune_mixtral_shakespeare.py --workdir runs/ft_mixtral

The tiny random Mixtral of scripts/make_tiny_hf.py: 4 experts, top 2, 300 SentencePiece
pieces. Result: docs/FINETUNING.md.

A pretrained Mixtral or Qwen3-MoE (`Qwen3MoeForCausalLM`) directory works the same way:

  python train.py --config configs/finetune_mixtral_shakespeare.py:path/to/moe --workdir runs/ft \\
    --config.schedule.learning_rate=1e-5
"""

from pathlib import Path

from transformer.train.config_files import load_module

common = load_module(Path(__file__).with_name("common.py"), "configs_common")

DEFAULT_DIR = "runs/tiny_hf/mixtral"  # written by scripts/make_tiny_hf.py


def get_config(arg=None):
  config = common.from_hf(arg, DEFAULT_DIR)  # model (experts, router), weights, tokenizer
  m = config.model
  m.max_len = 64  # the context trained (RoPE: any length up to the checkpoint's)
  m.dropout_rate = 0.0  # Mixtral trains without dropout
  m.attention_dropout_rate = 0.0
  config.data.kind = "lm"
  common.shakespeare_text(config.data)  # tokenized by the directory's tokenizer
  config.optimizer.b2 = 0.95  # Mixtral's AdamW betas (0.9, 0.95)
  config.optimizer.weight_decay = 0.1
  config.schedule.learning_rate = 1e-3  # for the tiny random Mixtral
  common.shakespeare_finetune_run(config)
  # SentencePiece encodes the default prompt, '\n', to no token.
  config.evaluate.sample.prompts = ("ROMEO:",)
  return config

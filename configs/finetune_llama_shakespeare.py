"""Fine-tune a Hugging Face Llama directory on tiny shakespeare (`init_from='hf:DIR'`).

As configs/finetune_gpt2_shakespeare.py for `LlamaForCausalLM`: the model config (RMSNorm,
SwiGLU, RoPE, grouped-query attention), the weights and the SentencePiece tokenizer
(`tokenizer.model`) come from the directory; the config sets only the run (data,
optimizer, steps) and runtime fields. The text is cut into windows of the token stream
(no BOS / EOS added). With no network, make a tiny random Llama first:

  python scripts/make_tiny_hf.py runs/tiny_hf llama
  python train.py --config configs/finetune_llama_shakespeare.py --workdir runs/ft_llama

The learning rate suits the tiny random Llama; a pretrained one (e.g. a `save_pretrained`
copy of a small Llama) takes a fine-tuning rate:

  python train.py --config configs/finetune_llama_shakespeare.py:path/to/llama --workdir runs/ft \\
    --config.schedule.learning_rate=2e-5

The tiny random Llama of scripts/make_tiny_hf.py has 300 SentencePiece pieces. Result:
docs/FINETUNING.md.
"""

from pathlib import Path

from transformer.train.config_files import load_module

common = load_module(Path(__file__).with_name("common.py"), "configs_common")

DEFAULT_DIR = "runs/tiny_hf/llama"  # written by scripts/make_tiny_hf.py


def get_config(arg=None):
  config = common.from_hf(arg, DEFAULT_DIR)  # model, weights and tokenizer
  m = config.model
  m.max_len = 64  # the context trained (RoPE: any length up to the checkpoint's)
  m.dropout_rate = 0.0  # Llama trains without dropout
  m.attention_dropout_rate = 0.0  # Llama's attention_dropout
  config.data.kind = "lm"
  common.shakespeare_text(config.data)  # tokenized by the directory's tokenizer
  config.optimizer.b2 = 0.95  # Llama's AdamW betas (0.9, 0.95)
  config.optimizer.weight_decay = 0.1  # Llama's
  config.schedule.learning_rate = 1e-3  # for the tiny random Llama (see above)
  common.shakespeare_finetune_run(config)
  # SentencePiece encodes the default prompt, '\n', to no token.
  config.evaluate.sample.prompts = ("ROMEO:",)
  return config

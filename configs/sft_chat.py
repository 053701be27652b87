"""Chat SFT of a Hugging Face checkpoint with its own chat template (`init_from='hf:DIR'`).

The model, its weights, its tokenizer and its chat template (`tokenizer_config.json` or
`chat_template.jinja`) come from the directory; each conversation of data/arith/ is
rendered with that template, ids equal to transformers' `apply_chat_template`, and the
loss is on the assistant turns and their end-of-turn tokens (transformer/tasks/sft.py).
LoRA adapters of rank 8 on the attention and MLP projections are trained, the weights
frozen; `--config.model.lora_rank=0` trains every weight instead.

  python train.py --config configs/sft_chat.py:path/to/checkpoint --workdir runs/sft_chat

Another conversation dataset reads the same way: `--config.data.path=DIR_OR_NAME`
(JSONL, Parquet or a Hub dataset with a column of {role, content} lists,
`--config.data.text_column=...`).
"""

from pathlib import Path

from transformer.train.config_files import load_module
from transformer.train.experiment import task_block

common = load_module(Path(__file__).with_name("common.py"), "configs_common")

DEFAULT_DIR = "runs/tiny_hf/gpt2"  # scripts/make_tiny_hf.py; a chat template must be added


def get_config(arg=None):
  config = common.from_hf(arg, DEFAULT_DIR)  # model, weights, tokenizer and template
  m = config.model
  m.max_len = 64  # the context trained
  m.dropout_rate = 0.0
  m.attention_dropout_rate = 0.0
  m.lora_rank = 8
  m.lora_targets = ("query", "key", "value", "out", "ffn/")  # every projection
  d = config.data
  d.kind = "sft"
  d.source = "hf"
  d.path = "data/arith"
  d.eval_split = "test"
  d.text_column = "messages"
  config.task = task_block("sft")
  config.data.eval_batch_size = 32
  common.clipped_cosine(config, 20, 0.1, learning_rate=1e-3)
  config.update(num_train_steps=200, batch_size=8, seq_len=64, log_every=20)
  common.evaluate_and_checkpoint(config, 100, batches=20)
  config.evaluate.exact_match.examples = 100  # held-out prompts answered at the end
  return config

"""Chat SFT of a character-level decoder on arithmetic: 'a+b=' and 'a*b=' with 1-3 digits.

`data.kind='sft'` on the conversations of data/arith/ (20,000 train, 1,000 test whose
prompts are never trained on; scripts/make_arith.py), read as Parquet (`data.source='hf'`)
and rendered with the plain template of a tokenizer without a chat template
(transformer/tasks/sft.py): the loss is on the assistant's answers and their EOS only. The
model is nanoGPT's CPU decoder (4 layers, 128 wide, context 64) on characters; whole
conversations are packed into rows of 64 with segment ids.

  python train.py --config configs/sft_arith.py --workdir runs/sft_arith

Every 500 updates the `exact_match` evaluator answers each held-out prompt greedily and
scores the answers that equal the reference (metric 'exact_match'); `eval.py --workdir DIR`
scores a checkpoint the same way, with five examples.
"""

from pathlib import Path

from transformer.train.config_files import load_module
from transformer.train.experiment import default_config, task_block

common = load_module(Path(__file__).with_name("common.py"), "configs_common")


def get_config(arg=None):
  del arg
  config = default_config()
  common.nanogpt_char_model(config.model)
  d = config.data
  d.kind = "sft"
  d.source = "hf"
  d.path = "data/arith"  # train-*.parquet and test-*.parquet name the splits
  d.eval_split = "test"
  d.text_column = "messages"
  d.tokenizer = "char"
  config.task = task_block("sft")
  common.nanogpt_adamw(config, learning_rate=3e-3)
  config.num_train_steps = 1500
  config.batch_size = 32  # rows of 64 characters, about two conversations each
  config.seq_len = 64
  config.log_every = 100
  common.evaluate_and_checkpoint(config, 500)  # loss on the answers of the whole test split
  config.evaluate.exact_match.every = 500  # and the greedy answers to its 1,000 prompts
  return config

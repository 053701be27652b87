"""Fine-tune a Hugging Face GPT-2 directory on tiny shakespeare (`init_from='hf:DIR'`).

The model config, the weights and the byte-level BPE tokenizer all come from the
directory; the config sets only the run (data, optimizer, steps) and runtime fields.
With no network, make a tiny random GPT-2 first:

  python scripts/make_tiny_hf.py runs/tiny_hf gpt2
  python train.py --config configs/finetune_gpt2_shakespeare.py --workdir runs/ft_gpt2

Another directory (e.g. a `save_pretrained` copy of `gpt2`):

  python train.py --config configs/finetune_gpt2_shakespeare.py:path/to/gpt2 --workdir runs/ft
"""

from transformer.train.experiment import default_config

DEFAULT_DIR = "runs/tiny_hf/gpt2"  # written by scripts/make_tiny_hf.py


def get_config(arg=None):
  config = default_config()
  config.init_from = f"hf:{arg or DEFAULT_DIR}"  # model, weights and tokenizer
  m = config.model
  m.max_len = 64  # positions used (at most the checkpoint's n_positions)
  m.dropout_rate = 0.1  # GPT-2's resid_pdrop (runtime fields are the config's)
  m.attention_dropout_rate = 0.1  # GPT-2's attn_pdrop
  d = config.data
  d.kind = "lm"  # next-token prediction
  d.source = "text"  # a local text file
  d.path = "data/tinyshakespeare.txt.gz"  # shipped with the project
  d.validation_fraction = 0.1  # last 10% for validation
  d.test_fraction = 0.0  # no test split
  d.eval_batch_size = 32
  config.optimizer.weight_decay = 0.01
  config.optimizer.clip_norm = 1.0
  config.schedule.kind = "cosine"
  config.schedule.learning_rate = 1e-4  # fine-tuning: a small peak rate
  config.schedule.warmup_steps = 20
  config.schedule.final_fraction = 0.1
  config.num_train_steps = 200
  config.batch_size = 8
  config.seq_len = 64
  config.log_every = 20
  config.eval_every = 100
  config.eval_batches = 20
  config.checkpoint_every = 100
  config.sample_tokens = 32
  return config

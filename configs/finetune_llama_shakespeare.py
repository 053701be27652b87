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

Result (2-core CPU shared with other jobs, load ~3.5), the tiny random Llama of
scripts/make_tiny_hf.py (300 SentencePiece pieces): 200 steps in 16 s wall (12 + 1 s CPU),
validation loss 5.172 nats/piece over 20 batches (step 1: 6.204 training; step 100: 5.313).
"""

from transformer.train.experiment import default_config

DEFAULT_DIR = "runs/tiny_hf/llama"  # written by scripts/make_tiny_hf.py


def get_config(arg=None):
  config = default_config()
  config.init_from = f"hf:{arg or DEFAULT_DIR}"  # model, weights and tokenizer
  m = config.model
  m.max_len = 64  # the context trained (RoPE: any length up to the checkpoint's)
  m.dropout_rate = 0.0  # Llama trains without dropout
  m.attention_dropout_rate = 0.0  # Llama's attention_dropout
  d = config.data
  d.kind = "lm"  # next-token prediction
  d.source = "text"  # a local text file
  d.path = "data/tinyshakespeare.txt.gz"  # shipped with the project
  d.validation_fraction = 0.1  # last 10% for validation
  d.test_fraction = 0.0  # no test split
  d.eval_batch_size = 32  # windows per evaluation batch
  config.optimizer.b2 = 0.95  # Llama's AdamW betas (0.9, 0.95)
  config.optimizer.weight_decay = 0.1  # Llama's decoupled weight decay
  config.optimizer.clip_norm = 1.0  # global-norm clipping
  config.schedule.kind = "cosine"  # warmup then cosine decay
  config.schedule.learning_rate = 1e-3  # peak, for the tiny random Llama (see above)
  config.schedule.warmup_steps = 20  # linear warmup
  config.schedule.final_fraction = 0.1  # decay to a tenth of the peak
  config.num_train_steps = 200  # updates
  config.batch_size = 8  # windows per update
  config.seq_len = 64  # tokens per window
  config.log_every = 20  # console / TensorBoard interval
  config.eval_every = 100  # validation interval
  config.eval_batches = 20  # validation batches per evaluation
  config.checkpoint_every = 100  # checkpoint interval
  config.sample_tokens = 32  # tokens sampled at the end
  config.sample_prompt = "ROMEO:"  # SentencePiece encodes the default '\n' to no token
  return config

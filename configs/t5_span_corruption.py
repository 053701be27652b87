"""T5-style span-corruption pretraining of a small encoder-decoder on tiny shakespeare.

The objective of Raffel et al. 2020 (noise density 0.15, mean span 3, sentinels; see
transformer/tasks/span_corruption.py) on the shipped text, with a T5.1.1-shaped model:
relative position buckets shared across layers, RMSNorm pre-LN, gated GELU, no biases,
untied logits, SentencePiece vocabulary (+ 100 sentinel ids).

  python train.py --config configs/t5_span_corruption.py --workdir runs/t5_span_corruption

Result: docs/RESULTS.md.
"""

from pathlib import Path

from transformer.train.config_files import load_module
from transformer.train.experiment import default_config

common = load_module(Path(__file__).with_name("common.py"), "configs_common")


def get_config(arg=None):
  del arg
  config = default_config()
  m = config.model
  m.family = "seq2seq"
  m.vocab_size = 0  # the tokenizer's vocabulary + the task's 100 sentinels
  m.d_model = 128
  m.num_heads = 4
  m.num_layers = 2
  m.num_decoder_layers = 2
  m.d_ff = 384  # gated FFN hidden width (T5.1.1 uses gated GELU)
  m.max_len = 128  # longest side (inputs)
  m.position = "relative_t5"  # bucketed relative bias, shared by the layers of a stack
  m.norm = "rmsnorm"  # T5's scale-only norm
  m.activation = "geglu"  # gated GELU (T5.1.1)
  m.use_bias = False  # T5 has no biases
  m.tie_embeddings = False  # T5.1.1 unties the logits
  common.span_corruption_pretraining(config, 500)
  d = config.data
  common.shakespeare_text(d)
  d.tokenizer = "sentencepiece"  # subwords trained on the text
  d.vocab_size = 1024
  d.target_seq_len = 32  # targets: 15% of a ~140-token window plus sentinels and EOS
  common.clipped_cosine(config, 100, learning_rate=2e-3)
  config.num_train_steps = 1000
  config.seq_len = 128  # encoder input length S
  config.log_every = 100
  return config

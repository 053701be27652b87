"""The character GPT of `configs/lm_shakespeare.py` with DeepSeek-V3's multi-head latent
attention (`nn/mla.py`; docs/ARCHITECTURE.md, "Latent attention").

- Keys and values from a 64-wide latent (`mla_kv_rank`), each of the 4 heads' keys and
  values 32 wide (`attention_head_dim`), plus 16 features that RoPE rotates: the queries'
  own and one key shared by the heads (`mla_rope_dim`); queries through a 96-wide latent
  (`mla_q_rank`).
- RoPE in place of the learned positions (latent attention's keys carry their position
  in the rotated part).

Its decoding cache holds 64 + 16 numbers per layer and token, against 2 x 4 x 32 for the
same heads' keys and values.

  python train.py --config configs/lm_shakespeare_mla.py --workdir runs/lm_shakespeare_mla
"""

from pathlib import Path

from transformer.train.config_files import load_module

lm_shakespeare = load_module(Path(__file__).with_name("lm_shakespeare.py"), "lm_shakespeare")


def get_config(arg=None):
  config = lm_shakespeare.get_config(arg)
  m = config.model
  m.position = "rope"
  m.attention_head_dim = 32
  m.mla_kv_rank = 64
  m.mla_rope_dim = 16
  m.mla_q_rank = 96
  return config

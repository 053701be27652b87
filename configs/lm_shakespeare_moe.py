"""The character GPT of `configs/lm_shakespeare.py` with DeepSeek-V3's mixture of experts
(`nn/moe.py`; the fields in docs/RESEARCH.md, "Mixture of experts").

- Layer 0 keeps its dense feed-forward, 512 wide (`moe_first_dense=1`).
- Layers 1-3: 8 experts 128 wide (`moe_d_ff`); each token goes to its top 2 by sigmoid
  scores, the two gates renormalised (`moe_router='sigmoid'`, `moe_norm_topk=True`), and
  through a shared expert 128 wide (`moe_shared_d_ff`); dropless.
- The load-balancing loss (`moe_balance_loss`, 0.01 per MoE layer) joins the training loss.

Per token a MoE layer computes 3 x 128 hidden units (the dense layer 512) and holds
9 x 128 of them.

  python train.py --config configs/lm_shakespeare_moe.py --workdir runs/lm_shakespeare_moe
"""

from pathlib import Path

from transformer.train.config_files import load_module

lm_shakespeare = load_module(Path(__file__).with_name("lm_shakespeare.py"), "lm_shakespeare")


def get_config(arg=None):
  config = lm_shakespeare.get_config(arg)
  m = config.model
  m.moe_experts = 8
  m.moe_top_k = 2
  m.moe_d_ff = 128
  m.moe_shared_d_ff = 128
  m.moe_first_dense = 1
  m.moe_router = "sigmoid"
  m.moe_norm_topk = True
  m.moe_capacity_factor = None
  return config

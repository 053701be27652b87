"""Qwen1.5-MoE / Qwen2-MoE (`Qwen2MoeForCausalLM`): the Qwen2 decoder whose every
feed-forward is a mixture of SwiGLU experts plus a shared expert.

- `num_experts` experts of width `moe_intermediate_size`, top `num_experts_per_tok`,
  renormalised only when `norm_topk_prob` (`moe_norm_topk`), dropless (`convert.mixtral`).
- A shared SwiGLU expert of width `shared_expert_intermediate_size` every token goes
  through (`moe_shared_d_ff`), its output times sigmoid(`shared_expert_gate`(x))
  (`moe_shared_gate`).
- Biases on q/k/v only (`qkv_bias`), windows as Qwen2.

Dense layers among the experts (`decoder_sparse_step` > 1, `mlp_only_layers`) are refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformer.convert import llama, mixtral
from transformer.convert.base import Converter, Rule, linear, require, unsupported
from transformer.nn.config import ModelConfig

ARCHITECTURE = "Qwen2MoeForCausalLM"


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  a = ARCHITECTURE
  require(hf, a, "decoder_sparse_step", (1,))
  if hf.get("mlp_only_layers"):
    unsupported(a, "mlp_only_layers", hf["mlp_only_layers"], ([],))
  fields = llama.common(hf, a, False) | {"d_ff": hf["moe_intermediate_size"]}
  fields |= {
    "qkv_bias": hf.get("qkv_bias", True) or None,
    "sliding_window": llama.qwen_window(hf, a),
  }
  fields |= mixtral.moe_fields(hf, "num_experts", bool(hf.get("norm_topk_prob", False)))
  return fields | {
    "moe_shared_d_ff": hf["shared_expert_intermediate_size"],
    "moe_shared_gate": True,
  }


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  out = llama.config_to_hf(c) | {"model_type": "qwen2_moe", "qkv_bias": c.qkv_biases}
  out |= llama.qwen_window_to_hf(c) | mixtral.moe_to_hf(c, "num_experts")
  out |= {"moe_intermediate_size": c.d_ff, "shared_expert_intermediate_size": c.moe_shared_d_ff}
  out |= {"decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": bool(c.moe_norm_topk)}
  for key in ("attention_bias", "mlp_bias"):
    del out[key]
  return out


def _moe(c: ModelConfig, ours: str, hf: str, i: int) -> list[Rule]:
  names = ("gate_proj", "up_proj", "down_proj")
  out = mixtral.expert_rules(f"{ours}/moe", f"{hf}.mlp", names, c.moe_experts)
  for our_name, name in zip(("wi_0", "wi_1", "wo"), names, strict=True):  # the shared expert
    out += linear(f"{ours}/moe/shared_ffn/{our_name}", f"{hf}.mlp.shared_expert.{name}", bias=False)
  return out + linear(f"{ours}/moe/shared_gate", f"{hf}.mlp.shared_expert_gate", bias=False)


def rules(c: ModelConfig) -> list[Rule]:
  return llama.decoder_rules(c, _moe)


CONVERTERS = {
  ARCHITECTURE: Converter(
    ARCHITECTURE, "qwen2_moe", config_from_hf, config_to_hf, rules, llama.PREFIX
  ),
}

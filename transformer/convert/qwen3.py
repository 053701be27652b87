"""Qwen3 (`Qwen3ForCausalLM`) and Qwen3-MoE (`Qwen3MoeForCausalLM`).

Qwen3 is the Llama layout with QK-norm: each query and key head is RMS-normalised over its
H features (one learned scale [H] for the queries, one for the keys, `q_norm` / `k_norm`)
before RoPE (`ModelConfig.qk_norm`), no biases, and `head_dim` set apart from D / N.
Qwen3-MoE replaces every layer's feed-forward with `num_experts` SwiGLU experts of width
`moe_intermediate_size` (`convert.mixtral` for the routing); its top-k probabilities are
renormalised only when `norm_topk_prob` is true (`ModelConfig.moe_norm_topk`). Dense
layers among the experts (`decoder_sparse_step` > 1, `mlp_only_layers`) are refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformer.convert import llama, mixtral
from transformer.convert.base import Converter, Rule, require, unsupported
from transformer.nn.config import ModelConfig

ARCHITECTURE = "Qwen3ForCausalLM"
MOE = "Qwen3MoeForCausalLM"


def config_from_hf(hf: Mapping[str, Any], a: str = ARCHITECTURE) -> dict[str, Any]:
  require(hf, a, "attention_bias", (False,))
  fields = llama.common(hf, a, False) | {"qk_norm": True}
  return fields | {"sliding_window": llama.qwen_window(hf, a)}


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  out = llama.config_to_hf(c) | {"model_type": "qwen3"} | llama.qwen_window_to_hf(c)
  del out["mlp_bias"]
  return out


def _experts_key(hf: Mapping[str, Any]) -> str:
  return "num_experts" if "num_experts" in hf else "num_local_experts"  # 4.x | 5.x name


def moe_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  require(hf, MOE, "decoder_sparse_step", (1,))
  if hf.get("mlp_only_layers"):
    unsupported(MOE, "mlp_only_layers", hf["mlp_only_layers"], ([],))
  fields = config_from_hf(hf, MOE) | {"d_ff": hf["moe_intermediate_size"]}
  normalise = bool(hf.get("norm_topk_prob", False))
  return fields | mixtral.moe_fields(hf, _experts_key(hf), normalise)


def moe_to_hf(c: ModelConfig) -> dict[str, Any]:
  out = config_to_hf(c) | {"model_type": "qwen3_moe", "moe_intermediate_size": c.d_ff}
  out |= {"decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": c.moe_norm_topk}
  return out | mixtral.moe_to_hf(c, "num_experts")


def _moe(c: ModelConfig, ours: str, hf: str, i: int) -> list[Rule]:
  names = ("gate_proj", "up_proj", "down_proj")
  return mixtral.expert_rules(f"{ours}/moe", f"{hf}.mlp", names, c.moe_experts)


def moe_rules(c: ModelConfig) -> list[Rule]:
  return llama.decoder_rules(c, _moe)


CONVERTERS = {
  ARCHITECTURE: Converter(
    ARCHITECTURE, "qwen3", config_from_hf, config_to_hf, llama.rules, llama.PREFIX
  ),
  MOE: Converter(MOE, "qwen3_moe", moe_from_hf, moe_to_hf, moe_rules, llama.PREFIX),
}

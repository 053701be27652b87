"""GLM-4.5 / GLM-4.6 (`Glm4MoeForCausalLM`): a Llama decoder whose feed-forward, past the
first `first_k_dense_replace` dense layers, is DeepSeek-V3's mixture of experts.

- Attention: biases on q/k/v only when `attention_bias` (`qkv_bias`), an optional Qwen3
  QK-norm (`use_qk_norm` -> `qk_norm`), RoPE on the first `partial_rotary_factor` of each
  head, rotating halves as Llama does (`rope_fraction`; Glm4MoeConfig's default 0.5).
- Dense layers: a SwiGLU `intermediate_size` wide (`d_ff`, `moe_first_dense`).
- MoE layers: `n_routed_experts` SwiGLU experts `moe_intermediate_size` wide (`moe_d_ff`),
  routed by sigmoid scores (`moe_router='sigmoid'`) with `e_score_correction_bias` used for
  the choice only (`moe_selection_bias`), group-limited top-k (`n_group`, `topk_group`),
  the chosen scores renormalised when `norm_topk_prob` and scaled by
  `routed_scaling_factor`; dropless. One shared expert `n_shared_experts` times as wide
  (`moe_shared_d_ff`), ungated.

The multi-token-prediction layers (`num_nextn_predict_layers`) serve speculative decoding
only: their tensors are left out on import and none are written on export.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformer.convert import llama, mixtral
from transformer.convert.base import NO_TOKEN_IDS, Converter, Rule, linear, same
from transformer.nn.config import ModelConfig

ARCHITECTURE = "Glm4MoeForCausalLM"


def moe_from_hf(hf: Mapping[str, Any], a: str) -> dict[str, Any]:
  """The MoE fields of DeepSeek-V3's layout (GLM-4.5 and DeepSeek-V3 share it)."""
  layers, dense = hf["num_hidden_layers"], hf.get("first_k_dense_replace", 1)
  if not 0 <= dense < layers:  # a model with no MoE layer is a dense family's
    raise ValueError(
      f"{a}: first_k_dense_replace={dense} is not supported (supported: 0 .. {layers - 1})"
    )
  width = hf["moe_intermediate_size"]
  return mixtral.moe_fields(hf, "n_routed_experts", hf.get("norm_topk_prob", True)) | {
    "moe_d_ff": width,
    "moe_first_dense": dense,
    "moe_shared_d_ff": width * hf.get("n_shared_experts", 1),
    "moe_router": "sigmoid",
    "moe_selection_bias": True,
    "moe_groups": hf.get("n_group", 1),
    "moe_top_groups": hf.get("topk_group", 1),
    "moe_routed_scale": float(hf.get("routed_scaling_factor", 1.0)),
  }


def moe_to_hf(c: ModelConfig) -> dict[str, Any]:
  normalise = c.moe_top_k > 1 if c.moe_norm_topk is None else c.moe_norm_topk
  return mixtral.moe_to_hf(c, "n_routed_experts") | {
    "moe_intermediate_size": c.expert_d_ff,
    "first_k_dense_replace": c.moe_first_dense,
    "n_shared_experts": c.moe_shared_d_ff // c.expert_d_ff,
    "n_group": c.moe_groups,
    "topk_group": c.moe_top_groups,
    "routed_scaling_factor": c.moe_routed_scale,
    "norm_topk_prob": normalise,
    "num_nextn_predict_layers": 0,
  }


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  a = ARCHITECTURE
  hf = {"partial_rotary_factor": 0.5, **hf}  # Glm4MoeConfig's default
  fields = llama.common(hf, a, False, partial_rope=True) | moe_from_hf(hf, a)
  fields |= {"qkv_bias": hf.get("attention_bias", False) or None}
  return fields | {"qk_norm": hf.get("use_qk_norm", False)}


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  out = llama.config_to_hf(c) | {"model_type": "glm4_moe", "attention_bias": c.qkv_biases}
  out["rope_parameters"]["partial_rotary_factor"] = c.rope_fraction
  del out["mlp_bias"]
  return out | moe_to_hf(c) | NO_TOKEN_IDS | {"use_qk_norm": c.qk_norm}


def feed_forward(c: ModelConfig, ours: str, hf: str, i: int) -> list[Rule]:
  """Layer i's dense SwiGLU, or its router (with the choice bias), experts and shared
  expert."""
  if not c.is_moe_layer(i):
    return llama.swiglu(c, ours, hf, i)
  names = ("gate_proj", "up_proj", "down_proj")
  out = mixtral.expert_rules(f"{ours}/moe", f"{hf}.mlp", names, c.moe_experts)
  out.append(same(f"{ours}/moe/router/bias", f"{hf}.mlp.gate.e_score_correction_bias"))
  if c.moe_shared_d_ff:
    for our_name, name in zip(("wi_0", "wi_1", "wo"), names, strict=True):
      out += linear(f"{ours}/moe/shared_ffn/{our_name}", f"{hf}.mlp.shared_experts.{name}", False)
  return out


def rules(c: ModelConfig) -> list[Rule]:
  return llama.decoder_rules(c, feed_forward)


CONVERTERS = {
  ARCHITECTURE: Converter(
    ARCHITECTURE, "glm4_moe", config_from_hf, config_to_hf, rules, llama.PREFIX
  ),
}

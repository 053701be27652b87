"""Mixtral (`MixtralForCausalLM`): a Mistral decoder whose feed-forward is a mixture of
SwiGLU experts on every layer (`nn/moe.py`).

Routing is ours exactly: router logits (no bias), softmax over the E experts in float32,
the top k, renormalised to sum to 1 (`ModelConfig.moe_norm_topk=True`), every assignment
computed (dropless, `moe_capacity_factor=None`). Checkpoints hold one tensor per expert
(`block_sparse_moe.experts.{e}.w1/w2/w3`: gate, down, up), stacked here into our expert
kernels [E, in, out]. Hugging Face's balance loss (`router_aux_loss_coef` times
`load_balancing_loss_func`) is k times ours, so `moe_balance_loss` = coef * k; it has
no router z-loss (`moe_router_z_loss=0`). Training-time router jitter is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformer.convert import llama
from transformer.convert.base import Converter, Rule, experts, linear, require
from transformer.nn.config import ModelConfig

ARCHITECTURE = "MixtralForCausalLM"


def moe_fields(hf: Mapping[str, Any], experts_key: str, normalise: bool) -> dict[str, Any]:
  """Our MoE fields from a Hugging Face MoE config (every layer sparse, dropless)."""
  k = hf["num_experts_per_tok"]
  return {
    "moe_experts": hf[experts_key],
    "moe_top_k": k,
    "moe_every": 1,
    "moe_norm_topk": normalise,
    "moe_capacity_factor": None,
    "moe_balance_loss": hf.get("router_aux_loss_coef", 0.001) * k,
    "moe_router_z_loss": 0.0,
  }


def moe_to_hf(c: ModelConfig, experts_key: str) -> dict[str, Any]:
  return {
    experts_key: c.moe_experts,
    "num_experts_per_tok": c.moe_top_k,
    "router_aux_loss_coef": c.moe_balance_loss / c.moe_top_k,
  }


def expert_rules(ours: str, hf: str, names: tuple[str, str, str], e: int) -> list[Rule]:
  """Router `hf`.gate <-> `ours`/router [D, E]; each expert's (gate, up, down) projections,
  `hf`.experts.{e}.NAME, stacked <-> wi_0, wi_1, wo [E, in, out]."""
  out = [*linear(f"{ours}/router", f"{hf}.gate", bias=False)]
  for our_name, name in zip(("wi_0", "wi_1", "wo"), names, strict=True):
    out.append(experts(f"{ours}/{our_name}", tuple(f"{hf}.experts.{i}.{name}" for i in range(e))))
  return out


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  a = ARCHITECTURE
  require(hf, a, "router_jitter_noise", (0.0, 0))
  fields = llama.common(hf, a, False) | {"sliding_window": hf.get("sliding_window")}
  return fields | moe_fields(hf, "num_local_experts", True)


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  out = llama.mistral_to_hf(c) | {"model_type": "mixtral", "router_jitter_noise": 0.0}
  return out | moe_to_hf(c, "num_local_experts")


def _moe(c: ModelConfig, ours: str, hf: str, i: int) -> list[Rule]:
  names = ("w1", "w3", "w2")  # gate, up, down
  return expert_rules(f"{ours}/moe", f"{hf}.block_sparse_moe", names, c.moe_experts)


def rules(c: ModelConfig) -> list[Rule]:
  return llama.decoder_rules(c, _moe)


CONVERTERS = {
  ARCHITECTURE: Converter(
    ARCHITECTURE, "mixtral", config_from_hf, config_to_hf, rules, llama.PREFIX
  ),
}

"""OLMo 2 (`Olmo2ForCausalLM`) and OLMo 3 (`Olmo3ForCausalLM`): the Llama tensor layout
with norms moved and widened.

- Each sublayer's output is normalised before the residual add, and its input is not:
  x + norm(attn(x)), then x + norm(mlp(x)) (`ModelConfig.norm_position='sublayer_post'`;
  `post_attention_layernorm` and `post_feedforward_layernorm` -> our `self_attention_norm`
  and `ffn_norm`), with a final norm.
- QK-norm over the whole projection: the N*H query features and the K*H key features are
  each RMS-normalised together, before RoPE (`qk_norm=True`, `qk_norm_over='projection'`;
  scales [N*H] and [K*H]).

OLMo 3 adds sliding-window layers (`layer_types`, three local layers per global one by
default -> `local_global_pattern` 'LLLG') and one RoPE per layer kind: the global layers'
base and scaling (`rope_parameters['full_attention']`), and the local layers' unscaled base
(`rope_parameters['sliding_attention']` -> `rope_local_theta`; another rope_type there is
refused).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformer.convert import llama
from transformer.convert.base import Converter, layer_pattern, layer_types, require, unsupported
from transformer.nn.config import ModelConfig

ARCHITECTURE = "Olmo2ForCausalLM"
OLMO3 = "Olmo3ForCausalLM"


def config_from_hf(hf: Mapping[str, Any], a: str = ARCHITECTURE) -> dict[str, Any]:
  require(hf, a, "attention_bias", (False,))
  fields = llama.common(hf, a, False)
  return fields | {"norm_position": "sublayer_post", "qk_norm": True, "qk_norm_over": "projection"}


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  out = llama.config_to_hf(c) | {"model_type": "olmo2"}
  del out["mlp_bias"]
  return out


def olmo3_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  a = OLMO3
  rope = hf.get("rope_parameters") or {}
  local = rope.get("sliding_attention") or {}
  if local.get("rope_type", "default") != "default":
    unsupported(
      a, "rope_parameters['sliding_attention']['rope_type']", local["rope_type"], ("default",)
    )
  hf = {**hf, "rope_parameters": rope.get("full_attention", rope)}
  pattern = layer_pattern(a, hf["layer_types"], hf["num_hidden_layers"])
  fields = config_from_hf(hf, a)
  theta = float(local.get("rope_theta", fields["rope_theta"]))
  same_rope = theta == fields["rope_theta"] and fields["rope_scaling"] == "none"
  local_theta = None if "L" not in pattern or same_rope else theta
  window = hf["sliding_window"] if "L" in pattern else None
  pattern = "" if pattern == "G" else pattern
  return (
    fields
    | {"sliding_window": window, "local_global_pattern": pattern}
    | {"rope_local_theta": local_theta}
  )


def olmo3_to_hf(c: ModelConfig) -> dict[str, Any]:
  out = config_to_hf(c) | {"model_type": "olmo3", "layer_types": layer_types(c)}
  local = {"rope_type": "default", "rope_theta": c.rope_local_theta or c.rope_theta}
  out["rope_parameters"] = {"full_attention": out["rope_parameters"], "sliding_attention": local}
  return out | {"sliding_window": c.sliding_window}


CONVERTERS = {
  ARCHITECTURE: Converter(
    ARCHITECTURE, "olmo2", config_from_hf, config_to_hf, llama.rules, llama.PREFIX
  ),
  OLMO3: Converter(OLMO3, "olmo3", olmo3_from_hf, olmo3_to_hf, llama.rules, llama.PREFIX),
}

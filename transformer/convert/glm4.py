"""GLM-4 (`Glm4ForCausalLM`, GLM-4-0414): the Llama decoder with four differences.

- A norm before and after each sublayer (`norm_position='sandwich'`: `input_layernorm` /
  `post_self_attn_layernorm` around attention, `post_attention_layernorm` /
  `post_mlp_layernorm` around the feed-forward), plain RMSNorms.
- RoPE on the first `partial_rotary_factor` of each head (`rope_fraction`, 0.5), rotating
  adjacent pairs: the query and key features are reordered on import
  (`base.rope_interleaved`).
- Biases on the query, key and value projections only, when `attention_bias`
  (`qkv_bias`).
- Fused `gate_up_proj` as Phi-3's (`convert.phi3`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformer.convert import llama, phi3
from transformer.convert.base import NO_TOKEN_IDS, Converter, Rule, rope_interleaved
from transformer.nn.config import ModelConfig

ARCHITECTURE = "Glm4ForCausalLM"
NORMS = (  # ours (sandwich) -> Glm4DecoderLayer's
  ("self_attention_norm", "input_layernorm"),
  ("self_attention_norm_post", "post_self_attn_layernorm"),
  ("ffn_norm", "post_attention_layernorm"),
  ("ffn_norm_post", "post_mlp_layernorm"),
)


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  fields = llama.common(hf, ARCHITECTURE, False, partial_rope=True)
  return fields | {"norm_position": "sandwich", "qkv_bias": hf.get("attention_bias", True) or None}


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  out = llama.config_to_hf(c) | {"model_type": "glm4", "attention_bias": c.qkv_biases}
  rope = out["rope_parameters"]
  rope["partial_rotary_factor"] = c.rope_fraction  # Glm4Config's default is 0.5
  del out["mlp_bias"]
  out |= NO_TOKEN_IDS  # the ids travel with the tokenizer files
  return out


def rules(c: ModelConfig) -> list[Rule]:
  out = llama.decoder_rules(c, phi3.gate_up, norm_names=NORMS)
  return rope_interleaved(out, c.head_dim, c.rope_dim)


CONVERTERS = {
  ARCHITECTURE: Converter(ARCHITECTURE, "glm4", config_from_hf, config_to_hf, rules, llama.PREFIX),
}
